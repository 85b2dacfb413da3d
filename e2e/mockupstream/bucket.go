package mockupstream

import (
	"math"
	"time"
)

// epsilon absorbs floating-point error, so that a client that waits exactly
// the advertised retry-after-ms finds the bucket refilled.
const epsilon = 1e-6

// limiter keeps one dimension's count (requests or tokens) of one key in
// one of the shapes upstreams keep it in: a token bucket or a fixed
// window. A nil limiter is an unlimited dimension. Limiters are not safe
// for concurrent use; Server.mu guards them. Every method but size wants
// advance(now) called first.
type limiter interface {
	// advance brings the count up to date at now.
	advance(now time.Time)
	// waitFor is how long until n units fit: 0 if they do now.
	waitFor(n float64, now time.Time) time.Duration
	// take removes n units: an admission, or a refusal that counts.
	take(n float64, now time.Time)
	// remaining is the whole units left, as remaining-* headers say.
	remaining() int64
	// untilFull is how long until the limit is back at its size: a
	// bucket's refill, a window's boundary.
	untilFull(now time.Time) time.Duration
	// size is the most the limit holds at once: a bucket's capacity, a
	// window's allowance.
	size() float64
	// span is the length of the limit's window, the time its size
	// refills over, for RateLimit-Policy's w.
	span() time.Duration
}

// newLimiter returns the limiter of cfg's shape for perMinute units a
// minute with room for burst (0 = one second's worth, at least 1; a
// window's allowance defaults to the window's share of perMinute), or nil
// when perMinute is not positive.
func newLimiter(cfg Config, perMinute, burst int64, now time.Time) limiter {
	if perMinute <= 0 {
		return nil
	}
	if cfg.Window > 0 {
		if burst <= 0 {
			burst = max(1, int64(math.Round(float64(perMinute)*cfg.Window.Seconds()/60)))
		}
		return newWindow(cfg.Window, float64(burst), cfg.WindowAligned, now)
	}
	if burst <= 0 {
		burst = max(1, perMinute/60)
	}
	return &bucket{
		capacity: float64(burst),
		perSec:   float64(perMinute) / 60,
		level:    float64(burst),
		last:     now,
	}
}

// bucket is a token bucket refilled continuously at perSec up to capacity.
// A refusal that counts (Config.CountRefused) takes from it too, and may
// leave it owing: the level goes below zero.
type bucket struct {
	capacity float64
	perSec   float64
	level    float64
	last     time.Time // when level was last brought up to date
}

// advance adds what has refilled since the last call. A clock that goes
// backwards refills nothing.
func (b *bucket) advance(now time.Time) {
	if !now.After(b.last) {
		return
	}
	b.level = min(b.capacity, b.level+now.Sub(b.last).Seconds()*b.perSec)
	b.last = now
}

func (b *bucket) waitFor(n float64, _ time.Time) time.Duration {
	if b.level+epsilon >= n {
		return 0
	}
	return durationCeil((n - b.level) / b.perSec)
}

func (b *bucket) untilFull(time.Time) time.Duration {
	return durationCeil((b.capacity - b.level) / b.perSec)
}

// take removes n units. An admission never takes more than is left; a
// counted refusal takes n whatever is left.
func (b *bucket) take(n float64, _ time.Time) { b.level -= n }

func (b *bucket) remaining() int64 {
	return max(0, int64(math.Floor(b.level+epsilon)))
}

func (b *bucket) size() float64 { return b.capacity }

func (b *bucket) span() time.Duration { return durationCeil(b.capacity / b.perSec) }

// durationCeil converts seconds to a Duration, rounding up to the nanosecond.
func durationCeil(seconds float64) time.Duration {
	if seconds <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(seconds * float64(time.Second)))
}
