// Package lanequeue owns lanes: per-lane strict FIFO queues, concurrency
// slots, lane-wide pauses and the bounded table that holds the lanes.
//
// Every decision is made under one mutex per lane at an explicit time taken
// from an injected clock; blocking happens outside the lock. There is no
// ticker goroutine: when the head of a queue must wait for time to pass (a
// pause or pacing), the lane arms a single one-shot timer.
//
// It does not know HTTP, upstreams or header formats: callers tell it what
// they learned (PauseUntil, Observe) and it decides who goes next.
package lanequeue

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// Errors returned by Acquire and Slot.WaitRetry; check with errors.Is.
var (
	// ErrQueueFull: the lane already has Config.MaxQueue waiters.
	ErrQueueFull = errors.New("lanequeue: queue full")
	// ErrBudgetExceeded: the request's deadline passed, or falls before the
	// lane's pause ends, so waiting cannot help.
	ErrBudgetExceeded = errors.New("lanequeue: request budget exceeded")
)

// Config holds a lane's limits. Zero fields take the documented defaults.
type Config struct {
	Concurrency    int         // initial concurrency limit; zero = 128
	MinConcurrency int         // lowest the limit may fall to; zero = 1
	MaxConcurrency int         // highest the limit may rise to; zero = 1024
	MaxQueue       int         // waiting requests before ErrQueueFull; zero = 10000
	Clock          clock.Clock // nil = the wall clock
}

func (c Config) withDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = 128
	}
	if c.MinConcurrency <= 0 {
		c.MinConcurrency = 1
	}
	if c.MaxConcurrency <= 0 {
		c.MaxConcurrency = 1024
	}
	if c.MaxConcurrency < c.MinConcurrency {
		c.MaxConcurrency = c.MinConcurrency
	}
	c.Concurrency = min(max(c.Concurrency, c.MinConcurrency), c.MaxConcurrency)
	if c.MaxQueue <= 0 {
		c.MaxQueue = 10000
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// ProbeWindow is how long a new lane sends one request at a time while it
// waits for its first answer to learn what the upstream tells about its
// limits. A burst before anything is known is what causes the first 429s.
const ProbeWindow = time.Second

// Lane is one queue with its own slots, pause and learned limits.
type Lane struct {
	key   Key
	id    string
	cfg   Config
	clock clock.Clock

	mu          sync.Mutex
	limit       int // current concurrency limit
	inFlight    int // requests at the upstream now
	waiters     list.List
	pausedUntil time.Time
	lastUsed    time.Time
	timer       clock.Timer
	timerAt     time.Time
	timerGen    uint64
	arrivals    uint64    // arrival counter, for the order of retries
	unanswered  int       // dispatches whose answer has not been observed yet
	orphaned    func()    // set when the table evicted the lane while busy; run once it is idle
	learned     bool      // an answer came back: pacing knows what the upstream tells
	probeUntil  time.Time // set by the first dispatch; see ProbeWindow
	pace        *pacer    // shared by the lanes of one limit group
	aimd        aimd
	stats       laneStats
}

type laneStats struct {
	admitted  int64
	retries   int64
	cancelled int64
	rejected  int64
	throttled int64
}

type waiter struct {
	ready   chan struct{} // closed when granted
	granted bool
	retry   bool // a request already admitted once, waiting to try again
	slot    *Slot
}

func newLane(key Key, cfg Config, pace *pacer) *Lane {
	cfg = cfg.withDefaults()
	if pace == nil {
		pace = &pacer{}
	}
	l := &Lane{key: key, id: key.ID(), cfg: cfg, clock: cfg.Clock, limit: cfg.Concurrency, pace: pace}
	l.lastUsed = cfg.Clock.Now()
	return l
}

// New returns a lane outside any table; tests and single-lane users call it.
func New(key Key, cfg Config) *Lane { return newLane(key, cfg, nil) }

// ID is the lane's short hashed identifier.
func (l *Lane) ID() string { return l.id }

// Key is what the lane was made for.
func (l *Lane) Key() Key { return l.key }

// Slot is a request's place in its lane from admission to the end of its
// answer. Release it exactly once (extra calls are no-ops); a deferred
// Release covers every path. A Slot is used by one goroutine.
type Slot struct {
	lane    *Lane
	seq     uint64 // arrival order, kept across retries
	cost    int64  // estimated tokens
	arrived time.Time
	granted time.Time // first grant

	// Guarded by lane.mu.
	active     bool // counted in the lane's inFlight
	awaiting   bool // dispatched, answer not yet observed
	released   bool
	mark       mark      // pacer totals right after the latest dispatch
	dispatched time.Time // latest dispatch
}

// Acquire waits in FIFO order for a free slot, for the lane's pause to end
// and for pacing to allow one more request costing cost tokens. It returns
// ctx's error when the client goes away (the waiter leaves the queue at
// once), ErrQueueFull when the queue is full, and ErrBudgetExceeded when
// ctx's deadline passes or lies before the end of the lane's pause.
func (l *Lane) Acquire(ctx context.Context, cost int64) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, budgetErr(err)
	}
	l.mu.Lock()
	now := l.clock.Now()
	l.lastUsed = now
	if l.waiters.Len() >= l.cfg.MaxQueue {
		l.stats.rejected++
		l.mu.Unlock()
		return nil, fmt.Errorf("lane %s: %w", l.id, ErrQueueFull)
	}
	if dl, ok := ctx.Deadline(); ok && l.pausedUntil.After(dl) {
		l.stats.rejected++
		l.mu.Unlock()
		return nil, fmt.Errorf("lane %s: paused past the deadline: %w", l.id, ErrBudgetExceeded)
	}
	l.arrivals++
	s := &Slot{lane: l, seq: l.arrivals, cost: cost, arrived: now}
	w := &waiter{ready: make(chan struct{}), slot: s}
	e := l.waiters.PushBack(w)
	l.dispatchLocked(now)
	l.mu.Unlock()
	if err := l.wait(ctx, w, e); err != nil {
		return nil, err
	}
	s.granted = s.dispatched
	return s, nil
}

