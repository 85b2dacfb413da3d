package lanequeue

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// group is the lanes that draw on one upstream limit. It holds the one mutex
// that guards them, a single queue of their waiters in arrival order (so
// each lane's own queue is FIFO too), and the Shared state it dispatches
// against.
type group struct {
	key    string
	cfg    Config
	clock  clock.Clock
	shared Shared
	// forgotten is called, outside mu, once nothing refers to the group any
	// more; the table drops it then. nil outside a table.
	forgotten func(*group)
	// onChange receives the group's state changes; nil: none are made.
	onChange func(Change)

	mu sync.Mutex
	// waiters are the queue, one list per priority, each in arrival
	// order (a retry keeps its place in its own).
	waiters    [2]list.List // *Slot, by Priority
	queuedCost int64        // the waiters' estimated tokens
	// highRun counts high-priority dispatches in a row while low ones
	// waited; at LowShare-1 the next dispatch is a low one.
	highRun int
	// ceil holds the route's configured limits; nil when none are.
	ceil *ceiling
	// cap is the global cap every dispatch takes a place of; nil: none.
	cap        *Cap
	seen       seen      // what was last reported through onChange
	arrivals   uint64    // arrival counter, for the order of retries
	unanswered int       // dispatches whose answer has not been reported
	learned    bool      // an answer came back: the probe is over
	probeUntil time.Time // set by the first dispatch; see probeWindow
	timer      clock.Timer
	timerAt    time.Time
	timerGen   uint64
	// refs counts what keeps the group alive: each of its lanes while the
	// table holds it, and each slot from Acquire until it is done. It is
	// atomic so that the table never takes mu: a group may hold mu through
	// a slow call to a shared store, and that must not hold up the table.
	refs atomic.Int64
}

func newGroup(key string, cfg Config, shared Shared, forgotten func(*group)) *group {
	g := &group{key: key, cfg: cfg, clock: cfg.Clock, shared: shared, forgotten: forgotten}
	if !cfg.Limits.IsZero() {
		g.ceil = newCeiling(cfg.Limits)
		// A configured limit is known: no need to wait for the first
		// answer to learn one.
		g.learned = cfg.Limits.RPM > 0 || cfg.Limits.TPM > 0 || cfg.Limits.Concurrency > 0
	}
	return g
}

// answeredElsewhere reports whether sh is shared with other replicas of
// the proxy and one of them has learned from an answer of the group
// lately: the first-answer probe need not wait for one of this replica's
// own.
func answeredElsewhere(sh Shared) bool {
	a, ok := sh.(interface{ AnsweredElsewhere() bool })
	return ok && a.AnsweredElsewhere()
}

// kick runs the dispatch again: the global cap has room for this group.
func (g *group) kick() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dispatchLocked(g.clock.Now())
}

// offCap takes the group out of the global cap's line: what holds its
// head back now, if anything, is not the cap. Requires g.mu held.
func (g *group) offCap() {
	if g.cap != nil {
		g.cap.leave(g)
	}
}

// queued is the number of waiters.
func (g *group) queued() int { return g.waiters[High].Len() + g.waiters[Low].Len() }

// head is the waiter to dispatch next: the first high-priority one,
// unless low-priority ones have waited through LowShare-1 high dispatches
// in a row.
func (g *group) head() *Slot {
	hi, lo := g.waiters[High].Front(), g.waiters[Low].Front()
	switch {
	case lo == nil && hi == nil:
		return nil
	case lo == nil:
		return hi.Value.(*Slot)
	case hi == nil || g.highRun >= LowShare-1:
		return lo.Value.(*Slot)
	}
	return hi.Value.(*Slot)
}

// newLane makes a lane of g with its ID. The caller accounts for the
// lane's reference.
func (g *group) newLane(key Key, id string) *Lane {
	l := &Lane{key: key, id: id, g: g}
	l.touch(g.clock.Now())
	return l
}

// enqueueLocked puts s in the queue: after every waiter that arrived before
// it and before every one that arrived after it (a retry keeps its place).
// Requires g.mu held.
func (g *group) enqueueLocked(s *Slot) {
	s.phase = phaseQueued
	s.ready, s.signalled = nil, false
	s.lane.queued++
	g.queuedCost += s.cost
	q := &g.waiters[s.prio]
	if s.retry {
		for at := q.Front(); at != nil; at = at.Next() {
			if at.Value.(*Slot).seq > s.seq {
				s.elem = q.InsertBefore(s, at)
				return
			}
		}
	}
	s.elem = q.PushBack(s)
}

// dequeueLocked takes a waiting s out of the queue. Requires g.mu held.
func (g *group) dequeueLocked(s *Slot) {
	g.waiters[s.prio].Remove(s.elem)
	s.elem = nil
	s.lane.queued--
	g.queuedCost -= s.cost
}

