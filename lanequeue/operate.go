package lanequeue

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// Operation is an operator's change to lanes while the proxy runs (the
// admin endpoints): what changes, who asked and when. Table.OperateRoute
// applies one to every lane of a route, those made later included;
// Table.OperateLane to one lane. Changes last as long as the table.
type Operation struct {
	Kind OpKind
	// Limits are the route's configured limits from now on (OpLimits):
	// its RPM, TPM, Concurrency, MinGap and Start; whether its models
	// share one limit (PerCredential) stays as the route started. nil:
	// the limits the route started with (TableConfig.RouteLimits).
	Limits *limit.Limits
	By     string    // who asked, as State shows it; never a credential
	At     time.Time // when
	// Elsewhere: another replica of the proxy took the operation first. A
	// hold or release of a lane this table does not have is kept for the
	// lane when it comes.
	Elsewhere bool
}

// OpKind is what an Operation does.
type OpKind uint8

const (
	_ OpKind = iota // none
	// OpLimits sets a route's configured limits (a route's only).
	OpLimits
	// OpHold holds the lanes: they dispatch nothing, their waiters wait
	// (each until its deadline), until OpRelease.
	OpHold
	// OpRelease ends a hold: the waiters go in their order.
	OpRelease
	// OpClear forgets what the lanes' limits learned (budgets, paces,
	// windows, the concurrency limit, a pause); configured limits stay.
	OpClear
)

func (k OpKind) String() string {
	switch k {
	case OpLimits:
		return "limits"
	case OpHold:
		return "hold"
	case OpRelease:
		return "release"
	case OpClear:
		return "clear"
	}
	return "unknown"
}

// ErrUnknownLane: no lane of the table has the ID OperateLane was given.
var ErrUnknownLane = errors.New("lanequeue: no lane has that ID")

// mark is who made an operator's change, and when.
type mark struct {
	at time.Time
	by string
}

func markOf(op Operation) *mark { return &mark{at: op.At, by: op.By} }

// routeOps are the operators' changes in force on a route: its limits set
// at run time (nil: as it started) and who set them, and its hold.
type routeOps struct {
	limits *limit.Limits
	set    mark
	hold   *mark
}

// RuntimeLimits are a route's configured limits as an operator set them
// while the proxy runs, when, and by whom.
type RuntimeLimits struct {
	limit.ConfiguredView
	SetAt time.Time `json:"set_at"`
	By    string    `json:"by"`
}

// OperateRoute applies op to every lane of route ("" for the default
// upstream), and to those its route makes later: its limits, a hold or
// its release, or a clear of what each of its limits learned (a clear
// touches only the lanes there are).
func (t *Table) OperateRoute(route string, op Operation) {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.mu.Lock()
	ops := t.routeOps[route]
	if ops == nil {
		ops = &routeOps{}
		t.routeOps[route] = ops
	}
	switch op.Kind {
	case OpLimits:
		ops.limits = nil
		if op.Limits != nil {
			lim := *op.Limits
			lim.PerCredential = t.cfg.RouteLimits[route].PerCredential
			ops.limits, ops.set = &lim, *markOf(op)
		}
	case OpHold:
		ops.hold = markOf(op)
	case OpRelease:
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
		case OpLimits:
			g.reconfigure(cfg, set)
		case OpHold, OpRelease:
			g.hold(ops.hold)
		case OpClear:
			g.clear(markOf(op))
		}
	}
}

// routeConfigLocked is the config a group of route starts from now, and
// its limits set at run time (nil: none). Requires t.mu held.
func (t *Table) routeConfigLocked(route string) (Config, *RuntimeLimits) {
	cfg := t.cfg.Lane
	lim, ok := t.cfg.RouteLimits[route]
	var set *RuntimeLimits
	if ops := t.routeOps[route]; ops != nil && ops.limits != nil {
		lim, ok = *ops.limits, true
		set = &RuntimeLimits{ConfiguredView: lim.View(), SetAt: ops.set.at, By: ops.set.by}
	}
	if ok {
		cfg.Limits = lim
		cfg = cfg.withDefaults()
	}
	return cfg, set
}

