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
	pastProbe(l)
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

// refuseConc reports a concurrency refusal.
func refuseConc(s *Slot) {
	report(s, Report{Status: 429, Verdict: ConcurrencyRefused, Hint: time.Second})
}

// settled is a lane past slow start: a concurrency refusal has been seen
// at a level far above conc, so the limit grows additively.
func settled(conc, minConc, maxConc int) (*Lane, *clock.Fake) {
	l, fc := aimdLane(conc, minConc, maxConc)
	c := &shared(l).conc
	c.slowStart, c.refusedAt = false, maxConc+1
	return l, fc
}

func TestRateRefusalLeavesConcurrencyAlone(t *testing.T) {
	l, _ := settled(8, 1, 64)
	slots := acquireN(t, l, 8)
	for _, s := range slots {
		refuse(s, 50*time.Millisecond)
	}
	wantLimit(t, l, 8)
	if n := l.State().Throttled; n != 8 {
		t.Fatalf("throttled count = %d, want 8", n)
	}
	releaseAll(slots)
}

func TestConcurrencyRefusalLowersLimitToWhatTheUpstreamHeld(t *testing.T) {
	tests := []struct {
		name                      string
		conc, min, inFlight, want int
	}{
		{"others in flight when it went", 16, 1, 10, 9},
		{"never below min", 16, 4, 2, 4},
		{"alone and refused", 8, 1, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := settled(tt.conc, tt.min, 64)
			slots := acquireN(t, l, tt.inFlight)
			refuseConc(slots[len(slots)-1]) // went with inFlight-1 others
			wantLimit(t, l, tt.want)
			releaseAll(slots)
		})
	}
}

func TestOverloadedIsConcurrencyEvidence(t *testing.T) {
	l, _ := settled(16, 1, 64)
	slots := acquireN(t, l, 6)
	slots[5].Report(Report{Status: 529, Verdict: Overloaded})
	wantLimit(t, l, 5)
	releaseAll(slots)
}

func TestConcurrencyRefusalsOfOneBurstCountOnce(t *testing.T) {
	l, fc := settled(16, 1, 64)
	early := acquireN(t, l, 12) // in flight together at t0
	fc.Advance(time.Second)
	refuseConc(early[11]) // 11 others
	wantLimit(t, l, 11)
	refuseConc(early[3]) // sent before the decrease: the same burst
	wantLimit(t, l, 11)

	releaseAll(early[:8]) // 4 left in flight
	fc.Advance(time.Second)
	late := acquireN(t, l, 1)[0] // dispatched after the decrease, with 4 others
	refuseConc(late)
	wantLimit(t, l, 4)
	releaseAll(append(early, late))
}

func TestSlowStartGrowsByOnePerAnswerAtTheLimit(t *testing.T) {
	l, _ := aimdLane(2, 1, 64)
	slots := acquireN(t, l, 2) // the limit is full
	accept(slots[0], headerparse.Limits{})
	wantLimit(t, l, 3)
	accept(slots[1], headerparse.Limits{}) // it filled the limit when it went
	wantLimit(t, l, 4)
	slots = append(slots, acquireN(t, l, 1)...) // 3 of 4: room to spare
	accept(slots[2], headerparse.Limits{})
	wantLimit(t, l, 4)
	releaseAll(slots)
}

func TestAdditiveGrowthAfterSlowStart(t *testing.T) {
	l, _ := settled(4, 1, 6)
	slots := acquireN(t, l, 4)
	for i := 0; i < 3; i++ {
		accept(slots[3], headerparse.Limits{})
	}
	wantLimit(t, l, 4)
	accept(slots[3], headerparse.Limits{})
	wantLimit(t, l, 5)
	slots = append(slots, acquireN(t, l, 1)...) // binding again at 5
	for i := 0; i < 4; i++ {
		accept(slots[4], headerparse.Limits{})
	}
	wantLimit(t, l, 5)
	accept(slots[4], headerparse.Limits{})
	wantLimit(t, l, 6)
	slots = append(slots, acquireN(t, l, 1)...) // binding at MaxConcurrency
	for i := 0; i < 50; i++ {
		accept(slots[5], headerparse.Limits{})
	}
	wantLimit(t, l, 6)
	releaseAll(slots)
}

func TestGrowthBackToARefusedLevelIsSlow(t *testing.T) {
	l, fc := aimdLane(8, 1, 64)
	slots := acquireN(t, l, 8)
	fc.Advance(time.Millisecond)
	refuseConc(slots[7]) // refused with 7 others: limit 7, level 8 refused
	wantLimit(t, l, 7)
	releaseAll(slots[7:])
	slots = slots[:7]
	for i := 0; i < 7*probeAcks-1; i++ {
		accept(slots[6], headerparse.Limits{})
	}
	wantLimit(t, l, 7)
	accept(slots[6], headerparse.Limits{})
	wantLimit(t, l, 8)
	releaseAll(slots)
}

func TestLongAnswersGrowConcurrencyToRateTimesAnswerTime(t *testing.T) {
	// 4 requests a second from headers, answers that take 2 s: 8 must be in
	// flight to keep the rate, whatever refusals taught before.
	l, fc := settled(2, 1, 64)
	c := &shared(l).conc
	c.refusedAt = 0
	c.answerSecs = 2
	lim := headerparse.Limits{Requests: win(4, 2, at(500*time.Millisecond))}
	slots := acquireN(t, l, 2)
	accept(slots[1], lim)
	if got := shared(l).pace.littleFloor(c.answerSecs); got != 8 {
		t.Fatalf("little floor = %d, want 8", got)
	}
	wantLimit(t, l, 3) // grew at once, not after a limit's worth
	fc.Advance(time.Second)
	releaseAll(slots)
}

func TestAnswerTimeIsMeasuredFromDispatchToRelease(t *testing.T) {
	l, fc := aimdLane(4, 1, 4)
	s := acquireN(t, l, 1)[0]
	accept(s, headerparse.Limits{})
	fc.Advance(1500 * time.Millisecond)
	s.Release()
	if got := l.State().AnswerSeconds; !near(got, 1.5) {
		t.Fatalf("answer seconds = %v, want 1.5", got)
	}
	r := acquireN(t, l, 1)[0]
	r.Report(Report{Status: 429, Verdict: RateRefused})
	fc.Advance(10 * time.Second)
	r.Release() // a refusal's time says nothing about answers
	if got := l.State().AnswerSeconds; !near(got, 1.5) {
		t.Fatalf("answer seconds = %v after a refusal, want 1.5", got)
	}
}

func TestProbeNewLaneSendsOneUntilAnswer(t *testing.T) {
	tests := []struct {
		name string
		end  func(fc *clock.Fake, first *Slot) // what ends the probe
	}{
		{"answer without rate-limit headers", func(_ *clock.Fake, s *Slot) { accept(s, headerparse.Limits{}) }},
		{"answer with limits", func(_ *clock.Fake, s *Slot) {
			accept(s, headerparse.Limits{Requests: win(100, 99, at(time.Minute))})
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

			failed.Report(Report{Verdict: NotSent}) // never reached the upstream
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
