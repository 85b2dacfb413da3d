package limit

import (
	"testing"
	"time"
)

// TestAdmittedRateIsMeasuredBetweenRefusals: the upstream refused
// dispatch 10 at 0 s and dispatch 31 at 1 s; the 20 in between were
// admitted: 20 a second, counted one fewer for the part-token the bucket
// may have held at the first refusal.
func TestAdmittedRateIsMeasuredBetweenRefusals(t *testing.T) {
	var l learner
	if r := l.refused(10, t0, 0); r != 0 {
		t.Fatalf("one refusal measured %v/s", r)
	}
	if r := l.refused(31, at(time.Second), 0); !near(r, 19) {
		t.Fatalf("measured %v/s, want 19", r)
	}
	// A third refusal, 10 dispatches and half a second later, of which
	// one more was refused earlier (learned late, out of order).
	if r := l.refused(41, at(1500*time.Millisecond), 0); !near(r, 28.0/1.5) {
		t.Fatalf("measured %v/s, want %v", r, 28.0/1.5)
	}
	if r := l.refused(35, at(1200*time.Millisecond), 0); !near(r, 27.0/1.5) {
		t.Fatalf("after a refusal learned out of order: %v/s, want %v", r, 27.0/1.5)
	}
}

// TestRefusalsElsewhereAreNotCountedAsAdmitted: with the pool's refusals
// counted (every replica's), the dispatches between two of this
// replica's refusals less all the refusals among them are what was
// admitted: 31 dispatches after dispatch 10 up to 41, 10 of them refused
// (11 − 1 before), 21 admitted, 20 a second counted one fewer. Counting
// only its own refusals would measure 29.
func TestRefusalsElsewhereAreNotCountedAsAdmitted(t *testing.T) {
	var l learner
	l.refused(10, t0, 1)
	if r := l.refused(41, at(time.Second), 11); !near(r, 20) {
		t.Fatalf("measured %v/s, want 20 (21 admitted less one)", r)
	}
	// No refusal learned between the two dispatches: every one between
	// was admitted.
	var none learner
	none.refused(10, t0, 5)
	if r := none.refused(40, at(time.Second), 5); !near(r, 29) {
		t.Fatalf("with no refusal counted between, measured %v/s, want 29 (30 admitted less one)", r)
	}
}

// TestRefusalsCloseTogetherMeasureNothing: two refusals within
// minSampleSpan, or with fewer than minSampleAdmits admitted between
// them, say nothing about a rate.
func TestRefusalsCloseTogetherMeasureNothing(t *testing.T) {
	var l learner
	l.refused(1, t0, 0)
	if r := l.refused(20, at(minSampleSpan-time.Millisecond), 0); r != 0 {
		t.Fatalf("measured %v/s over less than %v", r, minSampleSpan)
	}
	// Of dispatches 2 to 20, the upstream refused 20; 18 went.
	if r := l.refused(21, at(minSampleSpan), 0); !near(r, 17/minSampleSpan.Seconds()) {
		t.Fatalf("measured %v/s over %v, want %v", r, minSampleSpan, 17/minSampleSpan.Seconds())
	}
	var few learner
	few.refused(1, t0, 0)
	if r := few.refused(1+minSampleAdmits, at(time.Second), 0); r != 0 {
		t.Fatalf("measured %v/s from %d admitted", r, minSampleAdmits-1)
	}
	// Dispatches 2 to 8 and 10 admitted, 9 refused.
	if r := few.refused(3+minSampleAdmits, at(2*time.Second), 0); !near(r, (minSampleAdmits-1)/2.0) {
		t.Fatalf("measured %v/s from %d admitted in 2s, want %v", r, minSampleAdmits, (minSampleAdmits-1)/2.0)
	}
}

// TestElevenAdmissionsMeasureNoRate: eleven admissions between two
// refusals 2 s apart measure no rate yet; measured over so few, a rate
// is off by up to a sixth, and a climb back from one that low costs a
// run of long streams a tenth of its time (see minSampleAdmits).
func TestElevenAdmissionsMeasureNoRate(t *testing.T) {
	var l learner
	l.refused(1, t0, 0)
	if r := l.refused(13, at(2*time.Second), 0); r != 0 {
		t.Fatalf("measured %v/s from the 11 admitted between dispatches 1 and 13", r)
	}
	if r := l.refused(15, at(2*time.Second), 0); !near(r, 5.5) {
		t.Fatalf("measured %v/s from dispatches 2 to 14 less 13, 12 admitted in 2s, want 5.5 (one fewer, over 2s)", r)
	}
}

