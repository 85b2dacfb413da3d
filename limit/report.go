package limit

import (
	"net/http"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// Verdict is what an answer says about the upstream's capacity.
type Verdict uint8

const (
	// Accepted: the upstream took the request (a success, or an error that
	// is not about capacity).
	Accepted Verdict = iota
	// RateRefused: a 429 for rate, requests or tokens over a window.
	RateRefused
	// ConcurrencyRefused: a refusal because too many requests are in
	// flight.
	ConcurrencyRefused
	// Overloaded: the upstream is overloaded (503, 529); it refuses by load,
	// as a concurrency limit does.
	Overloaded
	// Failed: another retryable server error (408, 500, 502, 504). It
	// teaches nothing about limits.
	Failed
	// NotSent: no answer, the connection failed; or the upstream refused
	// the credential (401, 403 without a quota). The attempt never reached
	// the accounting of the key's limits, so what it was charged is given
	// back: forged credentials spend no real key's pace.
	NotSent
)

func (v Verdict) String() string {
	switch v {
	case Accepted:
		return "accepted"
	case RateRefused:
		return "rate_refused"
	case ConcurrencyRefused:
		return "concurrency_refused"
	case Overloaded:
		return "overloaded"
	case Failed:
		return "failed"
	case NotSent:
		return "not_sent"
	}
	return "unknown"
}

// Refusal reports whether the upstream said no for capacity.
func (v Verdict) Refusal() bool {
	return v.Limited() || v == Overloaded
}

// Limited reports whether the upstream refused for its limits (rate or
// concurrency), which waiting always meets; an overload may not pass.
func (v Verdict) Limited() bool { return v == RateRefused || v == ConcurrencyRefused }

// Pauses reports whether a retry after an answer with this verdict pauses
// the whole pool rather than waiting alone: a rate refusal or an
// overload is about the pool (a concurrency refusal waits for a permit).
func (v Verdict) Pauses() bool { return v == RateRefused || v == Overloaded }

// PauseReason names the pause an answer with this verdict sets (see
// View.PauseReason).
func (v Verdict) PauseReason() pauseReason {
	switch v {
	case RateRefused:
		return pauseRateLimited
	case Overloaded:
		return pauseOverloaded
	}
	return pauseRetry
}

// Report is everything one attempt's answer tells the lane, handed over in
// one call so that learning, pausing and dispatching happen in that order
// under one lock.
type Report struct {
	// Status is the upstream's HTTP status; 0 when there was no answer.
	Status  int
	Verdict Verdict
	// Limits are the answer's rate-limit headers, with relative resets
	// parsed at the time the attempt was sent.
	Limits headerparse.Limits
	// Hint is the upstream's own wait before trying again; 0 = none.
	Hint time.Duration
	// PauseUntil pauses every lane of the pool until then (zero: no
	// pause). A pause is only ever extended.
	PauseUntil time.Time
	// Quota is a quota the answer says is spent, which waiting for a rate
	// cannot renew (a day's requests, a spend cap). The limit's lanes keep
	// it (package lanequeue, in each replica), not its Shared state.
	Quota headerparse.Quota
}

// VerdictOf reads what an answer says about the upstream's capacity:
// status is its HTTP status (0: no answer came), retryable whether the
// same request may get another answer later, and namesConcurrency whether
// its words name too many requests in flight.
func VerdictOf(status int, retryable, namesConcurrency bool) Verdict {
	if status == 0 || status == http.StatusUnauthorized || status == http.StatusForbidden {
		return NotSent // no answer, or the credential refused
	}
	switch {
	case !retryable && status == http.StatusTooManyRequests:
		return Failed // a hard quota: nothing about rate or load
	case !retryable:
		return Accepted
	case namesConcurrency:
		return ConcurrencyRefused
	case status == http.StatusTooManyRequests:
		return RateRefused
	case status == http.StatusServiceUnavailable || status == 529:
		return Overloaded
	}
	return Failed
}
