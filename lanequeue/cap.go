package lanequeue

import (
	"container/list"
	"sync"
)

// globalCap is one concurrency cap over many groups
// (LLMPROXY_GLOBAL_CONCURRENCY). A group takes it as it dispatches a
// request, after its pause, pace and concurrency let the request go, and
// the request holds it until its permit goes back (its answer ended, or it
// waits to try again); so a group held by its own pause or pace never
// holds any of it. Groups that could dispatch but for the cap wait in
// arrival order, and each freed place goes to the first of them.
type globalCap struct {
	limit int

	mu      sync.Mutex
	inUse   int
	most    int                        // the most in use at once
	waiting list.List                  // *capSeat, in the order they came
	places  map[*capSeat]*list.Element // their places in waiting
}

// capSeat is a group's seat in the cap's line: wake runs the group's
// dispatch again when a place is free for it.
type capSeat struct{ wake func() }

// newCap returns a cap of limit (at least 1).
func newCap(limit int) *globalCap {
	return &globalCap{limit: max(limit, 1), places: map[*capSeat]*list.Element{}}
}

// take gives the group of seat g a place if there is one and no group
// waits before it; otherwise g waits in line for one. Called with the
// group's mutex held.
func (c *globalCap) take(g *capSeat) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.places[g]
	if c.inUse < c.limit && (c.waiting.Len() == 0 || c.waiting.Front() == e) {
		if e != nil {
			c.waiting.Remove(e)
			delete(c.places, g)
		}
		c.inUse++
		c.most = max(c.most, c.inUse)
		if c.inUse < c.limit {
			c.kickLocked() // room for the next in line too
		}
		return true
	}
	if e == nil {
		c.places[g] = c.waiting.PushBack(g)
	}
	return false
}

// giveBack returns a place and lets the first group in line try again.
func (c *globalCap) giveBack() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inUse--
	c.kickLocked()
}

// leave takes the group of seat g out of the line: it has nothing the cap
// holds back. Called with the group's mutex held.
func (c *globalCap) leave(g *capSeat) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.places[g]
	if e == nil {
		return
	}
	first := c.waiting.Front() == e
	c.waiting.Remove(e)
	delete(c.places, g)
	if first {
		c.kickLocked()
	}
}

// kickLocked lets the first group in line try again, if there is room. The
// group runs its dispatch on a goroutine of its own: it takes its own lock,
// which the caller may hold for another group. Requires c.mu held.
func (c *globalCap) kickLocked() {
	if c.inUse >= c.limit || c.waiting.Len() == 0 {
		return
	}
	g := c.waiting.Front().Value.(*capSeat)
	go g.wake()
}

// CapStats is what a globalCap shows.
type CapStats struct {
	Limit int `json:"limit"`
	InUse int `json:"in_use"`
	// Waiting is the number of groups with a request ready but for
	// the cap.
	Waiting int `json:"waiting_groups"`
	Most    int `json:"most_in_use"`
}

// Stats is the cap's state now.
func (c *globalCap) Stats() CapStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CapStats{Limit: c.limit, InUse: c.inUse, Waiting: c.waiting.Len(), Most: c.most}
}