// TestRateIsMeasuredOverTheLatestRefusalsOnly: refusals older than
// refusalSpan, or beyond refusalMemory, no longer count.
func TestRateIsMeasuredOverTheLatestRefusalsOnly(t *testing.T) {
	var l learner
	l.refused(0, t0, 0)
	// 10 s later the upstream admits 5 a second.
	for i := range 5 {
		l.refused(uint64(100+6*i), at(refusalSpan+time.Second+time.Duration(i)*time.Second), 0)
	}
	if r := l.refused(130, at(refusalSpan+6*time.Second), 0); !near(r, 4.8) {
		t.Fatalf("measured %v/s, want 4.8 (the old refusal forgotten)", r)
	}
	for i := range refusalMemory + 4 {
		l.refused(uint64(200+2*i), at(30*time.Second+time.Duration(i)*100*time.Millisecond), 0)
	}
	if len(l.refusals) != refusalMemory {
		t.Fatalf("%d refusals kept, want %d", len(l.refusals), refusalMemory)
	}
}

// TestRefusalsAtTheTopLevelsMeanConcurrency: the upstream admits every
// request at 8 in flight and refuses every one at 9: the bound is the
// number in flight, at 9. Refusals at levels where others were admitted
// mean a rate; refusals at the top of a ramp whose levels were each tried
// a few times only mean nothing yet.
func TestRefusalsAtTheTopLevelsMeanConcurrency(t *testing.T) {
	var conc learner
	for range 4 {
		for range 8 {
			conc.answered(8, false) // with a backlog, each goes as a permit frees
		}
		conc.answered(9, true)
		conc.answered(10, true)
	}
	if !conc.classify() || !conc.concurrencyBound() || conc.atLevel != 9 {
		t.Fatalf("refusals only at 9 and 10 in flight: at level %d, want 9", conc.atLevel)
	}
	var rate learner
	for range 8 {
		for level := 1; level <= 8; level++ {
			rate.answered(level, false)
		}
		rate.answered(4, true)
	}
	if rate.classify(); rate.concurrencyBound() {
		t.Fatalf("refusals at 4 in flight, with admissions up to 8, judged concurrency at %d", rate.atLevel)
	}
	var ramp learner
	for level := 1; level <= 12; level++ {
		ramp.answered(level, false)
		ramp.answered(level, false)
	}
	ramp.answered(13, true)
	ramp.answered(13, true)
	if ramp.classify(); ramp.concurrencyBound() {
		t.Fatalf("refusals at the top of a ramp judged concurrency at %d", ramp.atLevel)
	}
	// Once the levels below it have been admitted again and again, the
	// same refusals say concurrency.
	for range 4 {
		ramp.answered(12, false)
	}
	if !ramp.classify() || ramp.atLevel != 13 {
		t.Fatalf("at level %d after admissions at 11 and 12, want 13", ramp.atLevel)
	}
	// Refusals spread below it turn the judgement back to a rate.
	for range 8 {
		ramp.answered(5, true)
		ramp.answered(5, false)
	}
	if ramp.classify(); ramp.concurrencyBound() {
		t.Fatalf("refusals at 5, where the upstream admits, still judged concurrency at %d", ramp.atLevel)
	}
}

// TestCountsByLevelFade: past levelMemory answers every count halves.
func TestCountsByLevelFade(t *testing.T) {
	var l learner
	for range levelMemory {
		l.answered(3, false)
	}
	l.answered(3, true)
	if l.admitted[3] != levelMemory/2 || l.refusedAt[3] != 0.5 || l.counted != (levelMemory+1)/2.0 {
		t.Fatalf("admitted %v refused %v counted %v after %d answers", l.admitted[3], l.refusedAt[3], l.counted, levelMemory+1)
	}
	l.answered(maxLevel+10, false)
	if len(l.admitted) != maxLevel+1 || l.admitted[maxLevel] != 1 {
		t.Fatalf("a level past maxLevel was not counted at it")
	}
}

