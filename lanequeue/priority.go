package lanequeue

import (
	"errors"
	"strings"
)

// Priority is a request's class within its lane: High goes ahead of queued
// Low requests, which keep a guaranteed share of the dispatches.
type Priority uint8

const (
	High Priority = iota
	Low
)

// String is "high" or "low".
func (p Priority) String() string {
	if p == Low {
		return "low"
	}
	return "high"
}

// errPriority is UnmarshalText's error for a text that is neither.
var errPriority = errors.New("a priority is high or low")

// UnmarshalText reads "high" or "low" (any case) into p; p is left as it
// was on any other text.
func (p *Priority) UnmarshalText(text []byte) error {
	switch s := string(text); {
	case strings.EqualFold(s, "high"):
		*p = High
	case strings.EqualFold(s, "low"):
		*p = Low
	default:
		return errPriority
	}
	return nil
}

// lowShare is the share of dispatches kept for low-priority requests while
// high-priority ones wait: one in lowShare.
const lowShare = 4
