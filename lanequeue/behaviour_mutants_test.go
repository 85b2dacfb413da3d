package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// Tests that hold the learner's edges, found by mutation testing.

// quietLocal is the in-process state of a group whose upstream sends no
// headers, with an admission a moment ago (a live upstream).
func quietLocal() *Memory {
	s := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	s.learn.lastAccepted = t0
	return s
}

// TestDispatchesAreNumberedInOrder: each dispatch's number is one more
// than the last's.
func TestDispatchesAreNumberedInOrder(t *testing.T) {
	s := quietLocal()
	a, _, _ := s.Admit(t0, 1, true)
	b, _, _ := s.Admit(t0, 1, true)
	if a.Seq != 1 || b.Seq != 2 {
		t.Fatalf("numbered %d and %d, want 1 and 2", a.Seq, b.Seq)
	}
}

// TestPendingNeverGoesNegative: settling more than was sent at a level, or
// at a level never counted, changes nothing.
func TestPendingNeverGoesNegative(t *testing.T) {
	var l learner
	l.sent(3)
	l.settled(3)
	l.settled(3)
	l.settled(4) // beyond what was ever counted
	if l.pending[3] != 0 {
		t.Fatalf("pending %v after settling twice", l.pending[3])
	}
}

// TestClassifyAtItsEdges: each threshold of classify, exactly at it and
// just past it.
func TestClassifyAtItsEdges(t *testing.T) {
	counts := func(adm, ref map[int]float64) *learner {
		var l learner
		l.grow(16)
		for k, v := range adm {
			l.admitted[k] = v
		}
		for k, v := range ref {
			l.refusedAt[k] = v
		}
		return &l
	}
	for _, tt := range []struct {
		name     string
		adm, ref map[int]float64
		want     int
	}{
		{"two refusals above eight admissions below", map[int]float64{8: 8}, map[int]float64{9: 2}, 9},
		{"one refusal is not enough", map[int]float64{8: 8}, map[int]float64{9: 1}, 0},
		{"as many admitted as refused at the level", map[int]float64{8: 8, 9: 2}, map[int]float64{9: 2}, 9},
		{"more admitted than refused at the level", map[int]float64{8: 8, 9: 3}, map[int]float64{9: 2}, 0},
		{"seven admissions below, two refusals", map[int]float64{8: 7}, map[int]float64{9: 2}, 0},
		{"admissions below split over two levels", map[int]float64{7: 4, 8: 4}, map[int]float64{9: 2}, 9},
		{"the refused level is the lowest nothing went through at", map[int]float64{6: 8}, map[int]float64{9: 2}, 7},
		{"at level 2, level 1 counts once", map[int]float64{1: 8}, map[int]float64{2: 2}, 2},
		{"three quarters of all refusals at the top", map[int]float64{8: 8, 4: 8}, map[int]float64{9: 3, 4: 1}, 9},
		{"under three quarters at the top", map[int]float64{8: 8, 4: 8}, map[int]float64{9: 2, 4: 1}, 0},
		{"three refusals where nothing went through", nil, map[int]float64{9: 3}, 9},
		{"two refusals where nothing went through", nil, map[int]float64{9: 2}, 0},
		{"three refusals, one admission at the level", map[int]float64{9: 1}, map[int]float64{9: 3}, 9},
		{"four refusals, two admissions at the level", map[int]float64{9: 2}, map[int]float64{9: 4}, 9},
		{"three refusals, two admissions at the level", map[int]float64{9: 2}, map[int]float64{9: 3}, 0},
	} {
		l := counts(tt.adm, tt.ref)
		l.classify()
		if l.atLevel != tt.want {
			t.Errorf("%s: at level %d, want %d", tt.name, l.atLevel, tt.want)
		}
	}
	// A dispatch still out counts as admitted at its level.
	l := counts(nil, map[int]float64{9: 3})
	l.sent(9)
	l.sent(9)
	if l.classify(); l.atLevel != 0 {
		t.Errorf("two pending at 9 beside three refusals: at level %d, want 0", l.atLevel)
	}
}

// TestReachedNeedsMoreAdmittedThanRefused: equal counts do not reach.
func TestReachedNeedsMoreAdmittedThanRefused(t *testing.T) {
	var l learner
	l.answered(5, false)
	l.answered(6, true)
	if l.reached(5) {
		t.Fatal("one admitted and one refused at 5 and above counted as reached")
	}
	l.answered(7, false)
	if !l.reached(5) || l.reached(8) {
		t.Fatal("reached misread")
	}
}

