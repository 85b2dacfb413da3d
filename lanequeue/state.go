package lanequeue

import (
	"maps"
	"time"
)

// laneStats are a lane's counters; they live and die with the lane.
type laneStats struct {
	admitted    int64
	retries     int64
	cancelled   int64
	rejected    int64
	throttled   int64
	absorbed429 int64
	answers     map[int]int64 // status the client got (0: it went away)
	attempts    map[int]int64 // upstream status per attempt (0: no answer)
}

func (s *laneStats) countAnswer(status int) {
	if s.answers == nil {
		s.answers = map[int]int64{}
	}
	s.answers[status]++
}

func (s *laneStats) countAttempt(status int) {
	if s.attempts == nil {
		s.attempts = map[int]int64{}
	}
	s.attempts[status]++
}

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
	Concurrency int       `json:"concurrency_limit"` // of the lane's group
	PausedUntil time.Time `json:"paused_until,omitzero"`
	PauseReason string    `json:"pause_reason,omitempty"`
	Admitted    int64     `json:"admitted"`
	Retries     int64     `json:"retries"`
	Cancelled   int64     `json:"cancelled"`
	Rejected    int64     `json:"rejected"`
	Throttled   int64     `json:"throttled"`
	Absorbed429 int64     `json:"absorbed_429"`
	// Answers counts the statuses clients got; Attempts the upstream's
	// statuses per attempt (0: no answer).
	Answers  map[int]int64 `json:"answers,omitempty"`
	Attempts map[int]int64 `json:"attempts,omitempty"`
	// What the lane's group has learned; zero while the upstream said
	// nothing.
	RequestsLimit     float64   `json:"requests_limit,omitempty"`
	RequestsAvailable float64   `json:"requests_available,omitempty"`
	RequestsPerSecond float64   `json:"requests_per_second,omitempty"`
	TokensLimit       float64   `json:"tokens_limit,omitempty"`
	TokensAvailable   float64   `json:"tokens_available,omitempty"`
	TokensPerSecond   float64   `json:"tokens_per_second,omitempty"`
	Learned           string    `json:"learned_from,omitempty"`
	Corrected         bool      `json:"corrected_by_refusals,omitempty"`
	AnswerSeconds     float64   `json:"answer_seconds,omitempty"`
	Shared            string    `json:"shared,omitempty"` // "ok" or "degraded" when replicas share the group's state
	LastUsed          time.Time `json:"last_used"`
}

// State returns the lane's current state.
func (l *Lane) State() State {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	v := g.shared.View(now)
	s := State{
		ID: l.id, Route: l.key.Route, KeyHash: l.key.ShortKeyHash(), Path: l.key.Path, Model: l.key.Model,
		Queued: l.queued, InFlight: l.inFlight, Concurrency: v.Concurrency,
		PausedUntil: v.PausedUntil, PauseReason: v.PauseReason,
		Admitted: l.stats.admitted, Retries: l.stats.retries, Cancelled: l.stats.cancelled, Rejected: l.stats.rejected,
		Throttled: l.stats.throttled, Absorbed429: l.stats.absorbed429,
		Answers: maps.Clone(l.stats.answers), Attempts: maps.Clone(l.stats.attempts),
		Learned: v.Learned, Corrected: v.Corrected, AnswerSeconds: v.AnswerSeconds, Shared: v.Shared,
		LastUsed: l.lastUsed,
	}
	if v.Requests.Known {
		s.RequestsLimit, s.RequestsAvailable, s.RequestsPerSecond = v.Requests.Limit, v.Requests.Available, v.Requests.PerSecond
	}
	if v.Tokens.Known {
		s.TokensLimit, s.TokensAvailable, s.TokensPerSecond = v.Tokens.Limit, v.Tokens.Available, v.Tokens.PerSecond
	}
	return s
}
