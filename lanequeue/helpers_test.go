package lanequeue

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// accept reports an accepted answer with these limits.
func accept(s *Slot, lim headerparse.Limits) {
	report(s, Report{Status: 200, Verdict: Accepted, Limits: lim})
}

// refuse reports a rate refusal with the upstream's hint (0: none).
func refuse(s *Slot, hint time.Duration) {
	report(s, Report{Status: 429, Verdict: RateRefused, Hint: hint})
}

// report reports r for s's dispatch; a slot already answered is first sent
// again, which must be possible at once.
func report(s *Slot, r Report) {
	s.lane.g.mu.Lock()
	answered := s.phase != phaseSent
	s.lane.g.mu.Unlock()
	if answered {
		done := make(chan error, 1)
		go func() { done <- s.WaitRetry(context.Background(), 0) }()
		select {
		case err := <-done:
			if err != nil {
				panic("resend: " + err.Error())
			}
		case <-time.After(5 * time.Second):
			panic("resend blocked")
		}
	}
	s.Report(r)
}

// pause holds the lane's group until t, as a refusal's report would.
func pause(l *Lane, until time.Time) {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	sh := l.limit().shared.(*Memory)
	if until.After(sh.pausedUntil) {
		sh.pausedUntil = until
	}
}

// pastProbe ends the lane group's probe: tests of what follows start there.
func pastProbe(l *Lane) {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	l.limit().learned = true
}

// limitOf is the limit l draws on now.
func limitOf(l *Lane) *limit {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	return l.limit()
}

// shared is the lane's in-process shared state, for white-box checks.
func shared(l *Lane) *Memory { return l.limit().shared.(*Memory) }

// grownConc is a concurrency past slow start (a refusal was seen far above
// limit), bounded by 1 and 64.
func grownConc(limit int) concurrency {
	return concurrency{min: 1, max: 64, limit: limit, refusedAt: 65, probeAcks: minProbeAcks, lastRefusal: t0}
}

// firstSlotZero is the first time at or after t0 whose history bucket is
// ring slot 0.
func firstSlotZero() time.Time {
	t := t0
	for ring(bucketOf(t)) != 0 {
		t = t.Add(historyBucket)
	}
	return t
}

// mustFail returns the error of an acquire that must fail at once.
func mustFail(t *testing.T, ch <-chan result) error {
	t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			r.s.release()
			t.Fatal("acquire succeeded, want an error")
		}
		return r.err
	case <-time.After(time.Second):
		t.Fatal("acquire did not return")
	}
	return nil
}

// quantizedBudget is a window stated as 1200 whose upstream never shows
// more than 19 left and refills 20/s by its own counts: corrected to 20
// at 20/s. It returns the budget and the second answer's dispatch time.
func quantizedBudget(t *testing.T) (*budget, time.Time) {
	t.Helper()
	var b budget
	b.observe(win(1200, 19, at(50*time.Millisecond)), 1, t0, t0)
	for range 8 {
		b.take(1)
	}
	d := at(200 * time.Millisecond)
	b.observe(win(1200, 15, d.Add(250*time.Millisecond)), 9, d, d)
	if b.size() != 20 || !near(b.shown, 20) || !near(b.rate, 20) {
		t.Fatalf("quantized: size %v, shown %v, rate %v; want 20, 20, 20", b.size(), b.shown, b.rate)
	}
	return &b, d
}

// goneAfterCheckCtx is a client that goes away right after Acquire first
// checks it: Done is closed, Err is nil only on the first call.
type goneAfterCheckCtx struct {
	context.Context
	done   chan struct{}
	checks int
	mu     sync.Mutex
}

func newGoneAfterCheckCtx() *goneAfterCheckCtx {
	c := &goneAfterCheckCtx{Context: context.Background(), done: make(chan struct{})}
	close(c.done)
	return c
}

func (c *goneAfterCheckCtx) Done() <-chan struct{} { return c.done }

func (c *goneAfterCheckCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checks++
	if c.checks == 1 {
		return nil
	}
	return context.Canceled
}

// quietLocal is the in-process state of a group whose upstream sends no
// headers, with an admission a moment ago (a live upstream).
func quietLocal() *Memory {
	s := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	s.learn.lastAccepted = t0
	return s
}

// countAnswer counts one request of the lane by the status the client got
// (0: none was sent) and its outcome, as Slot.Done counts it.
func (l *Lane) countAnswer(status int, outcome Outcome) {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	l.stats.countAnswer(status, outcome, l.g.clock.Now())
}