// TestProbeCycle: cruising under the estimate, a probe above it once the
// pace has held requests back, then as long below it; a probe that met no
// refusal raises the estimate, one that did leaves it.
func TestProbeCycle(t *testing.T) {
	l := learner{estimate: 20, measured: true}
	if l.pace() != 20*cruiseShare {
		t.Fatalf("cruise pace %v, want %v", l.pace(), 20*cruiseShare)
	}
	if l.step(t0, false) {
		t.Fatal("a probe started while the pace held nothing back")
	}
	if !l.step(t0, true) || l.phase != probeUp || l.pace() != 20*probeGain {
		t.Fatalf("phase %v pace %v, want the up phase at %v", l.phase, l.pace(), 20*probeGain)
	}
	up := probeLength(20)
	if l.step(t0.Add(up-time.Millisecond), true) {
		t.Fatal("the up phase ended early")
	}
	if !l.step(t0.Add(up), true) || l.phase != probeDown || l.pace() != 20*drainGain {
		t.Fatalf("phase %v pace %v, want the down phase at %v", l.phase, l.pace(), 20*drainGain)
	}
	if !l.step(t0.Add(2*up), false) || l.phase != cruise || !near(l.estimate, 20*probeRaise) || l.from != rateProbe {
		t.Fatalf("after a clean probe: phase %v estimate %v from %q, want cruise at %v from probe", l.phase, l.estimate, l.from, 20*probeRaise)
	}
	next := t0.Add(2 * up).Add(l.cruise() / 2) // a clean probe brings the next one sooner
	if l.step(next.Add(-time.Millisecond), true) {
		t.Fatal("probed again before the cruise ended")
	}
	l.step(next, true)
	l.probeHit = true
	l.step(next.Add(probeLength(l.estimate)), true)
	l.step(next.Add(2*probeLength(l.estimate)), true)
	if !near(l.estimate, 20*probeRaise) {
		t.Fatalf("a probe that met a refusal moved the estimate to %v", l.estimate)
	}
}

// TestProbesAreBoundedInRequests: at a slow rate the up phase lasts long
// enough for probeRequests more, and the cruise for cycleRequests.
func TestProbesAreBoundedInRequests(t *testing.T) {
	if d := probeLength(4); d != 2*time.Second {
		t.Fatalf("up phase at 4/s lasts %v, want 2s", d)
	}
	if d := probeLength(100); d != probeSpan {
		t.Fatalf("up phase at 100/s lasts %v, want %v", d, probeSpan)
	}
	l := learner{estimate: 4, measured: true}
	if d := l.cruise(); d != 15*time.Second {
		t.Fatalf("cruise at 4/s lasts %v, want 15s", d)
	}
	if d := (&learner{estimate: 4}).cruise(); d != guessCruise {
		t.Fatalf("an unmeasured rate's cruise lasts %v, want %v", d, guessCruise)
	}
	l.estimate = 100
	if d := l.cruise(); d != probeEvery {
		t.Fatalf("cruise at 100/s lasts %v, want %v", d, probeEvery)
	}
	// Measured over 10 admissions, the estimate may be off by a tenth:
	// the cruise is 20 requests long, not 60.
	l = learner{estimate: 4, measured: true, sample: 10}
	if d := l.cruise(); d != 5*time.Second {
		t.Fatalf("cruise at 4/s, measured over 10, lasts %v, want 5s", d)
	}
	l.sample = 100
	if d := l.cruise(); d != 15*time.Second {
		t.Fatalf("cruise at 4/s, measured over 100, lasts %v, want 15s", d)
	}
}

// TestShortHintsArePacesLongOnesAreWaits: "try again in 50ms" is one
// request per 50 ms; Retry-After: 1 says nothing about a pace.
func TestShortHintsArePacesLongOnesAreWaits(t *testing.T) {
	for hint, want := range map[time.Duration]float64{50 * time.Millisecond: 20, 0: 0, -time.Second: 0, time.Second: 0, 999 * time.Millisecond: 1 / 0.999} {
		if got := hintPace(hint); !near(got, want) {
			t.Errorf("hintPace(%v) = %v, want %v", hint, got, want)
		}
	}
}

