package lanequeue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/llmproxy/llmproxy/internal/bound"
)

// A request's way to its slot: Acquire keys it (Key: route, credential's
// hash, path, model), finds or makes its lane (laneFor), and queues it
// there (Lane.acquireAs, in slot.go) for the group's dispatcher
// (dispatch.go).

// Request is what Acquire needs of a request: the parts of its lane's key,
// its estimated cost and priority, and the client it comes from.
type Request struct {
	Route      string // "" for the default upstream
	Credential string // as sent ("" for none): hashed at once, never kept
	Path       string
	Model      string
	Cost       int64 // estimated tokens
	Output     int64 // of Cost, the output it reserves (max_tokens)
	Priority   Priority
	// Client names who sent it (an eval, a user; "" for none): the
	// lane's clients take turns (see State.Clients). Shown as given,
	// bounded as a key's model is.
	Client string
}

// Acquire queues r in its lane (made when needed), after its route's model
// gate when it has one, and waits for its turn. It returns a slot, or an
// error (see Lane's acquire) with a LaneID method naming the lane, on
// which Answered counts the refused request's answer.
func (t *Table) Acquire(ctx context.Context, r Request) (*Slot, error) {
	key := NewKey(r.Route, r.Credential, r.Path, r.Model)
	l := t.laneFor(key)
	var leave func()
	var gated bool
	if gate := t.gates[key.Route]; gate != nil {
		var err error
		if leave, gated, err = gate.enter(ctx, key.Model); err != nil {
			return nil, &refusal{l.id, err}
		}
	}
	s, err := l.acquireAs(ctx, r.Cost, r.Priority, bounded(r.Client), r.Output)
	if err != nil {
		if leave != nil {
			leave()
		}
		return nil, &refusal{l.id, err}
	}
	s.leave = leave
	if gated {
		s.held |= heldGate
	}
	return s, nil
}

// NewKey is the key of a request on route that carries credential (""
// when none) to path for model: the credential hashed, path and model
// bounded (see bounded).
func NewKey(route, credential, path, model string) Key {
	return Key{Route: route, CredentialHash: HashCredential(credential), Path: bounded(path), Model: bounded(model)}
}

// HashCredential returns the hex SHA-256 of a credential; "" stays "".
func HashCredential(raw string) string {
	if raw == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(raw))
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:])
}

// maxField is the longest a path or model may be in a lane key as given;
// longer ones are shortened (see bound.Field).
const maxField = bound.MaxField

// bounded is s as a lane key field (see bound.Field): a client cannot
// make a lane, its metrics labels or /lanes grow with what it sends.
func bounded(s string) string { return bound.Field(s) }

// laneFor returns the lane for key, creating it when needed.
func (t *Table) laneFor(key Key) *Lane {
	t.mu.Lock()
	now := t.cfg.Lane.Clock.Now()
	l, ok := t.getLocked(key)
	if ok {
		l.touch(now) // so the sweep below cannot drop the lane it returns
	} else {
		l = t.newLaneLocked(key)
	}
	t.sweepLocked(now)
	evicted := t.takeEvictedLocked()
	t.mu.Unlock()
	t.notify(evicted)
	return l
}

// newLaneLocked makes the lane of key, in its group (made when needed),
// drawing on the limit of its key (see group.limitOf). Requires t.mu held.
func (t *Table) newLaneLocked(key Key) *Lane {
	id := t.newIDLocked(key)
	g := t.groupLocked(key)
	g.refs.Add(1)
	l := g.newLane(key, id)
	l.held = t.laneHolds[id]
	t.ids[l.id] = l
	t.makeRoomLocked()
	t.unproven.Add(key, l)
	return l
}

// groupLocked is the group of key's route and credential, made when
// needed. Requires t.mu held.
func (t *Table) groupLocked(key Key) *group {
	gk := key.groupKey()
	if g := t.groups[gk]; g != nil {
		return g
	}
	cfg, set := t.routeConfigLocked(key.Route)
	g := newGroup(gk, cfg, t.cfg.Shared, t.forgotten)
	g.route, g.set = key.Route, set
	if ops := t.routeOps[key.Route]; ops != nil {
		g.held = ops.hold
	}
	g.cap, g.seat.wake = t.cap, g.kick
	g.onChange = t.cfg.onChange
	g.refused = t.dropRefused
	t.groups[gk] = g
	return g
}

// getLocked returns the table's lane for key, now its most recently used,
// moving it among the vouched lanes when it became one. Requires t.mu held.
func (t *Table) getLocked(key Key) (*Lane, bool) {
	if l, ok := t.lanes.Get(key); ok {
		return l, true
	}
	l, ok := t.unproven.Get(key)
	if ok && l.vouched() {
		t.promoteLocked(key, l)
	}
	return l, ok
}

// promoteLocked moves l, of key, from unproven to lanes, as the most
// recently used. Requires t.mu held.
func (t *Table) promoteLocked(key Key, l *Lane) {
	t.moving = true
	t.unproven.Remove(key)
	t.moving = false
	t.lanes.Add(key, l)
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

// newIDLocked is the ID of a new lane of key: the first idDigits hex
// digits of the key's digest, or more of them when a lane of the table
// already has that ID. IDs name lanes in headers, logs and metric labels,
// where two lanes must not share one; 48 bits make a chance collision
// negligible, not one a client could search for. Requires t.mu held.
func (t *Table) newIDLocked(key Key) string {
	digest := key.digest()
	for n := t.cfg.idDigits; n < len(digest); n += 4 {
		if _, taken := t.ids[digest[:n]]; !taken {
			return digest[:n]
		}
	}
	return digest
}

// ID is the key's short hashed identifier, stable for a given key: what
// its lane is named by, unless another lane of the table had it first
// (see Table.newIDLocked).
func (k Key) ID() string { return k.digest()[:shortLen] }

// digest is the hex SHA-256 of the key's parts.
func (k Key) digest() string {
	h := sha256.New()
	for _, s := range []string{k.Route, k.CredentialHash, k.Path, k.Model} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}
