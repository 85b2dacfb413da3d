package limit

import (
	"testing"
	"time"
)

// TestAFreshGroupHasNotLoweredItsConcurrency: the view says the
// concurrency limit was lowered only once refusals lowered it (a shared
// store publishes only such limits); a fresh pool's was not.
func TestAFreshGroupHasNotLoweredItsConcurrency(t *testing.T) {
	l := NewMemory(Config{Concurrency: 8, MinConcurrency: 1, MaxConcurrency: 8})
	now := time.Unix(1_000_000, 0)
	if l.View(now).ConcurrencyLowered {
		t.Fatal("a fresh pool says its concurrency was lowered")
	}
	tk, _, ok := l.Admit(now, 1, false)
	if !ok {
		t.Fatal("admit")
	}
	l.Learn(&tk, Report{Status: 429, Verdict: ConcurrencyRefused}, now)
	if !l.View(now).ConcurrencyLowered {
		t.Fatal("a named concurrency refusal did not count as lowering")
	}
}

// TestFleetDispatchesCountOnceEach: the dispatches of other replicas
// between two of this one's count toward the pool's sending rate once;
// a count that did not move counts this dispatch alone.
func TestFleetDispatchesCountOnceEach(t *testing.T) {
	l := NewMemory(Config{})
	now := time.Unix(1_000_000, 0)
	l.Fleet().Dispatched(now, 0, 5, 0) // the first count only sets the mark
	l.Fleet().Dispatched(now, 0, 9, 0) // four dispatches, all replicas
	l.Fleet().Dispatched(now, 0, 9, 0) // the count had not moved: this one
	if n, _ := l.pace.recent.recent(now); n != 6 {
		t.Fatalf("the sending meter counts %d dispatches, want 1 + 4 + 1", n)
	}
}

// TestAReplicasFirstDispatchCountsTheGroupsLastSecond: a replica that
// starts sending after the others counts the pool's dispatches of the
// last second at its first, so that the sending rate it guesses from at
// its first refusal is the pool's, not the few of its own.
func TestAReplicasFirstDispatchCountsTheGroupsLastSecond(t *testing.T) {
	l := NewMemory(Config{})
	now := time.Unix(1_000_000, 0)
	l.Fleet().Dispatched(now, 0, 40, 18) // 18 in the last second, this one included
	l.Fleet().Dispatched(now, 0, 43, 20) // three more since: counted from the running total
	if n, _ := l.pace.recent.recent(now); n != 21 {
		t.Fatalf("the sending meter counts %d dispatches, want 18 + 3", n)
	}
}

// TestAPaceLearnedElsewhereIsProbedUp: a pool whose admissions a store
// kept elsewhere makes (the Redis path: Fleet.Dispatched, never Admit) still
// runs its probe cycle, so a pace learned too low from refusals rises
// while it is what holds requests back, and stays put while it is not.
//
// A probe made while another replica holds the raise lease (Fleet.Raiser
// false, above the fleet's pace) reached no upstream: it does not raise.
// What counts is the word during the up phase, not after it.
func TestAPaceLearnedElsewhereIsProbedUp(t *testing.T) {
	for _, c := range []struct {
		name   string
		held   bool
		raiser bool // during the up phase
		after  bool // in the other phases
		rise   bool
		probes bool
	}{
		{"held by the pace", true, true, true, true, true},
		{"not held", false, true, true, false, false},
		{"held, another replica raises", true, false, false, false, true},
		{"held, raiser in the up phase only", true, true, false, true, true},
		{"held, raiser after the up phase only", true, false, true, false, true},
	} {
		l := NewMemory(Config{Concurrency: 64, MaxConcurrency: 64})
		now := time.Unix(1_000_000, 0)
		l.learn.estimate, l.learn.from, l.learn.measured = 5, rateAdmitted, true
		l.pace.setFromRefusals(l.pacing(), now)
		start := l.View(now).Requests.PerSecond
		sawProbe := false
		for i := range 600 { // a minute, a dispatch each 100 ms, none refused
			now = now.Add(100 * time.Millisecond)
			if c.held {
				l.Fleet().Held(now)
			}
			sawProbe = sawProbe || l.Fleet().Dispatched(now, 0, uint64(i+1), 0).Probe
			if l.learn.phase == probeUp {
				l.Fleet().Raiser(c.raiser)
			} else {
				l.Fleet().Raiser(c.after)
			}
		}
		got := l.View(now).Requests.PerSecond
		if rose := got > start*1.2; rose != c.rise {
			t.Errorf("%s: the pace went from %.2f/s to %.2f/s over a minute of clean dispatches, want a rise: %v", c.name, start, got, c.rise)
		}
		if sawProbe != c.probes {
			t.Errorf("%s: a dispatch went as a probe: %v, want %v", c.name, sawProbe, c.probes)
		}
	}
}

