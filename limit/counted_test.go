package limit

import (
	"testing"
	"time"
)

// Upstreams that count refused requests against the limit (Azure, Kong's
// sliding window) punish every request sent past it: the bucket goes into
// debt, and whatever is sent before the debt is paid is refused and
// deepens it. These tests hold the rules that keep the learner from
// overdrawing such an upstream while it learns, and from reading its debt
// as its rate.

// TestEveryRefusalOfAnOvershootIsOwed: the answers to requests sent before
// the pace changed (an overshoot's requests still in flight when the first
// refusal came) each leave the pace one request further behind, as an
// upstream that counts refusals is owed each of them. A refusal of a
// request sent at the pace only empties the pace's bucket.
func TestEveryRefusalOfAnOvershootIsOwed(t *testing.T) {
	s := quietLocal()
	s.learn.lastAccepted = at(10 * time.Millisecond)
	first := at(250 * time.Millisecond)
	for i, d := range []time.Duration{20, 30, 40} {
		tk := Ticket{Seq: uint64(i + 2), Dispatched: at(d * time.Millisecond), Level: i + 1}
		s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, first)
		if got, want := s.pace.requests.bucket.Level(), -float64(i+1); !near(got, want) {
			t.Fatalf("after %d refusals of requests sent before the first came back, the pace holds %v, want %v",
				i+1, got, want)
		}
	}
	if !s.learn.cut.Equal(first) {
		t.Fatalf("setup: the estimate last changed at %v, want at the first refusal", s.learn.cut)
	}
	// Later, with the pace refilled: a request sent at it and refused
	// empties it, and owes nothing more.
	later := first.Add(2 * time.Second)
	s.pace.requests.advance(later)
	s.pace.requests.bucket.Set(s.pace.requests.bucket.At(), 3)
	s.learn.estimate, s.learn.measured = 20, true                                  // no cut from this refusal
	tk := Ticket{Seq: 5, Dispatched: later.Add(-100 * time.Millisecond), Level: 2} // nothing admitted since: no sample
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, later)
	if s.learn.cut.Equal(later) {
		t.Fatal("setup: the refusal of a request sent at the pace changed the estimate")
	}
	if got := s.pace.requests.bucket.Level(); got != 0 {
		t.Fatalf("a refusal of a request sent at the pace left the pace at %v, want 0", got)
	}
}

// TestAnOvershootsEchoesDoNotCutAGuess: the refusals of an overshoot's
// requests still in flight when the first refusal came, close together,
// show almost nothing got through between them: against an upstream that
// counts refusals that is its debt, not its rate. They do not cut the guess
// the first refusal made; a request sent after it and refused as soon
// does.
func TestAnOvershootsEchoesDoNotCutAGuess(t *testing.T) {
	span := 300 * time.Millisecond
	setup := func() *Memory {
		s := quietLocal()
		s.learn.estimate, s.learn.from = 40, rateSending
		first := Ticket{Seq: 1, Dispatched: t0, Level: 1}
		s.Learn(&first, Report{Status: 429, Verdict: RateRefused}, at(time.Millisecond))
		s.learn.cut = at(time.Millisecond) // the first refusal set the guess
		return s
	}
	after := setup()
	tk := Ticket{Seq: 3, Dispatched: at(span), Level: 1}
	after.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, at(span+time.Millisecond))
	if short := after.learn.short; short == 0 || short*shortCut >= 40 || !near(after.learn.estimate, short) {
		t.Fatalf("a refusal of a request sent after the guess left it at %v, want the short rate %v", after.learn.estimate, short)
	}

	before := setup()
	before.learn.cut = at(span + time.Millisecond/2) // the guess came after it went
	tk = Ticket{Seq: 3, Dispatched: at(span), Level: 1}
	before.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, at(span+time.Millisecond))
	if got := before.learn.estimate; !near(got, 40) {
		t.Fatalf("a refusal of a request sent before the guess cut it to %v, want it left at 40", got)
	}
}

// TestAGuessIsCutAgainOnlyAfterSomethingWasAdmittedAtIt: refused again at
// a guessed pace, the guess falls by unmeasuredCut; but not while nothing
// was admitted since the last cut (an upstream in debt refuses everything
// until it is paid, whatever the pace).
func TestAGuessIsCutAgainOnlyAfterSomethingWasAdmittedAtIt(t *testing.T) {
	for _, admitted := range []bool{false, true} {
		s := quietLocal()
		s.learn.estimate, s.learn.from = 20, rateSending
		s.learn.cut = at(time.Second)
		s.learn.lastAccepted = at(900 * time.Millisecond)
		// Reached: level 1 admitted often, so the refusal is not of a
		// number in flight.
		for range minBelow {
			s.learn.answered(1, false)
		}
		if admitted {
			s.learn.lastAccepted = at(1500 * time.Millisecond)
		}
		tk := Ticket{Seq: 50, Dispatched: at(1600 * time.Millisecond), Level: 1}
		s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, at(1700*time.Millisecond))
		want := 20.0
		if admitted {
			want = 20 * unmeasuredCut
		}
		if got := s.learn.estimate; !near(got, want) {
			t.Errorf("admitted since the cut %v: the guess became %v, want %v", admitted, got, want)
		}
	}
}

