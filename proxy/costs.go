package proxy

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/tokens"
)

// costly reports whether req has a cost side to keep: prices to read,
// a tier, a run or a budget.
func (p *Proxy) costly(req *request) bool {
	s := &req.spend
	return p.cfg.Prices != nil || s.asked != "" || s.run != "" || s.runBudget > 0 || p.cfg.Budget > 0 ||
		p.settings[req.route].ServiceTier != "" || p.settings[req.route].Budget > 0
}

// prepareSpend sets req's cost side once its body and lane request are
// read (its model, estimate and key put down in req.spend): its tier and
// the bodies that ask for it, the stream's usage, and the budgets it
// spends from.
func (p *Proxy) prepareSpend(req *request) error {
	s := &req.spend
	set := p.settings[req.route]
	if s.asked == "" {
		s.asked = set.ServiceTier
	}
	s.fallback = !set.FlexNever
	if s.asked == cost.Flex {
		p.askFlex(req)
	}
	if p.cfg.Prices != nil && req.body.file == nil {
		p.askUsage(req)
	}
	return p.scopeBudgets(req)
}

// askUsage asks a stream for its usage when the client did not
// (stream_options.include_usage), so the answer can be priced; the
// usage chunk is taken out of what the client gets.
func (p *Proxy) askUsage(req *request) {
	s := &req.spend
	path := req.target.Path
	if !strings.HasSuffix(path, "/completions") || p.cfg.Prices.Model(s.model) == nil {
		return // only chat and completions streams leave usage out unless asked, and only a price needs it
	}
	with, added := tokens.IncludeUsage(req.body.mem)
	if !added {
		return
	}
	if p.hold(req, int64(len(with))) != nil {
		return // no room to hold a second body: the answer goes unpriced
	}
	s.std, s.stripUsage = with, true
	if s.flexBody != nil {
		if f, ok := tokens.IncludeUsage(s.flexBody); ok {
			s.flexBody = f // replaces one held copy with one a few bytes longer
		}
	}
}

// scopeBudgets lists the accounts req spends from when a cap applies
// to it: its run's (capped by x-llmproxy-budget-usd), its credential's
// (LLMPROXY_BUDGET_USD) and its route's (LLMPROXY_ROUTE_<NAME>_BUDGET_USD).
// A cap needs a price: a request for a model the table does not price is
// refused when one applies.
func (p *Proxy) scopeBudgets(req *request) error {
	s := &req.spend
	routeCap := p.settings[req.route].Budget
	if s.runBudget == 0 && p.cfg.Budget == 0 && routeCap == 0 {
		return nil // counted in its run's row alone: no ledger to keep
	}
	if s.run != "" || s.runBudget > 0 {
		s.scopes = append(s.scopes, cost.Scope{Key: "run:" + s.key + ":" + s.run, Cap: s.runBudget, TTL: runTTL})
	}
	if p.cfg.Budget > 0 {
		s.scopes = append(s.scopes, cost.Scope{Key: "key:" + s.key, Cap: p.cfg.Budget, TTL: accountTTL})
	}
	if routeCap > 0 {
		s.scopes = append(s.scopes, cost.Scope{Key: "route:" + req.route, Cap: routeCap, TTL: accountTTL})
	}
	switch {
	case p.cfg.Prices.Model(s.model) == nil:
		return fail(failBudgetUnpriced, "a budget applies to this request, and the price table (LLMPROXY_PRICES) has no price for model "+
			quoteModel(s.model)+": the proxy cannot hold a budget it cannot price")
	case req.upgrade:
		return fail(failBudgetUnpriced, "a budget applies to this request, and a WebSocket session's cost has no bound the proxy can reserve before it opens")
	}
	s.bound = p.bound(req)
	if err := p.budgets.exhausted(s.scopes, s.bound); err != nil {
		return err
	}
	s.ended, s.end = context.WithCancelCause(context.Background())
	s.unwait = p.budgets.wait(s.scopes, s.bound, s.end)
	return nil
}

// accountTTL is how long a key's or a route's spend is kept once it
// spends no more: an account a month idle starts again from nothing.
const accountTTL = 30 * 24 * time.Hour

// bound is the most req can cost: its prompt's bytes bound its text's
// tokens (no tokenizer makes more tokens than bytes), with each
// message's overhead and each image by the largest rule, plus its
// output limit (the model's most, for each choice, when it sets none),
// at the dearest of its model's prices, whatever tier serves it.
func (p *Proxy) bound(req *request) cost.Amount {
	s := &req.spend
	input := req.body.size + s.estimate // the estimate counts every message's overhead and image
	output := s.output
	if !s.outputLimited {
		output = p.cfg.Prices.MaxOutput(s.model) * max(1, s.output/tokens.DefaultMaxOutput)
	}
	a, _ := p.cfg.Prices.Bound(s.model, cost.Dearest, input, output)
	return a
}

// reserve holds req's bound under its budgets before it is sent,
// waiting while holds under way may leave room, until its deadline, its
// client leaves or Stop; an exhausted budget ends the queued requests of
// its account too.
func (p *Proxy) reserve(req *request) error {
	s := &req.spend
	if len(s.scopes) == 0 || s.hold != nil {
		return nil
	}
	ctx, cancel := context.WithDeadline(s.client, req.deadline)
	defer cancel()
	defer context.AfterFunc(p.stopped, cancel)()
	h := cost.Hold{ID: cost.NewHoldID(), Amount: s.bound, Scopes: s.scopes, Expires: req.deadline.Add(time.Minute)}
	err := cost.Reserve(ctx, p.ledger, h)
	var ex *cost.Exhausted
	switch {
	case err == nil:
		s.hold = &h
		return nil
	case errors.As(err, &ex):
		p.budgets.mark(ex)
		return budgetFailure(ex)
	case ctx.Err() != nil:
		return err
	}
	p.log.Warn("the budget ledger failed: the request is refused, not sent unbudgeted", "err", err)
	return fail(failInternal, "the proxy could not reach its budget ledger: "+err.Error())
}

// settle ends req's hold with what its answer cost: the price of its
// usage; the whole hold when a success said no usage (it may have been
// billed); nothing when it failed.
func (p *Proxy) settle(req *request) {
	s := &req.spend
	if s.unwait != nil {
		s.unwait()
		s.end(nil)
	}
	if s.hold == nil {
		return
	}
	actual := cost.Amount(0)
	switch {
	case s.priced:
		actual = s.amount
	case req.status >= 200 && req.status < 300:
		actual = s.hold.Amount
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.ledger.Settle(ctx, *s.hold, actual); err != nil {
		p.log.Warn("could not settle a budget's hold; it lapses when it expires", "err", err)
	}
	s.hold = nil
}
