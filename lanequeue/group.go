package lanequeue

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// group is the lanes of one route and credential: the one mutex that
// guards them, their queues, taken in turns, and the limits they draw on.
// Each lane has a FIFO queue of its own; the lanes with waiters take turns,
// one dispatch each, within the priority classes. A lane draws on one
// limit: its model's, or one its model shares with others (see pool).
// Limits that hold their head back let the other lanes go.
type group struct {
	key   string
	route string
	// cfg changes only with mu and limMu held (an operator's limits).
	cfg   Config
	clock clock.Clock
	// newShared makes the Shared of a limit of the group, by its key.
	newShared func(key string, cfg limit.Config) limit.Shared
	// forgotten is called, outside mu, once nothing refers to the group any
	// more; the table drops it then. nil outside a table.
	forgotten func(*group)
	// onChange receives the group's state changes; nil: none are made.
	onChange func(laneChange)
	// refused is called, outside mu, when a request of a lane the
	// upstream only refused ends (see Lane.refusedOnly); the table drops
	// the lane when it is idle. nil outside a table.
	refused func(*Lane)

	mu sync.Mutex
	// turns holds the lanes with waiters in turn order; next is the one
	// whose turn comes next (nil: the first).
	turns turns
	next  *Lane
	// queuedBy counts the waiters by priority, every lane's.
	queuedBy [2]int
	// highRun counts high-priority dispatches in a row while low ones
	// waited; at lowShare-1 the next dispatch is a low one.
	highRun int
	// cap is the global cap every dispatch takes a place of; nil: none.
	cap      *globalCap
	seat     capSeat // its seat in cap's line
	arrivals uint64  // arrival counter, for the order of retries
	// pass numbers dispatch passes: a limit that held its lanes back in
	// the current one is marked with it.
	pass uint64
	// capHeldAt is the latest pass the global cap held the group back in
	// (see heldLocked).
	capHeldAt uint64
	// sent counts the group's dispatches, every limit's (see shareEvidence).
	sent uint64
	// fleet: replicas share the group's state (a dispatch's ticket came
	// with every replica's counts). Limits they find they share are
	// then named by what every replica can agree on (see mergeLocked).
	fleet    bool
	timer    clock.Timer
	timerAt  time.Time
	timerGen uint64
	// refs counts what keeps the group alive: each of its lanes while the
	// table holds it, and each slot from Acquire until it is done. It is
	// atomic so that the table never takes mu: a group may hold mu through
	// a slow call to a shared store, and that must not hold up the table.
	refs atomic.Int64

	// limits are the group's limits by key (one limit may have several
	// keys, once found shared); limMu guards the map alone, so that the
	// table finds a new lane's limit without mu.
	limMu  sync.Mutex
	limits map[string]*pool
	// apart: a trial showed the group's limits are their own (see
	// togetherLocked); no more are made.
	apart bool

	// An operator's changes (see Table.HoldRoute), guarded by mu: the route's
	// hold (nil: none), and its limits set at run time (nil: as
	// configured).
	held *byOperator
	set  *RuntimeLimits
}

func newGroup(key string, cfg Config, newShared func(string, limit.Config) limit.Shared, forgotten func(*group)) *group {
	return &group{key: key, cfg: cfg, clock: cfg.Clock, newShared: newShared, forgotten: forgotten,
		limits: map[string]*pool{}}
}

// Lane is one FIFO queue of one group, with its own counters. Its fields are
// guarded by its group's mutex.
type Lane struct {
	key Key
	id  string
	g   *group
	// lim is the pool the lane was made with (see drawsOn: follow mergedInto).
	lim *pool

	// client is the queue of the lane's requests that name no client,
	// one list per priority (its waiters), each in arrival order (a retry
	// keeps its place in its own); named holds the named clients' (at most
	// maxClients), others the one the names past them share (nil: none
	// yet), and rounds the clients with waiters of each class in turn
	// order (see clients.go). turnPrev and turnNext thread the lane
	// through the group's turns while it has any waiter.
	client
	named              map[string]*client
	others             *client
	rounds             [2]round
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
	// held is an operator's hold of the lane (nil: none).
	held *byOperator
	// standing is what the upstream's answers said of the lane's
	// credential: standingRefused and standingVouched bits (see
	// noteAnswer); atomic so the table reads it without the group's lock.
	standing atomic.Uint32
}

// The bits of Lane.standing.
const (
	standingRefused = 1 << iota // an answer was 401 or 403
	standingVouched             // an answer was 2xx or 429
)

// noteAnswer notes what an upstream answer reported as r says of the
// lane's credential. A 2xx served it, and a 429 or a spent quota (an API
// gateway's 403 among them) metered it: the upstream took it for a real
// one, and the lane is vouched for. Any other 401 or 403 refused it. Any
// other status (0: no answer) says nothing either way: an upstream may
// answer an unknown path or a malformed body before it looks at the
// credential.
//
// It reads as if/else, not a switch, so that coverage sees its conditions.
func (l *Lane) noteAnswer(r limit.Report) {
	status := r.Status
	if status >= 200 && status < 300 || status == 429 || r.Quota.Spent {
		l.standing.Or(standingVouched)
	} else if status == 401 || status == 403 {
		l.standing.Or(standingRefused)
	}
}

// vouched reports whether the upstream ever took the lane's credential.
func (l *Lane) vouched() bool { return l.standing.Load()&standingVouched != 0 }

