package proxy

import (
	"context"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/tokens"
	"github.com/llmproxy/llmproxy/upstream"
)

// Flex first: a request that asks for flex (x-llmproxy-tier: flex, or
// its route's LLMPROXY_ROUTE_<NAME>_SERVICE_TIER) is sent with the
// upstream's flex field set. A flex refusal is capacity, not rate: the
// lane learns nothing from it, and the request tries flex again after a
// backoff of its own until the time a standard attempt needs is all
// that is left before its deadline; then it goes at standard (unless
// its route says FLEX_FALLBACK=never). A model that answers that flex is
// not available for it is remembered, and its requests go at standard.

// askFlex makes req's flex body, unless its path has no tier field, its
// body is spooled, its model is known to have no flex, or there is no
// room to hold a second copy: it then goes at standard.
func (p *Proxy) askFlex(req *request) {
	s := &req.spend
	field := flexField(req.target.Path)
	if field == "" || req.body.file != nil || p.tiers.noFlex(req.route, s.model) {
		return
	}
	b, ok := tokens.SetServiceTier(req.body.mem, field, string(cost.Flex))
	if !ok || p.hold(req, int64(len(b))) != nil {
		return
	}
	s.flexBody, s.onFlex = b, true
	s.flexUntil = p.tiers.flexUntil(req.route, s.model, req.arrived, req.deadline)
}

// flexDecide is what to do with a flex attempt's answer that said no to
// flex (a), in place of d: the lane is told nothing (the refusal is not
// about its limits, and the upstream did not count it), and the request
// tries flex again after a backoff, as the same dispatch, while that
// leaves time for standard, else goes at standard now.
func (p *Proxy) flexDecide(req *request, a flexAnswer, now time.Time, rnd float64, d decision) decision {
	s := &req.spend
	// The lane is not told: its dispatch stays one, whose answer is the
	// one flex or standard gives at last. A retry holds its permit.
	d.quiet, d.pauseGroup, d.next = true, false, req.tries
	s.quieted = true
	if a == flexUnsupported {
		p.tiers.markNoFlex(req.route, s.model)
		s.onFlex = false
		d.action, d.wait = actRetry, 0
		return d
	}
	s.flexRefused++
	p.metrics.route(req.route).flexRefused.Inc()
	wait := flexBackoff(s.flexRefused, rnd)
	until := req.deadline
	if s.fallback {
		until = s.flexUntil
	}
	switch {
	case now.Add(wait).Before(until):
		d.action, d.wait = actRetry, wait
	case s.fallback:
		s.onFlex = false
		d.action, d.wait = actRetry, 0
	default:
		// The lane hears of the dispatch at last, as of one that never
		// reached the limit's accounting.
		d.quiet, d.report = false, reportOf(upstream.Result{})
		d.action, d.why = actGiveUp, "flex had no capacity until the request's deadline, and its route's FLEX_FALLBACK is never"
	}
	return d
}

// flexContext bounds a flex attempt to flexUntil when req may fall back
// to standard: a flex answer slower than that gives way to a standard
// one, and a request whose turn came after it goes at standard at once.
// Under x-llmproxy-retry: off the first answer is the client's, whenever
// it comes. The context's cancel is for the request's end.
func flexContext(ctx context.Context, req *request) (context.Context, context.CancelFunc) {
	s := &req.spend
	if !s.onFlex || !s.fallback || s.flexUntil.IsZero() || req.retryOff {
		return ctx, func() {}
	}
	if !time.Now().Before(s.flexUntil) {
		s.onFlex = false // its turn came too late for flex: standard at once
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, s.flexUntil)
}
