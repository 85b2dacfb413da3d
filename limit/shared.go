package limit

import "time"

// Shared is the state that the lanes of one limit group share: the budgets
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
	// that only an answer or a returned permit can change the answer. With
	// probe set, budgets that can only learn more from an answer let the
	// request go to find out.
	Admit(now time.Time, cost int64, probe bool) (t Ticket, at time.Time, ok bool)
	// Learn folds one answer to t's dispatch into the state: the pause,
	// the budgets and the concurrency limit. It may mark t (Accepted). It
	// may decline the report's pause when what it learned holds the group
	// better (a refusal by an upstream that admits other requests, with
	// no wait named for a rate): PausedUntil tells what it took.
	Learn(t *Ticket, r Report, now time.Time)
	// Refund gives back what t's dispatch charged to the budgets, when it
	// never reached the upstream (the group calls it after Learn of a
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
	// upstream (headers or refusals): a group whose configured limits are
	// only where learning starts (Limits.Start) then drops them.
	Knows() bool
	// AnsweredElsewhere reports whether another replica of the proxy
	// that keeps the state together with this one learned from an answer
	// of the group lately: the first-answer window need not wait for one
	// of this replica's own. Always false for state in one process.
	AnsweredElsewhere() bool
}

// Ticket records one dispatch: what it was charged and what the group knew
// when it went, so its answer can be read against that.
type Ticket struct {
	Dispatched time.Time
	Cost       int64 // estimated tokens charged
	// Requests and Tokens are the running totals charged right after the
	// dispatch (requests dispatched together count as sent first each):
	// what was sent after it may be missing from its answer's figures.
	Requests, Tokens float64
	InFlight         int  // other permits out when it went
	Limit            int  // the concurrency limit when it went
	Room             bool // a budget learned from headers had room for it
	Paced            bool // a pace learned from refusals had room for it
	Accepted         bool // its answer was accepted
	Refunded         bool // its charge was given back
	Returned         bool // its permit was given back
	// Lease names the permit when a shared store outside this process
	// gave it; empty for the in-process state. Such a store gives and
	// takes back its own permits (see Memory.NoteDispatch, NoteReturn).
	Lease string
	// OutNow is the number of permits out, all replicas together, when the
	// answer came; 0 means the in-process count.
	OutNow int
	// Seq numbers the dispatch among the group's dispatches (all
	// replicas', when a store kept elsewhere counts them), for measuring
	// the rate admitted between refusals.
	Seq uint64
	// Refusals is one more than the refusals of the group learned before
	// it went, all replicas together, when a store kept elsewhere counts
	// them; 0 when not counted (one process counts its own).
	Refusals uint64
	// Probe: it went while the learned pace probed above the admitted
	// rate.
	Probe bool
	// Settled: its answer was learned from, or none will come.
	Settled bool
	// Level is the number in flight it went at, itself included, less
	// the permits held by refused requests (not in flight upstream).
	Level int
	// HoldsRefused: it was refused and still holds its permit.
	HoldsRefused bool
}

// View is what Shared shows of itself.
type View struct {
	PausedUntil time.Time
	PauseReason string // "rate_limited", "overloaded", "retry", "window" (a fixed window's closure), "shared" (a pause another replica set, see redisstate) or ""
	Concurrency int    // current concurrency limit
	InFlight    int    // permits out
	// Requests and Tokens are the learned budgets; Known is false while
	// the upstream has said nothing.
	Requests, Tokens BudgetView
	// AnswerSeconds is the mean time an accepted answer holds its permit.
	AnswerSeconds float64
	// Learned says where the request pace comes from: "headers",
	// "refusals" (an upstream without headers), or "" (nothing
	// yet); FromRefusals asks for the second.
	Learned string
	// Bound is what the behaviour of an upstream without headers says it
	// limits.
	Bound Bound
	// RateFrom says where the request pace comes from (a sending rate
	// is a guess until two refusals measure the admitted rate).
	// AdmittedRate is the rate measured from behaviour, requests a second.
	RateFrom     RateFrom
	AdmittedRate float64
	// ConcurrencyFrom says where the concurrency limit comes from:
	// "words" (the upstream named concurrency), "refusals at N in flight"
	// (learned from behaviour), or "" (the start, grown by answers).
	ConcurrencyFrom string
	// ConcurrencyLowered: refusals of the number in flight (named, learned
	// from behaviour, or overload) lowered the concurrency limit lately;
	// otherwise it is the start, grown by answers.
	ConcurrencyLowered bool
	// Corrected is set once a refusal has overruled the headers' figures.
	Corrected bool
	// Window is what the group learned of fixed windows: nil while it
	// has seen no closure (a span the upstream refused everything in).
	Window *windowView
	// Shared is "" for state in this process only; a store shared by
	// replicas says "ok", or "degraded" while it serves local limits.
	Shared string
}

// Where a View's request pace comes from (View.Learned).
const (
	learnedFromHeaders  = "headers"
	learnedFromRefusals = "refusals"
)

// FromRefusals reports whether the request pace was learned from the
// upstream's refusals, with no headers to read it from.
func (v View) FromRefusals() bool { return v.Learned == learnedFromRefusals }

// BudgetView is one learned budget.
type BudgetView struct {
	Known     bool
	Limit     float64 // the window's size, as corrected by refusals
	Available float64
	PerSecond float64
}
