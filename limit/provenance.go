package limit

import (
	"math"
	"strconv"
)

// rateFrom says where a pool's request pace comes from. Code compares
// the values; String is what /lanes, the logs and the dashboard show.
type rateFrom uint8

const (
	rateUnknown  rateFrom = iota // nothing learned yet
	rateHeaders                  // the upstream's rate-limit headers
	rateAdmitted                 // measured between refusals
	rateSending                  // what the pool sent before its first refusals, lowered by later ones
	rateHint                     // one request per "try again in"
	rateProbe                    // a probe above it met no refusal
	rateReplicas                 // the pace other replicas learned, at this one's first refusal
)

var rateFromText = [...]string{"", "headers", "admitted rate", "sending rate", "hint", "probe", "replicas"}

func (f rateFrom) String() string { return shown(f, rateFromText[:]) }

// Learned is the coarse source of f that /lanes and the logs show as
// learned_from: "headers", "refusals" (every source read from the
// behaviour of an upstream without headers) or "" (nothing yet). Code
// asks View.FromHeaders and View.FromRefusals.
func (f rateFrom) Learned() string {
	switch f {
	case rateUnknown:
		return ""
	case rateHeaders:
		return "headers"
	}
	return "refusals"
}

// Bound is what the behaviour of an upstream without headers says it
// limits.
type Bound uint8

const (
	boundUnknown     Bound = iota // not known, or learned from headers
	BoundRate                     // the pace binds
	BoundConcurrency              // the number in flight binds
)

var boundText = [...]string{"", "rate", "concurrency"}

func (b Bound) String() string { return shown(b, boundText[:]) }

// pauseReason says why a pool is paused (View.PauseReason). Code compares
// the values; String is what /lanes, the logs and the metrics' reason
// label show.
type pauseReason uint8

const (
	notPaused        pauseReason = iota
	pauseRateLimited             // a rate refusal's wait
	pauseOverloaded              // an overloaded upstream's wait
	pauseRetry                   // another retryable answer's wait
	pauseWindow                  // a fixed window's closure, to its stated boundary
	pauseShared                  // a pause another replica set (see redisstate)
)

var pauseReasonText = [...]string{"", "rate_limited", "overloaded", "retry", "window", "shared"}

func (p pauseReason) String() string { return shown(p, pauseReasonText[:]) }

// concurrencyFrom says where a pool's concurrency limit comes from
// (View.ConcurrencyFrom): the start grown by answers (concurrencyGrown),
// the upstream's words (concurrencyNamed), or, above zero, the number in
// flight the upstream's refusals showed is too many. String is what
// /lanes and the logs show.
type concurrencyFrom int

const (
	concurrencyGrown concurrencyFrom = 0
	// concurrencyNamed sits below every number in flight.
	concurrencyNamed concurrencyFrom = math.MinInt
)

func (c concurrencyFrom) String() string {
	if c > 0 {
		return "refusals at " + strconv.Itoa(int(c)) + " in flight"
	}
	if c == concurrencyNamed {
		return "words"
	}
	if c == concurrencyGrown {
		return ""
	}
	return "unknown"
}

// Known reports whether the upstream showed the limit, in its words or
// by its refusals, rather than answers grew it from the start.
func (c concurrencyFrom) Known() bool { return c != concurrencyGrown }

// shown is v's text in texts, "unknown" for a value out of their range.
func shown[T ~uint8](v T, texts []string) string {
	if int(v) < len(texts) {
		return texts[v]
	}
	return "unknown"
}