// TestSlowStartSpreadsABurstBeforeAnyLimitIsKnown: without headers or a
// learned pace, what a burst of answers frees goes out 1/(startSpread ×
// limit) of an answer time apart, not at one instant; once a pace is
// learned the pace holds instead.
func TestSlowStartSpreadsABurstBeforeAnyLimitIsKnown(t *testing.T) {
	var s Memory
	s.conc = newConcLimit(Config{Concurrency: 4, MaxConcurrency: 64}.WithDefaults())
	s.learn.replySecs = 0.4
	if _, _, ok := s.Admit(t0, 1, true); !ok {
		t.Fatal("the first dispatch was held")
	}
	gap := time.Duration(0.4 / (startSpread * 4) * float64(time.Second)) // 50ms
	at, _, ok := s.Admit(t0.Add(gap-time.Millisecond), 1, true)
	if ok {
		t.Fatal("a second dispatch went within the spread")
	}
	if _, next, _ := s.Admit(t0.Add(time.Millisecond), 1, true); !next.Equal(t0.Add(gap)) {
		t.Fatalf("told to come back at %v, want %v (ticket %+v)", next, t0.Add(gap), at)
	}
	if _, _, ok := s.Admit(t0.Add(gap), 1, true); !ok {
		t.Fatal("held past the spread")
	}
	s.pace.setFromRefusals(1000, t0)
	s.pace.requests.bucket.Set(s.pace.requests.bucket.At(), 10)
	if _, _, ok := s.Admit(t0.Add(gap), 1, true); !ok {
		t.Fatal("the spread held a pool that has a learned pace")
	}
}

// TestRefusedPermitsDoNotCountAsInFlight: a refused request that still
// holds its permit is not in flight at the upstream, so a dispatch beside
// it goes at a level without it; the permit's return ends that.
func TestRefusedPermitsDoNotCountAsInFlight(t *testing.T) {
	var s Memory
	s.conc = newConcLimit(Config{Concurrency: 8, MaxConcurrency: 64}.WithDefaults())
	a, _, _ := s.Admit(t0, 1, true)
	b, _, _ := s.Admit(t0, 1, true)
	if a.Level != 1 || b.Level != 2 {
		t.Fatalf("levels %d and %d, want 1 and 2", a.Level, b.Level)
	}
	s.learn.lastAccepted = t0 // a live upstream
	s.Learn(&b, Report{Status: 429, Verdict: RateRefused}, t0)
	c, _, _ := s.Admit(t0.Add(time.Second), 1, true) // past the pace the refusal taught
	if c.Level != 2 {
		t.Fatalf("a dispatch beside a refused permit went at level %d, want 2", c.Level)
	}
	s.Return(&b, t0)
	if s.refusedHolding != 0 {
		t.Fatalf("%d refused permits held after the return", s.refusedHolding)
	}
	if s.learn.pending[1] != 1 || s.learn.pending[2] != 1 {
		t.Fatalf("pending %v, want a and c still out", s.learn.pending)
	}
}

// TestAGuessIsProbedSoonAndRaisedMore: a rate that is only a guess is
// probed within guessCruise, and a clean probe raises it by guessRaise.
func TestAGuessIsProbedSoonAndRaisedMore(t *testing.T) {
	l := learner{estimate: 10, from: rateSending, phaseUntil: t0}
	if !l.guess() {
		t.Fatal("a sending rate is not a guess")
	}
	end := cleanProbe(&l)
	// A clean probe also halves the cruise before the next one.
	if !near(l.estimate, 10*guessRaise) || l.phaseUntil != end.Add(guessCruise/2) {
		t.Fatalf("estimate %v next probe at %v, want %v at %v", l.estimate, l.phaseUntil, 10*guessRaise, end.Add(guessCruise/2))
	}
	if (&learner{from: rateHint}).guess() || (&learner{from: rateSending, measured: true}).guess() {
		t.Fatal("a hint or a measured rate counted as a guess")
	}
}

