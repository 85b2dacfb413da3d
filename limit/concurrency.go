package limit

import (
	"math"
	"time"
)

// concLimit is a pool's concurrency limit and its permits. The limit
// falls only on evidence that the number in flight is what the upstream
// bounds (a concurrency refusal, an overloaded answer, a refusal while the
// pace is well under the learned rate); a rate refusal slows the pace
// instead. Rate and concurrency are separate controls because in flight =
// rate × answer time: long answers need many in flight to keep a rate.
type concLimit struct {
	min, max int
	start    int // the configured start
	limit    int
	inFlight int // permits out
	// slowStart: no refusal yet, and the concurrency is not configured
	// (Limits.SlowStart); every second accepted answer that found the limit
	// full raises it by one (×1.5 per answer time).
	slowStart bool
	acks      int // accepted answers at the limit since the last change
	// refusedAt is the lowest level at which the upstream refused for
	// concurrency; growing back to it and past it takes regrowAcks limits'
	// worth of answers, so the limit still finds an upstream that allows
	// more later. Every refusal at that level again doubles regrowAcks;
	// both are forgotten refusedMemory after the latest concurrency
	// refusal.
	refusedAt   int
	regrowAcks  int
	lastRefusal time.Time // the latest concurrency refusal
	answerSecs  float64   // moving mean of accepted answers' time with a permit
}

const (
	// minRegrowAcks and maxRegrowAcks bound how many limits' worth of
	// accepted answers it takes to try again a level the upstream refused.
	minRegrowAcks = 10
	maxRegrowAcks = 80
	// refusedMemory is how long the refused level slows growth after the
	// latest concurrency refusal.
	refusedMemory = 30 * time.Second
	// answerWeight is the weight of the newest answer in answerSecs.
	answerWeight = 0.2
)

func newConcLimit(cfg Config) concLimit {
	return concLimit{min: cfg.MinConcurrency, max: cfg.MaxConcurrency, start: cfg.Concurrency, limit: cfg.Concurrency,
		slowStart: cfg.Limits.SlowStart(), regrowAcks: minRegrowAcks}
}

// reconfigure takes cfg's bounds: a configured concurrency is the limit
// from now on (and no slow start), else the limit stays, moved into the
// bounds.
func (c *concLimit) reconfigure(cfg Config) {
	c.min, c.max, c.start = cfg.MinConcurrency, cfg.MaxConcurrency, cfg.Concurrency
	if cfg.Limits.Concurrency > 0 {
		c.limit = cfg.Concurrency
		c.slowStart = false
	}
	c.limit = min(max(c.limit, c.min), c.max)
}

// littleFloor is the concurrency that rate (requests a second) needs for
// answers of secs (Little's law, rounded up), 0 when either is unknown.
func littleFloor(rate, secs float64) int {
	if rate <= 0 || secs <= 0 {
		return 0
	}
	return int(math.Ceil(rate * secs))
}

func (c *concLimit) free() bool { return c.inFlight < c.limit }

// accepted learns from an accepted answer, with out permits out now. little
// is the concurrency the learned rate needs for answers of the current
// length (0: unknown): below it the limit grows at once.
func (c *concLimit) accepted(t *Ticket, now time.Time, out, little int) {
	binding := out >= c.limit || t.InFlight+1 >= t.Limit
	if !binding || c.limit >= c.max {
		return // the limit was not what held requests back
	}
	if c.refusedAt > 0 && now.Sub(c.lastRefusal) > refusedMemory {
		// A refusal long ago (perhaps an overload that had nothing to do
		// with this key) no longer holds growth back.
		c.refusedAt, c.regrowAcks = 0, minRegrowAcks
	}
	regrowing := c.refusedAt > 0 && c.limit+1 >= c.refusedAt
	if c.limit < little && !regrowing {
		c.limit++
		return
	}
	c.acks++
	need := c.limit
	switch {
	case c.slowStart:
		need = 2
	case regrowing:
		need *= c.regrowAcks
	}
	if c.acks >= need {
		c.acks = 0
		c.limit++
	}
}

// refused learns from a refusal that points at concurrency. Each refusal
// lowers the limit by one: a limit k over what the upstream holds brings k
// refusals, so a burst of them lands on the upstream's level, while a lone
// refusal from a race (the upstream freeing a slot a moment after the
// proxy counted it free) costs one step, not half the limit. A stated
// concurrency refusal also brings the limit at once to the level the
// request went at and to what is out now (out, this one included): the
// upstream held no more. An overload or an inferred refusal only steps.
// least bounds a decrease that was inferred (0: none). A refusal never
// raises the limit.
func (c *concLimit) refused(t *Ticket, now time.Time, out, least int, stated bool) {
	c.lastRefusal = now
	c.acks = 0
	c.slowStart = false
	level := t.InFlight + 1
	switch {
	case c.refusedAt == 0 || level < c.refusedAt:
		c.refusedAt = level
	case level == c.refusedAt && c.limit >= level:
		c.regrowAcks = min(2*c.regrowAcks, maxRegrowAcks) // refused at the level again
	}
	next := c.limit - 1
	if stated {
		// The upstream said it refused for the number in flight: it held
		// no more than went with this request, nor than is out now.
		next = min(next, level, out)
	}
	c.limit = min(c.limit, c.max, max(next, least, c.min))
}

// overshot learns that nothing went through at level in flight or above
// while the slow start grew the limit: it goes back to what went through,
// but not under the configured start (a rate limit's first refusals come
// at any level) nor floor (Little's law needs the room for long answers).
func (c *concLimit) overshot(level, floor int) {
	c.limit = min(c.limit, max(level-1, c.start, floor))
}

// boundAt learns that the upstream refuses at level in flight and above,
// a concurrency limit: the limit holds the level below (within its
// bounds), the lowest such level is remembered as refused, and the slow
// start ends.
func (c *concLimit) boundAt(level int) {
	c.limit = min(c.limit, c.max, max(level-1, c.min))
	if c.refusedAt == 0 || level < c.refusedAt {
		c.refusedAt = level
	}
	c.slowStart = false
}

// answered feeds an accepted answer's time with its permit into the mean
// answer time.
func (c *concLimit) answered(t *Ticket, now time.Time) {
	if !t.accepted {
		return
	}
	d := now.Sub(t.Dispatched).Seconds()
	if c.answerSecs == 0 {
		c.answerSecs = d
	} else {
		c.answerSecs += answerWeight * (d - c.answerSecs)
	}
}