// wait blocks until w is granted or ctx is done. On cancellation the waiter
// leaves the queue; a grant won in the race is handed back.
func (l *Lane) wait(ctx context.Context, w *waiter, e *list.Element) error {
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted {
		w.slot.active = false
		l.inFlight--
		l.answeredLocked(w.slot)
		l.pace.refund(w.slot.cost)
	} else {
		l.waiters.Remove(e)
	}
	l.stats.cancelled++
	l.dispatchLocked(l.clock.Now())
	return budgetErr(ctx.Err())
}

func budgetErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrBudgetExceeded, err)
	}
	return err
}

// dispatchLocked grants the head of the queue for as long as it can go, and
// arms the lane timer when the head must wait for time. Requires l.mu held.
func (l *Lane) dispatchLocked(now time.Time) {
	// Requests granted together reach the upstream in any order, so each
	// is marked as if sent first in its batch: an answer then counts all
	// of its batch as possibly not yet in the upstream's figure.
	batch := l.pace.totals()
	for e := l.waiters.Front(); e != nil; e = l.waiters.Front() {
		w := e.Value.(*waiter)
		if now.Before(l.pausedUntil) {
			l.armLocked(now, l.pausedUntil)
			return
		}
		if l.inFlight >= l.limit {
			return // a Release dispatches again
		}
		if !l.learned && l.inFlight > 0 {
			if now.Before(l.probeUntil) {
				l.armLocked(now, l.probeUntil)
				return
			}
			l.learned = true // the first answer is slow; stop waiting for it
		}
		// With no answer outstanding, a budget that can only learn more
		// from an answer lets this request go to find out.
		if at, ok := l.pace.tryTake(now, w.slot.cost, l.unanswered == 0); !ok {
			if !at.IsZero() {
				l.armLocked(now, at)
			}
			return // else the next answer says more; Observe dispatches
		}
		l.waiters.Remove(e)
		w.granted = true
		l.inFlight++
		if l.probeUntil.IsZero() {
			l.probeUntil = now.Add(ProbeWindow)
		}
		s := w.slot
		s.active = true
		s.dispatched = now
		s.awaiting = true
		l.unanswered++
		s.mark = batch.plus(s.cost)
		if !w.retry {
			l.stats.admitted++
		}
		close(w.ready)
	}
	if l.timer != nil {
		// Nobody waits: a pending pacing timer would only keep the lane
		// alive.
		l.timer.Stop()
		l.timer = nil
		l.timerGen++
	}
}

