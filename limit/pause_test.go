package limit

import (
	"slices"
	"testing"
	"time"
)

// TestPoolPause: every case of whether a pool takes the pause a report
// asks for, and for what reason.
func TestPoolPause(t *testing.T) {
	until := t0.Add(2 * time.Second)
	ask := func(v Verdict, hint time.Duration) Report {
		return Report{Status: 429, Verdict: v, Hint: hint, PauseUntil: until}
	}
	quietLive := pauseEvidence{quiet: true, live: true}
	for _, tt := range []struct {
		name   string
		r      Report
		e      pauseEvidence
		reason pauseReason // the zero reason: no pause
	}{
		{"no pause asked", Report{Status: 429, Verdict: RateRefused}, pauseEvidence{}, notPaused},
		{"no pause asked of an outage", Report{Status: 503, Verdict: Overloaded}, pauseEvidence{quiet: true}, notPaused},
		{"not sent", Report{Verdict: NotSent, PauseUntil: until}, pauseEvidence{}, pauseRetry},
		{"a rate refusal with headers", ask(RateRefused, 0), pauseEvidence{}, pauseRateLimited},
		{"a long hint with headers", ask(RateRefused, 30*time.Second), pauseEvidence{}, pauseRateLimited},
		{"an overload with headers", ask(Overloaded, 0), pauseEvidence{}, pauseOverloaded},
		{"a concurrency refusal asked to pause", ask(ConcurrencyRefused, 0), pauseEvidence{}, pauseRetry},
		{"a failure asked to pause", ask(Failed, 0), pauseEvidence{}, pauseRetry},
		{"a window's closure holds the pool", ask(RateRefused, 50*time.Millisecond), pauseEvidence{closed: true}, notPaused},
		{"a window's closure holds the pool, no pause asked", Report{Status: 429, Verdict: RateRefused}, pauseEvidence{closed: true}, notPaused},
		{"a quiet refusal of an upstream that admits nothing", ask(RateRefused, 0), pauseEvidence{quiet: true}, pauseRateLimited},
		{"a quiet overload of an upstream that admits nothing", ask(Overloaded, 5*time.Second), pauseEvidence{quiet: true}, pauseOverloaded},
		{"a quiet refusal while admitting, no hint: the pace holds", ask(RateRefused, 0), quietLive, notPaused},
		{"a quiet refusal while admitting, a hint that is a pace", ask(RateRefused, 50*time.Millisecond), quietLive, pauseRateLimited},
		{"a hint just under a second is a pace", ask(RateRefused, time.Second-time.Millisecond), quietLive, pauseRateLimited},
		{"a hint of a second is not a pace", ask(RateRefused, time.Second), quietLive, notPaused},
		{"a quiet overload while admitting, a short hint", ask(Overloaded, 100*time.Millisecond), quietLive, pauseOverloaded},
		{"bound by concurrency: the limit holds, whatever the hint", ask(RateRefused, 50*time.Millisecond),
			pauseEvidence{quiet: true, live: true, concurrencyBound: true}, notPaused},
		{"bound by concurrency while the upstream admits nothing", ask(RateRefused, 0),
			pauseEvidence{quiet: true, concurrencyBound: true}, pauseRateLimited},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := poolPause(tt.r, tt.e)
			want := pause{}
			if tt.reason != notPaused {
				want = pause{until: tt.r.PauseUntil, reason: tt.reason}
			}
			if p != want {
				t.Fatalf("poolPause = %+v, want %+v", p, want)
			}
		})
	}
}

// TestAConfirmedClosureIsAPauseToItsBoundary: a closure that knows the
// earliest its boundary can be pauses the pool to then, for the window,
// whatever pause the report asks (or none).
func TestAConfirmedClosureIsAPauseToItsBoundary(t *testing.T) {
	boundary := t0.Add(700 * time.Millisecond)
	e := pauseEvidence{closed: true, opens: boundary}
	for _, r := range []Report{{Status: 429, Verdict: RateRefused, PauseUntil: at(2 * time.Second)}, {Status: 429, Verdict: RateRefused}} {
		if p := poolPause(r, e); p != (pause{until: boundary, reason: pauseWindow}) {
			t.Errorf("asked %v: poolPause = %+v, want until the boundary %v for the window", r.PauseUntil, p, boundary)
		}
	}
}

