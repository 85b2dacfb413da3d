package lanequeue

import (
	"math"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// kick runs the dispatch again: the global cap has room for this group.
func (g *group) kick() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dispatchLocked(g.clock.Now())
}

// offCap takes the group out of the global cap's line: what holds its
// waiters back now, if anything, is not the cap. Requires g.mu held.
func (g *group) offCap() {
	if g.cap != nil {
		g.cap.leave(&g.seat)
	}
}

// queued is the number of waiters, every lane's.
func (g *group) queued() int { return g.queuedBy[High] + g.queuedBy[Low] }

// headLocked is the waiter to dispatch next: the head in turn order (see
// Lane.head), from the lane whose turn it is, of the lanes whose limit was
// not held in this pass; a high-priority one, unless low-priority ones have
// waited through lowShare-1 high dispatches in a row. Requires g.mu held.
func (g *group) headLocked() *Slot {
	if g.held != nil {
		return nil // an operator holds the route
	}
	var hi, lo *Slot
	start := g.next
	if start == nil {
		start = g.turns.first
	}
	for l, n := start, g.turns.n; n > 0; n-- {
		if l.drawsOn().pass != g.pass && l.held == nil {
			if hi == nil {
				hi = l.head(High)
			}
			if lo == nil {
				lo = l.head(Low)
			}
			if hi != nil && lo != nil {
				break
			}
		}
		if l = l.turnNext; l == nil {
			l = g.turns.first
		}
	}
	switch {
	case lo == nil:
		return hi
	case hi == nil || g.highRun >= lowShare-1:
		return lo
	}
	return hi
}

// enqueueLocked puts s in its lane's queue, in its client's (see
// Lane.push): after every waiter that arrived before it and before every
// one that arrived after it (a retry keeps its place). Requires g.mu held.
func (g *group) enqueueLocked(s *Slot) {
	s.phase = phaseQueued
	s.ready, s.signalled = nil, false
	l := s.lane
	if l.queued == 0 {
		g.turns.push(l)
	}
	l.queued++
	l.queuedCost += s.cost
	g.queuedBy[s.prio]++
	// Where its wait starts: what held the lanes back after this dispatch
	// pass is what s waited for.
	s.ahead, s.joinedPass = l.push(s), g.pass
}

// dequeueLocked takes a waiting s out of its lane's queue. Requires g.mu
// held.
func (g *group) dequeueLocked(s *Slot) {
	l := s.lane
	l.remove(s)
	l.queued--
	l.queuedCost -= s.cost
	g.queuedBy[s.prio]--
	if l.queued == 0 {
		if g.next == l {
			g.next = l.turnNext
		}
		g.turns.remove(l)
	}
}

// The slot keeps its ticket's bookkeeping, so that a Shared is told of
// each event once: a charge given back (refundLocked), the tokens an
// answer used (settleLocked, never after a refund), a permit given back
// (returnLocked). Each goes to the limit that gave the ticket, and
// requires g.mu held.

func (g *group) refundLocked(s *Slot) {
	if s.refunded {
		return
	}
	s.lim.shared.Refund(&s.ticket)
	s.refunded = true
}

func (g *group) settleLocked(s *Slot, usedTokens int64) {
	if s.refunded {
		return
	}
	s.lim.learnCountOf(s)
	s.lim.shared.Settle(&s.ticket, usedTokens)
	if s.lim.ceil != nil {
		s.lim.ceil.Settle(s.ticket.Cost, usedTokens)
	}
}

func (g *group) returnLocked(s *Slot, now time.Time) {
	if s.returned {
		return
	}
	s.lim.shared.Return(&s.ticket, now)
	s.returned = true
}

// returnPermitLocked gives back the permit of a slot that holds one.
// Requires g.mu held.
func (g *group) returnPermitLocked(s *Slot, now time.Time) {
	if s.phase == phaseSent {
		s.lim.unanswered-- // no answer will be reported for this dispatch
	}
	s.lane.inFlight--
	g.returnLocked(s, now)
	if s.capped {
		s.capped = false
		g.cap.giveBack()
	}
}

