package lanequeue

import (
	"cmp"
	"fmt"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/internal/setting"
	"github.com/llmproxy/llmproxy/limit"
)

// Config holds a lane's limits. Zero fields take the documented defaults;
// the concurrency fields and Limits are those of limit.Config.
type Config struct {
	Concurrency    int         // a new group's concurrency limit; zero = 8
	MinConcurrency int         // lowest the limit may fall to; zero = 1
	MaxConcurrency int         // highest the limit may rise to; zero = 1024
	MaxQueue       int         // waiting requests per lane before ErrQueueFull; zero = 10000
	Clock          clock.Clock // nil = the wall clock
	// Limits are the route's configured limits (see limit.Limits).
	Limits limit.Limits
}

// limitConfig is the part of c a group's limit state starts from.
func (c Config) limitConfig() limit.Config {
	return limit.Config{Concurrency: c.Concurrency, MinConcurrency: c.MinConcurrency, MaxConcurrency: c.MaxConcurrency, Limits: c.Limits}
}

// The defaults of Config's and TableConfig's zero fields.
const (
	defaultMaxQueue = 10000
	defaultMaxLanes = 10000
	defaultIdleTTL  = 10 * time.Minute
	// defaultMetricLanes is how many lanes have series of their own in
	// the metrics, as many as a page of /lanes shows: the vouched-for
	// ones first, then the busiest, then the most recently used (see
	// Collector).
	defaultMetricLanes = 200
)

// WithDefaults is c with its zero fields at their documented defaults and
// its start inside its bounds, as a group uses it.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// Validate reports, as a *setting.Error, a negative count or bounds out
// of order once the zero ones take their defaults. A start outside the
// bounds is not an error: the group starts at the nearer bound.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Concurrency", c.Concurrency}, {"MinConcurrency", c.MinConcurrency}, {"MaxConcurrency", c.MaxConcurrency}, {"MaxQueue", c.MaxQueue}} {
		if f.v < 0 {
			return setting.Bad("lanequeue", f.name, fmt.Sprintf("%d is negative", f.v))
		}
	}
	d := limit.Config{}.WithDefaults()
	lo, hi := cmp.Or(c.MinConcurrency, d.MinConcurrency), cmp.Or(c.MaxConcurrency, d.MaxConcurrency)
	if lo > hi {
		return setting.Bad("lanequeue", "MinConcurrency", fmt.Sprintf("%d is above MaxConcurrency=%d", lo, hi))
	}
	return nil
}

func (c Config) withDefaults() Config {
	l := c.limitConfig().WithDefaults()
	c.Concurrency, c.MinConcurrency, c.MaxConcurrency = l.Concurrency, l.MinConcurrency, l.MaxConcurrency
	if c.MaxQueue <= 0 {
		c.MaxQueue = defaultMaxQueue
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// byOperator is who made an operator's change, and when.
type byOperator struct {
	at time.Time
	by string
}

// RuntimeLimits are a route's configured limits as an operator set them
// while the proxy runs, when, and by whom.
type RuntimeLimits struct {
	limit.ConfiguredView
	SetAt time.Time `json:"set_at"`
	By    string    `json:"by"`
}
