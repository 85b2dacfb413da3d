package lanequeue

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/llmproxy/llmproxy/limit"
)

// TableConfig bounds the lane table. Zero fields take the documented defaults.
type TableConfig struct {
	Lane Config // every new lane's config
	// RouteLimits are the configured limits of each route's groups, by
	// route name ("" for the default upstream); they set Lane.Limits.
	RouteLimits map[string]limit.Limits
	// GlobalConcurrency, when above 0, is one concurrency cap over every
	// group of the table (see globalCap).
	GlobalConcurrency int
	// LocalRoutes are the routes to a local server, by route name, each
	// with its model gate's fairness (0: DefaultFairness): Acquire waits
	// for the request's model's turn before the lane's queue (see
	// modelGate).
	LocalRoutes map[string]time.Duration
	// MaxLanes is the most lanes kept; zero = 10000. When a new lane
	// needs room, the least recently used lane the upstream never
	// vouched for goes first (see Lane.vouched), so lanes of forged or
	// revoked keys cannot push out what real lanes learned.
	MaxLanes int
	IdleTTL  time.Duration // a lane unused this long with nothing queued or in flight is dropped; zero = 10m
	// Shared makes the shared state of a new limit (see Key.limitKey), by
	// its key; nil = NewMemory, state in this process only.
	Shared func(key string, cfg limit.Config) limit.Shared
	// onEvict is called, outside the table's lock, for every lane dropped.
	onEvict func(*Lane)
	// metricLanes is how many lanes have series of their own in the
	// metrics (see Collector); zero: defaultMetricLanes. Tests lower it.
	metricLanes int
	// idDigits is how many hex digits a lane's ID starts with; zero:
	// shortLen. Tests shorten it to make IDs collide.
	idDigits int
	// Log, when set, gets one info line for each state change of a
	// lane's group (limits learned or changed, a pause and why, the
	// concurrency limit moving) and for each lane dropped. Lanes are named
	// by their hashed ID; no line holds a credential.
	Log *slog.Logger
	// onChange is called, outside every lock, after Log, for each change
	// (see laneChange); tests watch them here.
	onChange func(laneChange)
}

// Table holds the lanes, bounded in number; idle lanes are evicted.
//
// A lane evicted for space while it still has work keeps serving the
// requests that hold it; a later request with the same key gets a new lane
// of the same group, so the two still share one budget. A group lives as
// long as a lane of it is in the table or a request of it is under way.
// With MaxLanes well above the number of active lanes eviction of a busy
// lane never happens.
type Table struct {
	cfg TableConfig

	mu sync.Mutex
	// lanes holds the lanes the upstream vouched for, unproven the
	// others (see Lane.vouched), each by key, least recently used first;
	// together at most MaxLanes. A lane moves from unproven to lanes once
	// the table sees it vouched for.
	lanes     *simplelru.LRU[Key, *Lane]
	unproven  *simplelru.LRU[Key, *Lane]
	moving    bool             // a lane moves to lanes: not an eviction
	dropping  bool             // a lane the upstream only refused leaves
	ids       map[string]*Lane // the table's lanes by ID, which no two share
	evicted   []evicted        // filled by the LRU callback under mu, reported after unlock
	sweeping  bool             // the sweep is removing idle lanes
	lastSweep time.Time
	groups    map[string]*group // by Key.groupKey
	// cap is the global cap (nil: none); gates the local routes' model
	// gates, by route name. Both live as long as the table.
	cap   *globalCap
	gates map[string]*modelGate
	// opMu orders the operators' changes: each is recorded, then applied
	// to the groups, before the next. Under mu: the changes in force on
	// each route, and the lanes held, by ID.
	opMu      sync.Mutex
	routeOps  map[string]*routeOps
	laneHolds map[string]*byOperator
}

// CapStats is the state of the global cap; ok is false when there is none
// (TableConfig.GlobalConcurrency).
func (t *Table) CapStats() (st CapStats, ok bool) {
	if t.cap == nil {
		return st, false
	}
	return t.cap.Stats(), true
}

// GateStats is the state of each local route's model gate, in the order
// of the routes' names (TableConfig.LocalRoutes).
func (t *Table) GateStats() []GateStats {
	out := make([]GateStats, 0, len(t.gates))
	for _, route := range slices.Sorted(maps.Keys(t.gates)) {
		st := t.gates[route].Stats()
		st.Route = route
		out = append(out, st)
	}
	return out
}

// WithDefaults is c with its zero bounds and its lanes' config at their
// documented defaults.
func (c TableConfig) WithDefaults() TableConfig {
	c.Lane = c.Lane.withDefaults()
	c.MaxLanes = cmp.Or(max(c.MaxLanes, 0), defaultMaxLanes)
	c.IdleTTL = cmp.Or(max(c.IdleTTL, 0), defaultIdleTTL)
	return c
}

