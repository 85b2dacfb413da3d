package limit

// Config is what a new pool's state starts from: its concurrency limit,
// the bounds it moves in, and the route's configured limits.
type Config struct {
	// Concurrency is a new pool's concurrency limit; zero = 8. Until the
	// upstream first refuses for concurrency, every second accepted answer
	// while the limit is what holds requests back raises it by one (×1.5
	// each answer time), so a low start costs a few answer times, and an
	// upstream that limits concurrency is overrun by a few requests, not by
	// a whole burst.
	Concurrency    int
	MinConcurrency int // lowest the limit may fall to; zero = 1
	MaxConcurrency int // highest the limit may rise to; zero = 1024
	// Limits are the route's configured limits (see Limits): a configured
	// concurrency is the start, and as a ceiling also the highest.
	Limits Limits
}

// The defaults of Config's zero fields.
const (
	defaultConcurrency    = 8
	defaultMinConcurrency = 1
	defaultMaxConcurrency = 1024
)

// WithDefaults is c with its zero fields at their defaults and its start
// inside its bounds, as a pool uses it.
func (c Config) WithDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = defaultConcurrency
	}
	if c.MinConcurrency <= 0 {
		c.MinConcurrency = defaultMinConcurrency
	}
	if c.MaxConcurrency <= 0 {
		c.MaxConcurrency = defaultMaxConcurrency
	}
	if c.MaxConcurrency < c.MinConcurrency {
		c.MaxConcurrency = c.MinConcurrency
	}
	if n := c.Limits.Concurrency; n > 0 {
		c.Concurrency = n
		if !c.Limits.Start {
			c.MaxConcurrency = min(c.MaxConcurrency, n)
			c.MinConcurrency = min(c.MinConcurrency, c.MaxConcurrency)
		}
	}
	c.Concurrency = min(max(c.Concurrency, c.MinConcurrency), c.MaxConcurrency)
	return c
}
