package lanequeue

import "time"

// local is the in-process Shared: the state of one group in this process.
type local struct {
	pace        pacer
	conc        concurrency
	pausedUntil time.Time
	pauseReason string
	// Dispatches at one instant form a batch: each is marked as if sent
	// first in it, since they reach the upstream in any order.
	batchAt time.Time
	batch   mark
}

// NewLocalShared returns the in-process Shared for a group with cfg's
// concurrency bounds.
func NewLocalShared(cfg Config) Shared { return NewLocal(cfg) }

// Local is the in-process Shared. A Shared kept elsewhere can learn with
// one beside it (see redisstate): it hands Local the answers to learn from
// and tells it of the dispatches made elsewhere with NoteDispatch.
type Local = local

// NewLocal returns the in-process state for a group with cfg's concurrency
// bounds.
func NewLocal(cfg Config) *Local {
	cfg = cfg.withDefaults()
	return &local{conc: newConcurrency(cfg)}
}

// NoteDispatch records a dispatch another store admitted, so that what
// Local learns about the group's own sending rate stays true.
func (s *local) NoteDispatch(now time.Time) { s.pace.recent.add(now) }

// NoteReturn records the end of an answer whose permit another store gave,
// for the mean answer time; Local's own permit count is not touched.
func (s *local) NoteReturn(t *Ticket, now time.Time) { s.conc.answered(t, now) }

func (s *local) Admit(now time.Time, cost int64, probe bool) (Ticket, time.Time, bool) {
	if now.Before(s.pausedUntil) {
		return Ticket{}, s.pausedUntil, false
	}
	if !s.conc.free() {
		return Ticket{}, time.Time{}, false
	}
	at, ok, room, paced := s.pace.admit(now, cost, probe)
	if !ok {
		return Ticket{}, at, false
	}
	if !now.Equal(s.batchAt) {
		s.batchAt, s.batch = now, s.pace.totals()
	}
	m := s.batch.plus(cost)
	s.pace.take(now, cost)
	t := Ticket{Dispatched: now, Cost: cost, Requests: m.requests, Tokens: m.tokens,
		InFlight: s.conc.inFlight, Limit: s.conc.limit, Room: room, Paced: paced}
	s.conc.inFlight++
	return t, time.Time{}, true
}

func (s *local) Learn(t *Ticket, r Report, now time.Time) {
	if r.PauseUntil.After(s.pausedUntil) {
		s.pausedUntil = r.PauseUntil
		switch r.Verdict {
		case RateRefused:
			s.pauseReason = "rate_limited"
		case Overloaded:
			s.pauseReason = "overloaded"
		default:
			s.pauseReason = "retry"
		}
	}
	if r.Verdict == NotSent {
		s.Refund(t)
		return
	}
	corrected := false
	if r.Verdict == RateRefused {
		// Before the refusal's own headers are read: they describe the
		// window as the upstream enforces it, and the correction decides
		// how far to trust what the headers said before.
		corrected = s.pace.contradicted(t, r.Limits, now)
	}
	s.pace.observe(r.Limits, t, now)
	switch r.Verdict {
	case Accepted:
		t.Accepted = true
		s.pace.accepted(t, now)
		s.conc.accepted(t, now, s.outNow(t), s.pace.littleFloor(s.conc.answerSecs))
	case RateRefused:
		if !corrected && t.Room && s.pace.underUsed(now) {
			// The pace is well under what the upstream admits by its own
			// account, yet it refused: what binds is the number in flight.
			s.conc.refused(t, now, s.outNow(t), s.pace.littleFloor(s.conc.answerSecs), false)
			return
		}
		s.pace.refused(t, r.Hint, now)
	case ConcurrencyRefused, Overloaded:
		s.conc.refused(t, now, s.outNow(t), 0, r.Verdict == ConcurrencyRefused)
	}
}

// outNow is how many permits are out as t's answer is learned from.
func (s *local) outNow(t *Ticket) int {
	if t.OutNow > 0 {
		return t.OutNow
	}
	return s.conc.inFlight
}

func (s *local) Refund(t *Ticket) {
	if t.Refunded {
		return
	}
	t.Refunded = true
	s.pace.refund(t.Cost)
}

func (s *local) Settle(t *Ticket, usedTokens int64) {
	if !t.Refunded {
		s.pace.settle(t.Cost, usedTokens, t.Tokens)
	}
}

func (s *local) Return(t *Ticket, now time.Time) {
	if t.Returned {
		return
	}
	t.Returned = true
	s.conc.returned(t, now)
}

func (s *local) PausedUntil() time.Time { return s.pausedUntil }

func (s *local) View(now time.Time) View {
	v := View{Concurrency: s.conc.limit, InFlight: s.conc.inFlight, AnswerSeconds: s.conc.answerSecs}
	if now.Before(s.pausedUntil) {
		v.PausedUntil, v.PauseReason = s.pausedUntil, s.pauseReason
	}
	v.Requests, v.Tokens = s.pace.view(now)
	switch {
	case s.pace.synthetic:
		v.Learned = "refusals"
	case s.pace.requests.known || s.pace.tokens.known:
		v.Learned = "headers"
	}
	v.Corrected = s.pace.requests.capped > 0 || s.pace.tokens.capped > 0
	return v
}
