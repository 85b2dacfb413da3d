package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/internal/pacific"
	"github.com/llmproxy/llmproxy/lanequeue"
)

type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	// SpentUSD and BudgetUSD are a spent budget's spend and cap, in
	// dollars (budget_exhausted only).
	SpentUSD  *string `json:"spent_usd,omitempty"`
	BudgetUSD *string `json:"budget_usd,omitempty"`
}

// failure is an error the proxy answers itself; its kind picks the answer
// in replyFor.
type failure struct {
	kind       failKind
	msg        string
	retryAfter time.Duration // > 0: overrides the kind's Retry-After
	param      string        // the input at fault, the error's param ("": none)
	status     int           // > 0: overrides the kind's status
	// spent and cap are a spent budget's (hasSpend), for the body.
	spent, cap cost.Amount
	hasSpend   bool
}

func (f *failure) Error() string { return f.msg }

type failKind uint8

const (
	failInternal failKind = iota
	failQueueFull
	failDeadline
	failUnreachable
	failTooLarge
	failBodyRead
	failMethod
	failAbsoluteURI
	failShutdown
	failWaitTooLong
	failBadPriority
	failBadClient
	failBadMaxWait
	failBadRetry
	failQuota
	failAdminToken
	failNotReady
	failNotFound
	failBadAdminInput
	failAdminWrite
	failAdminHost
	failBodyTooSlow
	failBadTier
	failBadRun
	failBadBudget
	failBudgetUnpriced
	failBudget
	failBadJournal
	failJournalMiss
)

func fail(kind failKind, msg string) error { return &failure{kind: kind, msg: msg} }

// badAdmin is an admin endpoint's 400 for the input param ("": the whole
// body).
func badAdmin(param, msg string) error {
	return &failure{kind: failBadAdminInput, msg: msg, param: param}
}

// errorReply is the HTTP answer to a proxy-made error.
type errorReply struct {
	status     int
	typ, code  string
	msg        string
	param      string        // the error's param; "": null
	retryAfter time.Duration // > 0: send Retry-After
	noRetry    bool          // send x-should-retry: false
	// spent and budget are a spent budget's, in dollars ("": none).
	spent, budget string
	// shutdownWins: once the proxy is stopping, a request that failed
	// so (waiting, or at the upstream) is answered shutting_down instead,
	// so that its client retries elsewhere; not the client's own faults.
	shutdownWins bool
}

