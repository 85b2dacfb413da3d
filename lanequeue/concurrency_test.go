package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// aimdLane is a lane past the first-answer window with the given concurrency bounds.
func aimdLane(conc, minConc, maxConc int) (*Lane, *clock.Fake) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Route: "r", Path: "/v1/x", Model: "m"},
		Config{Concurrency: conc, MinConcurrency: minConc, MaxConcurrency: maxConc, MaxQueue: 100, Clock: fc})
	pastFirstAnswer(l)
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
		s.release()
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
	report(s, limit.Report{Status: 429, Verdict: limit.ConcurrencyRefused, Hint: time.Second})
}

// settled is a lane past slow start: its route configures conc as where
// learning starts, so the limit grows additively from there.
func settled(conc, minConc, maxConc int) (*Lane, *clock.Fake) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Route: "r", Path: "/v1/x", Model: "m"}, Config{Concurrency: conc, MinConcurrency: minConc, MaxConcurrency: maxConc, MaxQueue: 100, Clock: fc,
		Limits: limit.Limits{Concurrency: conc, Start: true}})
	pastFirstAnswer(l)
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

func TestConcurrencyRefusalNeverBelowMin(t *testing.T) {
	l, _ := settled(16, 4, 64)
	slots := acquireN(t, l, 2)
	refuseConc(slots[1])
	wantLimit(t, l, 4)
	releaseAll(slots)
}

func TestOverloadedIsConcurrencyEvidence(t *testing.T) {
	l, _ := settled(16, 1, 64)
	slots := acquireN(t, l, 6)
	slots[5].Report(limit.Report{Status: 529, Verdict: limit.Overloaded})
	wantLimit(t, l, 15) // one step: an overload may not be about this key
	releaseAll(slots)
}

func TestEachConcurrencyRefusalLowersTheLimitByOne(t *testing.T) {
	l, _ := settled(12, 1, 64)
	burst := acquireN(t, l, 12) // 4 more than the upstream holds
	for i, want := range []int{11, 10, 9, 8} {
		refuseConc(burst[11-i])
		wantLimit(t, l, want)
		burst[11-i].release()
	}
	releaseAll(burst)
}

func TestConcurrencyRefusalFallsToTheLevelItWentAt(t *testing.T) {
	l, _ := settled(32, 1, 64)
	slots := acquireN(t, l, 5) // the fifth went with 4 others
	refuseConc(slots[4])
	wantLimit(t, l, 5)
	releaseAll(slots[:3]) // only slots 3 and 4 are out now
	refuseConc(slots[3])  // went at level 4; the upstream holds at most 2
	wantLimit(t, l, 2)
	releaseAll(slots)
}