// forget tells the table that nothing refers to g any more. Call it after
// unlocking g.mu.
func (g *group) forget() { g.forgotten(g) }

// dispatchLocked grants waiters for as long as any can go, the lanes taking
// turns, and arms the timer at the earliest time a limit that held its
// lanes back may let them go. Requires g.mu held.
func (g *group) dispatchLocked(now time.Time) {
	g.pass++
	var wake time.Time
	hold := func(lim *pool, at time.Time, why int) {
		lim.pass = g.pass
		lim.heldAt[why] = g.pass
		if !at.IsZero() && (wake.IsZero() || at.Before(wake)) {
			wake = at
		}
	}
	for s := g.headLocked(); s != nil; s = g.headLocked() {
		lim := s.lane.drawsOn()
		if !g.quotaLocked(lim, s, now) {
			continue
		}
		if at, ok := lim.firstAnswerLocked(now); !ok {
			hold(lim, at, limitConcurrency)
			continue
		}
		cost := lim.counted(s.cost, s.output)
		if lim.ceil != nil {
			if at, ok := lim.ceil.Admit(now, cost, lim.shared); !ok {
				g.refuseLateLocked(lim, at)
				hold(lim, at, limitPace)
				continue
			}
		}
		if g.cap != nil && !g.cap.take(&g.seat) {
			g.capHeldAt = g.pass
			return // in the cap's line: a freed place dispatches again
		}
		t, at, ok := lim.shared.Admit(now, cost, lim.unanswered == 0)
		if !ok {
			if g.cap != nil {
				g.cap.giveBack()
			}
			if !at.IsZero() {
				g.refuseLateLocked(lim, at)
			}
			hold(lim, at, refusedFor(lim, now, at)) // a zero at: an answer or a returned permit dispatches again
			continue
		}
		g.grantLocked(now, s, lim, t)
	}
	g.offCap()
	if g.queued() > 0 && !wake.IsZero() {
		g.armLocked(now, wake)
	} else if g.timer != nil && g.queued() == 0 {
		// Nobody waits: a pending timer would only keep the group alive.
		g.timer.Stop()
		g.timer = nil
		g.timerGen++
	}
}

// grantLocked sends s, the head of its lane's queue, with ticket t of lim.
// Requires g.mu held.
func (g *group) grantLocked(now time.Time, s *Slot, lim *pool, t limit.Ticket) {
	switch {
	case s.prio == Low:
		g.highRun = 0
	case g.queuedBy[Low] > 0:
		g.highRun++
	}
	l := s.lane
	g.next = l.turnNext // the next lane's turn; in the lane, the next client's:
	c, r := s.client, &l.rounds[s.prio]
	c.dispatched++
	if c == r.next || r.next == nil && c == r.first {
		r.next = c.turn[s.prio].next // before s leaves the queue and c, maybe, the round
	}
	g.dequeueLocked(s)
	s.phase = phaseSent
	s.capped = g.cap != nil
	s.ticket, s.lim, s.refunded, s.returned = t, lim, false, false
	s.held = g.heldLocked(s, lim)
	g.sent++
	lim.sent++
	lim.share.dispatched(lim.sent, t.Dispatched)
	if lim.trial != nil {
		lim.sentOnTrialLocked(l.lim)
	}
	s.groupSent, s.limSent, s.fleet = g.sent, lim.sent, t.GroupSeq > 0
	if s.fleet {
		// Replicas sharing the state count every replica's dispatches:
		// what another limit of the group sent, as the upstream saw it.
		s.groupSent, s.limSent = t.GroupSeq, t.Seq
		g.fleet = true
	}
	if lim.firstSeq == 0 {
		lim.firstSeq, lim.firstAt = s.groupSent, t.Dispatched
	}
	l.inFlight++
	if !s.retry {
		l.stats.admitted++
	}
	lim.quota.sent(now)
	lim.unanswered++
	if lim.firstAnswerUntil.IsZero() {
		lim.firstAnswerUntil = now.Add(firstAnswerWindow)
	}
	if lim.ceil != nil {
		lim.ceil.Take(now, t.Cost)
	}
	s.signalLocked()
}

