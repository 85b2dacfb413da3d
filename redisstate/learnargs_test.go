package redisstate

import (
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
