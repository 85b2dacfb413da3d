package lanequeue

import "time"

// State is a point-in-time view of a lane, safe to show: it holds only the
// credential's short hash.
type State struct {
	ID          string    `json:"id"`
	Route       string    `json:"route"`
	KeyHash     string    `json:"key_hash"`
	Path        string    `json:"path"`
	Model       string    `json:"model"`
	Queued      int       `json:"queued"`
	InFlight    int       `json:"in_flight"`
	Concurrency int       `json:"concurrency_limit"`
	PausedUntil time.Time `json:"paused_until,omitzero"`
	Admitted    int64     `json:"admitted"`
	Retries     int64     `json:"retries"`
	Cancelled   int64     `json:"cancelled"`
	Rejected    int64     `json:"rejected"`
	Throttled   int64     `json:"throttled"`
	// What the lane has learned; zero while the upstream said nothing.
	RequestsLimit     float64   `json:"requests_limit,omitempty"`
	RequestsAvailable float64   `json:"requests_available,omitempty"`
	RequestsPerSecond float64   `json:"requests_per_second,omitempty"`
	TokensLimit       float64   `json:"tokens_limit,omitempty"`
	TokensAvailable   float64   `json:"tokens_available,omitempty"`
	TokensPerSecond   float64   `json:"tokens_per_second,omitempty"`
	LastUsed          time.Time `json:"last_used"`
}

// State returns the lane's current state.
func (l *Lane) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := State{
		ID: l.id, Route: l.key.Route, KeyHash: l.key.ShortKeyHash(), Path: l.key.Path, Model: l.key.Model,
		Queued: l.waiters.Len(), InFlight: l.inFlight, Concurrency: l.limit,
		Admitted: l.stats.admitted, Retries: l.stats.retries, Cancelled: l.stats.cancelled, Rejected: l.stats.rejected,
		Throttled: l.stats.throttled, LastUsed: l.lastUsed,
	}
	now := l.clock.Now()
	req, tok, reqKnown, tokKnown := l.pace.view(now)
	if reqKnown {
		s.RequestsLimit, s.RequestsAvailable, s.RequestsPerSecond = req.limit, req.avail, req.rate
	}
	if tokKnown {
		s.TokensLimit, s.TokensAvailable, s.TokensPerSecond = tok.limit, tok.avail, tok.rate
	}
	if l.pausedUntil.After(now) {
		s.PausedUntil = l.pausedUntil
	}
	return s
}