// TestARateFromAHintIsProbedSoonButRaisedAsMeasured: a pace from one
// refusal's hint may be a window's boundary read as a bucket's refill
// (a 100 ms wait to a 1 s window's end is 10/s of a window of 20): it is
// probed within guessCruise, as a guess is, and a clean probe raises it
// by probeRaise, as a measured rate.
func TestARateFromAHintIsProbedSoonButRaisedAsMeasured(t *testing.T) {
	l := learner{estimate: 10, from: rateHint, phaseUntil: t0}
	end := cleanProbe(&l)
	if !near(l.estimate, 10*probeRaise) || l.phaseUntil != end.Add(guessCruise/2) {
		t.Fatalf("estimate %v next probe at %v, want %v at %v", l.estimate, l.phaseUntil, 10*probeRaise, end.Add(guessCruise/2))
	}
	// Once measured, it cruises its cycle.
	m := learner{estimate: 10, from: rateHint, measured: true, phaseUntil: t0}
	cruise := m.cruise()
	if end := cleanProbe(&m); m.phaseUntil != end.Add(cruise/2) {
		t.Fatalf("a measured rate's next probe at %v, want %v", m.phaseUntil, end.Add(cruise/2))
	}
}

// TestAFirstRefusalsHintPaceIsProbedSoon: a first refusal whose hint
// sets the pace (10/s from 100 ms) starts the probe cycle after
// guessCruise, not after a measured rate's cruise (60 requests, 6 s): a
// window's boundary read as a pace is found out within seconds.
func TestAFirstRefusalsHintPaceIsProbedSoon(t *testing.T) {
	s := quietLocal()
	tk, _, _ := s.Admit(t0, 1, true)
	now := at(time.Millisecond)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 100 * time.Millisecond}, now)
	if s.learn.from != rateHint || s.learn.measured {
		t.Fatalf("rig: the pace is %v from %v (measured %v), want the hint's", s.learn.estimate, s.learn.from, s.learn.measured)
	}
	if want := now.Add(guessCruise); !s.learn.phaseUntil.Equal(want) {
		t.Fatalf("first probe at %v, want %v (guessCruise after the refusal)", s.learn.phaseUntil.Sub(t0), want.Sub(t0))
	}
}

