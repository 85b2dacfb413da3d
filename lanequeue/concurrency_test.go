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
	l := newLane(Key{Route: "r", Path: "/v1/x", Model: "m"},
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
	slots[5].Report(Report{Status: 529, Verdict: Overloaded})
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
	for _, probeAcks := range []int{minProbeAcks, 2 * minProbeAcks} {
		for i := 0; i < 7*probeAcks-1; i++ {
			accept(slots[6], headerparse.Limits{})
		}
		wantLimit(t, l, 7)
		accept(slots[6], headerparse.Limits{})
		wantLimit(t, l, 8) // the probe
		probe := acquireN(t, l, 1)[0]
		refuseConc(probe) // fails again
		wantLimit(t, l, 7)
		probe.release()
	}
	if got := shared(l).conc.probeAcks; got != 4*minProbeAcks {
		t.Fatalf("probeAcks = %d after two failed probes, want %d", got, 4*minProbeAcks)
	}
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
	s.release()
	if got := l.State().AnswerSeconds; !near(got, 1.5) {
		t.Fatalf("answer seconds = %v, want 1.5", got)
	}
	r := acquireN(t, l, 1)[0]
	r.Report(Report{Status: 429, Verdict: RateRefused})
	fc.Advance(10 * time.Second)
	r.release() // a refusal's time says nothing about answers
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
		{"probe window passes", func(fc *clock.Fake, _ *Slot) { fc.Set(at(probeWindow)) }},
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
			fc.Set(at(probeWindow - time.Nanosecond))
			if st := l.State(); st.InFlight != 1 || st.Queued != 7 {
				t.Fatalf("during the probe: %+v, want 1 in flight and 7 waiting", st)
			}
			mustBlock(t, chans[0])

			tt.end(fc, first)
			// All 8 go within the first answer's time (without headers,
			// slow start spreads them over part of it).
			for range 100 {
				if l.State().InFlight == 8 {
					break
				}
				fc.Advance(probeWindow / 100)
			}
			if st := l.State(); st.InFlight != 8 || st.Queued != 0 {
				t.Fatalf("after the probe: %+v, want all 8 in flight", st)
			}
			first.release()
			for _, ch := range chans {
				mustGet(t, ch).release()
			}
		})
	}
}

func TestProbeReleaseWithoutAnswerStaysOneAtATime(t *testing.T) {
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
	fc.Set(at(probeWindow)) // the window counts from the first dispatch
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

			failed.Report(Report{Verdict: NotSent}) // never reached the upstream
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

// Dispatches another store admitted go at the number in flight it says,
// all replicas together, and are numbered in the group's running count;
// a refused one's permit stops counting when it is given back.
func TestNoteDispatchTakesTheFleetsLevelAndCount(t *testing.T) {
	s := NewMemory(Config{Concurrency: 8, MaxConcurrency: 8})
	seq, level, _ := s.NoteDispatch(t0, 3, 100, 0)
	if seq != 100 || level != 4 {
		t.Fatalf("seq %d level %d, want the fleet's 100 and 3 out + itself = 4", seq, level)
	}
	tk := Ticket{Dispatched: t0, Level: level, Seq: seq, Lease: "l1"}
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, t0)
	if _, level, _ := s.NoteDispatch(t0, 3, 101, 0); level != 3 {
		t.Fatalf("level %d beside a refused permit still held, want 3", level)
	}
	s.NoteReturn(&tk, t0)
	if _, level, _ := s.NoteDispatch(t0, 3, 102, 0); level != 4 {
		t.Fatalf("level %d after the refused permit came back, want 4", level)
	}
	if n, _ := s.pace.recent.recent(t0); n != 3 {
		t.Fatalf("%d dispatches in the sending rate, want 3 (one each)", n)
	}
	s.NoteDispatch(t0, 0, 112, 0) // nine more elsewhere since
	if n, _ := s.pace.recent.recent(t0); n != 13 {
		t.Fatalf("%d dispatches in the sending rate, want 13: the other replicas' count too", n)
	}
}

// TestAnswerThatWentAtTheLimitIsBindingAfterOthersLeft: an answer whose
// request went as the last permit the limit allowed says the limit held
// requests back, even when the others have come back by the time it
// arrives; one that went with room to spare does not.
func TestAnswerThatWentAtTheLimitIsBindingAfterOthersLeft(t *testing.T) {
	c := newConcurrency(Config{Concurrency: 4, MinConcurrency: 1, MaxConcurrency: 64})
	last := Ticket{InFlight: 3, Limit: 4} // went with 3 others at limit 4
	c.accepted(&last, t0, 1, 0)
	c.accepted(&last, t0, 1, 0)
	if c.limit != 5 {
		t.Fatalf("limit = %d after two answers that went at the limit, want 5 (slow start)", c.limit)
	}
	roomy := Ticket{InFlight: 2, Limit: 5} // went with a permit to spare
	for range 4 {
		c.accepted(&roomy, at(time.Second), 1, 0)
	}
	if c.limit != 5 {
		t.Fatalf("limit = %d after answers that went with room, want still 5", c.limit)
	}
}

// TestRefusedLevelIsRememberedForAFullRefusedMemory: growth back to a level
// the upstream refused stays slow up to and including refusedMemory after
// the latest concurrency refusal, and is forgotten just after it.
func TestRefusedLevelIsRememberedForAFullRefusedMemory(t *testing.T) {
	full := Ticket{InFlight: 3, Limit: 4}
	c := grownConc(4)
	c.refusedAt = 5 // growing to 5 is a probe: it takes 4 × probeAcks answers
	for range 4 {
		c.accepted(&full, t0.Add(refusedMemory), 4, 0)
	}
	if c.limit != 4 || c.refusedAt != 5 {
		t.Fatalf("at exactly refusedMemory: limit %d, refusedAt %d; want 4 and 5 (still a probe)", c.limit, c.refusedAt)
	}
	c = grownConc(4)
	c.refusedAt, c.probeAcks = 5, 4*minProbeAcks
	for range 4 {
		c.accepted(&full, t0.Add(refusedMemory+time.Nanosecond), 4, 0)
	}
	if c.limit != 5 || c.refusedAt != 0 || c.probeAcks != minProbeAcks {
		t.Fatalf("just after refusedMemory: limit %d, refusedAt %d, probeAcks %d; want 5, 0, %d",
			c.limit, c.refusedAt, c.probeAcks, minProbeAcks)
	}
}

// TestLittleFloorRaisesTheLimitOnlyWhileBelowIt: below the concurrency the
// learned rate needs, each binding answer raises the limit at once; at that
// floor, growth takes a limit's worth of answers again.
func TestLittleFloorRaisesTheLimitOnlyWhileBelowIt(t *testing.T) {
	full := Ticket{InFlight: 3, Limit: 4}
	c := grownConc(3)
	c.accepted(&full, t0, 4, 4)
	if c.limit != 4 {
		t.Fatalf("below the floor: limit %d, want 4 at once", c.limit)
	}
	for i := range 3 {
		c.accepted(&full, t0, 4, 4)
		if c.limit != 4 {
			t.Fatalf("at the floor, answer %d: limit %d, want still 4", i+1, c.limit)
		}
	}
	c.accepted(&full, t0, 4, 4)
	if c.limit != 5 {
		t.Fatalf("at the floor after a limit's worth of answers: limit %d, want 5", c.limit)
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
