package limit

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// TestAConfiguredConcurrencyIsTheLimitAtOnce: an operator's configured
// concurrency is the pool's limit from the moment it is set, lowered or
// raised, and as a ceiling its highest; without one the limit stays,
// within the bounds, and its slow start goes on.
func TestAConfiguredConcurrencyIsTheLimitAtOnce(t *testing.T) {
	m := NewMemory(Config{})
	m.Configure(Config{Limits: Limits{RPM: 60}})
	if v := m.View(t0); v.Concurrency != 8 || !m.conc.slowStart {
		t.Fatalf("a configured RPM moved the limit to %d (slow start %v), want 8 in slow start", v.Concurrency, m.conc.slowStart)
	}
	m.Configure(Config{Limits: Limits{Concurrency: 2}})
	if v := m.View(t0); v.Concurrency != 2 || m.conc.max != 2 || m.conc.slowStart {
		t.Fatalf("concurrency 2 as a ceiling: limit %d, highest %d, slow start %v; want 2, 2, none", v.Concurrency, m.conc.max, m.conc.slowStart)
	}
	a, b := admitted(t, m, t0, 1), admitted(t, m, t0, 1)
	if _, _, ok := m.Admit(t0, 1, false); ok {
		t.Fatal("a third request went under a configured concurrency of 2")
	}
	m.Configure(Config{Limits: Limits{Concurrency: 30, Start: true}})
	if v := m.View(t0); v.Concurrency != 30 || m.conc.max != 1024 || v.InFlight != 2 {
		t.Fatalf("concurrency 30 as a start: limit %d, highest %d, %d in flight; want 30, 1024, 2", v.Concurrency, m.conc.max, v.InFlight)
	}
	m.Configure(Config{MaxConcurrency: 4})
	if v := m.View(t0); v.Concurrency != 4 || m.conc.min != 1 || m.conc.start != 4 {
		t.Fatalf("no configured concurrency, highest 4: limit %d, lowest %d, start %d; want 4, 1, 4", v.Concurrency, m.conc.min, m.conc.start)
	}
	m.Configure(Config{MinConcurrency: 6, MaxConcurrency: 10})
	if v := m.View(t0); v.Concurrency != 6 {
		t.Fatalf("lowest 6: limit %d, want 6", v.Concurrency)
	}
	answered(m, a, Report{Status: 200, Verdict: Accepted}, at(time.Second))
	answered(m, b, Report{Status: 200, Verdict: Accepted}, at(time.Second))
	if v := m.View(at(time.Second)); v.InFlight != 0 {
		t.Fatalf("%d in flight after both answers", v.InFlight)
	}
}

// TestForgetStartsAgainAndKeepsThePermitsOut: after Forget the state
// shows nothing learned (no budget, no pace from refusals, no pause, the
// configured start as its concurrency limit, no answer time), while the
// permits out stay counted and go back once each, and the next dispatch
// is numbered and marked after the earlier ones.
func TestForgetStartsAgainAndKeepsThePermitsOut(t *testing.T) {
	m := NewMemory(Config{Limits: Limits{Concurrency: 4, Start: true}})
	m.learn.lastAccepted = t0 // a live upstream: its quiet refusals teach a pace
	heads := headerparse.Limits{Requests: win(100, 3, at(time.Minute))}
	a := admitted(t, m, t0, 10)
	answered(m, a, Report{Status: 200, Verdict: Accepted, Limits: heads}, at(time.Second))
	held := admitted(t, m, at(time.Second), 10)
	refused := admitted(t, m, at(time.Second), 10)
	pause := at(time.Hour)
	m.Learn(refused, Report{Status: 503, Verdict: Overloaded, PauseUntil: pause}, at(2*time.Second))
	before := m.View(at(2 * time.Second))
	if !before.Requests.Known || !before.PausedUntil.Equal(pause) || before.Concurrency >= 4 || before.AnswerSeconds == 0 || m.refusedHolding != 1 {
		t.Fatalf("set-up: %+v, %d refused holding", before, m.refusedHolding)
	}
	m.Forget()
	v := m.View(at(2 * time.Second))
	if v.Requests.Known || !v.PausedUntil.IsZero() || v.RateFrom != rateUnknown || v.Concurrency != 4 || v.AnswerSeconds != 0 || v.ConcurrencyLowered {
		t.Fatalf("after Forget: %+v, want nothing learned and the configured start 4", v)
	}
	if v.InFlight != 2 || m.refusedHolding != 1 {
		t.Fatalf("after Forget: %d in flight, %d refused holding; want 2 and 1", v.InFlight, m.refusedHolding)
	}
	next := admitted(t, m, at(3*time.Second), 10)
	// Three went before it, 10 tokens each.
	if next.Seq != refused.Seq+1 || next.Requests != 4 || next.Tokens != 40 {
		t.Fatalf("the next dispatch is number %d marked %v requests, %v tokens; want %d, 4, 40",
			next.Seq, next.Requests, next.Tokens, refused.Seq+1)
	}
	m.Return(refused, at(3*time.Second))
	m.Return(held, at(3*time.Second))
	answered(m, next, Report{Status: 200, Verdict: Accepted}, at(4*time.Second))
	if v := m.View(at(4 * time.Second)); v.InFlight != 0 || m.refusedHolding != 0 {
		t.Fatalf("after every permit went back: %d in flight, %d refused holding; want 0 and 0", v.InFlight, m.refusedHolding)
	}
}

// TestForgetKeepsTheFleetsCount: a state beside a shared store keeps
// the fleet's running count of dispatches, which the next dispatch noted
// is counted from.
func TestForgetKeepsTheFleetsCount(t *testing.T) {
	m := NewMemory(Config{})
	m.Fleet().Dispatched(t0, 0, 40, 0)
	m.Forget()
	if m.fleetSent != 40 {
		t.Fatalf("the fleet's count is %d after Forget, want 40", m.fleetSent)
	}
	if tk := m.Fleet().Dispatched(at(time.Millisecond), 0, 45, 0); tk.Seq != 45 {
		t.Fatalf("the next dispatch noted is number %d, want 45", tk.Seq)
	}
}
