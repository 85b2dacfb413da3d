package lanequeue

import (
	"container/list"
	"slices"
	"strings"
	"time"
)

// Fair turns among a lane's clients. A request may name its client
// (Request.Client: the eval, the user). A lane keeps one FIFO per client and
// priority; within each priority class the clients with waiters take turns,
// one dispatch each, in the order they came to wait, so a client with little
// queued is not behind one with much. A retry still goes before every waiter
// of its class that arrived after it, out of turn. Requests that name no
// client are one client of their own, which the Lane embeds: a lane no
// request names a client on is the one FIFO it always was, and its requests
// make nothing more.

// maxClients is how many named clients a lane keeps apart. A client is
// forgotten, the least recent first, when a new name needs its place and
// nothing of it is in the lane (waiting, in flight or between retries);
// while all maxClients have, further names share one turn, shown as
// othersClient.
const maxClients = 64

// othersClient names, in State.Clients, the turn that the names past
// maxClients share. No client can send it as its own name: it has spaces.
const othersClient = "(other clients)"

// client is one client's waiters in a lane, one FIFO per priority, and its
// place in the lane's turns of each class while it has waiters there.
type client struct {
	name    string
	waiters [2]list.List // *Slot, by Priority, in arrival order (a retry keeps its place)
	turn    [2]struct{ prev, next *client }
	// live counts its slots from acquire until they are done: a client
	// with none may be forgotten.
	live       int
	dispatched int64
	seen       uint64 // the group's arrival count at its latest request
}

// round is the clients with waiters of one priority class, in the order
// they take turns: a list threaded through the clients, as turns is
// through the lanes.
type round struct {
	first, last *client
	next        *client // whose turn comes next; nil: first's
	queued      int     // waiters of the class, every client's
}

// clientOf is the client a request naming name (""; none) waits as, counted
// live; seq is the request's arrival number. Requires the group's mutex.
func (l *Lane) clientOf(name string, seq uint64) *client {
	c := &l.client
	if name != "" {
		if c = l.named[name]; c == nil {
			c = l.newClient(name)
		}
	}
	c.live++
	c.seen = seq
	return c
}

// newClient makes a client named name, in place of the least recent one
// with nothing in the lane when maxClients are known; when every one of them
// has something in the lane it is the shared turn of the others.
func (l *Lane) newClient(name string) *client {
	if len(l.named) >= maxClients {
		idle := l.leastRecentIdle()
		if idle == nil {
			if l.others == nil {
				l.others = &client{name: othersClient}
			}
			return l.others
		}
		delete(l.named, idle.name)
	}
	if l.named == nil {
		l.named = make(map[string]*client, 1)
	}
	c := &client{name: name}
	l.named[name] = c
	return c
}

// leastRecentIdle is the named client with nothing in the lane whose latest
// request came first; nil when every one has something in it.
func (l *Lane) leastRecentIdle() *client {
	var idle *client
	for _, c := range l.named {
		if c.live == 0 && (idle == nil || c.seen < idle.seen) {
			idle = c
		}
	}
	return idle
}

// push puts s in its client's queue of its class, after every waiter that
// arrived before it and before every one that arrived after it; a client
// whose queue was empty joins the class's round last. A slot that names no
// client is the lane's own. It returns the waiters ahead of s in that
// queue.
func (l *Lane) push(s *Slot) (ahead int) {
	c := s.client
	if c == nil {
		c = &l.client
		s.client = c
	}
	r := &l.rounds[s.prio]
	q := &c.waiters[s.prio]
	if q.Len() == 0 {
		r.join(c, s.prio)
	}
	r.queued++
	if s.retry {
		for at := q.Front(); at != nil; at = at.Next() {
			if at.Value.(*Slot).seq > s.seq {
				s.elem = q.InsertBefore(s, at)
				return ahead
			}
			ahead++
		}
	}
	ahead = q.Len()
	s.elem = q.PushBack(s)
	return ahead
}

// remove takes a waiting s out of its client's queue; a client left with no
// waiter of the class leaves its round.
func (l *Lane) remove(s *Slot) {
	c := s.client
	q := &c.waiters[s.prio]
	q.Remove(s.elem)
	s.elem = nil
	r := &l.rounds[s.prio]
	r.queued--
	if q.Len() == 0 {
		r.leave(c, s.prio)
	}
}

// head is the lane's next waiter of class p: the oldest retry of the class
// that arrived before the first waiter of the client whose turn it is, or
// else that waiter. nil when the class has none.
func (l *Lane) head(p Priority) *Slot {
	r := &l.rounds[p]
	c := r.next
	if c == nil {
		c = r.first
	}
	if c == nil {
		return nil
	}
	s := c.waiters[p].Front().Value.(*Slot)
	// A client's retries are the first of its queue (what arrived before
	// them went before them), the oldest first.
	for o := r.first; o != nil; o = o.turn[p].next {
		if f := o.waiters[p].Front().Value.(*Slot); f.retry && f.seq < s.seq {
			s = f
		}
	}
	return s
}

func (r *round) join(c *client, p Priority) {
	c.turn[p].prev, c.turn[p].next = r.last, nil
	if r.last != nil {
		r.last.turn[p].next = c
	} else {
		r.first = c
	}
	r.last = c
}

func (r *round) leave(c *client, p Priority) {
	t := &c.turn[p]
	if r.next == c {
		r.next = t.next
	}
	if t.prev != nil {
		t.prev.turn[p].next = t.next
	} else {
		r.first = t.next
	}
	if t.next != nil {
		t.next.turn[p].prev = t.prev
	} else {
		r.last = t.prev
	}
	t.prev, t.next = nil, nil
}

// leaveLocked ends s's time in its lane's books: its client loses it, and
// its group its reference; it reports whether that was the group's last.
// Requires the group's mutex held.
func (s *Slot) leaveLocked() (forget bool) {
	s.client.live--
	return s.lane.g.refs.Add(-1) == 0 && s.lane.g.forgotten != nil
}

// ClientState is one client of a lane as /lanes shows it: its name as sent
// ("" for the requests that name none, othersClient for the names past
// maxClients), its waiters, its dispatches (retries included), and how long
// its oldest waiter has waited.
type ClientState struct {
	Name              string  `json:"name"`
	Queued            int     `json:"queued"`
	Dispatched        int64   `json:"dispatched"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds,omitempty"`
}

// clientStates is every client of l, by name, when any request named one
// (the others' turn comes only past maxClients named); nil otherwise.
// Requires the group's mutex held.
func (l *Lane) clientStates(now time.Time) []ClientState {
	if len(l.named) == 0 {
		return nil
	}
	all := []*client{&l.client}
	for _, c := range l.named {
		all = append(all, c)
	}
	if l.others != nil {
		all = append(all, l.others)
	}
	states := make([]ClientState, len(all))
	for i, c := range all {
		st := ClientState{Name: c.name, Dispatched: c.dispatched}
		var oldest time.Time
		for p := range c.waiters {
			if f := c.waiters[p].Front(); f != nil {
				st.Queued += c.waiters[p].Len()
				if at := f.Value.(*Slot).arrived; oldest.IsZero() || at.Before(oldest) {
					oldest = at
				}
			}
		}
		if !oldest.IsZero() {
			st.OldestWaitSeconds = now.Sub(oldest).Seconds()
		}
		states[i] = st
	}
	slices.SortFunc(states, func(a, b ClientState) int { return strings.Compare(a.Name, b.Name) })
	return states
}