// answeredLocked notes that no answer will come for s's latest dispatch, or
// that it came. Requires l.mu held.
func (l *Lane) answeredLocked(s *Slot) {
	if s.awaiting {
		s.awaiting = false
		l.unanswered--
	}
}

// armLocked makes sure dispatch runs again at `at`. Requires l.mu held.
func (l *Lane) armLocked(now, at time.Time) {
	if l.timer != nil {
		if l.timerAt.Equal(at) {
			return
		}
		l.timer.Stop()
	}
	l.timerGen++
	gen := l.timerGen
	l.timerAt = at
	l.timer = l.clock.AfterFunc(at.Sub(now), func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.timerGen != gen {
			return
		}
		l.timer = nil
		l.dispatchLocked(l.clock.Now())
	})
}

// PauseUntil stops the lane from dispatching anything before t. A pause is
// only ever extended, never shortened.
func (l *Lane) PauseUntil(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.After(l.pausedUntil) {
		l.pausedUntil = t
	}
}

// WaitRetry waits until the lane may send this request again: after the
// pause, within pacing and the concurrency limit. The request keeps its
// place: it goes before every waiter that arrived at the lane after it did,
// and never counts against the queue's length. Errors are those of Acquire.
func (s *Slot) WaitRetry(ctx context.Context) error {
	l := s.lane
	l.mu.Lock()
	now := l.clock.Now()
	l.lastUsed = now
	if s.active {
		s.active = false
		l.inFlight--
	}
	l.answeredLocked(s)
	if err := ctx.Err(); err != nil {
		l.dispatchLocked(now)
		l.mu.Unlock()
		return budgetErr(err)
	}
	l.stats.retries++
	if dl, ok := ctx.Deadline(); ok && l.pausedUntil.After(dl) {
		l.dispatchLocked(now)
		l.mu.Unlock()
		return fmt.Errorf("lane %s: paused past the deadline: %w", l.id, ErrBudgetExceeded)
	}
	w := &waiter{ready: make(chan struct{}), retry: true, slot: s}
	var e *list.Element
	for at := l.waiters.Front(); at != nil; at = at.Next() {
		if at.Value.(*waiter).slot.seq > s.seq {
			e = l.waiters.InsertBefore(w, at)
			break
		}
	}
	if e == nil {
		e = l.waiters.PushBack(w)
	}
	l.dispatchLocked(now)
	l.mu.Unlock()
	return l.wait(ctx, w, e)
}

// Release ends the request's time in the lane and lets the next waiter in.
// Safe to call more than once.
func (s *Slot) Release() {
	l := s.lane
	l.mu.Lock()
	if s.released {
		l.mu.Unlock()
		return
	}
	s.released = true
	if s.active {
		s.active = false
		l.inFlight--
	}
	l.answeredLocked(s)
	now := l.clock.Now()
	l.lastUsed = now
	l.dispatchLocked(now)
	var orphaned func()
	if l.orphaned != nil && l.idleLocked() {
		orphaned, l.orphaned = l.orphaned, nil
	}
	l.mu.Unlock()
	if orphaned != nil {
		orphaned()
	}
}

// QueueWait is how long the request waited for its first dispatch.
func (s *Slot) QueueWait() time.Duration { return s.granted.Sub(s.arrived) }

// idleLocked reports whether nothing waits or runs. Requires l.mu held.
func (l *Lane) idleLocked() bool { return l.inFlight == 0 && l.waiters.Len() == 0 }
