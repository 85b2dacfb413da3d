package mockupstream

import (
	"math"
	"time"
)

// window is a fixed window: allowance units per length, the count starting
// again from zero at each boundary. An aligned window's boundaries are the
// multiples of length on the clock (Kong's rate limiting: the second, the
// minute); otherwise a window starts with the first request after the last
// one ended, as a Redis INCR + EXPIRE limiter's key does. Everything sent
// at a window's start is admitted up to the allowance; nothing more until
// the boundary.
type window struct {
	length    time.Duration
	allowance float64
	aligned   bool
	open      bool      // a window is running (always, when aligned)
	start     time.Time // when the running window began
	used      float64   // what it has counted
}

func newWindow(length time.Duration, allowance float64, aligned bool, now time.Time) *window {
	w := &window{length: length, allowance: allowance, aligned: aligned}
	w.advance(now)
	return w
}

// advance starts a new window when the running one has ended.
func (w *window) advance(now time.Time) {
	if w.aligned {
		if s := now.Truncate(w.length); !s.Equal(w.start) {
			w.start, w.used, w.open = s, 0, true
		}
		return
	}
	if w.open && !now.Before(w.start.Add(w.length)) {
		w.open, w.used = false, 0
	}
}

// waitFor is 0 while n fits in what the window has left, else the time to
// its boundary.
func (w *window) waitFor(n float64, now time.Time) time.Duration {
	if w.used+n <= w.allowance+epsilon {
		return 0
	}
	return w.untilFull(now)
}

// take counts n, opening a window counted from its first request.
func (w *window) take(n float64, now time.Time) {
	if !w.open {
		w.open, w.start = true, now
	}
	w.used += n
}

func (w *window) remaining() int64 {
	return max(0, int64(math.Floor(w.allowance-w.used+epsilon)))
}

// untilFull is the time to the running window's boundary, 0 when none
// runs.
func (w *window) untilFull(now time.Time) time.Duration {
	if !w.open {
		return 0
	}
	return max(0, w.start.Add(w.length).Sub(now))
}

func (w *window) size() float64 { return w.allowance }

func (w *window) span() time.Duration { return w.length }
