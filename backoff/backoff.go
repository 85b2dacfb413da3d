// Package backoff is llmproxy's retry-delay policy: capped exponential
// backoff with jitter, and the rule for preferring a server's hint over it.
//
// It is pure: the random number is an argument, so callers decide where
// randomness comes from and tests need no seeding. It does not decide
// whether to retry, only how long to wait.
package backoff

import (
	"math"
	"time"
)

const (
	defaultBase   = 500 * time.Millisecond
	defaultMax    = 8 * time.Second
	defaultJitter = 0.25
)

// Policy is a capped exponential backoff with multiplicative jitter, the
// schedule the official OpenAI and Anthropic SDKs use:
// min(0.5s·2^n, 8s)·(1 − 0.25·rnd).
//
// The zero value is that schedule.
type Policy struct {
	// Base is the delay before the first retry, before jitter.
	// Zero or negative means 500ms.
	Base time.Duration
	// Max caps the delay before jitter. Zero or negative means 8s.
	// A Base larger than Max is capped to Max.
	Max time.Duration
	// Jitter is the largest fraction taken off at random, clamped to [0, 1].
	// Zero or NaN means 0.25, so the factor lies in (0.75, 1.0]. There is no
	// way to ask for no jitter: a tiny value such as 1e-9 comes close.
	Jitter float64
}

func (p Policy) base() time.Duration {
	if p.Base <= 0 {
		return defaultBase
	}
	return p.Base
}

func (p Policy) max() time.Duration {
	if p.Max <= 0 {
		return defaultMax
	}
	return p.Max
}

func (p Policy) jitter() float64 {
	switch {
	case p.Jitter == 0 || math.IsNaN(p.Jitter):
		return defaultJitter
	case p.Jitter < 0:
		return 0
	case p.Jitter > 1:
		return 1
	}
	return p.Jitter
}

// Delay is the wait before retry number retry, counting from 0 for the first
// retry: min(Base·2^retry, Max)·(1 − Jitter·rnd).
//
// rnd is a uniform random number in [0, 1), such as rand.Float64(); values
// outside that range are clamped into it and NaN counts as 0. A negative retry
// counts as 0, and any retry, however large, gives at most Max. For a fixed rnd
// the delay never decreases as retry grows.
func (p Policy) Delay(retry int, rnd float64) time.Duration {
	maxDelay := p.max()
	d := min(p.base(), maxDelay)
	for i := 0; i < retry && d < maxDelay; i++ {
		if d > maxDelay/2 {
			d = maxDelay
			break
		}
		d *= 2
	}
	switch {
	case !(rnd > 0): // also NaN
		rnd = 0
	case rnd >= 1:
		rnd = math.Nextafter(1, 0)
	}
	factor := 1 - p.jitter()*rnd // in [0, 1]
	scaled := float64(d) * factor
	if scaled >= float64(d) {
		// No jitter taken off; also keeps a d near MaxInt64, which rounds
		// up to 2^63 as a float, from overflowing on the way back.
		return d
	}
	// Rounding is monotone, so the result never decreases as d grows.
	return max(time.Duration(scaled), 0)
}

// Choose is the wait before retry number retry: the server's hint when it
// sent one (hasHint) and it is not negative, otherwise p.Delay(retry, rnd).
// A hint is used as is, however long; capping it is the caller's decision.
func (p Policy) Choose(retry int, hint time.Duration, hasHint bool, rnd float64) time.Duration {
	if hasHint && hint >= 0 {
		return hint
	}
	return p.Delay(retry, rnd)
}