// NewTable returns an empty table.
func NewTable(cfg TableConfig) *Table {
	cfg = cfg.WithDefaults()
	if cfg.Shared == nil {
		cfg.Shared = func(_ string, c limit.Config) limit.Shared { return limit.NewMemory(c) }
	}
	if cfg.metricLanes <= 0 {
		cfg.metricLanes = defaultMetricLanes
	}
	if cfg.idDigits <= 0 {
		cfg.idDigits = shortLen
	}
	if log, next := cfg.Log, cfg.onChange; log != nil {
		cfg.onChange = func(c laneChange) {
			c.log(log)
			if next != nil {
				next(c)
			}
		}
	}
	t := &Table{cfg: cfg, groups: map[string]*group{}, ids: map[string]*Lane{}, gates: map[string]*modelGate{},
		routeOps: map[string]*routeOps{}, laneHolds: map[string]*byOperator{}}
	if cfg.GlobalConcurrency > 0 {
		t.cap = newCap(cfg.GlobalConcurrency)
	}
	for route, fairness := range cfg.LocalRoutes {
		t.gates[route] = newModelGate(fairness, cfg.Lane.Clock)
	}
	// Each list could take the whole table; makeRoomLocked keeps the two
	// together within MaxLanes, so neither evicts on its own.
	var err error
	if t.lanes, err = simplelru.NewLRU[Key, *Lane](cfg.MaxLanes, t.evictLocked); err != nil {
		panic(err) // only for a non-positive size, excluded above
	}
	t.unproven, _ = simplelru.NewLRU[Key, *Lane](cfg.MaxLanes, t.evictLocked)
	return t
}

// evictLocked is the one place a lane leaves the table: its group loses the
// lane's reference, and is dropped with its last one. The LRU calls it for
// eviction and removal alike. Requires t.mu held.
func (t *Table) evictLocked(_ Key, l *Lane) {
	if t.moving {
		return // it stays in the table
	}
	reason := "table_full"
	switch {
	case t.sweeping:
		reason = "idle"
	case t.dropping:
		reason = "refused"
	}
	t.evicted = append(t.evicted, evicted{l, reason})
	if t.ids[l.id] == l {
		delete(t.ids, l.id)
	}
	g := l.g
	if g.refs.Add(-1) == 0 {
		t.dropGroupLocked(g)
	}
}

// dropGroupLocked forgets g if it is still the table's group for its key.
// Requires t.mu held.
func (t *Table) dropGroupLocked(g *group) {
	if t.groups[g.key] == g {
		delete(t.groups, g.key)
	}
}

// forgotten is the groups' callback for the last slot of a group whose lanes
// have all left the table.
func (t *Table) forgotten(g *group) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if g.refs.Load() == 0 {
		t.dropGroupLocked(g)
	}
}

// makeRoomLocked evicts lanes until one more fits in MaxLanes: the least
// recently used of those the upstream never vouched for first (one
// vouched for since is moved instead), then the least recently used of
// the others. Requires t.mu held.
func (t *Table) makeRoomLocked() {
	for t.lanes.Len()+t.unproven.Len() >= t.cfg.MaxLanes {
		key, l, ok := t.unproven.GetOldest()
		switch {
		case !ok:
			t.lanes.RemoveOldest()
		case l.vouched():
			t.promoteLocked(key, l)
		default:
			t.unproven.RemoveOldest()
		}
	}
}

// dropRefused removes l from the table when the upstream has only refused
// its credential (see Lane.refusedOnly) and nothing of it is under way:
// a lane per forged or revoked key would otherwise stay for the idle TTL,
// in the metrics and in the way of real lanes. A lane whose group is busy
// stays, for the next request's end or the sweep.
func (t *Table) dropRefused(l *Lane) {
	t.mu.Lock()
	if cur, ok := t.unproven.Peek(l.key); ok && cur == l && l.g.mu.TryLock() {
		idle := l.queued == 0 && l.inFlight == 0 && l.sessions.Load() == 0
		l.g.mu.Unlock()
		if idle && l.refusedOnly() {
			t.dropping = true
			t.unproven.Remove(l.key)
			t.dropping = false
		}
	}
	evicted := t.takeEvictedLocked()
	t.mu.Unlock()
	t.notify(evicted)
}

