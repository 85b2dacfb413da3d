package lanequeue

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"github.com/llmproxy/llmproxy/limit"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/internal/setting"
)

// Errors returned by Acquire and Slot.WaitRetry; check with errors.Is.
var (
	// ErrQueueFull: the lane already has Config.MaxQueue waiters.
	ErrQueueFull = errors.New("lanequeue: queue full")
	// ErrBudgetExceeded: the request's deadline passed, or falls before the
	// lane's pause ends, so waiting cannot help.
	ErrBudgetExceeded = errors.New("lanequeue: request budget exceeded")
)

// WaitError is the error of a request that the group cannot send before
// its deadline: a pause or the pacing holds the queue until At, after it.
// It is returned at once rather than after the whole wait; it matches
// ErrBudgetExceeded with errors.Is.
type WaitError struct {
	At     time.Time // the earliest the group may send again
	Paused bool      // a pause holds it (else the pacing)
}

func (e *WaitError) Error() string {
	why := "pacing"
	if e.Paused {
		why = "a pause"
	}
	return "lanequeue: " + why + " holds the lane until " + e.At.Format(time.RFC3339Nano) + ", after the request's deadline"
}

func (e *WaitError) Is(target error) bool { return target == ErrBudgetExceeded }

// Config holds a lane's limits. Zero fields take the documented defaults;
// the concurrency fields and Limits are those of limit.Config.
type Config struct {
	Concurrency    int         // a new group's concurrency limit; zero = 8
	MinConcurrency int         // lowest the limit may fall to; zero = 1
	MaxConcurrency int         // highest the limit may rise to; zero = 1024
	MaxQueue       int         // waiting requests per lane before ErrQueueFull; zero = 10000
	Clock          clock.Clock // nil = the wall clock
	// Limits are the route's configured limits (see limit.Limits).
	Limits limit.Limits
}

// DefaultMaxQueue is the default of Config.MaxQueue.
const DefaultMaxQueue = 10000

// limitConfig is the part of c a group's limit state starts from.
func (c Config) limitConfig() limit.Config {
	return limit.Config{Concurrency: c.Concurrency, MinConcurrency: c.MinConcurrency, MaxConcurrency: c.MaxConcurrency, Limits: c.Limits}
}

// The defaults of TableConfig's zero fields.
const (
	DefaultMaxLanes = 10000
	DefaultIdleTTL  = 10 * time.Minute
)

// WithDefaults is c with its zero fields at their documented defaults and
// its start inside its bounds, as a group uses it.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// Validate reports, as a *setting.Error, a negative count or bounds out
// of order once the zero ones take their defaults. A start outside the
// bounds is not an error: the group starts at the nearer bound.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Concurrency", c.Concurrency}, {"MinConcurrency", c.MinConcurrency}, {"MaxConcurrency", c.MaxConcurrency}, {"MaxQueue", c.MaxQueue}} {
		if f.v < 0 {
			return setting.Bad("lanequeue", f.name, fmt.Sprintf("%d is negative", f.v))
		}
	}
	d := limit.Config{}.WithDefaults()
	lo, hi := cmp.Or(c.MinConcurrency, d.MinConcurrency), cmp.Or(c.MaxConcurrency, d.MaxConcurrency)
	if lo > hi {
		return setting.Bad("lanequeue", "MinConcurrency", fmt.Sprintf("%d is above MaxConcurrency=%d", lo, hi))
	}
	return nil
}