// cleanProbe runs one probe cycle of l from t0, up and down with no
// refusal, and returns when it ended.
func cleanProbe(l *learner) time.Time {
	up := probeLength(l.estimate)
	l.step(t0, true)
	l.step(t0.Add(up), true)
	l.step(t0.Add(2*up), true)
	return t0.Add(2 * up)
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

// TestClassifyAtItsEdges: each threshold of classify, exactly at it and
// just past it.
func TestClassifyAtItsEdges(t *testing.T) {
	counts := func(adm, ref map[int]float64) *learner {
		var l learner
		l.growLevels(16)
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
	l.noteSent(9)
	l.noteSent(9)
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
		t.Fatal("a concurrency-bound pool kept probing its pace")
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
	s.learn.estimate, s.learn.measured, s.learn.from = 1000, true, rateAdmitted
	s.pace.setFromRefusals(s.pacing(), t0)
	s.pace.requests.bucket.Set(s.pace.requests.bucket.At(), 100)
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
// a second, above what the pool was sending; and the concurrency limit
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
	if !near(s.learn.estimate, 16) || s.learn.from != rateSending {
		t.Fatalf("seeded %v from %q, want 16 from the sending rate's place", s.learn.estimate, s.learn.from)
	}
	if s.conc.limit != 8 {
		t.Fatalf("limit %d after a refusal at 9 nothing went through at, want 8", s.conc.limit)
	}
}

// TestLittlesLawWaitsForTheFirstAnswerTime: streams admitted (their
// headers in) but none ended when the tenth is refused at 10 in flight,
// nothing through at 10: no answer time yet, so the first guess is the
// sending rate. The first admitted answer that ends, after 0.5 s, tells
// what 9 in flight sustain, 18 a second, and the pace follows at once; a
// refused one's end tells no answer time. The guess is made once: an
// estimate cut since stays. A refusal that cut the guess before the answer
// time, or a rate measured meanwhile, is not overruled.
func TestLittlesLawWaitsForTheFirstAnswerTime(t *testing.T) {
	refusedStreams := func() (*Memory, []Ticket) {
		s := NewMemory(Config{Concurrency: 16, MaxConcurrency: 64})
		tks := admitN(t, s, 10, t0)
		for i := range tks[:9] {
			s.Learn(&tks[i], Report{Status: 200, Verdict: Accepted}, at(50*time.Millisecond))
		}
		s.Learn(&tks[9], Report{Status: 429, Verdict: RateRefused}, at(60*time.Millisecond))
		if !near(s.learn.estimate, 10) || s.learn.from != rateSending {
			t.Fatalf("first guess %v from %q, want the sending rate's 10", s.learn.estimate, s.learn.from)
		}
		return s, tks
	}
	s, tks := refusedStreams()
	s.Return(&tks[9], at(100*time.Millisecond))
	if !near(s.learn.estimate, 10) {
		t.Fatalf("estimate %v after a refused answer's end, want 10", s.learn.estimate)
	}
	s.Return(&tks[0], at(500*time.Millisecond))
	if !near(s.learn.estimate, 18) || !near(s.pace.requests.bucket.Rate, 18*cruiseShare) {
		t.Fatalf("estimate %v, pace %v after the first answer time; want 18 and %v",
			s.learn.estimate, s.pace.requests.bucket.Rate, 18*cruiseShare)
	}
	s.learn.estimate = 5
	s.Return(&tks[1], at(600*time.Millisecond))
	if !near(s.learn.estimate, 5) {
		t.Fatalf("estimate %v after a second answer time, want the 5 it was cut to", s.learn.estimate)
	}

	s, tks = refusedStreams() // refused again at the guess, cut, before the answer time
	s.learn.lastAccepted = at(50 * time.Millisecond)
	s.learn.admitted[9], s.learn.cut = 9, t0 // the level is reached, the cut long ago
	more := Ticket{Dispatched: at(70 * time.Millisecond), Level: 9, Seq: 11}
	s.Learn(&more, Report{Status: 429, Verdict: RateRefused}, at(80*time.Millisecond))
	if !near(s.learn.estimate, 10*unmeasuredCut) {
		t.Fatalf("estimate %v after a second refusal, want the guess cut to %v", s.learn.estimate, 10*unmeasuredCut)
	}
	s.Return(&tks[0], at(500*time.Millisecond))
	if !near(s.learn.estimate, 10*unmeasuredCut) {
		t.Fatalf("estimate %v after the answer time, want the cut guess %v: it was too fast already", s.learn.estimate, 10*unmeasuredCut)
	}

	s, tks = refusedStreams()
	s.learn.measured = true
	s.Return(&tks[0], at(500*time.Millisecond))
	if !near(s.learn.estimate, 10) {
		t.Fatalf("estimate %v over a measured one, want 10", s.learn.estimate)
	}
}

// TestOvershotIsARefusalAtTheLimitNothingWentThroughAt: a silent
// upstream refuses the request that took the pool to its concurrency
// limit of 4, nothing through at 4: Overshot. Not when the limit was
// above the level (8), nor at a level admitted at more than refused.
func TestOvershotIsARefusalAtTheLimitNothingWentThroughAt(t *testing.T) {
	refuseFourth := func(start, rounds int) bool {
		s := NewMemory(Config{Concurrency: start, MaxConcurrency: 64})
		now := t0
		for r := range rounds {
			tks := make([]Ticket, 4)
			for i := range tks { // spread as the slow start asks
				var ok bool
				if tks[i], _, ok = s.Admit(now.Add(time.Duration(i)*20*time.Millisecond), 1, true); !ok {
					t.Fatalf("round %d: dispatch %d not admitted", r, i)
				}
			}
			now = now.Add(80 * time.Millisecond)
			for i := range tks {
				if r == rounds-1 && i == 3 {
					s.Learn(&tks[3], Report{Status: 429, Verdict: RateRefused}, now.Add(60*time.Millisecond))
					return tks[3].Overshot
				}
				s.Learn(&tks[i], Report{Status: 200, Verdict: Accepted}, now.Add(50*time.Millisecond))
				s.Return(&tks[i], now.Add(100*time.Millisecond))
			}
			now = now.Add(time.Second)
		}
		return false
	}
	if !refuseFourth(4, 1) {
		t.Fatal("a refusal at the limit of 4, nothing through at 4, is not Overshot")
	}
	if refuseFourth(8, 1) {
		t.Fatal("a refusal at 4 under a limit of 8 is Overshot")
	}
	if refuseFourth(4, 3) {
		t.Fatal("a refusal at 4 after two admissions at 4 is Overshot")
	}
}

// TestHintSeedsWhenTooFewWereSent: with fewer than minSendingSample sent,
// a hint beats the sending rate even when it is faster.
func TestHintSeedsWhenTooFewWereSent(t *testing.T) {
	s := quietLocal()
	tk, _, _ := s.Admit(t0, 1, true)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 100 * time.Millisecond}, at(time.Millisecond))
	if s.learn.from != rateHint || !near(s.learn.estimate, 10) {
		t.Fatalf("seeded %v from %q, want 10 from the hint", s.learn.estimate, s.learn.from)
	}
}

