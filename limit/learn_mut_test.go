package limit

import (
	"testing"
	"time"
)

// TestRefusalsExactlyMinShortSpanApartShowWhatGotThrough: two refusals
// minShortSpan apart, too close to measure a rate, already show what got
// through between them, counted one more: dispatches 2 to 4 admitted over
// the span are (3+1) per minShortSpan. A hair closer, they show nothing.
// The short rate is what cuts a guess far above it at once.
func TestRefusalsExactlyMinShortSpanApartShowWhatGotThrough(t *testing.T) {
	var l learner
	l.refused(1, t0, 0)
	if r := l.refused(5, at(minShortSpan), 0); r != 0 {
		t.Fatalf("measured %v/s over %v, too short to measure", r, minShortSpan)
	}
	if want := (3 + 1) / minShortSpan.Seconds(); !near(l.short, want) {
		t.Fatalf("short rate %v over exactly %v, want %v", l.short, minShortSpan, want)
	}
	var closer learner
	closer.refused(1, t0, 0)
	closer.refused(5, at(minShortSpan-time.Millisecond), 0)
	if closer.short != 0 {
		t.Fatalf("short rate %v from refusals under %v apart, want none", closer.short, minShortSpan)
	}
}

// TestOneAdmissionBetweenCloseRefusalsShowsAShortRate: a single dispatch
// admitted between two refusals that are too close to measure is enough to
// show what got through (counted generously, as two); with none admitted
// between them they show nothing.
func TestOneAdmissionBetweenCloseRefusalsShowsAShortRate(t *testing.T) {
	span := 300 * time.Millisecond
	var one learner
	one.refused(1, t0, 0)
	one.refused(3, at(span), 0) // dispatch 2 admitted
	if want := (1 + 1) / span.Seconds(); !near(one.short, want) {
		t.Fatalf("short rate %v with one admitted over %v, want %v", one.short, span, want)
	}
	var none learner
	none.refused(1, t0, 0)
	none.refused(2, at(span), 0) // nothing between them
	if none.short != 0 {
		t.Fatalf("short rate %v with nothing admitted between the refusals, want none", none.short)
	}
}

// TestBareRefusalsOverASecondCloseASilentWindow: refusals that name no
// wait, minRun of them over minClosure with nothing admitted between, are
// a fixed window's silent closure: the pool waits for it as a whole. A
// report without a hint has no hint to read as a pace.
func TestBareRefusalsOverASecondCloseASilentWindow(t *testing.T) {
	s := quietLocal()
	a, _, ok := s.Admit(t0, 1, true)
	if !ok {
		t.Fatal("the first dispatch was held")
	}
	s.Learn(&a, Report{Status: 200, Verdict: Accepted}, at(10*time.Millisecond))
	var now time.Time
	for i := range minRun {
		d := at(100*time.Millisecond + time.Duration(i)*minClosure/(minRun-1))
		tk := Ticket{Seq: s.learn.dispatched(), Dispatched: d, Level: 1}
		now = d.Add(time.Millisecond)
		s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, now)
	}
	if v := s.View(now).Window; v == nil || !v.Closed {
		t.Fatalf("window %+v after %d bare refusals over %v, want a closure", v, minRun, minClosure)
	}
}

// TestAHintEqualToTheSendingRateDoesNotClaimTheSeed: with enough sent
// (minSendingSample), the first refusal seeds the rate from what the pool
// was sending; a hint that says exactly that rate leaves it the source.
func TestAHintEqualToTheSendingRateDoesNotClaimTheSeed(t *testing.T) {
	s := quietLocal()
	var tk Ticket
	for i := range minSendingSample {
		var ok bool
		if tk, _, ok = s.Admit(t0, 1, true); !ok {
			t.Fatalf("dispatch %d was held", i+1)
		}
	}
	now := at(time.Millisecond)
	rate := s.pace.recent.rate(now)
	hint := time.Duration(float64(time.Second) / rate)
	if hintPace(hint) != rate {
		t.Fatalf("setup: hint %v paces %v, not the sending rate %v", hint, hintPace(hint), rate)
	}
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: hint}, now)
	if s.learn.from != rateSending || !near(s.learn.estimate, rate) {
		t.Fatalf("seeded %v from %q, want the sending rate %v", s.learn.estimate, s.learn.from, rate)
	}
}

