package limit

import (
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/internal/bucket"
)

// Ceiling enforces a pool's configured limits in front of its Shared
// state: the gap between starts (MinGap, and RPM as even spacing) and the
// token rate (TPM, a bucket of one second's worth). Guarded by the group's
// mutex.
type Ceiling struct {
	lim     Limits
	gapNext time.Time     // the earliest next start by MinGap
	rpm     bucket.Spacer // starts by RPM
	tok     bucket.Bucket // tokens by TPM (see sizeTokens)
	// replaced: Limits.Start and the Shared state learned a limit of its
	// own, which replaces RPM and TPM from then on.
	replaced bool
	// growth multiplies a start's RPM and TPM: a start that holds requests
	// back without a refusal grows, so an upstream that allows more (and
	// says nothing) is found; grownAt is its last growth.
	growth  float64
	grownAt time.Time
	// undo is the spacing as it stood before the latest start, at undo.at,
	// which Refund puts back.
	undo struct {
		at, gapNext time.Time
		rpm         bucket.Spacer
	}
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
	c.sizeTokens()
	c.tok.Set(time.Time{}, c.tok.Size)
	return c
}

// rpmOn and tpmOn report whether RPM and TPM still hold.
func (c *Ceiling) rpmOn() bool { return c.lim.RPM > 0 && !c.replaced }
func (c *Ceiling) tpmOn() bool { return c.lim.TPM > 0 && !c.replaced }

// sizeTokens sets the token bucket to TPM at the present growth: a
// second's worth, at least one token.
func (c *Ceiling) sizeTokens() {
	c.tok.Rate = c.lim.TPM * c.growth / 60
	c.tok.Size = max(c.tok.Rate, 1)
}

// admit reports whether a request of cost tokens may start now, or else
// when it may.
func (c *Ceiling) Admit(now time.Time, cost int64, sh Shared) (time.Time, bool) {
	if c.lim.Start && !c.replaced && sh.Knows() {
		c.replaced = true
	}
	at := now
	if c.lim.MinGap > 0 {
		at = clock.Later(at, c.gapNext)
	}
	if c.rpmOn() {
		at = clock.Later(at, c.rpm.Next())
	}
	if c.tpmOn() {
		if when, ok := c.tok.Admit(now, float64(cost)); !ok {
			at = clock.Later(at, when)
		}
	}
	if at.After(now) {
		if c.lim.Start && !c.replaced {
			switch {
			case c.grownAt.IsZero():
				c.grownAt = now
			case now.Sub(c.grownAt) >= startGrowEvery:
				// Held back a while and nothing learned: the upstream has
				// not refused the start's pace; try more. (The bucket was
				// refilled to now above: the new rate counts from now.)
				c.growth *= startGrowth
				c.grownAt = now
				c.sizeTokens()
			}
		}
		return at, false
	}
	return time.Time{}, true
}

// take charges a start of cost tokens at now.
func (c *Ceiling) Take(now time.Time, cost int64) {
	c.undo.at, c.undo.gapNext, c.undo.rpm = now, c.gapNext, c.rpm
	if g := c.lim.MinGap; g > 0 {
		// Never closer than the gap, whatever happened before.
		c.gapNext = now.Add(g)
	}
	if c.rpmOn() {
		// Even spacing, at RPM's gap; an idle spell gives no burst.
		c.rpm.Take(now, time.Duration(float64(time.Minute)/(c.lim.RPM*c.growth)))
	}
	if c.tpmOn() {
		c.tok.Refill(now)
		c.tok.Charge(float64(cost))
	}
}

// Refund gives back what Take charged a start at `at` of cost tokens,
// which the upstream refused for its credential: the tokens, and the
// spacing (MinGap, RPM) when it was the latest start; a later start keeps
// the spacing it was given.
func (c *Ceiling) Refund(at time.Time, cost int64) {
	if c.tpmOn() {
		c.tok.Refund(float64(cost))
	}
	if !at.IsZero() && at.Equal(c.undo.at) {
		c.gapNext, c.rpm = c.undo.gapNext, c.undo.rpm
		c.undo.at = time.Time{}
	}
}

// Settle swaps what a request of estimate tokens was charged (Take charges
// at most the bucket's size) for the tokens it used: an overrun is owed
// from the next refill.
func (c *Ceiling) Settle(estimate, used int64) {
	if c.tpmOn() {
		c.tok.Settle(float64(estimate), float64(used))
	}
}

// ConfiguredView is what a pool's configured limits are now.
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
	v := c.lim.View()
	if c.replaced {
		v.Mode = "replaced"
	}
	return &v
}

// View is what l configures: its figures, and "ceiling" or "start".
func (l Limits) View() ConfiguredView {
	v := ConfiguredView{RPM: l.RPM, TPM: l.TPM, Concurrency: l.Concurrency, MinGapSecs: l.MinGap.Seconds(), Mode: "ceiling"}
	if l.Start {
		v.Mode = "start"
	}
	return v
}
