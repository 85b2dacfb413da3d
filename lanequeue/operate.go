package lanequeue

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// An operator's changes (the admin endpoints) name who asked (by, as
// State shows it; never a credential) and when (at), and last as long as
// the table. A route's ("" for the default upstream) reach its lanes made
// later too. A lane's name it by its ID: with elsewhere (another replica
// took the change first) a lane the table lacks is no error, and a hold
// is kept for it; else it is errUnknownLane, and nothing changes.

// SetRouteLimits makes lim route's configured limits from now on: its RPM,
// TPM, Concurrency, MinGap and Start; whether its models share one limit
// (PerCredential) stays as the route started. nil: the limits the route
// started with (TableConfig.RouteLimits).
func (t *Table) SetRouteLimits(route string, lim *limit.Limits, by string, at time.Time) {
	t.operateRoute(route, operation{Kind: opLimits, Limits: lim, By: by, At: at})
}

// HoldRoute holds route's lanes: they dispatch nothing, their waiters
// wait (each until its deadline); with held false it releases them, and
// the waiters go in their order.
func (t *Table) HoldRoute(route string, held bool, by string, at time.Time) {
	t.operateRoute(route, operation{Kind: holdKind(held), By: by, At: at})
}

// ClearRoute forgets what the limits of route's lanes learned (paces,
// windows, the concurrency limit, a pause, a spent quota); configured
// limits stay. It touches only the lanes there are.
func (t *Table) ClearRoute(route, by string, at time.Time) {
	t.operateRoute(route, operation{Kind: opClear, By: by, At: at})
}

// HoldLane holds the lane whose ID is id, or with held false releases it,
// as HoldRoute a route's; kept by ID for a lane of that ID made later too.
func (t *Table) HoldLane(id string, held bool, by string, at time.Time, elsewhere bool) error {
	return t.operateLane(id, operation{Kind: holdKind(held), By: by, At: at, Elsewhere: elsewhere})
}

// ClearLane forgets what the limit the lane whose ID is id draws on learned.
func (t *Table) ClearLane(id, by string, at time.Time, elsewhere bool) error {
	return t.operateLane(id, operation{Kind: opClear, By: by, At: at, Elsewhere: elsewhere})
}

// operation is an operator's change, as the method that made it took it.
type operation struct {
	Kind      opKind
	Limits    *limit.Limits // opLimits
	By        string
	At        time.Time
	Elsewhere bool
}

// opKind is what an operation does.
type opKind uint8

const (
	opLimits opKind = iota
	opHold
	opRelease
	opClear
)

func holdKind(held bool) opKind {
	if held {
		return opHold
	}
	return opRelease
}

// errUnknownLane: no lane of the table has the ID a lane's change named.
var errUnknownLane = errors.New("lanequeue: no lane has that ID")

func operatorOf(op operation) *byOperator { return &byOperator{at: op.At, by: op.By} }

// operateRoute applies op to every lane of route, and to those its route
// makes later (a clear touches only the lanes there are).
func (t *Table) operateRoute(route string, op operation) {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.mu.Lock()
	ops := t.routeOps[route]
	if ops == nil {
		ops = &routeOps{}
		t.routeOps[route] = ops
	}
	switch op.Kind {
	case opLimits:
		ops.limits = nil
		if op.Limits != nil {
			lim := *op.Limits
			lim.PerCredential = t.cfg.RouteLimits[route].PerCredential
			ops.limits, ops.set = &lim, *operatorOf(op)
		}
	case opHold:
		ops.hold = operatorOf(op)
	case opRelease:
		ops.hold = nil
	}
	cfg, set := t.routeConfigLocked(route)
	var groups []*group
	for _, g := range t.groups {
		if g.route == route {
			groups = append(groups, g)
		}
	}
	t.mu.Unlock()
	for _, g := range groups {
		switch op.Kind {
		case opLimits:
			g.operated(func() { g.reconfigureLocked(cfg, set) })
		case opHold, opRelease:
			g.operated(func() { g.held = ops.hold })
		case opClear:
			g.operated(func() { g.clearLocked(operatorOf(op)) })
		}
	}
}

// operateLane applies op to the lane whose ID is id: a hold or its
// release, kept by ID for a lane of that ID made later too, or a clear.
func (t *Table) operateLane(id string, op operation) error {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.mu.Lock()
	l := t.ids[id]
	if l == nil && !op.Elsewhere {
		t.mu.Unlock()
		return fmt.Errorf("lane %s: %w", id, errUnknownLane)
	}
	switch op.Kind {
	case opHold:
		t.laneHolds[id] = operatorOf(op)
	case opRelease:
		delete(t.laneHolds, id)
	}
	hold := t.laneHolds[id]
	t.mu.Unlock()
	if l != nil && op.Kind == opClear {
		l.g.operated(func() { l.drawsOn().forget(l.g.cfg, operatorOf(op)) })
	} else if l != nil {
		l.g.operated(func() { l.held = hold })
	}
	return nil
}

// operated makes an operator's change to the group (change, run under
// its mutex), then lets the waiters go as the group now allows.
func (g *group) operated(change func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	change()
	g.dispatchLocked(g.clock.Now())
}

// reconfigureLocked makes cfg the group's config, and its limits' (their
// ceilings and their states' bounds), with set the limits an operator
// set (nil: none). Requires g.mu held.
func (g *group) reconfigureLocked(cfg Config, set *RuntimeLimits) {
	g.limMu.Lock()
	g.cfg, g.set = cfg, set
	for _, p := range g.limits {
		p.configure(cfg)
		p.shared.Configure(cfg.limitConfig())
	}
	g.limMu.Unlock()
}

// clearLocked has each limit of the group forget what it learned, m
// having asked. Requires g.mu held.
func (g *group) clearLocked(m *byOperator) {
	g.limMu.Lock()
	for _, p := range g.limits {
		p.forget(g.cfg, m)
	}
	g.limMu.Unlock()
}
