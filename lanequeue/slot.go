package lanequeue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// acquireAs waits in FIFO order for a concurrency permit, for the group's
// pause to end and for pacing to allow one more request costing cost
// tokens, at priority p, as client (""; none): a high-priority request goes
// ahead of every queued low-priority one, except that one dispatch in
// lowShare goes to a low-priority request while both wait; within a class
// the lane's clients take turns (see clients.go). It returns ctx's error
// when the client goes away (the waiter leaves the queue at once),
// ErrQueueFull when the lane's queue is full, and ErrDeadlineExceeded when
// ctx's deadline passes or lies before the end of the pause. output is
// the part of cost that is output the request reserves (its max_tokens).
func (l *Lane) acquireAs(ctx context.Context, cost int64, p Priority, client string, output int64) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, deadlineErr(err)
	}
	g := l.g
	g.mu.Lock()
	now := g.clock.Now()
	l.touch(now)
	if l.queued >= g.cfg.MaxQueue {
		l.stats.rejected++
		g.mu.Unlock()
		return nil, fmt.Errorf("lane %s: %w", l.id, ErrQueueFull)
	}
	dl, _ := ctx.Deadline()
	if until := l.drawsOn().shared.PausedUntil(); !dl.IsZero() && until.After(dl) {
		l.stats.rejected++
		g.mu.Unlock()
		return nil, fmt.Errorf("lane %s: %w", l.id, &WaitError{At: until, Paused: true})
	}
	g.arrivals++
	l.lim.arrived++
	g.refs.Add(1)
	s := &Slot{lane: l, seq: g.arrivals, prio: p, cost: cost, output: min(max(output, 0), cost), arrived: now, deadline: dl, client: l.clientOf(client, g.arrivals)}
	g.enqueueLocked(s)
	g.dispatchLocked(now)
	s.waitLocked()
	g.mu.Unlock()
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	s.granted = s.ticket.Dispatched
	return s, nil
}

// wait blocks until s is granted or ctx is done. On cancellation the waiter
// leaves the queue; a grant won in the race, or made to a client already
// gone, is handed back. waitLocked ran under the lock that queued s.
func (s *Slot) wait(ctx context.Context) error {
	if s.ready == nil { // granted or refused as it was queued
		if s.refused == nil && ctx.Err() == nil {
			return nil
		}
	} else {
		select {
		case <-s.ready:
			if s.refused == nil {
				return nil
			}
		case <-ctx.Done():
		}
	}
	l := s.lane
	g := l.g
	g.mu.Lock()
	now := g.clock.Now()
	refused := s.refused
	switch {
	case refused != nil:
		s.refused = nil // the group took it out of the queue already
		l.stats.rejected++
	case s.phase == phaseSent:
		g.refundLocked(s)
		g.returnPermitLocked(s, now)
		l.stats.cancelled++
	default:
		g.dequeueLocked(s)
		if held, _ := l.operatorHoldLocked(); held != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// Its deadline passed while an operator held the lane: it
			// is answered as one whose pause outlasts it.
			refused = &WaitError{Held: true}
			l.stats.rejected++
		} else {
			l.stats.cancelled++
		}
	}
	end := phaseIdle
	if !s.retry {
		end = phaseDone // acquire returns no slot to release
	}
	s.phase = end
	forget := end == phaseDone && s.leaveLocked()
	g.dispatchLocked(now)
	g.mu.Unlock()
	if forget {
		g.forget()
	}
	if refused != nil {
		return fmt.Errorf("lane %s: %w", l.id, refused)
	}
	return deadlineErr(ctx.Err())
}