// refuseLateLocked gives up the wait of every waiter on lim whose deadline
// falls before at, the earliest lim lets the next of them go: nobody
// behind it goes sooner, so they would only wait until their deadline for
// an error. Requires g.mu held.
func (g *group) refuseLateLocked(lim *pool, at time.Time) {
	paused := !lim.shared.PausedUntil().Before(at)
	g.refuseLocked(lim, func(s *Slot) error {
		if !s.deadline.IsZero() && s.deadline.Before(at) {
			return &WaitError{At: at, Paused: paused}
		}
		return nil
	})
}

// refuseLocked gives up the wait of every waiter on lim for which why
// returns an error: each is taken out of the queue and told it. Requires
// g.mu held.
func (g *group) refuseLocked(lim *pool, why func(*Slot) error) {
	for l, next := g.turns.first, (*Lane)(nil); l != nil; l = next {
		next = l.turnNext // before l may leave the turns
		if l.drawsOn() != lim {
			continue
		}
		for p := range l.rounds {
			for c, nextC := l.rounds[p].first, (*client)(nil); c != nil; c = nextC {
				nextC = c.turn[p].next // before c may leave the round
				for e := c.waiters[p].Front(); e != nil; {
					next := e.Next()
					s := e.Value.(*Slot)
					if err := why(s); err != nil {
						g.dequeueLocked(s)
						s.refused = err
						s.signalLocked()
					}
					e = next
				}
			}
		}
	}
}

// queuedOn is the number of waiters on lim and their estimated tokens.
// Requires g.mu held.
func (g *group) queuedOn(lim *pool) (n int, cost int64) {
	for l := g.turns.first; l != nil; l = l.turnNext {
		if l.drawsOn() == lim {
			n += l.queued
			cost += l.queuedCost
		}
	}
	return n, cost
}

// minWake is the soonest the dispatch runs again after one that let
// nobody go: at the same instant nothing would have changed (an answer or
// a returned permit dispatches at once on its own).
const minWake = time.Millisecond

// armLocked makes sure dispatch runs again at `at`, minWake from now at
// the soonest. Requires g.mu held.
func (g *group) armLocked(now, at time.Time) {
	if soonest := now.Add(minWake); at.Before(soonest) {
		at = soonest
	}
	if g.timer != nil {
		if g.timerAt.Equal(at) {
			return
		}
		g.timer.Stop()
	}
	g.timerGen++
	gen := g.timerGen
	g.timerAt = at
	g.timer = g.clock.AfterFunc(at.Sub(now), func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.timerGen != gen {
			return
		}
		g.timer = nil
		g.dispatchLocked(g.clock.Now())
	})
}

// turns is the lanes with waiters, in the order they take turns: a list
// threaded through the lanes themselves, so that a lane joining it makes
// nothing.
type turns struct {
	first, last *Lane
	n           int
}

func (t *turns) push(l *Lane) {
	l.turnPrev, l.turnNext = t.last, nil
	if t.last != nil {
		t.last.turnNext = l
	} else {
		t.first = l
	}
	t.last = l
	t.n++
}

func (t *turns) remove(l *Lane) {
	if l.turnPrev != nil {
		l.turnPrev.turnNext = l.turnNext
	} else {
		t.first = l.turnNext
	}
	if l.turnNext != nil {
		l.turnNext.turnPrev = l.turnPrev
	} else {
		t.last = l.turnPrev
	}
	l.turnPrev, l.turnNext = nil, nil
	t.n--
}