// TestRefusalRingKeepsExactlyItsMemoryAndSpan: refusalMemory refusals are
// kept, and one exactly refusalSpan before the latest still counts.
func TestRefusalRingKeepsExactlyItsMemoryAndSpan(t *testing.T) {
	var l learner
	for i := range refusalMemory {
		l.refused(uint64(10*i), at(time.Duration(i)*time.Second), 0)
	}
	if len(l.refusals) != refusalMemory || l.refusals[0].seq != 0 {
		t.Fatalf("kept %d refusals from seq %d, want %d from 0", len(l.refusals), l.refusals[0].seq, refusalMemory)
	}
	var w learner
	w.refused(0, t0, 0)
	if r := w.refused(61, at(refusalSpan), 0); !near(r, 59/refusalSpan.Seconds()) {
		t.Fatalf("a refusal exactly refusalSpan back was dropped: %v/s", r)
	}
	if r := w.refused(62, at(refusalSpan+time.Nanosecond), 0); !near(r, 0) {
		t.Fatalf("a refusal past refusalSpan still counts: %v/s", r)
	}
}

// TestStepReturnsToCruiseWhenNothingIsLearned: with no estimate, or a
// concurrency bound, a probe phase ends and step says so, once.
func TestStepReturnsToCruiseWhenNothingIsLearned(t *testing.T) {
	l := learner{phase: probeUp}
	if !l.step(t0, true) || l.phase != cruise {
		t.Fatal("a probe without an estimate did not end")
	}
	if l.step(t0, true) {
		t.Fatal("step reported a change while cruising with nothing learned")
	}
	c := learner{estimate: 10, measured: true, atLevel: 9, phase: probeDown}
	if !c.step(t0, true) || c.phase != cruise {
		t.Fatal("a concurrency-bound group kept probing its pace")
	}
}

// TestCleanProbesInARowRaiseMore: the second clean probe in a row raises
// twice as much as the first.
func TestCleanProbesInARowRaiseMore(t *testing.T) {
	l := learner{estimate: 100, measured: true}
	now := t0
	for range 2 {
		l.step(now, true)
		now = now.Add(probeLength(l.estimate))
		l.step(now, true)
		now = now.Add(probeLength(l.estimate))
		l.step(now, true)
		now = l.phaseUntil
	}
	if want := 100 * probeRaise * (1 + 2*(probeRaise-1)); !near(l.estimate, want) {
		t.Fatalf("estimate %v after two clean probes, want %v", l.estimate, want)
	}
}

// TestProbeStartsOnlyWhenThePaceHeldRequestsWithinASecond: Admit probes
// when the pace held a request less than a second ago, marks the
// dispatches of the up phase, and no others.
func TestProbeStartsOnlyWhenThePaceHeldRequestsWithinASecond(t *testing.T) {
	s := quietLocal()
	s.learn.estimate, s.learn.measured, s.learn.from = 1000, true, "admitted rate"
	s.pace.setSynthetic(s.pacing(), t0)
	s.pace.requests.avail = 100
	s.held = t0
	s.learn.phaseUntil = t0
	tk, _, _ := s.Admit(t0.Add(time.Second), 1, true)
	if s.learn.phase != cruise || tk.Probe {
		t.Fatalf("probed a second after the pace last held a request (phase %v, probe %v)", s.learn.phase, tk.Probe)
	}
	s.held = t0.Add(time.Second)
	tk, _, _ = s.Admit(t0.Add(time.Second+time.Millisecond), 1, true)
	if s.learn.phase != probeUp || !tk.Probe {
		t.Fatalf("no probe just after the pace held a request (phase %v, probe %v)", s.learn.phase, tk.Probe)
	}
}

// TestFailedAnswersSayNothingOfTheLevel: a 500 is counted neither as an
// admission nor as a refusal.
func TestFailedAnswersSayNothingOfTheLevel(t *testing.T) {
	s := quietLocal()
	tk, _, _ := s.Admit(t0, 1, true)
	s.Learn(&tk, Report{Status: 500, Verdict: Failed}, t0)
	if s.learn.counted != 0 {
		t.Fatalf("a failed answer was counted: %v", s.learn.counted)
	}
}

// TestReplySecsIsTheFirstAnswers: the first accepted answer's time to its
// headers is kept; later ones do not move it.
func TestReplySecsIsTheFirstAnswers(t *testing.T) {
	s := quietLocal()
	a, _, _ := s.Admit(t0, 1, true)
	s.Learn(&a, Report{Status: 200, Verdict: Accepted}, at(200*time.Millisecond))
	b, _, _ := s.Admit(at(time.Second), 1, true)
	s.Learn(&b, Report{Status: 200, Verdict: Accepted}, at(2*time.Second))
	if !near(s.learn.replySecs, 0.2) {
		t.Fatalf("reply time %v, want the first answer's 0.2", s.learn.replySecs)
	}
}

