package limit

import "time"

// Limits are what a route's configuration says of its upstream's limits,
// per pool. Zero fields say nothing. By default they are ceilings:
// what is learned from the upstream may only lower them. With Start set
// they are where learning starts, and what the upstream shows replaces them.
type Limits struct {
	RPM         float64       // requests per minute
	TPM         float64       // tokens per minute
	Concurrency int           // requests in flight
	MinGap      time.Duration // between two request starts; always enforced
	Start       bool          // learning may replace RPM, TPM and Concurrency
	// PerCredential: every model of a credential draws on one limit (a
	// company gateway's or a LiteLLM virtual key's), not one limit per
	// model.
	PerCredential bool
}

// IsZero reports whether l configures no figure (RPM, TPM, Concurrency or
// MinGap).
func (l Limits) IsZero() bool { return l.RPM == 0 && l.TPM == 0 && l.Concurrency == 0 && l.MinGap == 0 }

// SlowStart reports whether a pool with these limits starts slow: until
// the upstream first refuses, its concurrency limit grows by half each
// answer time, and until a limit is learned the dispatches that growth
// frees at once are spread over part of an answer time, so that the first
// refusal comes back before the rest have gone. Only a configured
// concurrency says how many requests the upstream holds in flight; a
// configured RPM or TPM is a rate (and, as a ceiling, only the most the
// upstream may allow), so such a pool starts slow too. The one rule for
// the in-process state and for the replicas' shared one (redisstate's
// admit script is passed it).
func (l Limits) SlowStart() bool { return l.Concurrency == 0 }

// PerMinuteBounds are the least and the most a configured RPM or TPM
// other than 0 (none) may be: at the least, one request every 10,000
// minutes (about a week); a slower rate's spacing would not fit a
// time.Duration, and would turn pacing off instead of slowing it.
func PerMinuteBounds() (lo, hi float64) { return minPerMinute, maxPerMinute }

const (
	minPerMinute = 1e-4
	maxPerMinute = 1e12
)
