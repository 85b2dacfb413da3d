package lanequeue

import "time"

// pacer decides whether the lane's learned request and token budgets allow
// another dispatch now. All methods require the lane's mutex held.
type pacer struct{}

// admitLocked reports whether a request costing cost tokens may go at now;
// when not, it returns the earliest time worth asking again.
func (p *pacer) admitLocked(now time.Time, cost int64) (time.Time, bool) {
	return time.Time{}, true
}

// refundLocked gives back what admitLocked took for a request that never
// reached the upstream.
func (p *pacer) refundLocked(cost int64) {}