func (c Config) withDefaults() Config {
	l := c.limitConfig().WithDefaults()
	c.Concurrency, c.MinConcurrency, c.MaxConcurrency = l.Concurrency, l.MinConcurrency, l.MaxConcurrency
	if c.MaxQueue <= 0 {
		c.MaxQueue = DefaultMaxQueue
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// probeWindow is how long a new group sends one request at a time while it
// waits for its first answer to learn what the upstream tells about its
// limits. A burst before anything is known is what causes the first 429s.
const probeWindow = time.Second

// Lane is one FIFO queue of one group, with its own counters. Its fields are
// guarded by its group's mutex.
type Lane struct {
	key Key
	id  string
	g   *group
	// lim is the limit the lane draws on (see limit: follow mergedInto).
	lim *pool

	// waiters are the lane's queue, one list per priority, each in
	// arrival order (a retry keeps its place in its own); turnPrev and
	// turnNext thread it through the group's turns while it has any.
	waiters            [2]list.List // *Slot, by Priority
	turnPrev, turnNext *Lane
	queued             int   // waiters
	queuedCost         int64 // their estimated tokens
	inFlight           int   // this lane's slots holding a permit
	// lastUsed is when a request last came (UnixNano of the group's
	// clock); atomic so that the table reads it without the group's lock.
	lastUsed atomic.Int64
	// sessions counts the lane's open sessions (WebSocket connections
	// joined after their handshake): they hold no permit, and keep the
	// lane from being swept as idle.
	sessions atomic.Int64
	stats    laneStats
}

// openSession counts a session opened on the lane, until the returned
// func is called (once; later calls do nothing).
func (l *Lane) openSession() (closed func()) {
	l.sessions.Add(1)
	var once sync.Once
	return func() { once.Do(func() { l.sessions.Add(-1) }) }
}

// newLane returns a lane outside any table, with a group of its own (the
// tests' single lanes).
func newLane(key Key, cfg Config) *Lane {
	cfg = cfg.withDefaults()
	g := newGroup(key.groupKey(), cfg, func(_ string, c limit.Config) limit.Shared { return limit.NewMemory(c) }, nil)
	g.refs.Store(1) // the lane's own
	return g.newLane(key, key.ID(), g.limitOf(key))
}

// touch records a use of the lane at now.
func (l *Lane) touch(now time.Time) { l.lastUsed.Store(now.UnixNano()) }

// used is when the lane was last used.
func (l *Lane) used() time.Time { return time.Unix(0, l.lastUsed.Load()) }

// ID is the lane's short hashed identifier.
func (l *Lane) ID() string { return l.id }

// Key is what the lane was made for.
func (l *Lane) Key() Key { return l.key }

// Slot is a request's place in its lane from admission to the end of its
// answer. Call Done once it is over (extra calls are no-ops); a deferred
// Done covers every path. A Slot is used by one goroutine.
type Slot struct {
	lane *Lane
	// lim is the limit whose ticket the slot holds: its lane's when it was
	// granted (guarded by the group's mutex).
	lim *pool
	// limSent and groupSent are lim's and the group's dispatch counts
	// right after its latest dispatch (see sharing).
	limSent, groupSent uint64
	seq                uint64 // arrival order, kept across retries
	prio               Priority
	capped             bool  // holds a place of the global cap; guarded by the group's mutex
	cost               int64 // estimated tokens
	arrived            time.Time
	granted            time.Time // first grant
	// deadline is the current wait's context deadline (zero: none).
	deadline time.Time

	// Guarded by the group's mutex.
	phase phase
	elem  *list.Element // its place in the group's queue while queued
	// ready is closed when a wait is granted or refused; made only when
	// the wait has to block (see waitLocked), so a request that goes at
	// once makes no channel. signalled: it was granted or refused.
	ready      chan struct{}
	signalled  bool
	ticket     limit.Ticket // the latest dispatch
	lastStatus int          // status of the latest reported answer
	retry      bool         // waiting again after an answer
	refused    *WaitError   // set when the group gave up the wait (and signalled it)

	counted bool   // Done was called; the slot's goroutine only
	leave   func() // leaves the route's model gate; nil: none
}

// phase is where a slot stands. The transitions:
//
//	queued  → sent       dispatch (a permit and the budgets are taken)
//	sent    → answered   Report
//	sent, answered → queued   WaitRetry (the permit goes back)
//	queued  → idle       a retry's wait is cancelled
//	any     → done       Done, or a first wait cancelled
type phase uint8

const (
	phaseQueued phase = iota
	phaseSent
	phaseAnswered
	phaseIdle
	phaseDone
)

// holdsPermit reports whether the slot counts against the concurrency limit.
func (p phase) holdsPermit() bool { return p == phaseSent || p == phaseAnswered }

// acquire waits in FIFO order for a concurrency permit, for the group's
// pause to end and for pacing to allow one more request costing cost
// tokens, at priority p: a high-priority request goes ahead of every
// queued low-priority one, except that one dispatch in LowShare goes to a
// low-priority request while both wait. It returns ctx's error when the
// client goes away (the waiter leaves the queue at once), ErrQueueFull
// when the lane's queue is full, and ErrBudgetExceeded when ctx's deadline
// passes or lies before the end of the pause.
func (l *Lane) acquire(ctx context.Context, cost int64, p Priority) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, budgetErr(err)
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
	if until := l.limit().shared.PausedUntil(); !dl.IsZero() && until.After(dl) {
		l.stats.rejected++
		g.mu.Unlock()
		return nil, fmt.Errorf("lane %s: %w", l.id, &WaitError{At: until, Paused: true})
	}
	g.arrivals++
	l.lim.arrived++
	g.refs.Add(1)
	s := &Slot{lane: l, seq: g.arrivals, prio: p, cost: cost, arrived: now, deadline: dl}
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

// signalLocked tells s's wait that it was granted or refused. Requires
// g.mu held.
func (s *Slot) signalLocked() {
	s.signalled = true
	if s.ready != nil {
		close(s.ready)
	}
}

// waitLocked readies s to wait: it makes the channel wait blocks on,
// unless s was granted or refused already. Requires g.mu held, taken
// since s was queued.
func (s *Slot) waitLocked() {
	if !s.signalled {
		s.ready = make(chan struct{})
	}
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
		l.stats.cancelled++
	}
	end := phaseIdle
	if !s.retry {
		end = phaseDone // acquire returns no slot to release
	}
	s.phase = end
	forget := end == phaseDone && g.unrefLocked()
	g.dispatchLocked(now)
	g.mu.Unlock()
	if forget {
		g.forget()
	}
	if refused != nil {
		return fmt.Errorf("lane %s: %w", l.id, refused)
	}
	return budgetErr(ctx.Err())
}

func budgetErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrBudgetExceeded, err)
	}
	return err
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
		return budgetErr(err)
	}

	g.mu.Lock()
	now = g.clock.Now()
	l.stats.retries++
	if s.lastStatus == 429 {
		l.stats.absorbed429++
	}
	dl, _ := ctx.Deadline()
	if until := l.limit().shared.PausedUntil(); !dl.IsZero() && until.After(dl) {
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
// model gate's place to the next model. A Slot whose Acquire failed only
// counts the answer. Later calls do nothing.
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
	forget = g.unrefLocked()
	g.dispatchLocked(now)
	return forget
}

// queueWait is how long the request waited for its first dispatch.
func (s *Slot) queueWait() time.Duration { return s.granted.Sub(s.arrived) }
