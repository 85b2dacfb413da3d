// Package limit holds the state of one upstream limit and how it learns
// from each answer: the Shared interface a pool (the lanes that draw on
// one limit) draws on, the evidence that crosses it (Ticket at dispatch,
// Report of an answer, View of the state), Memory (the state in this
// process), and the route's configured ceilings. It decides nothing about
// queues; package lanequeue asks it whether a request may go and tells it
// what each answer said, with the mutex of the pool's group (the lanes of
// one route and credential) held.
//
// A limit has a shape: a token bucket, or fixed windows learned from
// refusals that end at one boundary (windows.go). Every call takes the
// time as an argument.
//
// # Pacing from headers
//
// Each window an upstream states (requests, tokens) is a token bucket: a
// size, what is left, a refill rate learned from the headers (what is
// missing refills by the reset). A request takes its estimated cost at
// dispatch; its answer's remaining count replaces the local count, less
// what was sent after it, and its usage settles the estimate. Until a
// window is known it holds nothing back.
//
// # Corrections
//
// The upstream's refusals outrank arithmetic on its headers. A refusal of
// a request the bucket had room for shows the headers overstate the
// window (a per-minute limit enforced per second): the window shrinks to
// the most the upstream ever showed left, plus one, and the refill is
// measured from its remaining counts over time, and from the line two
// answers' remaining counts and resets trace (a bucket's remaining is its
// size less its rate times the time to full, whatever its size). An
// answer older than one already counted, and a request refused, which
// the upstream never counted, take nothing more off the window.
//
// # Concurrency
//
// The concurrency limit starts at Config.Concurrency and grows in slow
// start while answers come back with the limit full; it falls only on
// evidence that the number in flight is what binds (a refusal that names
// concurrency, an overloaded answer, a refusal while the pace is well
// under what the upstream admits), and a level refused is tried again
// only after many answers. Rate and concurrency are separate controls: in
// flight = rate × answer time (Little's law), so long answers need many
// in flight to keep a rate, and the limit never falls under that.
//
// # Learning from behaviour
//
// An upstream that explains nothing (a bare 429 or 503) still shows its
// limit by what it does. Between two refusals its bucket was empty at both
// ends, so the requests it admitted in between, over the time between
// their dispatches, is its refill rate. Refusals that come only at the top
// numbers in flight, where admissions are rare, show a concurrency limit;
// refusals at any level show a rate. The pool cruises a little under the
// measured rate and now and then probes above it for a short spell,
// followed by as long a spell below: a probe that meets no refusal raises
// the rate. Words (a hint, Retry-After, "too many concurrent requests")
// only make it converge sooner. The learner (behaviour.go) alone moves
// the admitted rate; the concurrency controller (concurrency.go) alone
// moves its limit and ends its slow start, which a pool has unless its
// concurrency is configured (Limits.SlowStart). ("Probe" means this, sending above what
// the upstream was seen to admit, everywhere in this package: the pace's
// probe cycle, and a fixed window sending one more than its allowance.
// A budget is one of the upstream's windows, of requests or of tokens,
// stated by its headers or paced from its refusals; a request's time to
// wait is its deadline, lanequeue's and proxy's.)
//
// # Pauses
//
// An answer the proxy retries after may ask the pool to pause
// (Report.PauseUntil). Whether the pool takes it is decided in pause.go:
// poolPause declines it for a fixed window's closure, or a refusal the
// learned pace or concurrency limit holds the pool for better; lengthen
// lengthens, or takes, one the upstream's refusals show charged.
//
// # Replicas
//
// Memory is the in-process state of a pool. A Shared kept elsewhere
// (redisstate) admits from state every replica shares and tells Memory,
// through Fleet, what the other replicas did, so that what each replica
// learns is about the pool as the upstream sees it.
package limit
