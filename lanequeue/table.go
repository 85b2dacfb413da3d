package lanequeue

import (
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// TableConfig bounds the lane table. Zero fields take the documented defaults.
type TableConfig struct {
	Lane     Config        // every new lane's config
	MaxLanes int           // most lanes kept; the least recently used goes first; zero = 10000
	IdleTTL  time.Duration // a lane unused this long with nothing queued or in flight is dropped; zero = 10m
	// OnEvict is called, outside the table's lock, for every lane dropped.
	OnEvict func(*Lane)
}

// Table holds the lanes, bounded in number; idle lanes are evicted.
//
// A lane evicted for space while it still has work keeps serving the
// requests that hold it; a later request with the same key gets a new lane.
// With MaxLanes well above the number of active lanes this never happens.
type Table struct {
	cfg TableConfig

	mu        sync.Mutex
	lanes     *simplelru.LRU[string, *Lane]
	evicted   []*Lane // filled by the LRU callback under mu, drained after unlock
	lastSweep time.Time
	groups    map[string]*group // shared budgets by Key.LimitGroup
}

// group is one shared pacer and how many lanes in the table use it.
type group struct {
	pace  *pacer
	lanes int
}

// NewTable returns an empty table.
func NewTable(cfg TableConfig) *Table {
	cfg.Lane = cfg.Lane.withDefaults()
	if cfg.MaxLanes <= 0 {
		cfg.MaxLanes = 10000
	}
	if cfg.IdleTTL <= 0 {
		cfg.IdleTTL = 10 * time.Minute
	}
	t := &Table{cfg: cfg, groups: map[string]*group{}}
	lanes, err := simplelru.NewLRU[string, *Lane](cfg.MaxLanes, func(_ string, l *Lane) {
		t.evicted = append(t.evicted, l)
		l.mu.Lock()
		idle := l.idleLocked()
		if !idle {
			// Still serving: the group stays until the lane is idle, so a
			// new lane for the same key shares its budget meanwhile.
			l.orphaned = func() {
				t.mu.Lock()
				defer t.mu.Unlock()
				t.dropGroupLocked(l.key.LimitGroup())
			}
		}
		l.mu.Unlock()
		if idle {
			t.dropGroupLocked(l.key.LimitGroup())
		}
	})
	if err != nil {
		panic(err) // only for a non-positive size, excluded above
	}
	t.lanes = lanes
	return t
}

// dropGroupLocked forgets one lane's use of a limit group. Requires t.mu
// held.
func (t *Table) dropGroupLocked(gk string) {
	if g := t.groups[gk]; g != nil {
		if g.lanes--; g.lanes <= 0 {
			delete(t.groups, gk)
		}
	}
}

// Get returns the lane for key, creating it when needed.
func (t *Table) Get(key Key) *Lane {
	id := key.ID()
	t.mu.Lock()
	now := t.cfg.Lane.Clock.Now()
	l, ok := t.lanes.Get(id)
	if !ok {
		gk := key.LimitGroup()
		g := t.groups[gk]
		if g == nil {
			g = &group{pace: &pacer{}}
			t.groups[gk] = g
		}
		g.lanes++
		l = newLane(key, t.cfg.Lane, g.pace)
		t.lanes.Add(id, l)
	} else {
		l.mu.Lock()
		l.lastUsed = now // so the sweep below cannot drop the lane it returns
		l.mu.Unlock()
	}
	t.sweepLocked(now)
	evicted := t.takeEvictedLocked()
	t.mu.Unlock()
	t.notify(evicted)
	return l
}

// Lookup returns the lane with this ID, if the table has it.
func (t *Table) Lookup(id string) (*Lane, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lanes.Peek(id)
}

// Has reports whether l is still in the table (not evicted).
func (t *Table) Has(l *Lane) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	got, ok := t.lanes.Peek(l.id)
	return ok && got == l
}

// Len is the number of lanes.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lanes.Len()
}

// Lanes returns every lane, least recently used first.
func (t *Table) Lanes() []*Lane {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lanes.Values()
}

// States returns a snapshot of every lane, least recently used first.
func (t *Table) States() []State {
	lanes := t.Lanes()
	out := make([]State, 0, len(lanes))
	for _, l := range lanes {
		out = append(out, l.State())
	}
	return out
}

// Sweep drops lanes idle for longer than IdleTTL now, without waiting for
// the next Get.
func (t *Table) Sweep() {
	t.mu.Lock()
	t.lastSweep = time.Time{}
	t.sweepLocked(t.cfg.Lane.Clock.Now())
	evicted := t.takeEvictedLocked()
	t.mu.Unlock()
	t.notify(evicted)
}

// sweepLocked removes idle lanes whose last use is older than the TTL. It
// runs at most every TTL/8 so Get stays O(1) on average. Lanes are visited
// oldest first and the walk stops at the first one used recently. Requires
// t.mu held.
func (t *Table) sweepLocked(now time.Time) {
	if now.Sub(t.lastSweep) < t.cfg.IdleTTL/8 {
		return
	}
	t.lastSweep = now
	for _, id := range t.lanes.Keys() {
		l, _ := t.lanes.Peek(id)
		l.mu.Lock()
		stale := now.Sub(l.lastUsed) >= t.cfg.IdleTTL
		idle := l.idleLocked()
		l.mu.Unlock()
		if !stale {
			return
		}
		if idle {
			t.lanes.Remove(id)
		}
	}
}

func (t *Table) takeEvictedLocked() []*Lane {
	ev := t.evicted
	t.evicted = nil
	return ev
}

func (t *Table) notify(evicted []*Lane) {
	if t.cfg.OnEvict == nil {
		return
	}
	for _, l := range evicted {
		t.cfg.OnEvict(l)
	}
}