func TestSlowStartGrowsByHalfPerAnswerTime(t *testing.T) {
	l, _ := aimdLane(4, 1, 64)
	slots := acquireN(t, l, 4) // the limit is full
	accept(slots[0], headerparse.Limits{})
	wantLimit(t, l, 4)
	accept(slots[1], headerparse.Limits{})
	wantLimit(t, l, 5)
	slots = append(slots, acquireN(t, l, 1)...) // full again, at 5
	accept(slots[2], headerparse.Limits{})
	wantLimit(t, l, 5)
	accept(slots[3], headerparse.Limits{})
	wantLimit(t, l, 6)
	releaseAll(slots)
	// Answers that went with room to spare do not count.
	more := acquireN(t, l, 2)
	accept(more[0], headerparse.Limits{})
	accept(more[1], headerparse.Limits{})
	wantLimit(t, l, 6)
	releaseAll(more)
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

func TestGrowthBackToARefusedLevelIsSlowAndSlowerAfterEachFailure(t *testing.T) {
	l, _ := aimdLane(8, 1, 64)
	slots := acquireN(t, l, 8)
	refuseConc(slots[7]) // refused with 7 others: limit 7, level 8 refused
	wantLimit(t, l, 7)
	releaseAll(slots[7:])
	slots = slots[:7]
	// Each refusal at the level again doubles the answers growing back to
	// it takes: 10, 20, 40 limits' worth (limit's minRegrowAcks is 10).
	for _, regrowAcks := range []int{10, 20, 40} {
		for i := 0; i < 7*regrowAcks-1; i++ {
			accept(slots[6], headerparse.Limits{})
		}
		wantLimit(t, l, 7)
		accept(slots[6], headerparse.Limits{})
		wantLimit(t, l, 8) // back at the refused level
		eighth := acquireN(t, l, 1)[0]
		refuseConc(eighth) // refused there again
		wantLimit(t, l, 7)
		eighth.release()
	}
	releaseAll(slots)
}

func TestAnswerTimeIsMeasuredFromDispatchToRelease(t *testing.T) {
	l, fc := aimdLane(4, 1, 4)
	s := acquireN(t, l, 1)[0]
	accept(s, headerparse.Limits{})
	fc.Advance(1500 * time.Millisecond)
	s.release()
	if got := l.State().AnswerSeconds; !near(got, 1.5) {
		t.Fatalf("answer seconds = %v, want 1.5", got)
	}
	r := acquireN(t, l, 1)[0]
	r.Report(limit.Report{Status: 429, Verdict: limit.RateRefused})
	fc.Advance(10 * time.Second)
	r.release() // a refusal's time says nothing about answers
	if got := l.State().AnswerSeconds; !near(got, 1.5) {
		t.Fatalf("answer seconds = %v after a refusal, want 1.5", got)
	}
}

func TestANewLaneSendsOneUntilItsFirstAnswer(t *testing.T) {
	tests := []struct {
		name string
		end  func(fc *clock.Fake, first *Slot) // what ends the first-answer window
	}{
		{"answer without rate-limit headers", func(_ *clock.Fake, s *Slot) { accept(s, headerparse.Limits{}) }},
		{"answer with limits", func(_ *clock.Fake, s *Slot) {
			accept(s, headerparse.Limits{Requests: win(100, 99, at(time.Minute))})
		}},
		{"the window passes", func(fc *clock.Fake, _ *Slot) { fc.Set(at(firstAnswerWindow)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fc := clock.NewFake(t0)
			l := newLane(Key{Path: "/v1/x"}, Config{Concurrency: 8, MaxConcurrency: 8, Clock: fc})
			first := mustGet(t, acquireAsync(context.Background(), l))
			chans := make([]<-chan result, 7)
			for i := range chans {
				chans[i] = acquireAsync(context.Background(), l)
			}
			waitQueued(t, l, 7)
			fc.Set(at(firstAnswerWindow - time.Nanosecond))
			if st := l.State(); st.InFlight != 1 || st.Queued != 7 {
				t.Fatalf("during the first-answer window: %+v, want 1 in flight and 7 waiting", st)
			}
			mustBlock(t, chans[0])

			tt.end(fc, first)
			// All 8 go within the first answer's time (without headers,
			// slow start spreads them over part of it).
			for range 100 {
				if l.State().InFlight == 8 {
					break
				}
				fc.Advance(firstAnswerWindow / 100)
			}
			if st := l.State(); st.InFlight != 8 || st.Queued != 0 {
				t.Fatalf("after the first-answer window: %+v, want all 8 in flight", st)
			}
			first.release()
			for _, ch := range chans {
				mustGet(t, ch).release()
			}
		})
	}
}

func TestAFirstReleaseWithoutAnswerStaysOneAtATime(t *testing.T) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Path: "/v1/x"}, Config{Concurrency: 8, MaxConcurrency: 8, Clock: fc})
	first := mustGet(t, acquireAsync(context.Background(), l))
	a := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	b := acquireAsync(context.Background(), l)
	waitQueued(t, l, 2)
	first.release() // e.g. a connection error: no answer to learn from
	sa := mustGet(t, a)
	mustBlock(t, b)
	if st := l.State(); st.InFlight != 1 || st.Queued != 1 {
		t.Fatalf("state %+v, want still one at a time", st)
	}
	fc.Set(at(firstAnswerWindow)) // the window counts from the first dispatch
	sb := mustGet(t, b)
	sa.release()
	sb.release()
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

			failed.Report(limit.Report{Verdict: limit.NotSent}) // never reached the upstream
			s := mustGet(t, next)
			if w := s.queueWait(); w != 0 {
				t.Fatalf("queue wait = %v, want the refund to let it go at once", w)
			}
			if now := fc.Now(); !now.Equal(t0) {
				t.Fatalf("clock moved to %v", now)
			}
			failed.release()
			s.release()
		})
	}
}

// TestAnswerTimeIsAMovingMeanWeightingTheNewestByAFifth: the mean answer
// time starts at the first answer's time and then moves a fifth of the way
// to each new one.
func TestAnswerTimeIsAMovingMeanWeightingTheNewestByAFifth(t *testing.T) {
	l, fc := aimdLane(4, 1, 4)
	for i, tt := range []struct {
		took time.Duration
		want float64
	}{{time.Second, 1}, {3 * time.Second, 1.4}, {900 * time.Millisecond, 1.3}} {
		s := acquireN(t, l, 1)[0]
		accept(s, headerparse.Limits{})
		fc.Advance(tt.took)
		s.release()
		if got := l.State().AnswerSeconds; !near(got, tt.want) {
			t.Fatalf("answer %d: mean answer seconds = %v, want %v", i+1, got, tt.want)
		}
	}
}
