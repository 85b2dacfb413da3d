package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// silentLane is a lane whose upstream sends no headers and admitted one
// request, with its fake clock.
func silentLane(t *testing.T) (*Lane, *Slot, func(time.Duration)) {
	t.Helper()
	l, fc := testLane(64, 1000)
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{})
	return l, s, fc.Advance
}

// TestSilentRefusalOfALiveUpstreamPacesInsteadOfPausing: a bare 429 while
// the upstream admits others teaches a pace and pauses nothing; with a
// hint, the hint is the pause.
func TestSilentRefusalOfALiveUpstreamPacesInsteadOfPausing(t *testing.T) {
	l, s, advance := silentLane(t)
	defer s.release()
	for range 8 { // others admitted at this level and above
		o := mustGet(t, acquireAsync(context.Background(), l))
		accept(o, headerparse.Limits{})
		o.release()
	}
	advance(time.Second)
	report(s, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: t0.Add(2 * time.Second)})
	st := l.State()
	if !st.PausedUntil.IsZero() {
		t.Fatalf("paused until %v after a bare refusal of a live upstream", st.PausedUntil)
	}
	if st.RequestsPerSecond <= 0 || st.RateFrom != "sending rate" || st.Bound != "rate" || st.Learned != "refusals" {
		t.Fatalf("learned %+v, want a pace from the rate it was sending", st)
	}
	resend(t, s, advance)
	now := l.g.clock.Now()
	s.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: 50 * time.Millisecond, PauseUntil: now.Add(50 * time.Millisecond)})
	if st := l.State(); !st.PausedUntil.Equal(now.Add(50 * time.Millisecond)) {
		t.Fatalf("paused until %v, want the hint's 50ms", st.PausedUntil)
	}
}

// resend sends s again, moving the clock on until the pace lets it go.
func resend(t *testing.T, s *Slot, advance func(time.Duration)) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.WaitRetry(context.Background(), 0) }()
	for range 100 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(10 * time.Millisecond):
			advance(100 * time.Millisecond)
		}
	}
	t.Fatal("the resend never went")
}

// TestRefusalOfAnUpstreamThatAdmitsNothingPauses: with nothing admitted
// for limit's liveFor (5 s), a refusal is not a limit to measure: its
// pause holds.
func TestRefusalOfAnUpstreamThatAdmitsNothingPauses(t *testing.T) {
	const liveFor = 5 * time.Second
	l, s, advance := silentLane(t)
	defer s.release()
	advance(liveFor)
	until := t0.Add(liveFor + time.Second)
	report(s, limit.Report{Status: 503, Verdict: limit.Overloaded, PauseUntil: until})
	if st := l.State(); !st.PausedUntil.Equal(until) || st.RequestsPerSecond != 0 {
		t.Fatalf("state %+v, want paused until %v and no pace", st, until)
	}
}

// TestAnUnsentAttemptDoesNotEndTheFirstAnswerWindow: a new group's first attempt that
// never reached the upstream keeps the group waiting for a real answer.
func TestAnUnsentAttemptDoesNotEndTheFirstAnswerWindow(t *testing.T) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Path: "/v1/x"}, Config{Concurrency: 8, Clock: fc})
	s := mustGet(t, acquireAsync(context.Background(), l))
	s.Report(limit.Report{Verdict: limit.NotSent})
	l.g.mu.Lock()
	learned := l.drawsOn().learned
	l.g.mu.Unlock()
	if learned {
		t.Fatal("an unsent attempt ended the first-answer window")
	}
	accept(s, headerparse.Limits{})
	s.release()
}

// concurrencyBound is a group's state that says the number in flight is
// what binds.
type concurrencyBound struct{ *limit.Memory }

func (c concurrencyBound) View(now time.Time) limit.View {
	v := c.Memory.View(now)
	v.Bound = limit.BoundConcurrency
	return v
}

// TestConcurrencyBoundRetryIsHeldByTheGroup: Report tells the caller
// whether the group's state says the number in flight is the bound (a
// retry waits for a free permit, not for its own wait), and that the
// group took no pause when a rate binds.
func TestConcurrencyBoundRetryIsHeldByTheGroup(t *testing.T) {
	for _, bound := range []bool{false, true} {
		fc := clock.NewFake(t0)
		tb := NewTable(TableConfig{Lane: Config{Concurrency: 4, MaxConcurrency: 4, Clock: fc}, Shared: func(_ string, cfg limit.Config) limit.Shared {
			m := limit.NewMemory(cfg)
			if bound {
				return concurrencyBound{m}
			}
			return m
		}})
		s, err := tb.Acquire(context.Background(), Request{Path: "/v1/x", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		accept(s, headerparse.Limits{})
		fc.Advance(time.Second)
		o, err := tb.Acquire(context.Background(), Request{Path: "/v1/x", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		paused, held := o.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: fc.Now().Add(time.Second)})
		if held != bound || !paused.IsZero() {
			t.Fatalf("bound by concurrency %v: reported bound %v, paused until %v", bound, held, paused)
		}
		if again, held := o.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: fc.Now().Add(time.Second)}); held || !again.IsZero() {
			t.Fatalf("a report made again: bound %v, paused until %v; want neither", held, again)
		}
		o.Done(429, "upstream_error", -1)
		s.Done(200, "ok", -1)
	}
}
