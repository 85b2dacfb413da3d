package lanequeue

import (
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// aimd adapts the lane's concurrency limit, for upstreams that limit
// concurrency or say nothing about their limits: halve on a 429, at most
// once per burst; add one after a limit's worth of successes while the limit
// is what holds requests back. Fields require the lane's mutex held.
type aimd struct {
	lastDecrease time.Time
	acks         int
}

// proactiveFraction: a window with less than this share left, and no reset
// to pace by, lowers concurrency before the upstream has to say no.
const proactiveFraction = 0.1

// decreaseLocked halves the limit unless a decrease already happened after
// the request that prompted this one was dispatched: 429s from requests that
// were already in flight count once. Requires l.mu held.
func (l *Lane) decreaseLocked(dispatched, now time.Time) {
	if !l.aimd.lastDecrease.IsZero() && !dispatched.After(l.aimd.lastDecrease) {
		return
	}
	l.aimd.lastDecrease = now
	l.aimd.acks = 0
	l.limit = max(l.cfg.MinConcurrency, l.limit/2)
}

// Observe tells the lane what one answer's headers said about the upstream's
// limits. Call it for every answer, with or without rate-limit headers: the
// first one ends the lane's probing. Parse relative resets with the time the
// attempt was sent, not the time its answer came.
func (s *Slot) Observe(lim headerparse.Limits) {
	l := s.lane
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	l.learned = true
	l.answeredLocked(s)
	l.pace.observe(lim, s.mark, s.dispatched, now)
	for _, w := range []headerparse.Window{lim.Requests, lim.Tokens} {
		if w.Limit > 0 && w.HasRemaining && float64(w.Remaining) < proactiveFraction*float64(w.Limit) && w.Reset.IsZero() {
			l.decreaseLocked(s.dispatched, now)
		}
	}
	l.dispatchLocked(now)
}

// Throttled tells the lane the upstream refused this request for rate or
// load (429, 503, 529), with its hint of when to try again (zero: none).
func (s *Slot) Throttled(hint time.Duration) {
	l := s.lane
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stats.throttled++
	now := l.clock.Now()
	l.decreaseLocked(s.dispatched, now)
	l.pace.refused(hint, now)
}

// Succeeded tells the lane the upstream accepted this request.
func (s *Slot) Succeeded() {
	l := s.lane
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pace.accepted(l.clock.Now())
	if l.inFlight < l.limit || l.limit >= l.cfg.MaxConcurrency {
		return // the limit is not what holds requests back
	}
	l.aimd.acks++
	if l.aimd.acks >= l.limit {
		l.aimd.acks = 0
		l.limit++
		l.dispatchLocked(l.clock.Now())
	}
}

// Settle corrects the token budget with what the request really used, when
// no answer since its dispatch has already told the upstream's own count.
func (s *Slot) Settle(usedTokens int64) {
	l := s.lane
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pace.settle(s.cost, usedTokens, s.mark)
	l.dispatchLocked(l.clock.Now())
}

// Refund gives back what the latest dispatch took from the budgets when the
// attempt never reached the upstream (a connection error).
func (s *Slot) Refund() {
	l := s.lane
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answeredLocked(s)
	l.pace.refund(s.cost)
	l.dispatchLocked(l.clock.Now())
}
