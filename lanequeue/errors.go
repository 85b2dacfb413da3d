package lanequeue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors returned by Acquire and Slot.WaitRetry; check with errors.Is.
var (
	// ErrQueueFull: the lane already has Config.MaxQueue waiters.
	ErrQueueFull = errors.New("lanequeue: queue full")
	// ErrDeadlineExceeded: the request's deadline passed (the error
	// wraps the context's too), or falls before the lane's pause ends, so
	// waiting cannot help.
	ErrDeadlineExceeded = errors.New("lanequeue: request deadline exceeded")
)

// WaitError is the error of a request that the group cannot send before
// its deadline: a pause or the pacing holds the queue until At, after it.
// It is returned at once rather than after the whole wait; it matches
// ErrDeadlineExceeded with errors.Is. A request whose deadline passed
// while an operator held its lane (Held) gets one too, at its deadline:
// nobody knows when a hold ends, so At is zero.
type WaitError struct {
	At     time.Time // the earliest the group may send again
	Paused bool      // a pause holds it (else the pacing)
	Held   bool      // an operator's hold held it
}

func (e *WaitError) Error() string {
	if e.Held {
		return "lanequeue: an operator's hold held the lane past the request's deadline"
	}
	why := "pacing"
	if e.Paused {
		why = "a pause"
	}
	return "lanequeue: " + why + " holds the lane until " + e.At.Format(time.RFC3339Nano) + ", after the request's deadline"
}

func (e *WaitError) Is(target error) bool { return target == ErrDeadlineExceeded }

func deadlineErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrDeadlineExceeded, err)
	}
	return err
}

// refusal is Acquire's error: err, met in the lane whose ID is id.
type refusal struct {
	id  string
	err error
}

func (e *refusal) Error() string  { return e.err.Error() }
func (e *refusal) Unwrap() error  { return e.err }
func (e *refusal) LaneID() string { return e.id }
