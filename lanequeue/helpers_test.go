package lanequeue

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// accept reports an accepted answer with these limits.
func accept(s *Slot, lim headerparse.Limits) {
	report(s, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: lim})
}

// refuse reports a rate refusal with the upstream's hint (0: none).
func refuse(s *Slot, hint time.Duration) {
	report(s, limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: hint})
}

// report reports r for s's dispatch; a slot already answered is first sent
// again, which must be possible at once.
func report(s *Slot, r limit.Report) {
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
	// An answer that never reached the upstream teaches nothing but its
	// pause; its ticket went at a number in flight no dispatch reached, so
	// settling it counts no pending dispatch down.
	t := limit.Ticket{Level: math.MaxInt}
	l.drawsOn().shared.Learn(&t, limit.Report{Verdict: limit.NotSent, PauseUntil: until}, l.g.clock.Now())
}

// pastFirstAnswer ends the lane group's first-answer window: tests of
// what follows start there.
func pastFirstAnswer(l *Lane) {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	l.drawsOn().learned = true
}

// limitOf is the limit l draws on now.
func limitOf(l *Lane) *pool {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	return l.drawsOn()
}

// shared is the lane's in-process shared state, for white-box checks.
func shared(l *Lane) *limit.Memory { return l.drawsOn().shared.(*limit.Memory) }

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

// countAnswer counts one request of the lane by the status the client got
// (0: none was sent) and its outcome, as Slot.Done counts it.
func (l *Lane) countAnswer(status int, outcome string) {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	l.stats.countAnswer(status, outcome, l.g.clock.Now())
}

// elsewhere is a Local whose peers have had an answer once answered is
// set.
type elsewhere struct {
	*limit.Memory
	answered *atomic.Bool
}

func (e elsewhere) AnsweredElsewhere() bool { return e.answered.Load() }

func win(limit, remaining int64, reset time.Time) headerparse.Window {
	return headerparse.Window{Limit: limit, Remaining: remaining, HasRemaining: true, Reset: reset}
}

func at(d time.Duration) time.Time { return t0.Add(d) }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// anyAfter is an answer's count of the limit's own requests sent after it
// (sharing.observe) that could explain any excess.
const anyAfter = math.MaxUint64

// acquire is acquireAs for a request that names no client.
func (l *Lane) acquire(ctx context.Context, cost int64, p Priority) (*Slot, error) {
	return l.acquireAs(ctx, cost, p, "", 0)
}

// queueWait is how long the request waited for its first dispatch.
func (s *Slot) queueWait() time.Duration { return s.granted.Sub(s.arrived) }

// newLane returns a lane outside any table, with a group of its own (the
// tests' single lanes).
func newLane(key Key, cfg Config) *Lane {
	cfg = cfg.withDefaults()
	g := newGroup(key.groupKey(), cfg, func(_ string, c limit.Config) limit.Shared { return limit.NewMemory(c) }, nil)
	g.refs.Store(1) // the lane's own
	return g.newLane(key, key.ID())
}

// lookup returns the lane with this ID, if the table has it.
func (t *Table) lookup(id string) (*Lane, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.ids[id]
	return l, ok
}

// laneCount is the number of lanes.
func (t *Table) laneCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lanes.Len() + t.unproven.Len()
}

// groupCount is the number of limit groups alive: in the table or still
// serving a request.
func (t *Table) groupCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.groups)
}

// sweep drops lanes unused for IdleTTL or longer now, without waiting for
// the next laneFor.
func (t *Table) sweep() {
	t.mu.Lock()
	t.lastSweep = time.Time{}
	t.sweepLocked(t.cfg.Lane.Clock.Now())
	evicted := t.takeEvictedLocked()
	t.mu.Unlock()
	t.notify(evicted)
}
