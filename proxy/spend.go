package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// What a request costs: the tier it asks for (flex first, standard
// before its deadline), the run it belongs to, the budgets it spends
// from, and what its answer cost. Nothing of it is set for a request
// when Config.Prices is nil and it asks for no tier: the plain path
// stays as it is.

// The client's say over cost, in headers the upstream never sees.
const (
	tierHeader   = "X-Llmproxy-Tier"
	runHeader    = "X-Llmproxy-Run"
	budgetHeader = "X-Llmproxy-Budget-Usd"
)

// The answer's headers on cost.
const (
	servedTierHeader = "X-Llmproxy-Served-Tier"
	costHeader       = "X-Llmproxy-Cost-Usd"
)

// runTTL is how long a run's spend and its row are kept after its last
// request.
const runTTL = 24 * time.Hour

// spend is a request's cost side.
type spend struct {
	// asked is the tier the client or the route asked for ("" none).
	asked cost.Tier
	// fallback: a flex request may go at standard before its deadline.
	fallback bool
	// onFlex: the next attempt asks the upstream for flex.
	onFlex bool
	// flexBody is the body with the upstream's flex field set; std the
	// body sent at standard when it differs from the client's (the
	// proxy asked a stream for its usage). nil: the client's.
	flexBody, std []byte
	// stripUsage: the proxy asked the stream for its usage, and takes the
	// usage chunk out of what the client gets.
	stripUsage bool
	// flexUntil is when a flex attempt gives way to standard: the time a
	// standard attempt needs is left before the deadline.
	flexUntil   time.Time
	flexRefused int
	// quieted: a flex refusal was retried as the same dispatch, which
	// the lane has not been told of (see heard).
	quieted bool
	model   string
	// run is the x-llmproxy-run name; key the credential's short hash.
	run, key string
	// runBudget is x-llmproxy-budget-usd; 0: none.
	runBudget cost.Amount
	// estimate and output are the lane's estimate of its tokens and the
	// part of it for its output; outputLimited: the body sets its
	// output's limit (see tokens.Request).
	estimate, output int64
	outputLimited    bool
	// bound is the most it can cost (see bound); client is its client's
	// context, whose leaving ends a wait for a budget's room.
	bound  cost.Amount
	client context.Context
	// scopes are the accounts it spends from when a cap applies (see
	// scopeBudgets); hold what it reserved under them.
	scopes []cost.Scope
	hold   *cost.Hold
	// ended ends its wait in its lane when a budget it spends from is
	// found spent (see budgetMarks); unwait stops that.
	ended  context.Context
	end    context.CancelCauseFunc
	unwait func()
	// served is the tier the answer was billed at; amount what it cost,
	// priced when the table has its model.
	served cost.Tier
	amount cost.Amount
	priced bool
}

// wire is the body the next attempt sends; nil: the client's own.
func (s *spend) wire() []byte {
	if s.onFlex {
		return s.flexBody
	}
	return s.std
}

// heard is r, the report of an answer to the lane, without the answer's
// rate-limit headers when flex refusals went quietly before it in the
// same dispatch: the upstream counted the request when its last attempt
// went, not when the lane dispatched it, and the lane would misread its
// counts and resets against the dispatch.
func (s *spend) heard(r limit.Report) limit.Report {
	if s.quieted {
		s.quieted = false
		r.Limits = headerparse.Limits{}
	}
	return r
}

// why is err, the lane's refusal of s's request, or what ended its wait
// when a spent budget did.
func (s *spend) why(err error) error {
	if err == nil || s.ended == nil {
		return err
	}
	var f *failure
	if cause := context.Cause(s.ended); errors.As(cause, &f) {
		return cause
	}
	return err
}