// WaitRetry gives back the slot's permit, waits `after` (a delay for this
// request alone; a pause for the whole group is set with Report), then
// waits until the lane may send the request again: after the pause, within
// pacing and the concurrency limit. The request keeps its place: it goes
// before every waiter that arrived after it did, and is never refused for a
// full queue. Errors are those of Acquire.
func (s *Slot) WaitRetry(ctx context.Context, after time.Duration) error {
	l := s.lane
	g := l.g
	g.mu.Lock()
	now := g.clock.Now()
	l.touch(now)
	if s.phase.holdsPermit() {
		g.returnPermitLocked(s, now)
	}
	s.phase = phaseIdle
	g.dispatchLocked(now)
	g.mu.Unlock()
	if err := sleep(ctx, g.clock, after); err != nil {
		return deadlineErr(err)
	}

	g.mu.Lock()
	now = g.clock.Now()
	l.stats.retries++
	if s.lastStatus == 429 {
		l.stats.absorbed429++
	}
	dl, _ := ctx.Deadline()
	if until := l.drawsOn().shared.PausedUntil(); !dl.IsZero() && until.After(dl) {
		g.mu.Unlock()
		return fmt.Errorf("lane %s: %w", l.id, &WaitError{At: until, Paused: true})
	}
	s.deadline = dl
	s.retry = true
	g.enqueueLocked(s)
	g.dispatchLocked(now)
	s.waitLocked()
	g.mu.Unlock()
	return s.wait(ctx)
}

// sleep waits d on c, or until ctx is done.
func sleep(ctx context.Context, c clock.Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	done := make(chan struct{})
	t := c.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// Done ends the request's time in its lane: its answer used usedTokens
// (below 0: not known), the client got status (0: none was sent) and the
// answer ended as outcome. The permit goes to the next waiter, and the
// model gate's place to the next model. Later calls do nothing.
func (s *Slot) Done(status int, outcome string, usedTokens int64) {
	if s.counted {
		return
	}
	s.counted = true
	l := s.lane
	g := l.g
	g.mu.Lock() // one hold for all of it: the settling, the release, the count
	now := g.clock.Now()
	settled := usedTokens >= 0 && !s.granted.IsZero()
	if settled {
		g.settleLocked(s, usedTokens)
		if s.phase == phaseDone { // released before: the release does not dispatch
			g.dispatchLocked(now)
		}
	}
	forget := s.releaseLocked(now)
	l.stats.countAnswer(status, outcome, now)
	g.mu.Unlock()
	if forget {
		g.forget()
	}
	if g.refused != nil && l.refusedOnly() {
		g.refused(l)
	}
	if s.leave != nil {
		s.leave()
	}
}

// OpenSession gives the permit back for a session that goes on without
// one (a WebSocket joined after its handshake) and counts it open on the
// lane until the returned func is called.
func (s *Slot) OpenSession() (closed func()) {
	s.release()
	return s.lane.openSession()
}

// ID is the slot's lane's short hashed identifier.
func (s *Slot) ID() string { return s.lane.id }

// release ends the request's time in the lane and lets the next waiter in.
// Safe to call more than once.
func (s *Slot) release() {
	g := s.lane.g
	g.mu.Lock()
	forget := s.releaseLocked(g.clock.Now())
	g.mu.Unlock()
	if forget {
		g.forget()
	}
}

// releaseLocked is release under g.mu; forget reports that the group lost
// its last reference, for g.forget once the lock is given back.
func (s *Slot) releaseLocked(now time.Time) (forget bool) {
	l := s.lane
	g := l.g
	if s.phase == phaseDone {
		return false
	}
	switch {
	case s.phase.holdsPermit():
		g.returnPermitLocked(s, now)
	case s.phase == phaseQueued:
		g.dequeueLocked(s)
	}
	s.phase = phaseDone
	l.touch(now)
	forget = s.leaveLocked()
	g.dispatchLocked(now)
	return forget
}

// waitLocked readies s to wait: it makes the channel wait blocks on,
// unless s was granted or refused already. Requires g.mu held, taken
// since s was queued.
func (s *Slot) waitLocked() {
	if !s.signalled {
		s.ready = make(chan struct{})
	}
}

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