// refusedOnly reports whether the upstream refused the lane's credential
// and never took it.
func (l *Lane) refusedOnly() bool { return l.standing.Load() == standingRefused }

// openSession counts a session opened on the lane, until the returned
// func is called (once; later calls do nothing).
func (l *Lane) openSession() (closed func()) {
	l.sessions.Add(1)
	var once sync.Once
	return func() { once.Do(func() { l.sessions.Add(-1) }) }
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
	// right after its latest dispatch (see shareEvidence): every replica's when
	// fleet (a store shared by replicas counted them), else this one's.
	limSent, groupSent uint64
	fleet              bool
	seq                uint64 // arrival order, kept across retries
	prio               Priority
	capped             bool  // holds a place of the global cap; guarded by the group's mutex
	cost               int64 // estimated tokens
	output             int64 // of cost, the output it reserves
	prompted           int64 // what the upstream counted its prompt as (PromptCounted); 0: not said
	arrived            time.Time
	granted            time.Time // first grant
	// deadline is the current wait's context deadline (zero: none).
	deadline time.Time

	// Guarded by the group's mutex.
	phase phase
	elem  *list.Element // its place in its client's queue while queued
	// client is whose turn it waits in (see clients.go); set as it is
	// queued.
	client *client
	// ready is closed when a wait is granted or refused; made only when
	// the wait has to block (see waitLocked), so a request that goes at
	// once makes no channel. signalled: it was granted or refused.
	ready     chan struct{}
	signalled bool
	ticket    limit.Ticket // the latest dispatch
	// refunded and returned: the ticket's charge and its permit went back
	// (refundLocked, returnLocked); a new ticket clears them.
	refunded, returned bool
	lastStatus         int   // status of the latest reported answer
	retry              bool  // waiting again after an answer
	refused            error // set when the group gave up the wait (and signalled it): a *WaitError or *QuotaError

	// Its latest wait (see Waited), set under the group's mutex as it
	// joins the queue and as it is granted: the waiters ahead of it, the
	// dispatch pass it joined in, what held it back.
	ahead      int
	joinedPass uint64
	held       held

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

// drawsOn is the pool the lane draws on now: the one it was made with, or
// the one that took it over. Requires the group's mutex held.
func (ln *Lane) drawsOn() *pool { return ln.lim.root() }

// changeKind names what changed in a lane's state.
type changeKind uint8

const (
	// changeLimits: the group learned its limits or where they come from
	// changed, a window's size or a pace learned from refusals moved by
	// more than a tenth, or refusals began to overrule the headers.
	changeLimits changeKind = iota
	// changePaused: an answer started a pause of the group (not an extension of
	// one under way).
	changePaused
	// changeConcurrency: the group's concurrency limit moved. Rises are
	// reported at most once a second, from the last level reported; falls
	// at once.
	changeConcurrency
	// changeEvicted: the lane left the table.
	changeEvicted
	// changeQuota: an answer said the limit's quota is spent (not a
	// renewal of a quota spent already).
	changeQuota
)

// laneChange is one state change of a lane's group, reported through
// TableConfig.onChange outside every lock. It holds no credential.
type laneChange struct {
	Kind changeKind
	Lane *Lane
	At   time.Time
	// Status and Verdict are of the answer that caused it (changePaused,
	// changeConcurrency, changeLimits).
	Status  int
	Verdict limit.Verdict
	// View is the group's state after the change.
	View limit.View
	// From is the previous concurrency limit (changeConcurrency).
	From int
	// PauseFor is how long a pause lasts (changePaused); the Verdict
	// says why.
	PauseFor time.Duration
	// QuotaUntil is when a spent quota renews (changeQuota); zero when
	// the answer did not say.
	QuotaUntil time.Time
	// Reason says why a lane was evicted: "idle", "table_full" or
	// "refused" (see Table.dropRefused).
	Reason string
	// SharesLimitWith and SharedBecause say which other models draw on
	// the lane's limit and why (changeLimits; see State).
	SharesLimitWith     []string
	SharesLimitWithMore int
	SharedBecause       string
}

// limitOf returns the limit a lane of key draws on, making it when needed.
func (g *group) limitOf(key Key) *pool {
	lk := key.limitKey(g.cfg.Limits.PerCredential)
	g.limMu.Lock()
	defer g.limMu.Unlock()
	l := g.limits[lk]
	if l == nil {
		l = newPool(lk, g.cfg, g.newShared(lk, g.cfg.limitConfig()))
		l.seq = len(g.limits)
		g.limits[lk] = l
	}
	l.addModel(key.Model)
	return l
}

// newLane makes a lane of g with its ID, drawing on the limit of its key
// (see limitOf). The caller accounts for the lane's reference.
func (g *group) newLane(key Key, id string) *Lane {
	l := &Lane{key: key, id: id, g: g, lim: g.limitOf(key)}
	l.touch(g.clock.Now())
	return l
}

// operatorHoldLocked is an operator's hold that keeps the lane from
// dispatching, its own or its route's, and what it holds ("lane" or
// "route"); nil when none. Requires the group's mutex held.
func (l *Lane) operatorHoldLocked() (*byOperator, string) {
	if l.held != nil {
		return l.held, "lane"
	}
	if l.g.held != nil {
		return l.g.held, "route"
	}
	return nil, ""
}
