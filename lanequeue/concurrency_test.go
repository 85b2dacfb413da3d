package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// aimdLane is a lane past the probe with the given concurrency bounds.
func aimdLane(conc, minConc, maxConc int) (*Lane, *clock.Fake) {
	fc := clock.NewFake(t0)
	l := New(Key{Route: "r", Path: "/v1/x", Model: "m"},
		Config{Concurrency: conc, MinConcurrency: minConc, MaxConcurrency: maxConc, MaxQueue: 100, Clock: fc})
	l.learned = true
	return l, fc
}

// acquireN takes n slots that are free now.
func acquireN(t *testing.T, l *Lane, n int) []*Slot {
	t.Helper()
	slots := make([]*Slot, n)
	for i := range slots {
		slots[i] = mustGet(t, acquireAsync(context.Background(), l))
	}
	return slots
}

func releaseAll(slots []*Slot) {
	for _, s := range slots {
		s.Release()
	}
}

func wantLimit(t *testing.T, l *Lane, want int) {
	t.Helper()
	if got := l.State().Concurrency; got != want {
		t.Fatalf("concurrency limit = %d, want %d", got, want)
	}
}

func TestThrottledHalvesLimitNotBelowMin(t *testing.T) {
	tests := []struct {
		name            string
		conc, min, want int
	}{
		{"even", 8, 1, 4},
		{"odd rounds down", 5, 1, 2},
		{"floored at min", 8, 5, 5},
		{"already at min", 1, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := aimdLane(tt.conc, tt.min, 64)
			s := acquireN(t, l, 1)[0]
			s.Throttled(0)
			wantLimit(t, l, tt.want)
			if n := l.State().Throttled; n != 1 {
				t.Fatalf("throttled count = %d, want 1", n)
			}
			s.Release()
		})
	}
}

func TestThrottledBurstCountsOnce(t *testing.T) {
	l, fc := aimdLane(16, 1, 16)
	early := acquireN(t, l, 4) // in flight together at t0
	fc.Advance(time.Second)

	early[0].Throttled(0)
	wantLimit(t, l, 8)
	for _, s := range early[1:] {
		s.Throttled(0) // dispatched before the decrease: the same burst
	}
	wantLimit(t, l, 8)

	fc.Advance(time.Second)
	late := acquireN(t, l, 1)[0] // dispatched after the decrease
	late.Throttled(0)
	wantLimit(t, l, 4)
	early[1].Throttled(0) // still from before either decrease
	wantLimit(t, l, 4)

	if n := l.State().Throttled; n != 6 {
		t.Fatalf("throttled count = %d, want every 429 counted", n)
	}
	releaseAll(append(early, late))
}

func TestThrottledAfterRetryIsNewEvidence(t *testing.T) {
	l, fc := aimdLane(8, 1, 8)
	s := acquireN(t, l, 1)[0]
	s.Throttled(0)
	wantLimit(t, l, 4)
	fc.Advance(time.Second)
	if err := s.WaitRetry(context.Background()); err != nil {
		t.Fatalf("retry: %v", err)
	}
	s.Throttled(0) // the retry was dispatched after the decrease
	wantLimit(t, l, 2)
	s.Release()
}

func TestSucceededAddsOneAfterLimitSuccessesWhileBinding(t *testing.T) {
	l, _ := aimdLane(4, 1, 6)
	slots := acquireN(t, l, 4) // in flight == limit
	for i := 0; i < 3; i++ {
		slots[0].Succeeded()
	}
	wantLimit(t, l, 4)
	slots[0].Succeeded()
	wantLimit(t, l, 5)

	slots = append(slots, acquireN(t, l, 1)...) // binding again at 5
	for i := 0; i < 4; i++ {
		slots[0].Succeeded()
	}
	wantLimit(t, l, 5) // needs 5 now
	slots[0].Succeeded()
	wantLimit(t, l, 6)

	slots = append(slots, acquireN(t, l, 1)...) // binding at MaxConcurrency
	for i := 0; i < 50; i++ {
		slots[0].Succeeded()
	}
	wantLimit(t, l, 6)
	releaseAll(slots)
}

func TestSucceededLeavesLimitWhenNotBinding(t *testing.T) {
	tests := []struct {
		name                string
		conc, max, inFlight int
	}{
		{"in flight below the limit", 4, 8, 3},
		{"nothing in flight", 4, 8, 0},
		{"limit at MaxConcurrency", 4, 4, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := aimdLane(tt.conc, 1, tt.max)
			slots := acquireN(t, l, tt.inFlight)
			var s *Slot
			if tt.inFlight > 0 {
				s = slots[0]
			} else {
				s = acquireN(t, l, 1)[0]
				s.Release() // its answer comes after it left the count
			}
			for i := 0; i < 50; i++ {
				s.Succeeded()
			}
			wantLimit(t, l, tt.conc)
			if tt.inFlight < tt.conc {
				// Successes while not binding did not pile up either:
				// once binding, it takes a full limit's worth again.
				slots = append(slots, acquireN(t, l, tt.conc-tt.inFlight)...)
				for i := 0; i < tt.conc-1; i++ {
					slots[0].Succeeded()
				}
				wantLimit(t, l, tt.conc)
				slots[0].Succeeded()
				wantLimit(t, l, tt.conc+1)
			}
			releaseAll(slots)
		})
	}
}

func TestSucceededIncreaseLetsWaiterIn(t *testing.T) {
	l, _ := aimdLane(2, 1, 4)
	slots := acquireN(t, l, 2)
	ch := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	slots[0].Succeeded()
	mustBlock(t, ch)
	slots[1].Succeeded()
	wantLimit(t, l, 3)
	slots = append(slots, mustGet(t, ch))
	releaseAll(slots)
}

