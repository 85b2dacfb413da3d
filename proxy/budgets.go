package proxy

import (
	"context"
	"strings"
	"sync"

	"github.com/llmproxy/llmproxy/cost"
)

// budgetMarks are the budgets this process found spent, and the queued
// requests that spend from them: when one is found spent, its queued
// requests are answered at once, and new ones before they queue. A
// budget is spent for a cap: a request that carries a larger one (its
// run's x-llmproxy-budget-usd raised) goes on.
type budgetMarks struct {
	mu      sync.Mutex
	spent   map[string]cost.Exhausted
	waiters map[string]map[*budgetWaiter]struct{}
}

// budgetWaiter is a queued request: its cap on one account, and what
// ends its wait.
type budgetWaiter struct {
	cap    cost.Amount
	cancel context.CancelCauseFunc
}

// maxBudgetMarks bounds the accounts marked spent (runs are named by
// clients); past it the marks start over, and a spent budget is found
// again by its next reservation.
const maxBudgetMarks = 10000

// exhausted is the failure of a request spending from scopes when one
// of them is marked spent at its cap or above.
func (b *budgetMarks) exhausted(scopes []cost.Scope) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range scopes {
		if m, ok := b.spent[s.Key]; ok && s.Cap > 0 && s.Cap <= m.Cap {
			return budgetFailure(&cost.Exhausted{Key: s.Key, Spent: m.Spent, Cap: s.Cap})
		}
	}
	return nil
}

// mark notes ex's account spent at its cap, and ends the wait of the
// queued requests that carry that cap or a smaller one.
func (b *budgetMarks) mark(ex *cost.Exhausted) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.spent == nil || len(b.spent) >= maxBudgetMarks {
		b.spent = map[string]cost.Exhausted{}
	}
	if m, ok := b.spent[ex.Key]; !ok || ex.Cap >= m.Cap {
		b.spent[ex.Key] = *ex
	}
	for w := range b.waiters[ex.Key] {
		if w.cap <= ex.Cap {
			w.cancel(budgetFailure(&cost.Exhausted{Key: ex.Key, Spent: ex.Spent, Cap: w.cap}))
		}
	}
}

// wait registers a queued request spending from scopes, whose wait
// cancel ends; the function returned unregisters it.
func (b *budgetMarks) wait(scopes []cost.Scope, cancel context.CancelCauseFunc) func() {
	var ws []*budgetWaiter
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiters == nil {
		b.waiters = map[string]map[*budgetWaiter]struct{}{}
	}
	for _, s := range scopes {
		if s.Cap <= 0 {
			continue
		}
		w := &budgetWaiter{cap: s.Cap, cancel: cancel}
		if b.waiters[s.Key] == nil {
			b.waiters[s.Key] = map[*budgetWaiter]struct{}{}
		}
		b.waiters[s.Key][w] = struct{}{}
		ws = append(ws, w)
	}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for i, s := range capped(scopes) {
			delete(b.waiters[s.Key], ws[i])
			if len(b.waiters[s.Key]) == 0 {
				delete(b.waiters, s.Key)
			}
		}
	}
}

// capped is the scopes with a cap, in order.
func capped(scopes []cost.Scope) []cost.Scope {
	var out []cost.Scope
	for _, s := range scopes {
		if s.Cap > 0 {
			out = append(out, s)
		}
	}
	return out
}

// budgetFailure is the answer to a request whose budget is spent.
func budgetFailure(ex *cost.Exhausted) error {
	return &failure{kind: failBudget, spent: ex.Spent, cap: ex.Cap, hasSpend: true,
		msg: "the budget " + scopeName(ex.Key) + " is spent: " + ex.Spent.String() + " of " + ex.Cap.String() +
			" USD, and this one could cost more than is left; nothing was sent upstream"}
}

// scopeName is how a budget's account is named to its client: its kind
// and name, without the credential's hash.
func scopeName(key string) string {
	kind, rest, _ := strings.Cut(key, ":")
	switch kind {
	case "run":
		_, name, _ := strings.Cut(rest, ":")
		return "of run " + quoteModel(name) + " (x-llmproxy-budget-usd)"
	case "key":
		return "of this API key (LLMPROXY_BUDGET_USD)"
	}
	return "of route " + quoteModel(rest) + " (LLMPROXY_ROUTE_<NAME>_BUDGET_USD)"
}

// quoteModel is a model's name for a message, bounded.
func quoteModel(m string) string {
	if m == "" {
		return "(none)"
	}
	if len(m) > 64 {
		m = m[:64] + "…"
	}
	return "\"" + m + "\""
}
