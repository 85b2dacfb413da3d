package lanequeue

// aimd adapts the lane's concurrency limit. Requires the lane's mutex held.
type aimd struct {
	min, max int
}

func (a *aimd) init(cfg Config) { a.min, a.max = cfg.MinConcurrency, cfg.MaxConcurrency }