// OperateLane applies op to the lane whose ID is id (as State shows it): a
// hold or its release, kept by ID for a lane of that ID made later too,
// or a clear of what the lane's limit learned. It returns ErrUnknownLane,
// and changes nothing, when no lane of the table has that ID, unless
// op.Elsewhere. An OpLimits is a route's, not a lane's: an error.
func (t *Table) OperateLane(id string, op Operation) error {
	if op.Kind == OpLimits {
		return fmt.Errorf("lanequeue: lane %s: limits are set on a route", id)
	}
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.mu.Lock()
	l := t.ids[id]
	if l == nil && !op.Elsewhere {
		t.mu.Unlock()
		return fmt.Errorf("lane %s: %w", id, ErrUnknownLane)
	}
	switch op.Kind {
	case OpHold:
		t.laneHolds[id] = markOf(op)
	case OpRelease:
		delete(t.laneHolds, id)
	}
	hold := t.laneHolds[id]
	t.mu.Unlock()
	if l != nil && op.Kind == OpClear {
		l.clear(markOf(op))
	} else if l != nil {
		l.hold(hold)
	}
	return nil
}

// reconfigure makes cfg the group's config, and its limits' (their
// ceilings and their states' bounds), with set the limits an operator
// set (nil: none); then the waiters go as the new limits let them.
func (g *group) reconfigure(cfg Config, set *RuntimeLimits) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limMu.Lock()
	g.cfg, g.set = cfg, set
	for _, p := range g.limits {
		p.configure(cfg)
		p.shared.Configure(cfg.limitConfig())
	}
	g.limMu.Unlock()
	g.dispatchLocked(g.clock.Now())
}

// hold holds the group (m: who and when) or, with nil, releases it.
func (g *group) hold(m *mark) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = m
	g.dispatchLocked(g.clock.Now())
}

// clear forgets what each limit of the group learned.
func (g *group) clear(m *mark) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limMu.Lock()
	for _, p := range g.limits {
		p.forget(g.cfg, m)
	}
	g.limMu.Unlock()
	g.dispatchLocked(g.clock.Now())
}

// hold holds the lane (m: who and when) or, with nil, releases it.
func (l *Lane) hold(m *mark) {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	l.held = m
	g.dispatchLocked(g.clock.Now())
}

// clear forgets what the limit the lane draws on learned.
func (l *Lane) clear(m *mark) {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	l.drawsOn().forget(g.cfg, m)
	g.dispatchLocked(g.clock.Now())
}

// operatorHoldLocked is an operator's hold that keeps the lane from
// dispatching, its own or its route's, and what it holds ("lane" or
// "route"); nil when none. Requires the group's mutex held.
func (l *Lane) operatorHoldLocked() (*mark, string) {
	if l.held != nil {
		return l.held, "lane"
	}
	if l.g.held != nil {
		return l.g.held, "route"
	}
	return nil, ""
}

// configure takes cfg's configured limits: a new ceiling (nil when none),
// and a limit they name is known. Requires the group's mutex held.
func (l *pool) configure(cfg Config) {
	l.ceil = nil
	if !cfg.Limits.IsZero() {
		l.ceil = cfg.Limits.Ceiling()
	}
	// A configured limit is known: no need to wait for the first answer
	// to learn one.
	l.learned = l.learned || cfg.Limits.RPM > 0 || cfg.Limits.TPM > 0 || cfg.Limits.Concurrency > 0
}

// forget drops what the limit learned, a spent quota too, as a new limit
// of cfg starts, and notes who asked (m). Requires the group's mutex held.
func (l *pool) forget(cfg Config, m *mark) {
	l.shared.Forget()
	l.quota = quotaHold{}
	l.learned, l.firstAnswerUntil = false, time.Time{}
	l.configure(cfg)
	l.seen = seen{}
	l.admitted, l.spoke, l.refusedAt = false, false, time.Time{}
	l.cleared = m
}