// TestARefusedProbeTakesBackARaisePastItsPace: clean probes in a row raise
// a guess by more each time, past the pace the latest probe ran at. When
// the probe above such a raise is refused, the estimate goes back to what
// it was before the raise at once. A raise no larger than the probe's own
// gain is left to the refusals' measurement.
func TestARefusedProbeTakesBackARaisePastItsPace(t *testing.T) {
	for _, tt := range []struct {
		name        string
		from, raise float64
		want        float64
	}{
		{"raised past the probe's pace", 20, 2, 20},
		{"raised by the probe's gain", 20, probeGain, 20 * probeGain},
	} {
		s := quietLocal()
		s.learn.estimate, s.learn.from = tt.from*tt.raise, rateProbe
		s.learn.raisedFrom = tt.from
		s.learn.phase = probeUp
		s.pace.setFromRefusals(s.pacing(), t0)
		tk := Ticket{Seq: 9, Dispatched: t0, Level: 1, Probe: true}
		s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, at(100*time.Millisecond))
		if got := s.learn.estimate; !near(got, tt.want) {
			t.Errorf("%s: a refused probe left the estimate at %v, want %v", tt.name, got, tt.want)
		}
		// A raise is taken back once: the next refused probe finds none.
		again := Ticket{Seq: 10, Dispatched: at(150 * time.Millisecond), Level: 1, Probe: true}
		s.Learn(&again, Report{Status: 429, Verdict: RateRefused}, at(200*time.Millisecond))
		if got := s.learn.estimate; !near(got, tt.want) {
			t.Errorf("%s: a second refused probe moved the estimate to %v, want it left at %v", tt.name, got, tt.want)
		}
	}
}

// TestACleanProbeRemembersWhatItRaisedFrom: the raise of a clean probe
// keeps the estimate it raised, for a refused probe to go back to.
func TestACleanProbeRemembersWhatItRaisedFrom(t *testing.T) {
	l := learner{estimate: 10, from: rateSending}
	now := t0
	l.step(now, true) // up
	now = l.phaseUntil
	l.step(now, true) // down
	now = l.phaseUntil
	l.step(now, true) // clean: raise
	if l.raisedFrom != 10 || !near(l.estimate, 10*guessRaise) {
		t.Fatalf("a clean probe raised 10 to %v and remembered %v, want %v and 10", l.estimate, l.raisedFrom, 10*guessRaise)
	}
}

// TestARateIsNotMeasuredAcrossAPause: refusals while nothing has been
// admitted lately pause the pool; the next refusal, sent after the pause,
// measures nothing over the stretch the pool sent nothing in, where the
// same two refusals without the pause between them measure the rate.
func TestARateIsNotMeasuredAcrossAPause(t *testing.T) {
	for _, paused := range []bool{false, true} {
		var l learner
		l.refused(1, t0, 0)
		if paused {
			l.heldUntil = at(400 * time.Millisecond)
		}
		// 20 dispatched in the 600 ms after the first refusal, one refused.
		got := l.refused(22, at(600*time.Millisecond), 0)
		if paused && got != 0 {
			t.Errorf("measured %v/s over a span the pool was paused for", got)
		}
		if !paused && !near(got, (20-1)/0.6) {
			t.Errorf("measured %v/s without a pause, want %v", got, (20-1)/0.6)
		}
	}
	// The pause comes from a refusal of an upstream that admitted nothing
	// lately.
	s := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	tk := Ticket{Seq: 1, Dispatched: t0, Level: 1}
	until := at(time.Second)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, PauseUntil: until}, at(time.Millisecond))
	if !s.learn.heldUntil.Equal(until) {
		t.Fatalf("a refusal while down held the pool until %v, and measurements from %v", until, s.learn.heldUntil)
	}
}