// TestAReplicaFirstRefusedStartsFromTheFleetsPace: at its first refusal a
// replica starts from the pace the other replicas learned from refusals
// when that is lower than what the pool was sending, rather than cutting
// its way down with refusals of its own, and below it (by unmeasuredCut)
// when the refused request was sent at that pace, as one process slows
// when refused again at a pace not yet measured; a higher one, or none,
// leaves the sending rate.
func TestAReplicaFirstRefusedStartsFromTheFleetsPace(t *testing.T) {
	for _, c := range []struct {
		name      string
		fleetPace float64
		paced     bool // the refused request went at the fleet's pace
		seenAfter bool // ... but this replica saw that pace only after it went
		want      float64
		from      rateFrom
	}{
		{"lower than the sending rate", 7, false, false, 7, rateReplicas},
		{"lower, and refused at it", 7, true, false, 7 * unmeasuredCut, rateReplicas},
		{"lower, refused, sent before it was seen", 7, true, true, 7, rateReplicas},
		{"none", 0, false, false, 31, rateSending},
		{"higher than the sending rate", 50, true, false, 31, rateSending},
		{"as high as the sending rate", 31, false, false, 31, rateSending},
	} {
		m := NewMemory(Config{Concurrency: 64, MaxConcurrency: 64})
		now := time.Unix(1_000_000, 0)
		seen := now.Add(-time.Millisecond)
		if c.seenAfter {
			seen = now.Add(time.Millisecond)
		}
		m.Fleet().Said(time.Time{}, c.fleetPace, 0, 0, seen)
		first, _, ok := m.Admit(now, 1, false)
		if !ok {
			t.Fatal("admit")
		}
		m.Learn(&first, Report{Status: 200, Verdict: Accepted}, now) // the upstream is live
		var last Ticket
		for range 30 {
			if last, _, ok = m.Admit(now, 1, false); !ok {
				t.Fatal("admit")
			}
		}
		last.Paced = c.paced
		m.Learn(&last, Report{Status: 429, Verdict: RateRefused}, now)
		v := m.View(now)
		if !near(v.AdmittedRate, c.want) || v.RateFrom != c.from {
			t.Errorf("%s: first refusal set %.2f/s from %q, want %.2f/s from %q", c.name, v.AdmittedRate, v.RateFrom, c.want, c.from)
		}
	}
}

// TestAProbeDuringWhichAnyReplicaWasRefusedRaisesNothing: the other
// replicas send at the prober's pace, so a refusal of any of them during
// the probe (the fleet's count of refusals rose) shows the probe went too
// far, though none of this replica's own requests was refused.
func TestAProbeDuringWhichAnyReplicaWasRefusedRaisesNothing(t *testing.T) {
	for _, c := range []struct {
		name      string
		elsewhere uint64 // refusals elsewhere during the probe
		want      float64
	}{
		{"none", 0, 10 * probeRaise},
		{"one", 1, 10},
	} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 8})
		m.pace.fromRefusals = true
		l := &m.learn
		l.estimate, l.measured, l.from, l.phaseUntil = 10, true, rateAdmitted, t0
		m.Fleet().Said(time.Time{}, 0, 5, 0, t0)
		l.step(t0, true)
		if l.phase != probeUp {
			t.Fatalf("%s: phase %v, want the probe", c.name, l.phase)
		}
		up := probeLength(10)
		m.Fleet().Said(time.Time{}, 0, 5+c.elsewhere, 0, t0.Add(up/2))
		// A refusal ends the up phase at once; with none it runs its length.
		if ended := l.phase == probeDown; ended != (c.elsewhere > 0) {
			t.Errorf("%s refused elsewhere halfway through the probe: it ended then: %v", c.name, ended)
		}
		l.step(t0.Add(up), true)
		l.step(t0.Add(2*up), true)
		if !near(l.estimate, c.want) {
			t.Errorf("%s refused elsewhere during the probe: estimate %v after it, want %v", c.name, l.estimate, c.want)
		}
	}
}

