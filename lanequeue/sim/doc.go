// Package sim runs the lane engine against a model upstream in simulated
// time: the real proxy (and so the real lane table, groups, header and error
// parsing, and retry decisions) in front of the project's mock upstream
// called in-process, inside a testing/synctest bubble where time passes only
// when every goroutine waits. A matrix cell of e2e/loadbench that takes half
// a minute on real sockets takes a fraction of a second here, so the engine
// is tuned here and confirmed by loadbench.
//
// Everything is in its tests:
//
//	go test ./lanequeue/sim -v            # the matrix, one line a cell
//	go test ./lanequeue/sim -run 'Sim/short' -v
package sim