// TestFirstRefusalAtAnUnreachedLevelSeedsFromLittlesLaw: refused at 9 in
// flight with nothing through at 9, answers of 0.5 s: 8 in flight held 16
// a second, above what the group was sending; and the concurrency limit
// falls to the 8 that went through.
func TestFirstRefusalAtAnUnreachedLevelSeedsFromLittlesLaw(t *testing.T) {
	s := NewMemory(Config{Concurrency: 16, MaxConcurrency: 64})
	s.conc.start = 4
	var tks []Ticket
	for range 9 {
		tk, _, _ := s.Admit(t0, 1, true)
		tks = append(tks, tk)
	}
	s.conc.answerSecs = 0.5
	s.learn.lastAccepted = t0
	for i := range tks[:8] {
		s.learn.answered(tks[i].Level, false)
	}
	s.Learn(&tks[8], Report{Status: 429, Verdict: RateRefused}, at(time.Millisecond))
	if !near(s.learn.estimate, 16) || s.learn.from != "sending rate" {
		t.Fatalf("seeded %v from %q, want 16 from the sending rate's place", s.learn.estimate, s.learn.from)
	}
	if s.conc.limit != 8 {
		t.Fatalf("limit %d after a refusal at 9 nothing went through at, want 8", s.conc.limit)
	}
}

// TestHintSeedsWhenTooFewWereSent: with fewer than minSampleAdmits sent,
// a hint beats the sending rate even when it is faster.
func TestHintSeedsWhenTooFewWereSent(t *testing.T) {
	s := quietLocal()
	tk, _, _ := s.Admit(t0, 1, true)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 100 * time.Millisecond}, at(time.Millisecond))
	if s.learn.from != "hint" || !near(s.learn.estimate, 10) {
		t.Fatalf("seeded %v from %q, want 10 from the hint", s.learn.estimate, s.learn.from)
	}
}

// TestAHintEqualToTheRateLeavesItsSource: a hint that says exactly the
// learned rate does not claim it.
func TestAHintEqualToTheRateLeavesItsSource(t *testing.T) {
	s := quietLocal()
	s.learn.estimate, s.learn.measured, s.learn.from = 20, true, "admitted rate"
	s.pace.setSynthetic(s.pacing(), t0)
	tk, _, _ := s.Admit(at(time.Second), 1, true)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 50 * time.Millisecond}, at(time.Second))
	if s.learn.from != "admitted rate" {
		t.Fatalf("source %q after a hint equal to the rate", s.learn.from)
	}
}

// TestToConcurrencySetsTheLimitAndTheRefusedLevel: a group found bound at
// 9 in flight holds 8, and remembers 9 as the level refused (a lower one
// already remembered stays).
func TestToConcurrencySetsTheLimitAndTheRefusedLevel(t *testing.T) {
	s := quietLocal()
	s.conc.limit = 12
	s.learn.atLevel = 9
	s.toConcurrency()
	if s.conc.limit != 8 || s.conc.refusedAt != 9 || s.conc.slowStart {
		t.Fatalf("limit %d refused at %d slow start %v, want 8, 9, false", s.conc.limit, s.conc.refusedAt, s.conc.slowStart)
	}
	s.conc.refusedAt = 7
	s.toConcurrency()
	if s.conc.refusedAt != 7 {
		t.Fatalf("refused level %d, want the lower 7 kept", s.conc.refusedAt)
	}
	s.conc.refusedAt = 9
	s.learn.atLevel = 9
	s.toConcurrency()
	if s.conc.refusedAt != 9 {
		t.Fatalf("refused level %d, want 9", s.conc.refusedAt)
	}
}

// TestConcurrencyBoundRefusalStopsAtTheLevelBelow: each refusal of a
// group bound at 9 steps its limit down, never under 8.
func TestConcurrencyBoundRefusalStopsAtTheLevelBelow(t *testing.T) {
	l, _, slots := topRefusedLane(t)
	sh := shared(l)
	for range 3 {
		sh.learn.answered(10, true)
	}
	sh.conc.limit = 9
	report(slots[9], Report{Status: 429, Verdict: RateRefused})
	if st := l.State(); st.Concurrency != 9 {
		t.Fatalf("limit %d, want 9: the refusals start at 10", st.Concurrency)
	}
	releaseAll(slots)
}

