package limit

import (
	"math"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// Ceiling enforces a group's configured limits in front of its Shared
// state: the gap between starts (MinGap, and RPM as even spacing) and the
// token rate (TPM, a bucket of one second's worth). Guarded by the group's
// mutex.
type Ceiling struct {
	lim      Limits
	gapNext  time.Time // the earliest next start by MinGap
	rpmNext  time.Time // the earliest next start by RPM
	tokAvail float64   // tokens left at tokAt
	tokAt    time.Time
	// replaced: Limits.Start and the Shared state learned a limit of its
	// own, which replaces RPM and TPM from then on.
	replaced bool
	// growth multiplies a start's RPM and TPM: a start that holds requests
	// back without a refusal grows, so an upstream that allows more (and
	// says nothing) is found; grownAt is its last growth.
	growth  float64
	grownAt time.Time
}

// Growth of a start that holds requests back while nothing is learned:
// by startGrowth every startGrowEvery.
const (
	startGrowth    = 1.25
	startGrowEvery = time.Second
)

// Ceiling returns the enforcement of l, starting full.
func (l Limits) Ceiling() *Ceiling {
	c := &Ceiling{lim: l, growth: 1}
	c.tokAvail = c.tokCap()
	return c
}

// rpmOn and tpmOn report whether RPM and TPM still hold.
func (c *Ceiling) rpmOn() bool { return c.lim.RPM > 0 && !c.replaced }
func (c *Ceiling) tpmOn() bool { return c.lim.TPM > 0 && !c.replaced }

// rpmGap is the spacing of starts that RPM asks for.
func (c *Ceiling) rpmGap() time.Duration {
	return time.Duration(float64(time.Minute) / (c.lim.RPM * c.growth))
}

func (c *Ceiling) tokRate() float64 { return c.lim.TPM * c.growth / 60 }

// tokCap is the token bucket's size: one second's worth.
func (c *Ceiling) tokCap() float64 { return max(c.tokRate(), 1) }

func (c *Ceiling) refill(now time.Time) {
	if !c.tokAt.IsZero() && now.After(c.tokAt) {
		c.tokAvail = math.Min(c.tokCap(), c.tokAvail+c.tokRate()*now.Sub(c.tokAt).Seconds())
	}
	if now.After(c.tokAt) {
		c.tokAt = now
	}
}

// admit reports whether a request of cost tokens may start now, or else
// when it may.
func (c *Ceiling) Admit(now time.Time, cost int64, sh Shared) (time.Time, bool) {
	if c.lim.Start && !c.replaced {
		if sh.Knows() {
			c.replaced = true
		}
	}
	at := now
	if c.lim.MinGap > 0 {
		at = clock.Later(at, c.gapNext)
	}
	if c.rpmOn() {
		at = clock.Later(at, c.rpmNext)
	}
	if c.tpmOn() {
		c.refill(now)
		if need := math.Min(float64(cost), c.tokCap()); c.tokAvail < need {
			secs := math.Min((need-c.tokAvail)/c.tokRate(), maxWaitSeconds)
			at = clock.Later(at, now.Add(max(time.Duration(math.Ceil(secs*float64(time.Second))), time.Millisecond)))
		}
	}
	if at.After(now) {
		if c.lim.Start && !c.replaced {
			switch {
			case c.grownAt.IsZero():
				c.grownAt = now
			case now.Sub(c.grownAt) >= startGrowEvery:
				// Held back a while and nothing learned: the upstream has
				// not refused the start's pace; try more.
				c.growth *= startGrowth
				c.grownAt = now
			}
		}
		return at, false
	}
	return time.Time{}, true
}

// take charges a start of cost tokens at now.
func (c *Ceiling) Take(now time.Time, cost int64) {
	if g := c.lim.MinGap; g > 0 {
		// Never closer than the gap, whatever happened before.
		c.gapNext = now.Add(g)
	}
	if c.rpmOn() {
		// Even spacing, kept in step with the plan when a timer fires a
		// little late (up to a tenth of a gap), so the rate holds; an
		// idle spell gives no burst.
		g := c.rpmGap()
		if c.rpmNext.IsZero() || now.Sub(c.rpmNext) > g/10 {
			c.rpmNext = now
		}
		c.rpmNext = c.rpmNext.Add(g)
	}
	if c.tpmOn() {
		c.refill(now)
		c.tokAvail -= math.Min(float64(cost), c.tokCap())
	}
}

// Settle swaps what a request of estimate tokens was charged (Take charges
// at most the bucket's size) for the tokens it used.
func (c *Ceiling) Settle(estimate, used int64) {
	if c.tpmOn() {
		c.tokAvail = math.Min(c.tokCap(), c.tokAvail+math.Min(float64(estimate), c.tokCap())-float64(used))
	}
}

// ConfiguredView is what a group's configured limits are now.
type ConfiguredView struct {
	RPM         float64 `json:"rpm,omitempty"`
	TPM         float64 `json:"tpm,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	MinGapSecs  float64 `json:"min_gap_seconds,omitempty"`
	// Mode is "ceiling" or "start"; "replaced" once learning replaced a
	// start.
	Mode string `json:"mode"`
}

func (c *Ceiling) View() *ConfiguredView {
	v := &ConfiguredView{RPM: c.lim.RPM, TPM: c.lim.TPM, Concurrency: c.lim.Concurrency,
		MinGapSecs: c.lim.MinGap.Seconds(), Mode: "ceiling"}
	switch {
	case c.replaced:
		v.Mode = "replaced"
	case c.lim.Start:
		v.Mode = "start"
	}
	return v
}