// TestAGuessFollowsTheFleetsPaceDown: a replica whose rate is not yet
// measured (a guess, or a hint's pace: one refusal's wait bounds the
// refill from above, far above it when a token was about to come) takes
// the pace the fleet learned from refusals when that is under any pace
// the guess would send; a measured rate, and a pace the guess's own
// phases could have sent, keep their own.
func TestAGuessFollowsTheFleetsPaceDown(t *testing.T) {
	for _, c := range []struct {
		name     string
		start    rateFrom // where the estimate came from
		measured bool
		pace     float64
		want     float64
		from     rateFrom
	}{
		{"a guess above the fleet", rateSending, false, 3, 3, rateReplicas},
		{"a hint's pace above the fleet", rateHint, false, 3, 3, rateReplicas},
		{"a measured rate", rateAdmitted, true, 3, 8, rateAdmitted},
		{"a pace the guess drains at", rateSending, false, 8 * drainGain, 8, rateSending},
		{"no fleet pace", rateSending, false, 0, 8, rateSending},
	} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 8})
		m.pace.fromRefusals = true
		l := &m.learn
		l.estimate, l.measured, l.from = 8, c.measured, c.start
		m.Fleet().Said(time.Time{}, c.pace, 5, 0, t0)
		if !near(l.estimate, c.want) || l.from != c.from {
			t.Errorf("%s: estimate %v from %q, want %v from %q", c.name, l.estimate, l.from, c.want, c.from)
		}
	}
}

// TestOtherReplicasAdmissionsCountTowardWhatTheUpstreamTakes: the answers
// every replica had admitted (Fleet.Said) count toward what the upstream
// takes, less this replica's own, which it counted as they came; so a
// 150 ms wait stated to the millisecond, while the fleet's 20 a second
// go through, points at a fixed window's end, as in one process, and not
// at the pace of the third this replica sent.
func TestOtherReplicasAdmissionsCountTowardWhatTheUpstreamTakes(t *testing.T) {
	for _, fleet := range []bool{false, true} {
		l := NewMemory(Config{Concurrency: 64, MaxConcurrency: 64})
		start := time.Unix(1_000_000, 0)
		var sent, admitted uint64
		for i := range 7 { // this replica's third of a second's 21
			now := start.Add(time.Duration(i) * 140 * time.Millisecond)
			sent += 3
			tk := l.Fleet().Dispatched(now, 0, sent, 0)
			tk.Lease = "l"
			l.Learn(&tk, Report{Status: 200, Verdict: Accepted}, now.Add(100*time.Millisecond))
			l.Fleet().Returned(&tk, now.Add(100*time.Millisecond))
			if admitted += 3; fleet {
				l.Fleet().Said(now, 0, 0, admitted, now.Add(100*time.Millisecond))
			}
		}
		if fleet {
			// The first word only marks the count (it holds the
			// pool's whole past): the others' 2 after each of the 6
			// next.
			if n, _ := l.learn.admits.recent(start.Add(time.Second)); n != 7+12 {
				t.Fatalf("the admissions meter counts %d, want this replica's 7 and the others' 12", n)
			}
		}
		now := start.Add(time.Second)
		sent++
		tk := l.Fleet().Dispatched(now, 0, sent, 0)
		tk.Lease = "l"
		l.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: 150 * time.Millisecond, PauseUntil: now.Add(150 * time.Millisecond)}, now)
		w := l.View(now).Window
		if suspected := w != nil && w.Closed; suspected != fleet {
			t.Errorf("fleet's admissions counted %v: a window's closure suspected %v, want %v", fleet, suspected, fleet)
		}
	}
}