// TestAnUnsentAttemptDoesNotEndTheProbe: a new group's first attempt that
// never reached the upstream keeps the group waiting for a real answer.
func TestAnUnsentAttemptDoesNotEndTheProbe(t *testing.T) {
	fc := clock.NewFake(t0)
	l := New(Key{Path: "/v1/x"}, Config{Concurrency: 8, Clock: fc})
	s := mustGet(t, acquireAsync(context.Background(), l))
	s.Report(Report{Verdict: NotSent})
	l.g.mu.Lock()
	learned := l.g.learned
	l.g.mu.Unlock()
	if learned {
		t.Fatal("an unsent attempt ended the probe")
	}
	accept(s, headerparse.Limits{})
	s.Release()
}

// TestPendingAboveTheRefusalsCountsAsAdmitted: requests still out at a
// level above the refusals are admissions there, so a rate, not a cap.
func TestPendingAboveTheRefusalsCountsAsAdmitted(t *testing.T) {
	var l learner
	for range 8 {
		l.answered(8, false)
	}
	for range 3 {
		l.answered(9, true)
	}
	for range 5 {
		l.sent(10)
	}
	if l.classify(); l.atLevel != 0 {
		t.Fatalf("five out at 10 beside three refusals at 9: at level %d, want 0", l.atLevel)
	}
}

// TestAtLevelTwoTheLevelBelowCountsOnce: four admissions at 1 are not
// eight.
func TestAtLevelTwoTheLevelBelowCountsOnce(t *testing.T) {
	var l learner
	for range 4 {
		l.answered(1, false)
	}
	l.answered(2, true)
	l.answered(2, true)
	if l.classify(); l.atLevel != 0 {
		t.Fatalf("four admissions at 1, two refusals at 2: at level %d, want 0", l.atLevel)
	}
}

// TestCeilRate: Little's law, rounded up; 0 when either is unknown.
func TestCeilRate(t *testing.T) {
	for _, tt := range []struct {
		rate, secs float64
		want       int
	}{{16, 0.5, 8}, {16.1, 0.5, 9}, {0, 1, 0}, {1, 0, 0}, {-1, 1, 0}, {1, -1, 0}} {
		if got := ceilRate(tt.rate, tt.secs); got != tt.want {
			t.Errorf("ceilRate(%v, %v) = %d, want %d", tt.rate, tt.secs, got, tt.want)
		}
	}
}

// TestFloorFromAMeasuredRate: the concurrency a measured rate needs is
// taken at the cruise share of it.
func TestFloorFromAMeasuredRate(t *testing.T) {
	s := quietLocal()
	s.pace.setSynthetic(10, t0)
	s.learn.estimate, s.learn.measured = 10, true
	s.conc.answerSecs = 1
	if f := s.floor(); f != 10 { // ceil(9.7)
		t.Fatalf("floor %d, want 10", f)
	}
	s.learn.measured = false
	if f := s.floor(); f != 0 {
		t.Fatalf("floor %d from a guess, want 0", f)
	}
}

// TestNoHintSeedsFromTheSendingRate: a refusal without a hint, with few
// sent, starts from what was sent, never from nothing.
func TestNoHintSeedsFromTheSendingRate(t *testing.T) {
	s := quietLocal()
	tk, _, _ := s.Admit(t0, 1, true)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, at(time.Millisecond))
	if s.learn.from != "sending rate" || s.learn.estimate <= 0 {
		t.Fatalf("seeded %v from %q, want the sending rate", s.learn.estimate, s.learn.from)
	}
}

// TestNamedConcurrencyWithoutALevelKeepsTheLimit: toConcurrency for a
// group that named concurrency but showed no level changes no limit.
func TestNamedConcurrencyWithoutALevelKeepsTheLimit(t *testing.T) {
	s := quietLocal()
	s.learn.named = true
	s.conc.limit = 12
	s.toConcurrency()
	if s.conc.limit != 12 || s.conc.refusedAt != 0 {
		t.Fatalf("limit %d refused at %d, want 12 and 0", s.conc.limit, s.conc.refusedAt)
	}
}

// TestAFasterHintDoesNotSeedOverWhatWasSent: with enough sent, a hint
// faster than the sending rate is not taken as the seed.
func TestAFasterHintDoesNotSeedOverWhatWasSent(t *testing.T) {
	s := quietLocal()
	var tk Ticket
	for range 10 {
		tk, _, _ = s.Admit(t0, 1, true)
	}
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 10 * time.Millisecond}, at(time.Millisecond))
	if s.learn.from != "sending rate" || !near(s.learn.estimate, 8) {
		t.Fatalf("seeded %v from %q, want the 8/s sent (the limit let 8 go)", s.learn.estimate, s.learn.from)
	}
}
