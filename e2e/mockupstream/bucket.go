package mockupstream

import (
	"math"
	"time"
)

// epsilon absorbs floating-point error, so that a client that waits exactly
// the advertised retry-after-ms finds the bucket refilled.
const epsilon = 1e-6

// bucket is a token bucket refilled continuously at perSec up to capacity.
// A nil *bucket is an unlimited dimension: it always has room and takes
// nothing. bucket is not safe for concurrent use; Server.mu guards it.
type bucket struct {
	capacity float64
	perSec   float64
	level    float64
	last     time.Time // when level was last brought up to date
}

// newBucket returns a full bucket refilled at perMinute units per minute with
// room for burst units (0 = one second's worth, at least 1), or nil when
// perMinute is not positive.
func newBucket(perMinute, burst int64, now time.Time) *bucket {
	if perMinute <= 0 {
		return nil
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

// advance adds what has refilled since the last call. A clock that goes
// backwards refills nothing.
func (b *bucket) advance(now time.Time) {
	if b == nil || !now.After(b.last) {
		return
	}
	b.level = min(b.capacity, b.level+now.Sub(b.last).Seconds()*b.perSec)
	b.last = now
}

// waitFor is how long until the bucket holds n units: 0 if it already does.
// The caller must have called advance.
func (b *bucket) waitFor(n float64) time.Duration {
	if b == nil || b.level+epsilon >= n {
		return 0
	}
	return durationCeil((n - b.level) / b.perSec)
}

// untilFull is how long until the bucket is back at capacity.
func (b *bucket) untilFull() time.Duration {
	return durationCeil((b.capacity - b.level) / b.perSec)
}

// take removes n units; the caller has checked waitFor(n) == 0.
func (b *bucket) take(n float64) {
	if b != nil {
		b.level = max(0, b.level-n)
	}
}

// remaining is the whole units left, as the remaining-* headers report them.
func (b *bucket) remaining() int64 {
	return int64(math.Floor(b.level + epsilon))
}

// durationCeil converts seconds to a Duration, rounding up to the nanosecond.
func durationCeil(seconds float64) time.Duration {
	if seconds <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(seconds * float64(time.Second)))
}
