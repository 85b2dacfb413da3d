//go:build race

package sim

// raceBuild: the race detector slows every goroutine several times and
// changes the order in which those that wake at one simulated instant run,
// so a run under it is another (harsher) schedule, not the one the targets
// are set for. Under it TestSim holds only "no client fails".
const raceBuild = true