// TestAnOwnAdmissionWaitsForTheFleetsCount: an answer this replica
// counted before the fleet's count has it (the word came from an
// admission made in between) is not counted again when the count takes
// it: a word whose count did not move keeps this replica's own since.
func TestAnOwnAdmissionWaitsForTheFleetsCount(t *testing.T) {
	l := NewMemory(Config{Concurrency: 64, MaxConcurrency: 64})
	now := time.Unix(1_000_000, 0)
	l.Fleet().Said(now, 0, 0, 10, now) // the mark
	tk := l.Fleet().Dispatched(now, 0, 11, 0)
	tk.Lease = "l"
	l.Learn(&tk, Report{Status: 200, Verdict: Accepted}, now)
	l.Fleet().Said(now, 0, 0, 10, now) // not in the count yet
	l.Fleet().Said(now, 0, 0, 13, now) // now it is, with two of the others'
	if n, _ := l.learn.admits.recent(now); n != 3 {
		t.Fatalf("the admissions meter counts %d, want this replica's 1 and the others' 2", n)
	}
}

// TestFollowingTheFleetsPaceIsACut: a guess that follows the fleet's pace
// down has changed as at a refusal of its own, so a refusal of a request
// sent before it (an upstream that counts refusals is still owed what went
// faster) cuts nothing more; one sent after it, with the upstream
// admitting since, is refused at that pace and cuts it, as one process
// refused again at a pace not yet measured.
func TestFollowingTheFleetsPaceIsACut(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 8})
	now := t0
	admit := func() Ticket {
		t.Helper()
		for range 100 {
			tk, at, ok := m.Admit(now, 1, false)
			if ok {
				return tk
			}
			if !at.After(now) {
				t.Fatalf("admit at +%v refused with no time to wait for", now.Sub(t0))
			}
			now = at // paced: the queue waits its turn
		}
		t.Fatal("admit never let a request go")
		return Ticket{}
	}
	answer := func(tk Ticket, status int, v Verdict) {
		now = now.Add(10 * time.Millisecond)
		m.Learn(&tk, Report{Status: status, Verdict: v}, now)
		m.Return(&tk, now)
	}
	for range 20 {
		answer(admit(), 200, Accepted)
		now = now.Add(40 * time.Millisecond)
	}
	answer(admit(), 429, RateRefused)
	if v := m.View(now); v.RateFrom != rateSending {
		t.Fatalf("first refusal: pace from %q, want the sending rate", v.RateFrom)
	}
	now = now.Add(300 * time.Millisecond)
	answer(admit(), 200, Accepted) // the upstream admits again since the refusal
	now = now.Add(100 * time.Millisecond)
	before := admit()
	now = now.Add(50 * time.Millisecond)
	pace := m.learn.estimate / 2
	m.Fleet().Said(time.Time{}, pace, 1, 0, now)
	if v := m.View(now); !near(v.AdmittedRate, pace) || v.RateFrom != rateReplicas {
		t.Fatalf("the guess did not follow the fleet's pace %.2f: %.2f from %q", pace, v.AdmittedRate, v.RateFrom)
	}
	answer(before, 429, RateRefused)
	if got := m.learn.estimate; !near(got, pace) {
		t.Errorf("a refusal of a request sent before the guess followed the fleet cut it: %.2f, want %.2f", got, pace)
	}
	now = now.Add(500 * time.Millisecond)
	answer(admit(), 200, Accepted)
	now = now.Add(500 * time.Millisecond)
	answer(admit(), 429, RateRefused)
	if got := m.learn.estimate; !near(got, pace*unmeasuredCut) {
		t.Errorf("a refusal at the fleet's pace, with an admission since: %.2f, want %.2f", got, pace*unmeasuredCut)
	}
}

// TestAFleetDispatchThroughAClosedWindowIsAKnock: a replica's dispatch the
// window gate let through as a knock says so on its ticket, as one
// process's does (TestATicketSaysWhetherItKnocked); one through an open
// pool does not.
func TestAFleetDispatchThroughAClosedWindowIsAKnock(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	now := t0
	if _, ok, knock, _ := m.Fleet().WindowGate(now); !ok || knock || m.Fleet().Dispatched(now, 0, 0, 0).Knock {
		t.Fatal("a dispatch into an open pool is a knock")
	}
	m.win.closed, m.win.since, m.win.knockAt = true, now, now
	for {
		at, ok, knock, _ := m.Fleet().WindowGate(now)
		if ok {
			if !knock || !m.Fleet().Dispatched(now, 1, 1, 0).Knock {
				t.Fatal("the dispatch the closed window let through is not marked a knock")
			}
			return
		}
		if !at.After(now) {
			t.Fatalf("held at %v with no time to go", now.Sub(t0))
		}
		now = at
	}
}