// replies maps every kind of proxy-made error to its answer. It is the one
// place that decides statuses, types, codes and retry headers.
var replies = map[failKind]errorReply{
	failInternal:    {status: http.StatusInternalServerError, typ: "server_error", code: "internal_error", shutdownWins: true},
	failQueueFull:   {status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full", retryAfter: time.Second, shutdownWins: true},
	failDeadline:    {status: http.StatusGatewayTimeout, typ: "timeout_error", code: "budget_exceeded", noRetry: true, shutdownWins: true},
	failUnreachable: {status: http.StatusBadGateway, typ: "upstream_error", code: "upstream_unreachable", noRetry: true, shutdownWins: true},
	failTooLarge:    {status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large", noRetry: true},
	failBodyRead:    {status: http.StatusBadRequest, typ: "invalid_request_error", code: "body_read_error"},
	failMethod:      {status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed"},
	failAbsoluteURI: {status: http.StatusBadRequest, typ: "invalid_request_error", code: "absolute_uri"},
	failBadPriority: {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_priority", noRetry: true},
	failBadClient:   {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_client", noRetry: true},
	failBadMaxWait:  {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_max_wait", noRetry: true},
	failBadRetry:    {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_retry", noRetry: true},
	// A quota the upstream said is spent, answered here without a call
	// upstream: with the upstream's status (429 unless it used another),
	// Retry-After when the renewal is known, and never retried by an SDK.
	failQuota: {status: http.StatusTooManyRequests, typ: "insufficient_quota", code: "quota_exhausted", noRetry: true},
	// The upstream's own limits hold the lane past the request's deadline:
	// the client learns at once when to come back, instead of at its
	// deadline; its SDK must not retry sooner on its own. (The codes
	// budget_exceeded and wait_exceeds_budget, which clients match on,
	// keep the word they were published with.)
	failWaitTooLong: {status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "wait_exceeds_budget", noRetry: true, shutdownWins: true},
	// Another replica, or this one restarted, can take the retry.
	failShutdown: {status: http.StatusServiceUnavailable, typ: "server_error", code: "shutting_down", retryAfter: time.Second},
	// The admin listener's guarded endpoints without the admin token.
	failAdminToken: {status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_admin_token"},
	// /readyz while the proxy cannot serve (draining, or Health.Ready's
	// reason): a load balancer sends the traffic elsewhere.
	failNotReady: {status: http.StatusServiceUnavailable, typ: "server_error", code: "not_ready", retryAfter: time.Second},
	// The admin listener's paths it does not serve, and routes and lanes
	// it does not have.
	failNotFound: {status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found"},
	// A change to lanes the admin endpoints cannot read (param names the
	// field).
	failBadAdminInput: {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_admin_request"},
	// A change to lanes from a client that may not make one (another
	// host without the admin token, another site's page).
	failAdminWrite: {status: http.StatusForbidden, typ: "invalid_request_error", code: "admin_write_refused"},
	// The admin listener without a token, asked by another name than
	// localhost or a loopback address (a page rebinding its own name).
	failAdminHost: {status: http.StatusForbidden, typ: "invalid_request_error", code: "admin_host_refused"},
	// A request body that arrived under LLMPROXY_MIN_BODY_RATE: it gave
	// back what it held rather than keep it at the client's pace.
	failBodyTooSlow: {status: http.StatusRequestTimeout, typ: "invalid_request_error", code: "body_too_slow"},
	failBadTier:     {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_tier", noRetry: true},
	failBadRun:      {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_run", noRetry: true},
	failBadBudget:   {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_budget", noRetry: true},
	// A budget applies and the price table cannot price the model.
	failBudgetUnpriced: {status: http.StatusBadRequest, typ: "invalid_request_error", code: "budget_unpriced", noRetry: true},
	// A run's, key's or route's budget is spent: nothing was sent
	// upstream, and a retry would meet the same budget.
	failBudget:      {status: http.StatusTooManyRequests, typ: "insufficient_quota", code: "budget_exhausted", noRetry: true},
	failBadJournal:  {status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_journal", noRetry: true},
	failJournalMiss: {status: http.StatusNotFound, typ: "invalid_request_error", code: "journal_miss", noRetry: true},
}

// errShutdown is the answer to requests cut short by Stop.
var errShutdown = fail(failShutdown, "the proxy is shutting down and stopped this request before the upstream answered; retry")

// replyFor maps an error to the answer the client gets at now: the
// proxy's own failures by kind, the lane's errors, anything else as
// internal.
func replyFor(err error, now time.Time) errorReply {
	var f *failure
	var we *lanequeue.WaitError
	var qe *lanequeue.QuotaError
	switch {
	case errors.As(err, &f):
	case errors.As(err, &we) && we.Held:
		// Nobody knows when a hold ends: a second, as a full queue's.
		f = &failure{kind: failWaitTooLong, retryAfter: time.Second,
			msg: "an operator's hold (llmproxy hold) held this lane past the request's deadline (LLMPROXY_MAX_WAIT or the client's timeout); retry once it is released"}
	case errors.As(err, &qe):
		f = quotaFailure(qe, now)
	case errors.As(err, &we):
		why := "the upstream's rate limit, as the proxy paces it,"
		if we.Paused {
			why = "the upstream's wait hint"
		}
		f = &failure{kind: failWaitTooLong, retryAfter: max(we.At.Sub(now), time.Millisecond),
			msg: why + " holds this key's requests past the request's deadline (LLMPROXY_MAX_WAIT or the client's timeout); retry after Retry-After"}
	case errors.Is(err, lanequeue.ErrQueueFull):
		f = &failure{kind: failQueueFull, msg: err.Error() + " (LLMPROXY_MAX_QUEUE); retry later"}
	case errors.Is(err, context.DeadlineExceeded): // the lane's wait ran past the request's deadline
		f = &failure{kind: failDeadline, msg: "the request's deadline passed (LLMPROXY_MAX_WAIT or the client's timeout): " + err.Error()}
	default:
		f = &failure{kind: failInternal, msg: "internal error"}
	}
	r := replies[f.kind]
	r.msg, r.param = f.msg, f.param
	if f.hasSpend {
		r.spent, r.budget = f.spent.String(), f.cap.String()
	}
	if f.retryAfter > 0 {
		r.retryAfter = f.retryAfter
	}
	if f.status > 0 {
		r.status = f.status
	}
	return r
}

// quotaFailure is the answer to a request its lane refused for a spent
// quota, at now: the upstream's status, and when the quota renews, on
// the clock and on the Pacific clock Google's quotas renew by, or that
// this is not known.
func quotaFailure(qe *lanequeue.QuotaError, now time.Time) *failure {
	f := &failure{kind: failQuota, status: qe.Status}
	const spent = "the upstream said this key's quota for this model is spent"
	if qe.Until.IsZero() {
		f.msg = spent + " and did not say when it renews; the proxy answers in its place and sends one request a minute upstream to see whether it has"
		return f
	}
	f.retryAfter = max(qe.Until.Sub(now), time.Millisecond)
	f.msg = spent + " until " + qe.Until.UTC().Format(time.RFC3339) + " (" + pacific.Clock(qe.Until, now) +
		"); the proxy answers in its place until then"
	if qe.Probed {
		f.msg += ", but for one request a minute sent upstream to see whether it renewed sooner (its words alone said so)"
	}
	return f
}

// setNoRetry tells the client's SDK not to retry the answer on its own
// (the OpenAI and Anthropic SDKs read X-Should-Retry first): the proxy
// retried already, or retrying cannot help.
func setNoRetry(h http.Header) { h.Set("X-Should-Retry", "false") }

func (e errorReply) write(w http.ResponseWriter) {
	h := w.Header()
	if e.retryAfter > 0 {
		secs := int64((e.retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		h.Set("Retry-After-Ms", strconv.FormatInt(e.retryAfter.Milliseconds(), 10))
	}
	if e.noRetry {
		setNoRetry(h)
	}
	// Every proxy-made message starts with "llmproxy: " so users can tell
	// it from the upstream's.
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(e.status)
	out := apiErrorBody{Message: "llmproxy: " + e.msg, Type: e.typ, Code: e.code}
	if e.param != "" {
		out.Param = &e.param
	}
	if e.budget != "" {
		out.SpentUSD, out.BudgetUSD = &e.spent, &e.budget
	}
	_ = json.NewEncoder(w).Encode(apiError{Error: out})
}