// Answered counts, on the lane whose ID is id, the answer to a request
// the lane refused, as Slot.Done counts a slot's.
func (t *Table) Answered(id string, status int, outcome string) {
	t.mu.Lock()
	l := t.ids[id]
	t.mu.Unlock()
	if l == nil {
		return
	}
	g := l.g
	g.mu.Lock()
	l.stats.countAnswer(status, outcome, g.clock.Now())
	g.mu.Unlock()
	if g.refused != nil && l.refusedOnly() {
		g.refused(l)
	}
}

// allLanes returns every lane, least recently used first.
func (t *Table) allLanes() []*Lane {
	t.mu.Lock()
	lanes := append(t.lanes.Values(), t.unproven.Values()...)
	t.mu.Unlock()
	slices.SortStableFunc(lanes, func(a, b *Lane) int { return a.used().Compare(b.used()) })
	return lanes
}

// States returns a snapshot of every lane, least recently used first.
func (t *Table) States() []State {
	lanes := t.allLanes()
	out := make([]State, 0, len(lanes))
	for _, l := range lanes {
		out = append(out, l.State())
	}
	return out
}

// Busiest returns at most n lanes' states (with their History when
// history is set), those with the most queued and in flight first, then
// the most recently used; and how many lanes there are. A status page
// asks for a page of lanes, never all 10,000 at once.
func (t *Table) Busiest(n int, history bool) (states []State, total int) {
	loads := t.loads(false)
	state := (*Lane).State
	if history {
		state = (*Lane).StateWithHistory
	}
	for _, ld := range loads[:min(n, len(loads))] {
		states = append(states, state(ld.l))
	}
	return states, len(loads)
}

// load is a lane's place in Busiest's order.
type load struct {
	l               *Lane
	vouched         bool
	queued, flights int
	used            time.Time
}

// loads are every lane's loads, the busiest (most queued and in flight)
// first, then the most recently used; with vouchedFirst, the lanes the
// upstream vouched for before all others.
func (t *Table) loads(vouchedFirst bool) []load {
	lanes := t.allLanes()
	loads := make([]load, len(lanes))
	for i, l := range lanes {
		l.g.mu.Lock()
		loads[i] = load{l, vouchedFirst && l.vouched(), l.queued, l.inFlight, l.used()}
		l.g.mu.Unlock()
	}
	slices.SortStableFunc(loads, func(a, b load) int {
		if a.vouched != b.vouched {
			if a.vouched {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.queued+b.flights, a.queued+a.flights), b.used.Compare(a.used))
	})
	return loads
}

// sweepLocked removes idle lanes whose last use is older than the TTL. It
// runs at most every TTL/8 so laneFor stays O(1) on average. Lanes are visited
// oldest first and the walk stops at the first one used recently. Requires
// t.mu held.
func (t *Table) sweepLocked(now time.Time) {
	if now.Sub(t.lastSweep) < t.cfg.IdleTTL/8 {
		return
	}
	t.lastSweep = now
	t.sweepListLocked(t.lanes, now)
	t.sweepListLocked(t.unproven, now)
}

// sweepListLocked is sweepLocked's walk of one of the table's lists.
// Requires t.mu held.
func (t *Table) sweepListLocked(lanes *simplelru.LRU[Key, *Lane], now time.Time) {
	for _, key := range lanes.Keys() {
		l, _ := lanes.Peek(key)
		if now.Sub(l.used()) < t.cfg.IdleTTL {
			return
		}
		// A group whose lock is taken is busy, maybe waiting on a shared
		// store: the table does not wait for it, and the lane stays until
		// a later sweep finds it idle.
		if !l.g.mu.TryLock() {
			continue
		}
		idle := l.queued == 0 && l.inFlight == 0 && l.sessions.Load() == 0
		l.g.mu.Unlock()
		if idle {
			t.sweeping = true
			lanes.Remove(key)
			t.sweeping = false
		}
	}
}

// evicted is a lane that left the table, and why.
type evicted struct {
	lane   *Lane
	reason string
}

func (t *Table) takeEvictedLocked() []evicted {
	ev := t.evicted
	t.evicted = nil
	return ev
}

func (t *Table) notify(evicted []evicted) {
	if len(evicted) == 0 {
		return
	}
	now := t.cfg.Lane.Clock.Now()
	for _, e := range evicted {
		if t.cfg.onEvict != nil {
			t.cfg.onEvict(e.lane)
		}
		if t.cfg.onChange != nil {
			t.cfg.onChange(laneChange{Kind: changeEvicted, Lane: e.lane, At: now, Reason: e.reason})
		}
	}
}

// routeOps are the operators' changes in force on a route: its limits set
// at run time (nil: as it started) and who set them, and its hold.
type routeOps struct {
	limits *limit.Limits
	set    byOperator
	hold   *byOperator
}
