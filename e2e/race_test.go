//go:build race

package e2e

// raceEnabled: the race detector is on. Tests that hold wall-clock
// figures (restartTimed) skip then; CI runs them in a step of their own.
const raceEnabled = true