// The group keeps each ticket's bookkeeping, so that a Shared is told of
// each event once: a charge given back (refundLocked), the tokens an
// answer used (settleLocked, never after a refund), a permit given back
// (returnLocked). Each requires g.mu held.

func (g *group) refundLocked(t *Ticket) {
	if t.Refunded {
		return
	}
	g.shared.Refund(t)
	t.Refunded = true
}

func (g *group) settleLocked(t *Ticket, usedTokens int64) {
	if t.Refunded {
		return
	}
	g.shared.Settle(t, usedTokens)
	if g.ceil != nil {
		g.ceil.settle(t.Cost, usedTokens)
	}
}

func (g *group) returnLocked(t *Ticket, now time.Time) {
	if t.Returned {
		return
	}
	g.shared.Return(t, now)
	t.Returned = true
}

// returnPermitLocked gives back the permit of a slot that holds one.
// Requires g.mu held.
func (g *group) returnPermitLocked(s *Slot, now time.Time) {
	if s.phase == phaseSent {
		g.unanswered-- // no answer will be reported for this dispatch
	}
	s.lane.inFlight--
	g.returnLocked(&s.ticket, now)
	if s.capped {
		s.capped = false
		g.cap.giveBack()
	}
}

// unrefLocked drops one reference and reports whether it was the last.
// Requires g.mu held.
func (g *group) unrefLocked() bool {
	return g.refs.Add(-1) == 0 && g.forgotten != nil
}

// forget tells the table that nothing refers to g any more. Call it after
// unlocking g.mu.
func (g *group) forget() { g.forgotten(g) }

// dispatchLocked grants the head of the queue for as long as it can go, and
// arms the timer when the head must wait for time. Requires g.mu held.
func (g *group) dispatchLocked(now time.Time) {
	for s := g.head(); s != nil; s = g.head() {
		if !g.learned && g.unanswered > 0 && answeredElsewhere(g.shared) {
			g.learned = true // another replica's answer taught the group
		}
		if !g.learned && g.unanswered > 0 {
			if now.Before(g.probeUntil) {
				g.offCap()
				g.armLocked(now, g.probeUntil)
				return
			}
			g.learned = true // the first answer is slow; stop waiting for it
		}
		// With no answer outstanding, a budget that can only learn more
		// from an answer lets this request go to find out.
		if g.ceil != nil {
			if at, ok := g.ceil.admit(now, s.cost, g.shared); !ok {
				g.offCap()
				g.refuseLateLocked(at)
				if g.queued() > 0 {
					g.armLocked(now, at)
				}
				return
			}
		}
		if g.cap != nil && !g.cap.take(g) {
			return // in the cap's line: a freed place dispatches again
		}
		t, at, ok := g.shared.Admit(now, s.cost, g.unanswered == 0)
		if !ok {
			if g.cap != nil {
				g.cap.giveBack()
			}
			if !at.IsZero() {
				g.refuseLateLocked(at)
				if g.queued() > 0 {
					g.armLocked(now, at)
				}
			}
			return // else an answer or a returned permit dispatches again
		}
		g.grantLocked(now, s, t)
	}
	g.offCap()
	if g.timer != nil {
		// Nobody waits: a pending timer would only keep the group alive.
		g.timer.Stop()
		g.timer = nil
		g.timerGen++
	}
}

// grantLocked sends s, the head of the queue, with ticket t. Requires g.mu
// held.
func (g *group) grantLocked(now time.Time, s *Slot, t Ticket) {
	if g.ceil != nil {
		g.ceil.take(now, s.cost)
	}
	switch {
	case s.prio == Low:
		g.highRun = 0
	case g.waiters[Low].Len() > 0:
		g.highRun++
	}
	g.dequeueLocked(s)
	s.phase = phaseSent
	s.capped = g.cap != nil
	s.ticket = t
	s.lane.inFlight++
	if !s.retry {
		s.lane.stats.admitted++
	}
	g.unanswered++
	if g.probeUntil.IsZero() {
		g.probeUntil = now.Add(probeWindow)
	}
	s.signalLocked()
}

// refuseLateLocked gives up the wait of every waiter whose deadline falls
// before at, the earliest the head of the queue may go: nobody behind it
// goes sooner, so they would only sit out their budget for an error.
// Each is taken out of the queue and told why. Requires g.mu held.
func (g *group) refuseLateLocked(at time.Time) {
	paused := !g.shared.PausedUntil().Before(at)
	for p := range g.waiters {
		for e := g.waiters[p].Front(); e != nil; {
			next := e.Next()
			s := e.Value.(*Slot)
			if !s.deadline.IsZero() && s.deadline.Before(at) {
				g.dequeueLocked(s)
				s.refused = &WaitError{At: at, Paused: paused}
				s.signalLocked()
			}
			e = next
		}
	}
}

// armLocked makes sure dispatch runs again at `at`. Requires g.mu held.
func (g *group) armLocked(now, at time.Time) {
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
