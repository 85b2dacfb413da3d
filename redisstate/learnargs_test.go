package redisstate

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// TestOnlyARateRefusalEmptiesAPaceLearnedFromRefusals: an answer to a
// permit Redis gave, in a group whose request pace was learned from
// refusals (no headers) and which has seen no fixed window, tells Redis to
// empty the shared request budget when it is a rate refusal (the
// upstream's bucket is empty), and to leave what is left alone when it is
// anything else.
func TestOnlyARateRefusalEmptiesAPaceLearnedFromRefusals(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := &shared{st: &Store{}, local: limit.NewMemory(limit.Config{})}
	// A first quiet refusal naming its wait paces the group from refusals.
	m := limit.NewMemory(limit.Config{})
	first, _, _ := m.Admit(now.Add(-2*time.Second), 1, false)
	m.Learn(&first, limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: 400 * time.Millisecond}, now.Add(-2*time.Second))
	v := m.View(now)
	v.Concurrency, v.Requests = 4, limit.BudgetView{Known: true, Limit: 5, Available: 3, PerSecond: 2.5}
	if !v.FromRefusals() || v.Window != nil {
		t.Fatal("the view does not read as a pace learned from refusals")
	}
	for _, c := range []struct {
		verdict limit.Verdict
		want    leftMode
	}{
		{limit.RateRefused, leftCapped},
		{limit.Accepted, leftUnchanged},
		{limit.ConcurrencyRefused, leftUnchanged},
		{limit.Overloaded, leftUnchanged},
		{limit.Failed, leftUnchanged},
	} {
		tk := limit.Ticket{Lease: "l", Dispatched: now.Add(-time.Second)}
		args := s.learnArgsFor(&tk, limit.Report{Status: 429, Verdict: c.verdict}, v, now)
		if args.Req.Mode != c.want {
			t.Errorf("%v: the request budget's mode %v, want %v", c.verdict, args.Req.Mode, c.want)
		}
		if c.want == leftCapped && args.Req.Value != 0 {
			t.Errorf("%v: capped at %v, want 0", c.verdict, args.Req.Value)
		}
	}
}

// TestAWindowStatedToTheMillisecondReachesTheFleet: a refusal whose wait,
// to the millisecond, points at a fixed window's boundary pauses the fleet
// to that boundary while the closure is only suspected (this replica
// holds only until its test), and, once the test confirmed it, tells
// Redis the boundary for the fleet's window (learnArgs.Bound) with the
// requests sent at the refused request's dispatch. A wait in whole
// seconds, or an answer that is no rate refusal, does neither.
func TestAWindowStatedToTheMillisecondReachesTheFleet(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name               string
		hint               time.Duration
		verdict            limit.Verdict
		pause, test, whole bool // whole: Retry-After, whole seconds rounded up
	}{
		{"stated to the ms", 600 * time.Millisecond, limit.RateRefused, true, true, false},
		{"in whole seconds", 2 * time.Second, limit.RateRefused, false, true, true},
		{"no rate refusal", 600 * time.Millisecond, limit.Overloaded, false, false, false},
	} {
		m := limit.NewMemory(limit.Config{Concurrency: 50, MaxConcurrency: 50})
		s := &shared{st: &Store{}, local: m}
		now := start
		for range 20 { // 20 admitted in the last second
			tk, _, ok := m.Admit(now, 1, false)
			if !ok {
				t.Fatalf("%s: admit", c.name)
			}
			m.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, now.Add(10*time.Millisecond))
			m.Return(&tk, now.Add(10*time.Millisecond))
			now = now.Add(20 * time.Millisecond)
		}
		boundary := now.Add(c.hint)
		refuse := func(now time.Time) learnArgs {
			tk, _, ok := m.Admit(now, 1, false)
			if !ok {
				t.Fatalf("%s: admit at %v", c.name, now.Sub(start))
			}
			tk.Lease, tk.Requests = "l", 41
			hint := boundary.Sub(now)
			if c.whole {
				hint = (hint + time.Second - 1).Truncate(time.Second)
			}
			r := limit.Report{Status: 429, Verdict: c.verdict, Hint: hint, PauseUntil: now.Add(hint)}
			m.Learn(&tk, r, now)
			return s.learnArgsFor(&tk, r, m.View(now), now)
		}
		args := refuse(now)
		if paused := args.Pause == boundary.Sub(now).Milliseconds(); paused != c.pause {
			t.Errorf("%s: the fleet paused for %d ms, to the boundary %v", c.name, args.Pause, c.pause)
		}
		if args.Bound != 0 {
			t.Errorf("%s: a suspected closure told the fleet a boundary", c.name)
		}
		if !c.test {
			continue
		}
		// The test, refused for the same boundary: confirmed.
		test := m.PausedUntil()
		if !test.Before(boundary) {
			t.Fatalf("%s: this replica holds until %v, its test's time, not the boundary", c.name, test.Sub(now))
		}
		args = refuse(test)
		if w := m.View(test).Window; w == nil || w.ClosedUntil.IsZero() {
			t.Fatalf("%s: the test did not confirm the closure", c.name)
		}
		want := boundary.Sub(test).Milliseconds()
		if c.whole {
			want = 0 // only to the second: each replica's own
		}
		if args.Bound != want || args.Bound > 0 && args.Sent != 41 {
			t.Errorf("%s: after the test the fleet was told a boundary %d ms on, sent %v; want %d ms, 41", c.name, args.Bound, args.Sent, want)
		}
	}
}

// TestAConcurrencyBoundReplicaRaisesAPaceWithoutTheLease: a replica that
// found the bound is a concurrency limit says so with its answer, and its
// pace learned from refusals (loose by design: the limit holds the group)
// then raises the fleet's while another replica holds the raise lease; a
// replica bound by the rate may not.
func TestAConcurrencyBoundReplicaRaisesAPaceWithoutTheLease(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	now := time.Now()
	m := limit.NewMemory(limit.Config{})
	first, _, _ := m.Admit(now.Add(-2*time.Second), 1, false)
	m.Learn(&first, limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: 400 * time.Millisecond}, now.Add(-2*time.Second))
	s := &shared{st: st, local: m}
	for _, c := range []struct {
		bound limit.Bound
		want  string
	}{
		{limit.BoundRate, "12"},
		{limit.BoundConcurrency, "14"},
	} {
		paced := st.Shared("paced-"+c.want, groupCfg).(*shared)
		learnWindow(t, st, paced, "a", true, 10, 10)
		if rep := learnWindow(t, st, paced, "a", true, 12, 12); !rep.raiser {
			t.Fatal("a did not take the raise lease")
		}
		v := m.View(now)
		v.Requests, v.Bound = limit.BudgetView{Known: true, Limit: 14, PerSecond: 14}, c.bound
		if !v.FromRefusals() {
			t.Fatal("the view does not read as a pace learned from refusals")
		}
		tk := limit.Ticket{Lease: "l", Dispatched: now.Add(-time.Second)}
		args := s.learnArgsFor(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, v, now)
		if err := learnScript.Run(context.Background(), st.rdb(), []string{paced.state, paced.leases, paced.climits, paced.raise, paced.levels}, argv(args)...).Err(); err != nil {
			t.Fatal(err)
		}
		if rate := hget(t, st, paced.state, "r_rate"); rate != c.want {
			t.Errorf("bound %v: the fleet's pace %s after this replica's 14 while a holds the raise lease, want %s", c.bound, rate, c.want)
		}
	}
}
