package lanequeue

// held is a set of the reasons a waiter was held back for, one bit each
// (heldNames' order).
type held uint8

// The reasons, in the order Waited lists them. The first three are a
// limit's own (pool.heldAt), the cap is the group's.
const (
	heldGate held = 1 << iota
	heldPause
	heldPace
	heldConcurrency
	heldCap
)

var heldNames = [...]string{"model_gate", "pause", "pace", "concurrency", "cap"}

// limitHeld are the reasons a limit keeps the pass it last held its
// lanes for (pool.heldAt), by their index.
const (
	limitPause = iota
	limitPace
	limitConcurrency
	limitReasons
)