func TestThrottledResetsSuccessCount(t *testing.T) {
	l, _ := aimdLane(4, 1, 8)
	slots := acquireN(t, l, 4)
	for i := 0; i < 3; i++ {
		slots[0].Succeeded()
	}
	slots[1].Throttled(0)
	wantLimit(t, l, 2)
	slots[0].Succeeded() // the 3 earlier successes do not count any more
	wantLimit(t, l, 2)
	slots[0].Succeeded()
	wantLimit(t, l, 3)
	releaseAll(slots)
}

func TestObserveProactiveDecrease(t *testing.T) {
	reset := at(time.Minute)
	tests := []struct {
		name string
		lim  headerparse.Limits
		want int
	}{
		{"requests under 10% without reset", headerparse.Limits{Requests: win(100, 9, time.Time{})}, 4},
		{"tokens under 10% without reset", headerparse.Limits{Tokens: win(1000, 99, time.Time{})}, 4},
		{"exhausted without reset", headerparse.Limits{Requests: win(100, 0, time.Time{})}, 4},
		{"both windows low halve once", headerparse.Limits{Requests: win(100, 1, time.Time{}), Tokens: win(1000, 1, time.Time{})}, 4},
		{"exactly 10% left", headerparse.Limits{Requests: win(100, 10, time.Time{})}, 8},
		{"low with a reset: pacing handles it", headerparse.Limits{Requests: win(100, 9, reset), Tokens: win(1000, 1, reset)}, 8},
		{"low without a limit", headerparse.Limits{Requests: win(0, 0, time.Time{})}, 8},
		{"limit without a remaining count", headerparse.Limits{Requests: headerparse.Window{Limit: 100}}, 8},
		{"nothing reported", headerparse.Limits{}, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := aimdLane(8, 1, 8)
			s := acquireN(t, l, 1)[0]
			s.Observe(tt.lim)
			wantLimit(t, l, tt.want)
			s.Release()
		})
	}
}

func TestProbeNewLaneSendsOneUntilAnswer(t *testing.T) {
	tests := []struct {
		name string
		end  func(fc *clock.Fake, first *Slot) // what ends the probe
	}{
		{"answer without rate-limit headers", func(_ *clock.Fake, s *Slot) { s.Observe(headerparse.Limits{}) }},
		{"answer with limits", func(_ *clock.Fake, s *Slot) {
			s.Observe(headerparse.Limits{Requests: win(100, 99, at(time.Minute))})
		}},
		{"probe window passes", func(fc *clock.Fake, _ *Slot) { fc.Set(at(ProbeWindow)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fc := clock.NewFake(t0)
			l := New(Key{Path: "/v1/x"}, Config{Concurrency: 8, MaxConcurrency: 8, Clock: fc})
			first := mustGet(t, acquireAsync(context.Background(), l))
			chans := make([]<-chan result, 7)
			for i := range chans {
				chans[i] = acquireAsync(context.Background(), l)
			}
			waitQueued(t, l, 7)
			fc.Set(at(ProbeWindow - time.Nanosecond))
			if st := l.State(); st.InFlight != 1 || st.Queued != 7 {
				t.Fatalf("during the probe: %+v, want 1 in flight and 7 waiting", st)
			}
			mustBlock(t, chans[0])

			tt.end(fc, first)
			if st := l.State(); st.InFlight != 8 || st.Queued != 0 {
				t.Fatalf("after the probe: %+v, want all 8 in flight", st)
			}
			first.Release()
			for _, ch := range chans {
				mustGet(t, ch).Release()
			}
		})
	}
}

func TestProbeReleaseWithoutAnswerStaysOneAtATime(t *testing.T) {
	fc := clock.NewFake(t0)
	l := New(Key{Path: "/v1/x"}, Config{Concurrency: 8, MaxConcurrency: 8, Clock: fc})
	first := mustGet(t, acquireAsync(context.Background(), l))
	a := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	b := acquireAsync(context.Background(), l)
	waitQueued(t, l, 2)
	first.Release() // e.g. a connection error: no answer to learn from
	sa := mustGet(t, a)
	mustBlock(t, b)
	if st := l.State(); st.InFlight != 1 || st.Queued != 1 {
		t.Fatalf("state %+v, want still one at a time", st)
	}
	fc.Set(at(ProbeWindow)) // the window counts from the first dispatch
	sb := mustGet(t, b)
	sa.Release()
	sb.Release()
}

func TestRefundLetsNextWaiterGo(t *testing.T) {
	tests := []struct {
		name string
		lim  headerparse.Limits
		cost int64
	}{
		{"request budget", headerparse.Limits{Requests: win(10, 1, at(10*time.Second))}, 1},
		{"token budget", headerparse.Limits{Tokens: win(1000, 100, at(10*time.Second))}, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, fc := observedLane(t, 8, tt.cost, tt.lim)
			failed := mustGet(t, acquireCostAsync(context.Background(), l, tt.cost)) // takes what is left
			next := acquireCostAsync(context.Background(), l, tt.cost)
			waitQueued(t, l, 1)
			mustBlock(t, next)

			failed.Refund() // never reached the upstream
			s := mustGet(t, next)
			if w := s.QueueWait(); w != 0 {
				t.Fatalf("queue wait = %v, want the refund to let it go at once", w)
			}
			if now := fc.Now(); !now.Equal(t0) {
				t.Fatalf("clock moved to %v", now)
			}
			failed.Release()
			s.Release()
		})
	}
}
