package lanequeue

import (
	"maps"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// State is a point-in-time view of a lane, safe to show: it holds only the
// credential's short hash.
type State struct {
	ID       string `json:"id"`
	Route    string `json:"route"`
	KeyHash  string `json:"key_hash"`
	Path     string `json:"path"`
	Model    string `json:"model"`
	Queued   int    `json:"queued"`
	InFlight int    `json:"in_flight"`
	// Sessions is the lane's open WebSocket sessions, joined after their
	// handshake; they hold no permit.
	Sessions    int       `json:"sessions,omitempty"`
	Concurrency int       `json:"concurrency_limit"` // of the lane's group
	PausedUntil time.Time `json:"paused_until,omitzero"`
	PauseReason string    `json:"pause_reason,omitempty"`
	// Quota says, while an answer's spent quota holds the lane's limit
	// (its requests are refused without a call upstream), until when in
	// words: "quota spent until 00:00 PT" or "quota spent, reset not
	// known"; QuotaUntil is that time, zero when not known.
	Quota       string    `json:"quota,omitempty"`
	QuotaUntil  time.Time `json:"quota_until,omitzero"`
	Admitted    int64     `json:"admitted"`
	Retries     int64     `json:"retries"`
	Cancelled   int64     `json:"cancelled"`
	Rejected    int64     `json:"rejected"`
	Throttled   int64     `json:"throttled"`
	Absorbed429 int64     `json:"absorbed_429"`
	// Answers counts the statuses clients got (0: none was sent), Outcomes
	// the same answers by outcome (the label Slot.Done was given);
	// Attempts the upstream's statuses per attempt (0: no answer).
	Answers  map[int]int64    `json:"answers,omitempty"`
	Outcomes map[string]int64 `json:"outcomes,omitempty"`
	Attempts map[int]int64    `json:"attempts,omitempty"`
	// answerCounts counts the answers by both, for the metrics.
	answerCounts map[answerKey]int64
	// Pauses counts the pauses this lane's answers started, by reason;
	// PausedSeconds the pause time they set.
	Pauses        map[string]int64   `json:"pauses,omitempty"`
	PausedSeconds map[string]float64 `json:"paused_seconds,omitempty"`
	// GroupQueued is the number of requests waiting in the lane's limit
	// group (this lane's and those of lanes sharing its limit), and
	// DrainSeconds an estimate of when the group will have sent them all:
	// the rest of the pause, then the longest of what the learned request
	// and token rates and the concurrency limit at the mean answer time
	// allow. 0 when nothing waits, or nothing is learned yet and no pause
	// holds the group.
	GroupQueued  int     `json:"group_queued"`
	DrainSeconds float64 `json:"drain_seconds,omitempty"`
	// History is the lane's last minutes of answers and upstream 429s;
	// only in StateWithHistory.
	History *History `json:"history,omitempty"`
	// What the lane's group has learned; zero while the upstream said
	// nothing.
	RequestsLimit     float64 `json:"requests_limit,omitempty"`
	RequestsAvailable float64 `json:"requests_available,omitempty"`
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	TokensLimit       float64 `json:"tokens_limit,omitempty"`
	TokensAvailable   float64 `json:"tokens_available,omitempty"`
	TokensPerSecond   float64 `json:"tokens_per_second,omitempty"`
	Learned           string  `json:"learned_from,omitempty"`
	// What the group believes binds and why (see View): Bound "rate" or
	// "concurrency" when learned from behaviour; RateFrom and
	// ConcurrencyFrom say where the pace and the concurrency limit come
	// from; AdmittedRate is the rate measured between refusals.
	Bound           string  `json:"bound,omitempty"`
	RateFrom        string  `json:"rate_from,omitempty"`
	AdmittedRate    float64 `json:"admitted_rate,omitempty"`
	ConcurrencyFrom string  `json:"concurrency_from,omitempty"`
	Corrected       bool    `json:"corrected_by_refusals,omitempty"`
	AnswerSeconds   float64 `json:"answer_seconds,omitempty"`
	Shared          string  `json:"shared,omitempty"` // "ok" or "degraded" when replicas share the group's state
	// Share is what this replica keeps to while Redis is away (Shared
	// "degraded"): its part of the limits the replicas shared.
	Share *limit.ShareView `json:"share,omitempty"`
	// Configured is the route's configured limits for the group, shown
	// beside what was learned; nil when none are.
	Configured *limit.ConfiguredView `json:"configured,omitempty"`
	// Shape says, when the upstream counts in another shape than a token
	// bucket, what the group learned of it and from what ("window of 200
	// per 10s, learned from refusals whose waits end at one boundary").
	Shape string `json:"shape,omitempty"`
	// SharesLimitWith names the other models whose lanes draw on the
	// lane's limit (the first 8; SharesLimitWithMore counts the rest),
	// and SharedBecause why: "configured"
	// (LLMPROXY_ROUTE_<NAME>_SHARED_LIMIT=credential), "headers move
	// together" or "refused together" (joined on trial).
	SharesLimitWith     []string `json:"shares_limit_with,omitempty"`
	SharesLimitWithMore int      `json:"shares_limit_with_more,omitempty"`
	SharedBecause       string   `json:"shared_because,omitempty"`
	// QueuedLow is how many of the lane's waiters are low priority (the
	// JSON name is older than the word and stays).
	QueuedLow int       `json:"group_queued_low,omitempty"`
	LastUsed  time.Time `json:"last_used"`
	// Clients are the lane's clients, by name, once a request named one
	// (x-llmproxy-client): they take turns within each priority class.
	Clients []ClientState `json:"clients,omitempty"`
	// Held says what an operator holds, "lane" or "route" (the lane
	// dispatches nothing until it is released), since when and by whom;
	// "" when nothing is held.
	Held      string    `json:"held,omitempty"`
	HeldSince time.Time `json:"held_since,omitzero"`
	HeldBy    string    `json:"held_by,omitempty"`
	// RuntimeLimits are the route's configured limits as an operator set
	// them while the proxy runs (Configured shows them in force); nil: as
	// the route started.
	RuntimeLimits *RuntimeLimits `json:"runtime_limits,omitempty"`
	// ClearedAt and ClearedBy say when and by whom an operator last
	// cleared what the lane's limit learned.
	ClearedAt time.Time `json:"cleared_at,omitzero"`
	ClearedBy string    `json:"cleared_by,omitempty"`
}

// State returns the lane's current state.
func (l *Lane) State() State { return l.state(false) }

// StateWithHistory returns the lane's current state with its History.
func (l *Lane) StateWithHistory() State { return l.state(true) }

func (l *Lane) state(withHistory bool) State {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	lim := l.drawsOn()
	v := lim.shared.View(now)
	queued, queuedCost := g.queuedOn(lim)
	s := State{
		ID: l.id, Route: l.key.Route, KeyHash: l.key.shortKeyHash(), Path: l.key.Path, Model: l.key.Model,
		Queued: l.queued, InFlight: l.inFlight, Sessions: int(l.sessions.Load()), Concurrency: v.Concurrency,
		PausedUntil: v.PausedUntil, PauseReason: v.PauseReason.String(),
		Admitted: l.stats.admitted, Retries: l.stats.retries, Cancelled: l.stats.cancelled, Rejected: l.stats.rejected,
		Throttled: l.stats.throttled, Absorbed429: l.stats.absorbed429,
		answerCounts: maps.Clone(l.stats.answers), Attempts: maps.Clone(l.stats.attempts),
		Pauses: maps.Clone(l.stats.pauses), PausedSeconds: maps.Clone(l.stats.pausedSecs),
		GroupQueued:  queued,
		DrainSeconds: drainSeconds(queued, queuedCost, v, now),
		Learned:      v.RateFrom.Learned(), Corrected: v.Corrected,
		Bound: v.Bound.String(), RateFrom: v.RateFrom.String(), AdmittedRate: v.AdmittedRate, ConcurrencyFrom: v.ConcurrencyFrom.String(), AnswerSeconds: v.AnswerSeconds, Shared: v.Shared,
		Share: v.Share, LastUsed: l.used(),
	}
	s.QuotaUntil, s.Quota = lim.quota.describe(now)
	if lim.ceil != nil {
		s.Configured = lim.ceil.View()
	}
	if h, what := l.operatorHoldLocked(); h != nil {
		s.Held, s.HeldSince, s.HeldBy = what, h.at, h.by
	}
	s.RuntimeLimits = g.set
	if c := lim.cleared; c != nil {
		s.ClearedAt, s.ClearedBy = c.at, c.by
	}
	s.Shape = v.Window.String()
	s.SharesLimitWith, s.SharesLimitWithMore, s.SharedBecause = lim.sharedWith(l.key.Model)
	s.QueuedLow = l.rounds[Low].queued
	s.Clients = l.clientStates(now)
	if v.Requests.Known {
		s.RequestsLimit, s.RequestsAvailable, s.RequestsPerSecond = v.Requests.Limit, v.Requests.Available, v.Requests.PerSecond
	}
	if v.Tokens.Known {
		s.TokensLimit, s.TokensAvailable, s.TokensPerSecond = v.Tokens.Limit, v.Tokens.Available, v.Tokens.PerSecond
	}
	if len(s.answerCounts) > 0 {
		s.Answers, s.Outcomes = map[int]int64{}, map[string]int64{}
		for k, n := range s.answerCounts {
			s.Answers[k.Status] += n
			s.Outcomes[k.Outcome] += n
		}
	}
	if withHistory {
		h := l.stats.hist.view(now)
		s.History = &h
	}
	return s
}

// drainSeconds estimates how long the group takes to send n queued
// requests costing tokens in all, from what v has learned: the rest of
// the pause, then the slowest of the request pace and the token pace (past
// what their windows still hold) and the concurrency limit at the mean
// answer time. 0 when nothing waits, or when nothing bounds the pace yet
// and no pause holds the group.
func drainSeconds(n int, tokens int64, v limit.View, now time.Time) float64 {
	if n == 0 {
		return 0
	}
	d := 0.0
	// What the window still holds goes at once; the rest at the pace.
	if b := v.Requests; b.Known && b.PerSecond > 0 {
		d = max(d, (float64(n)-max(b.Available, 0))/b.PerSecond)
	}
	if b := v.Tokens; b.Known && b.PerSecond > 0 {
		d = max(d, (float64(tokens)-max(b.Available, 0))/b.PerSecond)
	}
	if v.Concurrency > 0 && v.AnswerSeconds > 0 {
		d = max(d, float64(n)*v.AnswerSeconds/float64(v.Concurrency))
	}
	if v.PausedUntil.After(now) {
		// Nothing goes before the pause ends: at least that long, even
		// when nothing bounds the pace yet.
		d += v.PausedUntil.Sub(now).Seconds()
	}
	return d
}