// TestARefusalThatLowersTheRateEndsARowOfCleanProbes: after clean probes
// in a row the next raise is larger each time; a refusal that lowers the
// rate ends the row, so the next clean probe raises by the first step
// again, not by the row's.
func TestARefusalThatLowersTheRateEndsARowOfCleanProbes(t *testing.T) {
	s := quietLocal()
	s.learn.estimate, s.learn.from, s.learn.measured, s.learn.streak = 30, rateAdmitted, true, 3
	s.learn.refused(1, t0, 0)
	// 20 dispatched over a second after the first refusal, one refused: a
	// measurement under the estimate.
	tk := Ticket{Seq: 22, Dispatched: at(time.Second), Level: 1}
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, at(time.Second+time.Millisecond))
	if s.learn.estimate >= 30 {
		t.Fatalf("setup: the refusal left the estimate at %v", s.learn.estimate)
	}
	if s.learn.streak != 0 {
		t.Fatalf("a refusal that lowered the rate left a row of %d clean probes", s.learn.streak)
	}
	// One that lowers nothing (a probe's, under a measured estimate) keeps it.
	s.learn.streak = 2
	probe := Ticket{Seq: 23, Dispatched: at(1100 * time.Millisecond), Level: 1, Probe: true}
	before := s.learn.estimate
	s.Learn(&probe, Report{Status: 429, Verdict: RateRefused}, at(1200*time.Millisecond))
	if s.learn.estimate != before || s.learn.streak != 2 {
		t.Fatalf("a refusal that lowered nothing (%v to %v) changed the row to %d", before, s.learn.estimate, s.learn.streak)
	}
}

// TestAWaitThatEndsLaterThanTheFirstIsAPause: refusals of a live upstream
// with no headers name whole-second waits, which the learned pace holds
// better than a pause would. But one that counts refusals charges each:
// a refusal names a wait that ends later than the first one named since
// an admission, by more than its grain, and whoever goes when that first
// wait ends is refused again. The pool takes that wait as a whole, with
// one request at its end; refusals that name the same end (a window's
// boundary) take no pause.
func TestAWaitThatEndsLaterThanTheFirstIsAPause(t *testing.T) {
	for _, c := range []struct {
		name   string
		second time.Duration // the second refusal's wait, half a second after the first
		paused bool
	}{{"an end within its grain", 2 * time.Second, false}, {"an end a grain later", 3 * time.Second, true}} {
		t.Run(c.name, func(t *testing.T) {
			s := quietLocal()
			now := t0
			for i, hint := range []time.Duration{2 * time.Second, c.second} {
				tk := Ticket{Seq: uint64(i + 1), Dispatched: now, Level: 1}
				s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: hint, PauseUntil: now.Add(hint)}, now)
				if i == 0 {
					now = now.Add(500 * time.Millisecond)
				}
			}
			got := s.View(now).PausedUntil
			if c.paused && (!got.Equal(now.Add(c.second)) || !s.paused.trial) {
				t.Fatalf("paused until %v (zero: none; one request at its end: %v), want for %v with one request at its end",
					got, s.paused.trial, c.second)
			}
			if !c.paused && !got.IsZero() {
				t.Fatalf("paused for %v, want no pause: the pace holds the pool", got.Sub(now))
			}
		})
	}
}

// TestOnlyNamedWaitsWithNothingElseOutShowACharge: the first wait that
// counts is the first one named (a refusal naming none names no end), and
// the pool takes a later one as a charged debt only when all it has out
// was refused: one still out may yet be admitted, and pay.
func TestOnlyNamedWaitsWithNothingElseOutShowACharge(t *testing.T) {
	for _, c := range []struct {
		name   string
		hints  []time.Duration // the refusals' waits, half a second apart
		out    int             // requests dispatched, each refused in turn
		paused bool
	}{
		{"every request out refused", []time.Duration{2 * time.Second, 3 * time.Second}, 2, true},
		{"one still out", []time.Duration{2 * time.Second, 3 * time.Second}, 3, false},
		{"the first refusal names no wait", []time.Duration{0, 3 * time.Second}, 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := quietLocal()
			now := t0
			var tickets []Ticket
			for range c.out {
				tk, _, ok := s.Admit(now, 1, false)
				if !ok {
					t.Fatalf("dispatch %d refused", len(tickets)+1)
				}
				tickets = append(tickets, tk)
			}
			for i, hint := range c.hints {
				r := Report{Status: 429, Verdict: RateRefused, Hint: hint}
				if hint > 0 {
					r.PauseUntil = now.Add(hint)
				}
				s.Learn(&tickets[i], r, now)
				now = now.Add(500 * time.Millisecond)
			}
			now = now.Add(-500 * time.Millisecond)
			got := s.View(now).PausedUntil
			if c.paused != s.paused.trial || c.paused && !got.Equal(now.Add(c.hints[1])) {
				t.Fatalf("paused until %v (one request at its end: %v), want a pause with one request at its end: %v",
					got, s.paused.trial, c.paused)
			}
		})
	}
}