// signalLocked tells s's wait that it was granted or refused. Requires
// g.mu held.
func (s *Slot) signalLocked() {
	s.signalled = true
	if s.ready != nil {
		close(s.ready)
	}
}

// heldLocked is what held s back since it joined, read as it is granted
// from lim: each reason lim held its lanes for in a later pass, and the
// cap if it held the group in one. A limit held in this pass lets none
// of its lanes go in it, so a pass that grants s counts no reason of its
// own. Requires g.mu held.
func (g *group) heldLocked(s *Slot, lim *pool) held {
	var h held
	for i, pass := range lim.heldAt {
		if pass > s.joinedPass {
			h |= heldPause << i
		}
	}
	if g.capHeldAt > s.joinedPass {
		h |= heldCap
	}
	return h
}

// quotaLocked applies lim's quota to its waiters at now, s the head: while
// it holds, every waiter is refused; when a probe is due, every one but s.
// It reports whether s may go on to be admitted. Requires g.mu held.
func (g *group) quotaLocked(lim *pool, s *Slot, now time.Time) bool {
	switch lim.quota.check(now) {
	case quotaNone:
		return true
	case quotaProbe:
		g.refuseLocked(lim, func(w *Slot) error {
			if w == s {
				return nil
			}
			return lim.quota.err()
		})
		return true
	}
	g.refuseLocked(lim, func(*Slot) error { return lim.quota.err() })
	return false
}

// refusedFor is why lim's Shared state refused a dispatch at now, when
// it said to ask again at at: its pause, else its pace, else (a zero at,
// only an answer or a returned permit can change it) its concurrency.
func refusedFor(lim *pool, now, at time.Time) int {
	switch {
	case lim.shared.PausedUntil().After(now):
		return limitPause
	case at.IsZero():
		return limitConcurrency
	}
	return limitPace
}

// An upstream counts a request's prompt its own way (its tokenizer, the
// whole JSON body), and its token limits are in its count; the output it
// reserves is the request's max_tokens either way. A limit learns how many
// of the upstream's prompt tokens one token of the proxy's estimate is,
// from the prompt tokens the answers' usage reported against the estimate,
// and charges its budgets, and the route's ceiling, in the upstream's
// count: the prompt scaled, the output as reserved.

// Bounds of a believable count per estimated token, and how much of each
// new reading moves it once one is known.
const (
	minPerEstimate  = 0.2
	maxPerEstimate  = 10
	perEstimateGain = 0.25
)

// learnCount takes an answer's usage (the prompt tokens it counted, below
// 1: none said) of a request whose prompt was estimated at estimate.
// Requires the group's mutex held.
func (l *pool) learnCount(estimate, used int64) {
	if estimate <= 0 || used <= 0 {
		return
	}
	r := math.Min(math.Max(float64(used)/float64(estimate), minPerEstimate), maxPerEstimate)
	if l.perEstimate == 0 {
		l.perEstimate = r
		return
	}
	l.perEstimate += perEstimateGain * (r - l.perEstimate)
}

// learnCountOf learns from s's answer: its prompt, the part of its cost
// that is not output, against what the upstream counted it as.
func (l *pool) learnCountOf(s *Slot) { l.learnCount(s.cost-s.output, s.prompted) }

// counted is what a request estimated at estimate tokens, output of them
// reserved for its output, costs in the upstream's count, as far as the
// answers have shown it. Requires the group's mutex held.
func (l *pool) counted(estimate, output int64) int64 {
	prompt := estimate - output
	if l.perEstimate == 0 || prompt <= 0 {
		return estimate
	}
	return max(1, int64(math.Round(float64(prompt)*l.perEstimate))+output)
}

// PromptCounted tells the slot what the upstream counted its request's
// prompt as: its answer's usage (input tokens). Call it before Done; the
// lane's limit learns from it how the upstream counts.
func (s *Slot) PromptCounted(tokens int64) { s.prompted = tokens }