// TestAHintEqualToTheRateLeavesItsSource: a hint that says exactly the
// learned rate does not claim it.
func TestAHintEqualToTheRateLeavesItsSource(t *testing.T) {
	s := quietLocal()
	s.learn.estimate, s.learn.measured, s.learn.from = 20, true, rateAdmitted
	s.pace.setFromRefusals(s.pacing(), t0)
	tk, _, _ := s.Admit(at(time.Second), 1, true)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 50 * time.Millisecond}, at(time.Second))
	if s.learn.from != rateAdmitted {
		t.Fatalf("source %q after a hint equal to the rate", s.learn.from)
	}
}

// TestToConcurrencySetsTheLimitAndTheRefusedLevel: a pool found bound at
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
		l.noteSent(10)
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

// TestLittleFloor: Little's law, rounded up; 0 when either is unknown.
func TestLittleFloor(t *testing.T) {
	for _, tt := range []struct {
		rate, secs float64
		want       int
	}{{16, 0.5, 8}, {16.1, 0.5, 9}, {0, 1, 0}, {1, 0, 0}, {-1, 1, 0}, {1, -1, 0}} {
		if got := littleFloor(tt.rate, tt.secs); got != tt.want {
			t.Errorf("littleFloor(%v, %v) = %d, want %d", tt.rate, tt.secs, got, tt.want)
		}
	}
}

// TestFloorFromAMeasuredRate: the concurrency a measured rate needs is
// taken at the cruise share of it.
func TestFloorFromAMeasuredRate(t *testing.T) {
	s := quietLocal()
	s.pace.setFromRefusals(10, t0)
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
	if s.learn.from != rateSending || s.learn.estimate <= 0 {
		t.Fatalf("seeded %v from %q, want the sending rate", s.learn.estimate, s.learn.from)
	}
}

// TestNamedConcurrencyWithoutALevelKeepsTheLimit: toConcurrency for a
// pool that named concurrency but showed no level changes no limit.
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
	if s.learn.from != rateSending || !near(s.learn.estimate, 8) {
		t.Fatalf("seeded %v from %q, want the 8/s sent (the limit let 8 go)", s.learn.estimate, s.learn.from)
	}
}

// TestPendingNeverGoesNegative: settling more than was sent at a level, or
// at a level never counted, changes nothing.
func TestPendingNeverGoesNegative(t *testing.T) {
	var l learner
	l.noteSent(3)
	l.settled(3)
	l.settled(3)
	l.settled(4) // beyond what was ever counted
	if l.pending[3] != 0 {
		t.Fatalf("pending %v after settling twice", l.pending[3])
	}
}

// admitN admits n dispatches at now, which must all go.
func admitN(t *testing.T, m *Memory, n int, now time.Time) []Ticket {
	t.Helper()
	ts := make([]Ticket, n)
	for i := range ts {
		tk, _, ok := m.Admit(now, 1, i == 0)
		if !ok {
			t.Fatalf("dispatch %d of %d not admitted", i+1, n)
		}
		ts[i] = tk
	}
	return ts
}

// silentOne is the state of a pool whose upstream sends no headers and
// admitted one request, still out, answered at t0.
func silentOne(t *testing.T) (*Memory, *Ticket) {
	t.Helper()
	m := NewMemory(Config{Concurrency: 64, MinConcurrency: 1, MaxConcurrency: 64})
	tk := admitN(t, m, 1, t0)[0]
	m.Learn(&tk, Report{Status: 200, Verdict: Accepted}, t0)
	return m, &tk
}