// TestAStatedBoundaryRefusedAgainIsLengthened: where refusals count, a
// refusal's wait ends one request short, since the refused request is
// charged too: the window's closure the hints stated ends, the first
// request at its boundary is refused again with the same wait, and so on
// for ever. The closure is a pause to the earliest its boundary can be
// (the hints' grain before it), and one that paid nothing is lengthened:
// the next holds the pool for its wait and twice the last besides.
func TestAStatedBoundaryRefusedAgainIsLengthened(t *testing.T) {
	const wait, grain = 200 * time.Millisecond, time.Millisecond
	m := NewMemory(Config{Concurrency: 8})
	m.win.known, m.win.allowance = true, 100 // a window whose shape is known
	tk, _, _ := m.Admit(t0, 1, true)
	m.Learn(&tk, Report{Status: 200, Verdict: Accepted}, t0)
	m.Return(&tk, t0)
	refuse := func(now time.Time) time.Time {
		tk, next, ok := m.Admit(now, 1, true)
		if !ok {
			t.Fatalf("at %v: held until %v (%+v)", now.Sub(t0), next.Sub(t0), m.View(now))
		}
		m.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: wait, PauseUntil: now.Add(wait)}, now)
		m.Return(&tk, now)
		if m.paused.reason != pauseWindow {
			t.Fatalf("at %v: paused for %q, want the window", now.Sub(t0), m.paused.reason)
		}
		return m.paused.until
	}
	now := t0.Add(100 * time.Millisecond)
	if first := refuse(now); !first.Equal(now.Add(wait - grain)) {
		t.Fatalf("the first refusal pauses the pool %v, want to its stated boundary's earliest, %v", first.Sub(now), wait-grain)
	}
	boundary := m.View(now).PausedUntil // the window holds the pool to the boundary
	if !boundary.Equal(now.Add(wait)) {
		t.Fatalf("held until %v, want the stated boundary %v", boundary.Sub(now), wait)
	}
	second := refuse(boundary)
	if want := boundary.Add(wait - grain + 2*(wait-grain)); !second.Equal(want) {
		t.Fatalf("refused at the boundary it named: paused %v, want %v", second.Sub(boundary), want.Sub(boundary))
	}
}

// TestLearnTakesOnlyALongerPause: Memory.Learn takes the pause poolPause
// decides on when it ends later than the one under way, with its reason.
func TestLearnTakesOnlyALongerPause(t *testing.T) {
	m := NewMemory(Config{})
	var tk [3]Ticket
	for i := range tk {
		tk[i], _, _ = m.Admit(t0, 1, true)
	}
	m.Learn(&tk[0], Report{Status: 503, Verdict: Overloaded, PauseUntil: at(2 * time.Second)}, t0)
	m.Learn(&tk[1], Report{Verdict: NotSent, PauseUntil: at(time.Second)}, t0)
	if v := m.View(t0); !v.PausedUntil.Equal(at(2*time.Second)) || v.PauseReason != pauseOverloaded {
		t.Fatalf("paused until %v for %q, want the longer overload's, %v", v.PausedUntil, v.PauseReason, at(2*time.Second))
	}
	m.Learn(&tk[2], Report{Verdict: NotSent, PauseUntil: at(3 * time.Second)}, t0)
	if v := m.View(t0); !v.PausedUntil.Equal(at(3*time.Second)) || v.PauseReason != pauseRetry {
		t.Fatalf("paused until %v for %q, want %v for \"retry\"", v.PausedUntil, v.PauseReason, at(3*time.Second))
	}
}

// TestAPauseThatPaidNothingIsLengthened: an upstream that charges refused
// requests names a wait that ends one request short; the lone request sent
// at its end is refused with the same wait. That pause paid nothing, so the
// next is its wait and twice the last pause besides; an admission ends the
// lengthening.
func TestAPauseThatPaidNothingIsLengthened(t *testing.T) {
	const wait = 300 * time.Millisecond
	m := NewMemory(Config{})
	refuse := func(now time.Time) time.Time {
		tk, at, ok := m.Admit(now, 1, true)
		if !ok {
			t.Fatalf("at %v: no admission after the pause (next at %v; %+v)", now.Sub(t0), at.Sub(t0), m.View(now))
		}
		m.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: wait, PauseUntil: now.Add(wait)}, now)
		m.Return(&tk, now)
		return m.View(now).PausedUntil
	}
	first := refuse(t0)
	if !first.Equal(t0.Add(wait)) {
		t.Fatalf("the first refusal pauses until %v, want its wait, %v", first.Sub(t0), wait)
	}
	// The lone request goes once the hint's pace allows, just after.
	resent := first.Add(20 * time.Millisecond)
	second := refuse(resent)
	if want := resent.Add(wait + 2*wait); !second.Equal(want) {
		t.Errorf("after a pause that paid nothing: paused %v, want %v", second.Sub(resent), want.Sub(resent))
	}
	// An admission: the next refusal's pause is its wait again.
	tk, _, _ := m.Admit(second, 1, true)
	m.Learn(&tk, Report{Status: 200, Verdict: Accepted}, second)
	m.Return(&tk, second)
	later := second.Add(400 * time.Millisecond)
	if third := refuse(later); !third.Equal(later.Add(wait)) {
		t.Errorf("after an admission: paused %v, want the wait, %v", third.Sub(later), wait)
	}
}

