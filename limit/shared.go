package limit

import "time"

// Shared is the state that the lanes of one pool share: the budgets
// learned from the upstream, the pause, and the concurrency permits. The
// lanes keep their queues and counters; everything that must agree across
// lanes, and across replicas of the proxy, sits behind this interface.
//
// Calls come from the group with its mutex held, one at a time, with the
// time as an argument; an implementation must answer promptly (one backed
// by a remote store answers from what it knows locally when the store is
// slow) and needs no lock of its own for the group's sake. The group calls
// Refund and Return at most once for a ticket, and Settle never for one
// refunded: an implementation keeps no such guard of its own.
type Shared interface {
	// Admit decides whether a request costing cost tokens may go now: the
	// pause is over, a concurrency permit is free and the budgets allow
	// it. If so it takes the permit, charges the budgets and returns the
	// dispatch's ticket. If not, at is when to ask again; a zero at means
	// that only an answer or a returned permit can change the answer.
	// alone says that no earlier dispatch of the pool awaits its answer:
	// then budgets that can only learn more from an answer let the request
	// go to find out.
	Admit(now time.Time, cost int64, alone bool) (t Ticket, at time.Time, ok bool)
	// Learn folds one answer to t's dispatch into the state: the pause,
	// the budgets and the concurrency limit. It may note in t what its
	// later calls on t need. It may decline the report's pause when what
	// it learned holds the pool better (a refusal by an upstream that
	// admits other requests, with no wait named for a rate): PausedUntil
	// tells what it took.
	Learn(t *Ticket, r Report, now time.Time)
	// Refund gives back what t's dispatch charged to the budgets, when it
	// never reached the upstream (the pool calls it after Learn of a
	// NotSent answer).
	Refund(t *Ticket)
	// Settle swaps t's estimated token cost for what the answer used.
	Settle(t *Ticket, usedTokens int64)
	// Return gives back t's concurrency permit: its answer ended, or the
	// request waits to try again.
	Return(t *Ticket, now time.Time)
	// PausedUntil is the end of the current pause; zero or past when none.
	PausedUntil() time.Time
	// View is what the state shows at now.
	View(now time.Time) View
	// Knows reports whether the state has learned a limit from the
	// upstream (headers or refusals): a pool whose configured limits are
	// only where learning starts (Limits.Start) then drops them.
	Knows() bool
	// Configure takes cfg as the pool's configuration from now on: an
	// operator changed the route's configured limits while the proxy
	// runs. The concurrency bounds apply at once; a configured
	// concurrency is the limit now.
	Configure(cfg Config)
	// Forget drops what the state learned (budgets, paces, windows, the
	// concurrency limit, a pause), as an operator asks, and starts again
	// from its configuration; the permits out stay counted.
	Forget()
	// AnsweredElsewhere reports whether another replica of the proxy
	// that keeps the state together with this one learned from an answer
	// of the pool lately: the first-answer window need not wait for one
	// of this replica's own. Always false for state in one process.
	AnsweredElsewhere() bool
}
