//go:build race

package proxy

// raceEnabled: the race detector is on, and allocates on its own.
const raceEnabled = true
