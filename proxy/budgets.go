package proxy

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/cost"
)

// budgetMarks are the spend this process found on budgets that could
// not take a request, and the queued requests that spend from them:
// when a budget is found too spent for one request, the queued requests
// whose own bound does not fit what is left either are answered at
// once, and new ones before they queue. Spend only grows, so a mark
// holds until it is markTTL old (a run's spend lapses after a day, and
// another replica's marks are not these).
type budgetMarks struct {
	mu      sync.Mutex
	spent   map[string]budgetMark
	waiters map[string]map[*budgetWaiter]struct{}
}

// budgetMark is an account's spend as a refused reservation found it.
type budgetMark struct {
	spent cost.Amount
	at    time.Time
}

// budgetWaiter is a queued request: its cap on one account, its bound,
// and what ends its wait.
type budgetWaiter struct {
	cap, bound cost.Amount
	cancel     context.CancelCauseFunc
}

// maxBudgetMarks bounds the accounts marked (runs are named by
// clients); past it the marks start over, and a spent budget is found
// again by its next reservation.
const maxBudgetMarks = 10000

// markTTL is how long a mark is believed.
const markTTL = 10 * time.Minute

// exhausted is the failure of a request of bound spending from scopes
// when one of them is marked too spent to take it.
func (b *budgetMarks) exhausted(scopes []cost.Scope, bound cost.Amount) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range scopes {
		if m, ok := b.spent[s.Key]; ok && s.Cap > 0 && time.Since(m.at) < markTTL && m.spent+bound > s.Cap {
			return budgetFailure(&cost.Exhausted{Key: s.Key, Spent: m.spent, Cap: s.Cap})
		}
	}
	return nil
}

// mark notes ex's account's spend, and ends the wait of the queued
// requests whose bound does not fit under their cap beside it.
func (b *budgetMarks) mark(ex *cost.Exhausted) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.spent == nil || len(b.spent) >= maxBudgetMarks {
		b.spent = map[string]budgetMark{}
	}
	b.spent[ex.Key] = budgetMark{spent: max(ex.Spent, b.spent[ex.Key].spent), at: time.Now()}
	for w := range b.waiters[ex.Key] {
		if ex.Spent+w.bound > w.cap {
			w.cancel(budgetFailure(&cost.Exhausted{Key: ex.Key, Spent: ex.Spent, Cap: w.cap}))
		}
	}
}

// wait registers a queued request of bound spending from scopes, whose
// wait cancel ends; the function returned unregisters it.
func (b *budgetMarks) wait(scopes []cost.Scope, bound cost.Amount, cancel context.CancelCauseFunc) func() {
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
		w := &budgetWaiter{cap: s.Cap, bound: bound, cancel: cancel}
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
