package lanequeue

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

// ParsePriority reads "high" or "low" (any case); ok is false otherwise.
func ParsePriority(s string) (p Priority, ok bool) {
	switch {
	case equalFold(s, "high"):
		return High, true
	case equalFold(s, "low"):
		return Low, true
	}
	return High, false
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		c := a[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != b[i] {
			return false
		}
	}
	return true
}

// LowShare is the share of dispatches kept for low-priority requests while
// high-priority ones wait: one in LowShare.
const LowShare = 4
