package lanequeue

import (
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// Verdict is what an answer says about the upstream's capacity.
type Verdict uint8

const (
	// Accepted: the upstream took the request (a success, or an error that
	// is not about capacity).
	Accepted Verdict = iota
	// RateRefused: a 429 for rate, requests or tokens over a window.
	RateRefused
	// ConcurrencyRefused: a refusal because too many requests are in
	// flight.
	ConcurrencyRefused
	// Overloaded: the upstream is overloaded (503, 529); it refuses by load,
	// as a concurrency limit does.
	Overloaded
	// Failed: another retryable server error (408, 500, 502, 504). It
	// teaches nothing about limits.
	Failed
	// NotSent: no answer, the connection failed. The attempt never reached
	// the upstream's accounting, so what it was charged is given back.
	NotSent
)

func (v Verdict) String() string {
	switch v {
	case Accepted:
		return "accepted"
	case RateRefused:
		return "rate_refused"
	case ConcurrencyRefused:
		return "concurrency_refused"
	case Overloaded:
		return "overloaded"
	case Failed:
		return "failed"
	case NotSent:
		return "not_sent"
	}
	return "unknown"
}

// Refusal reports whether the upstream said no for capacity.
func (v Verdict) Refusal() bool {
	return v.Limited() || v == Overloaded
}

// Limited reports whether the upstream refused for its limits (rate or
// concurrency), which waiting always meets; an overload may not pass.
func (v Verdict) Limited() bool { return v == RateRefused || v == ConcurrencyRefused }

// Pauses reports whether a retry after an answer with this verdict pauses
// the whole limit group rather than waiting alone: a rate refusal or an
// overload is about the group (a concurrency refusal waits for a permit).
func (v Verdict) Pauses() bool { return v == RateRefused || v == Overloaded }

// PauseReason names the pause an answer with this verdict sets (see
// View.PauseReason).
func (v Verdict) PauseReason() string {
	switch v {
	case RateRefused:
		return "rate_limited"
	case Overloaded:
		return "overloaded"
	}
	return "retry"
}

// Report is everything one attempt's answer tells the lane, handed over in
// one call so that learning, pausing and dispatching happen in that order
// under one lock.
type Report struct {
	// Status is the upstream's HTTP status; 0 when there was no answer.
	Status  int
	Verdict Verdict
	// Limits are the answer's rate-limit headers, with relative resets
	// parsed at the time the attempt was sent.
	Limits headerparse.Limits
	// Hint is the upstream's own wait before trying again; 0 = none.
	Hint time.Duration
	// PauseUntil pauses every lane of the group until then (zero: no
	// pause). A pause is only ever extended.
	PauseUntil time.Time
}

// Report tells the lane what the answer to the slot's latest dispatch said.
// Call it once per attempt, as soon as the answer's status and headers are
// in (or the attempt failed without one), before WaitRetry or Done.
//
// It reports whether the group holds the retry: it is paused until
// r.PauseUntil or later, or it learned that the number in flight is the
// bound, so a free permit is what the retry waits for. The group may
// decline a refusal's pause when what it learned holds the group better
// (see Shared.Learn); a request that asked for the pause and is not held
// waits out its own wait before it goes again (WaitRetry's after).
func (s *Slot) Report(r Report) (held bool) {
	l := s.lane
	g := l.g
	g.mu.Lock()
	if s.phase != phaseSent {
		held = !l.limit().shared.PausedUntil().Before(r.PauseUntil)
		g.mu.Unlock()
		return held // reported already, or released
	}
	now := g.clock.Now()
	lim := s.lim
	s.phase = phaseAnswered
	s.lastStatus = r.Status
	lim.unanswered--
	if r.Verdict != NotSent {
		lim.learned = true
	}
	l.stats.countAttempt(r.Status, now)
	if r.Verdict.Refusal() {
		l.stats.throttled++
	}
	before := lim.shared.PausedUntil()
	lim.shared.Learn(&s.ticket, r, now)
	if r.Verdict == NotSent {
		g.refundLocked(s) // it never reached the upstream
	}
	shared := g.shareLocked(lim, s, r.Limits.Requests)
	if g.togetherLocked(l.lim, s.lim, r, now) {
		shared = true
	}
	lim = l.limit() // the limit the lane draws on from now on
	var changes []Change
	var v View
	if g.onChange != nil {
		v = lim.shared.View(now)
	}
	// The group may decline an answer's pause (see Shared.Learn): count
	// the one it took.
	if from, until := clock.Later(before, now), lim.shared.PausedUntil(); r.PauseUntil.After(from) && until.After(from) {
		// This answer started a pause, or made one longer.
		reason := r.Verdict.PauseReason()
		started := !before.After(now)
		l.stats.countPause(reason, until.Sub(from), started)
		if started && g.onChange != nil {
			changes = append(changes, Change{Kind: Paused, Lane: l, At: now, Status: r.Status, Verdict: r.Verdict,
				View: v, PauseReason: reason, PauseFor: until.Sub(now)})
		}
	}
	if g.onChange != nil {
		changes = g.changesLocked(l, lim, r, v, now, changes, shared)
	}
	held = !lim.shared.PausedUntil().Before(r.PauseUntil)
	if !held && r.Verdict.Refusal() && !r.PauseUntil.IsZero() && lim.shared.View(now).Bound == BoundConcurrency {
		// The group learned that the number in flight is the bound: its
		// concurrency limit holds the retry until a permit frees.
		held = true
	}
	g.dispatchLocked(now)
	g.mu.Unlock()
	for _, c := range changes {
		g.onChange(c)
	}
	return held
}