// TestAPauseThatPaidNothingIsLengthenedFromHalfItsWait: the lengthening
// holds for a new wait of half the last pause, and not under it (a short
// wait after a long pause is a pace).
func TestAPauseThatPaidNothingIsLengthenedFromHalfItsWait(t *testing.T) {
	const wait = 300 * time.Millisecond
	for _, c := range []struct {
		next time.Duration
		want time.Duration
	}{{wait / 2, wait/2 + 2*wait}, {wait/2 - time.Millisecond, wait/2 - time.Millisecond}} {
		m := NewMemory(Config{})
		refuse := func(now time.Time, hint time.Duration) time.Time {
			tk, _, _ := m.Admit(now, 1, true)
			m.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: hint, PauseUntil: now.Add(hint)}, now)
			m.Return(&tk, now)
			return m.View(now).PausedUntil
		}
		resent := refuse(t0, wait).Add(20 * time.Millisecond)
		if got := refuse(resent, c.next).Sub(resent); got != c.want {
			t.Errorf("a wait of %v after a pause of %v that paid nothing: paused %v, want %v", c.next, wait, got, c.want)
		}
	}
}

// TestAPauseAfterOneThatPaidNothingEndsWithOneRequest: when a pause
// follows one that paid nothing (see lengthen), one request goes at its
// end and the queue behind it waits for its answer: a wait is the
// upstream's word, not a guarantee, and a queue sent whole at its end into
// a limit still spent (one that counts refusals) only deepens the debt.
// Once that request is admitted the rest go.
func TestAPauseAfterOneThatPaidNothingEndsWithOneRequest(t *testing.T) {
	const wait = 300 * time.Millisecond
	m := NewMemory(Config{Concurrency: 8})
	now := t0
	for range 2 { // the second pause is lengthened: the first paid nothing
		tk, _, ok := m.Admit(now, 1, true)
		if !ok {
			t.Fatalf("at %v: no admission after the pause", now.Sub(t0))
		}
		m.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: wait, PauseUntil: now.Add(wait)}, now)
		m.Return(&tk, now)
		now = m.View(now).PausedUntil.Add(20 * time.Millisecond)
	}
	end := now
	trial, _, ok := m.Admit(end, 1, true)
	if !ok {
		t.Fatalf("no request goes when the pause ends (%+v)", m.View(end))
	}
	answered := end.Add(time.Second) // the pace holds nothing back by then
	if _, next, ok := m.Admit(answered, 1, false); ok || !next.IsZero() {
		t.Fatalf("a second request before the first's answer: ok %v, next %v; want it to wait for that answer", ok, next)
	}
	m.Learn(&trial, Report{Status: 200, Verdict: Accepted}, answered)
	if _, next, ok := m.Admit(answered, 1, false); !ok && next.IsZero() {
		t.Fatalf("after the first was admitted the next still waits for an answer")
	}
}

// TestASuspectedClosureIsNoPause: a long wait after a burst suspects a
// window's closure, whose test goes a moment later, long before the
// boundary the wait names: the pool takes no pause that would hold it.
func TestASuspectedClosureIsNoPause(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8})
	tk, _, _ := m.Admit(t0, 1, true)
	m.Learn(&tk, Report{Status: 200, Verdict: Accepted}, t0)
	m.Return(&tk, t0)
	now := t0.Add(100 * time.Millisecond)
	tk, _, _ = m.Admit(now, 1, true)
	m.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 5 * time.Second, PauseUntil: now.Add(5 * time.Second)}, now)
	m.Return(&tk, now)
	if !m.win.closed || m.win.confirmed {
		t.Fatalf("closed %v confirmed %v, want a suspected closure", m.win.closed, m.win.confirmed)
	}
	test := m.win.knockAt
	if _, next, ok := m.Admit(test, 1, true); !ok {
		t.Fatalf("the closure's test at %v held until %v (paused until %v)", test.Sub(now), next.Sub(now), m.paused.until.Sub(now))
	}
}

// TestAPauseWithNoWaitThatPaidNothingKeepsLengthening: a refusal with no
// wait (a silent upstream; the pause is the proxy's own backoff) names no
// pace, so a pause after one that paid nothing is lengthened however short
// its backoff is beside the last pause: twice the last pause more, at most
// maxKnock more. Knocks into an upstream that counts refusals thin out
// until its refill pays back more than they cost.
func TestAPauseWithNoWaitThatPaidNothingKeepsLengthening(t *testing.T) {
	const backoff = time.Second
	m := NewMemory(Config{})
	now := t0
	var got []time.Duration
	for range 6 {
		tk, at, ok := m.Admit(now, 1, true)
		if !ok {
			t.Fatalf("at %v: no admission after the pause (next at %v)", now.Sub(t0), at.Sub(t0))
		}
		m.Learn(&tk, Report{Status: 429, Verdict: RateRefused, PauseUntil: now.Add(backoff)}, now)
		m.Return(&tk, now)
		until := m.View(now).PausedUntil
		got = append(got, until.Sub(now))
		now = until.Add(20 * time.Millisecond)
	}
	s := time.Second
	if want := []time.Duration{s, 3 * s, 7 * s, 15 * s, 31 * s, 31 * s}; !slices.Equal(got, want) {
		t.Errorf("pauses %v, want %v", got, want)
	}
}
