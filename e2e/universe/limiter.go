package universe

import (
	"math"
	"time"
)

// Shape is how a limit keeps its count (PROVIDERS.md §11).
type Shape string

const (
	// Bucket is a token bucket: Burst units, refilled at Rate a second.
	Bucket Shape = "bucket"
	// Window is a fixed window of Rate×Window units that opens with the
	// first request after the last one closed (Redis INCR + EXPIRE).
	Window Shape = "window"
	// Aligned is a fixed window aligned to the clock, shifted by Phase.
	Aligned Shape = "aligned"
	// Log is a sliding-window log: at most Rate×Window units admitted in
	// any trailing Window.
	Log Shape = "log"
)

// Limit is one limit of an upstream.
type Limit struct {
	Shape  Shape
	Rate   float64       // units a second, in the long run
	Burst  float64       // Bucket: its size in units
	Window time.Duration // Window, Aligned, Log
	Phase  time.Duration // Aligned: the windows start this far past the clock's
	Tokens bool          // counts tokens; else requests
}

// allowance is what one window admits.
func (l Limit) allowance(scale float64) float64 {
	return math.Max(1, math.Floor(l.Rate*l.Window.Seconds()*scale))
}

// capacity is a bucket's size at scale.
func (l Limit) capacity(scale float64) float64 { return math.Max(1, l.Burst*scale) }

// counter is one limit's count for one scope.
type counter struct {
	l     Limit
	level float64   // Bucket: units in it (negative: in debt)
	last  time.Time // Bucket: when level was last brought up to date
	start time.Time // Window, Aligned: the open window's start
	used  float64   // Window, Aligned: units taken in the open window
	log   []entry   // Log: admissions within the trailing window, oldest first
	init  bool
}

type entry struct {
	at   time.Time
	cost float64
}

// settle brings the count up to now at scale (the limit's size then).
func (c *counter) settle(now time.Time, scale float64) {
	switch c.l.Shape {
	case Bucket:
		size := c.l.capacity(scale)
		if !c.init {
			c.level, c.last, c.init = size, now, true
		}
		if d := now.Sub(c.last).Seconds(); d > 0 {
			c.level = math.Min(size, c.level+d*c.l.Rate*scale)
		}
		c.level = math.Min(c.level, size)
		c.last = now
	case Window:
		if !c.init || !now.Before(c.start.Add(c.l.Window)) {
			c.start, c.used, c.init = now, 0, true
		}
	case Aligned:
		start := now.Add(-c.l.Phase).Truncate(c.l.Window).Add(c.l.Phase)
		if start.After(now) {
			start = start.Add(-c.l.Window)
		}
		if !c.init || !start.Equal(c.start) {
			c.start, c.used, c.init = start, 0, true
		}
	case Log:
		cut := now.Add(-c.l.Window)
		i := 0
		for i < len(c.log) && !c.log[i].at.After(cut) {
			i++
		}
		c.log = c.log[i:]
	}
}

// room is whether cost fits now, and if not how long until it would if
// nothing else were taken.
func (c *counter) room(now time.Time, cost, scale float64) (bool, time.Duration) {
	switch c.l.Shape {
	case Bucket:
		if c.level >= cost {
			return true, 0
		}
		return false, seconds((cost - c.level) / (c.l.Rate * scale))
	case Window, Aligned:
		if c.used+cost <= c.l.allowance(scale) {
			return true, 0
		}
		return false, c.start.Add(c.l.Window).Sub(now)
	default: // Log
		sum := 0.0
		for _, e := range c.log {
			sum += e.cost
		}
		allow := c.l.allowance(scale)
		if sum+cost <= allow {
			return true, 0
		}
		for _, e := range c.log {
			sum -= e.cost
			if sum+cost <= allow {
				return false, e.at.Add(c.l.Window).Sub(now) + time.Nanosecond
			}
		}
		return false, c.l.Window
	}
}

// take charges cost.
func (c *counter) take(now time.Time, cost float64) {
	switch c.l.Shape {
	case Bucket:
		c.level -= cost
	case Window, Aligned:
		c.used += cost
	default:
		c.log = append(c.log, entry{now, cost})
	}
}

// remaining is what the count has left now, and how long until it is whole
// again (a bucket full, a window's end, the log's oldest entry gone).
func (c *counter) remaining(now time.Time, scale float64) (left float64, full time.Duration) {
	switch c.l.Shape {
	case Bucket:
		return math.Max(0, math.Floor(c.level)), seconds((c.l.capacity(scale) - c.level) / (c.l.Rate * scale))
	case Window, Aligned:
		return math.Max(0, c.l.allowance(scale)-c.used), c.start.Add(c.l.Window).Sub(now)
	default:
		sum := 0.0
		for _, e := range c.log {
			sum += e.cost
		}
		full := time.Duration(0)
		if n := len(c.log); n > 0 {
			full = c.log[n-1].at.Add(c.l.Window).Sub(now)
		}
		return math.Max(0, c.l.allowance(scale)-sum), full
	}
}

// stated is the size a header states for the limit: its true size
// (exact) or its per-minute figure (quantized).
func (c *counter) stated(scale float64, perMinute bool) float64 {
	if perMinute {
		return math.Round(c.l.Rate * scale * 60)
	}
	if c.l.Shape == Bucket {
		return math.Floor(c.l.capacity(scale))
	}
	return c.l.allowance(scale)
}

func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}