// topRefused is a silent upstream's state with 10 permits out, 9 of them
// admitted, whose counts show admissions again and again at 9 in flight
// and refusals at 10, a second on: the tenth dispatch's refusal is about
// to say concurrency.
func topRefused(t *testing.T) (*Memory, []Ticket, time.Time) {
	t.Helper()
	m := NewMemory(Config{Concurrency: 10, MinConcurrency: 1, MaxConcurrency: 10})
	ts := admitN(t, m, 10, t0)
	for i := range ts[:9] {
		m.Learn(&ts[i], Report{Status: 200, Verdict: Accepted}, t0)
	}
	for range minBelow {
		m.learn.answered(9, false)
	}
	for range 3 {
		m.learn.answered(10, true)
	}
	return m, ts, t0.Add(time.Second)
}

// TestConcurrencyBoundRefusalLowersTheLimitNotThePace: refusals that come
// only at the top level in flight lower the concurrency limit, show it as
// learned from refusals, take no pause, and leave the pace loose.
func TestConcurrencyBoundRefusalLowersTheLimitNotThePace(t *testing.T) {
	m, ts, now := topRefused(t)
	m.learn.answered(11, true)
	m.Learn(&ts[9], Report{Status: 429, Verdict: RateRefused, PauseUntil: now.Add(time.Second)}, now)
	v := m.View(now)
	if v.Bound != BoundConcurrency || v.ConcurrencyFrom != 10 || v.Concurrency != 9 {
		t.Fatalf("bound %v from %q limit %d; want concurrency 9 from refusals at 10 in flight", v.Bound, v.ConcurrencyFrom, v.Concurrency)
	}
	if !v.PausedUntil.IsZero() || !m.PausedUntil().IsZero() {
		t.Fatalf("a concurrency-bound refusal paused the pool until %v", m.PausedUntil())
	}
	if !near(m.pace.requests.bucket.Rate, m.learn.estimate*concurrencyLoose) {
		t.Fatalf("pace %v, want loose %v", m.pace.requests.bucket.Rate, m.learn.estimate*concurrencyLoose)
	}
}

// TestConcurrencyBoundRefusalStopsAtTheLevelBelow: a pool whose
// refusals start at 10 in flight, at a limit of 9 already, stays at 9.
func TestConcurrencyBoundRefusalStopsAtTheLevelBelow(t *testing.T) {
	m, ts, now := topRefused(t)
	for range 3 {
		m.learn.answered(10, true)
	}
	m.conc.limit = 9
	m.Learn(&ts[9], Report{Status: 429, Verdict: RateRefused}, now)
	if c := m.View(now).Concurrency; c != 9 {
		t.Fatalf("limit %d, want 9: the refusals start at 10", c)
	}
}

// TestShortHintCapsTheRate: a measured rate above one request per hint
// falls to it: the next request's wait is at most one request's refill.
func TestShortHintCapsTheRate(t *testing.T) {
	m, _ := silentOne(t)
	tk := admitN(t, m, 1, t0)[0]
	m.learn.estimate, m.learn.measured, m.learn.from = 30, true, rateAdmitted
	now := t0.Add(time.Second)
	m.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 50 * time.Millisecond}, now)
	if v := m.View(now); !near(v.AdmittedRate, 20) || v.RateFrom != rateHint {
		t.Fatalf("rate %v from %v after a 50ms hint, want 20 from the hint", v.AdmittedRate, v.RateFrom)
	}
}

// TestARefundedDispatchLeavesTheSpread (issue 49): the slow start's
// spread counts from the latest dispatch the upstream counted: a refunded
// one (refused for its credential) puts back the one before it.
func TestARefundedDispatchLeavesTheSpread(t *testing.T) {
	var s Memory
	s.conc = newConcLimit(Config{Concurrency: 4, MaxConcurrency: 64}.WithDefaults())
	s.learn.replySecs = 0.4
	gap := time.Duration(0.4 / (startSpread * 4) * float64(time.Second)) // 50ms
	first, _, _ := s.Admit(t0, 1, true)
	forged, _, ok := s.Admit(t0.Add(gap), 1, true)
	if !ok {
		t.Fatal("held past the spread")
	}
	s.Refund(&first) // not the latest: the spread stays the forged one's
	if _, _, ok := s.Admit(t0.Add(gap+time.Millisecond), 1, true); ok {
		t.Fatal("a refund of an earlier dispatch let one go within the latest's spread")
	}
	s.Refund(&forged)
	if _, _, ok := s.Admit(t0.Add(gap+time.Millisecond), 1, true); !ok {
		t.Fatal("the refunded dispatch's spread held the next")
	}
}