// TestAGuessIsCutToTheShortRateOnlyWhenFarAboveIt: two refusals 250 ms
// apart with three admitted between show about 16 a second got through. A
// guessed rate more than shortCut times that is cut to it at once; one at
// most shortCut times above it is left to the measurement (what gets
// through right after a refusal may be less than the refill).
func TestAGuessIsCutToTheShortRateOnlyWhenFarAboveIt(t *testing.T) {
	span := 250 * time.Millisecond
	short := (3 + 1) / span.Seconds()
	for _, tt := range []struct {
		name  string
		guess float64
		want  float64
	}{
		{"far above: cut to it", 2 * shortCut * short, short},
		{"exactly shortCut times above: left", shortCut * short, shortCut * short},
		{"a little above: left", 1.5 * short, 1.5 * short},
	} {
		s := quietLocal()
		s.learn.estimate, s.learn.from = tt.guess, rateSending
		first := Ticket{Seq: 1, Dispatched: t0, Level: 1}
		s.Learn(&first, Report{Status: 429, Verdict: RateRefused}, at(time.Millisecond))
		if s.learn.estimate != tt.guess {
			t.Fatalf("%s: setup: the first refusal moved the guess to %v", tt.name, s.learn.estimate)
		}
		second := Ticket{Seq: 5, Dispatched: at(span), Level: 1} // 2 to 4 admitted
		now := at(span + time.Millisecond)
		s.Learn(&second, Report{Status: 429, Verdict: RateRefused}, now)
		if !near(s.learn.short, short) {
			t.Fatalf("%s: setup: short rate %v, want %v", tt.name, s.learn.short, short)
		}
		if v := s.View(now); !near(v.AdmittedRate, tt.want) {
			t.Errorf("%s: guess %v became %v, want %v", tt.name, tt.guess, v.AdmittedRate, tt.want)
		}
	}
}

// TestAPastResetOfAFullWindowIsNotEarly: a window that shows all of its
// size left is full, so a reset already past says nothing about the
// upstream's clock: a later reset stated a second after its dispatch is
// believed, and the missing five refill over that second.
func TestAPastResetOfAFullWindowIsNotEarly(t *testing.T) {
	var b budget
	b.observe(win(10, 10, at(-time.Second)), 0, t0, t0)
	b.observe(win(10, 5, at(2*time.Second)), 0, at(time.Second), at(time.Second))
	if b.early != 0 || !near(b.bucket.Rate, 5) {
		t.Fatalf("early %v, rate %v; want no early reset and 5/s", b.early, b.bucket.Rate)
	}
}

// TestAResetAheadOfItsDispatchWithinItsGrainIsNotEarly: a reset in whole
// seconds that lies half a second after its dispatch is on time (its
// grain allows it to be up to a second late, not early): a later reset
// 200 ms after its dispatch is believed, not read as late as a grain.
func TestAResetAheadOfItsDispatchWithinItsGrainIsNotEarly(t *testing.T) {
	var b budget
	w := win(10, 5, at(500*time.Millisecond))
	w.ResetGrain = time.Second
	b.observe(w, 0, t0, t0)
	d := at(time.Second)
	b.observe(win(10, 5, d.Add(200*time.Millisecond)), 0, d, d)
	if b.early != 0 || !near(b.bucket.Rate, 5/0.2) {
		t.Fatalf("early %v, rate %v; want no early reset and %v/s", b.early, b.bucket.Rate, 5/0.2)
	}
}
