package lanequeue

import "time"

// Waited is what the slot's latest wait (Acquire's, or WaitRetry's) met,
// for a trace once the wait is over: the number of waiters ahead of it in
// its queue when it joined (0: it was first; its client's at its
// priority, the lane's when it names no client, see Request.Client), and
// why it waited, in this order, each at most once: "model_gate" (a local
// route's server held another model), "pause" (its limit was paused
// after a refusal), "pace" (the learned or configured rate or token
// budget), "concurrency" (no permit free, or a new limit's one request
// in flight before its first answer), "cap" (LLMPROXY_GLOBAL_CONCURRENCY);
// none when it went at once, or only waited for those ahead of it.
func (s *Slot) Waited() (ahead int, reasons []string) {
	for i, name := range heldNames {
		if s.held&(1<<i) != 0 {
			reasons = append(reasons, name)
		}
	}
	return s.ahead, reasons
}

// held is a set of the reasons a waiter was held back for, one bit each
// (heldNames' order).
type held uint8

// The reasons, in the order Waited lists them. The first three are a
// limit's own (pool.heldAt), the cap is the group's.
const (
	heldGate held = 1 << iota
	heldPause
	heldPace
	heldConcurrency
	heldCap
)

var heldNames = [...]string{"model_gate", "pause", "pace", "concurrency", "cap"}

// limitHeld are the reasons a limit keeps the pass it last held its
// lanes for (pool.heldAt), by their index.
const (
	limitPause = iota
	limitPace
	limitConcurrency
	limitReasons
)

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

// startWaitLocked notes, as s joins its lane's queue with ahead waiters
// before it, where its wait starts: what held the lanes back after this
// dispatch pass is what s waited for. Requires g.mu held.
func (g *group) startWaitLocked(s *Slot, ahead int) {
	s.ahead, s.joinedPass = ahead, g.pass
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
