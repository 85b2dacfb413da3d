package limit

import (
	"strconv"
	"time"
)

// Ticket records one dispatch: what it was charged and what the pool knew
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
	// Lease names the permit when a shared store outside this process
	// gave it; empty for the in-process state. Such a store gives and
	// takes back its own permits (see Fleet.Dispatched, Fleet.Returned).
	Lease string
	// OutNow is the number of permits out, all replicas together, when the
	// answer came; 0 means the in-process count.
	OutNow int
	// Seq numbers the dispatch among the pool's dispatches (all
	// replicas', when a store kept elsewhere counts them), for measuring
	// the rate admitted between refusals.
	Seq uint64
	// GroupSeq numbers the dispatch among those of every limit of its
	// lanes' group (every model of one route and credential), all
	// replicas', when a store kept elsewhere counts them; 0: not counted
	// (one process counts its own).
	GroupSeq uint64
	// Refusals is one more than the refusals of the pool learned before
	// it went, all replicas together, when a store kept elsewhere counts
	// them; 0 when not counted (one process counts its own).
	Refusals uint64
	// Probe: it went while the learned pace probed above the admitted
	// rate.
	Probe bool
	// Level is the number in flight it went at, itself included, less
	// the permits held by refused requests (not in flight upstream).
	Level int
	// Overshot: refused at a concurrency limit nothing went through at
	// lately (see behaved). Knock: it went to see if a closed window opened.
	Overshot, Knock bool
	// Peers: limits of its group not found to share its window may spend its refill unseen (see budget.count).
	Peers bool

	// Memory's own account of the dispatch, kept with it because a
	// Shared kept elsewhere hands Memory the same ticket (see
	// Fleet.Returned): what its answer was and where its permit is.
	accepted     bool // its answer was accepted
	settled      bool // its answer was learned from, or none will come
	holdsRefused bool // it was refused and still holds its permit
	returned     bool // its permit was given back
}

// View is what Shared shows of itself.
type View struct {
	PausedUntil time.Time
	// PauseReason says why: a rate refusal ("rate_limited"), an
	// overload ("overloaded"), another retryable answer ("retry"), a
	// fixed window's closure ("window"), a pause another replica set
	// ("shared", see PausedElsewhere); its zero value while not paused.
	PauseReason pauseReason
	Concurrency int // current concurrency limit
	InFlight    int // permits out
	// Requests and Tokens are the learned budgets; Known is false while
	// the upstream has said nothing.
	Requests, Tokens BudgetView
	// AnswerSeconds is the mean time an accepted answer holds its permit;
	// Sending the requests a second the pool dispatched lately.
	AnswerSeconds, Sending float64
	// Bound is what the behaviour of an upstream without headers says it
	// limits.
	Bound Bound
	// RateFrom says where the request pace comes from (a sending rate
	// is a guess until two refusals measure the admitted rate); its
	// zero value while nothing is learned. FromHeaders and FromRefusals
	// ask which of the two kinds of evidence it is.
	// AdmittedRate is the rate measured from behaviour, requests a second.
	RateFrom     rateFrom
	AdmittedRate float64
	// ConcurrencyFrom says where the concurrency limit comes from: the
	// upstream named concurrency ("words"), its refusals at a number in
	// flight ("refusals at N in flight"), or, its zero value, the start
	// grown by answers ("").
	ConcurrencyFrom concurrencyFrom
	// ConcurrencyLowered: refusals of the number in flight (named, learned
	// from behaviour, or overload) lowered the concurrency limit lately;
	// otherwise it is the start, grown by answers.
	ConcurrencyLowered bool
	// Corrected is set once a refusal has overruled the headers' figures.
	Corrected bool
	// Window is what the pool learned of fixed windows: nil while it
	// has seen no closure (a span the upstream refused everything in).
	Window *windowView
	// Shared is "" for state in this process only; a store shared by
	// replicas says "ok", or "degraded" while it serves local limits.
	Shared string
	// Share is the part of the shared limits a replica keeps to while it
	// serves local limits (Shared "degraded"); nil otherwise.
	Share *ShareView
}

// ShareView is a replica's share of the limits the replicas shared, kept
// while the store that shares them is away: 1/Replicas of each.
type ShareView struct {
	Replicas    int `json:"replicas"`
	Concurrency int `json:"concurrency"`
	// RequestsPerSecond and TokensPerSecond are 0 where the shared
	// limits bound nothing.
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	TokensPerSecond   float64 `json:"tokens_per_second,omitempty"`
}

// FromHeaders reports whether the request pace was read from the
// upstream's rate-limit headers.
func (v View) FromHeaders() bool { return v.RateFrom == rateHeaders }

// FromRefusals reports whether the request pace was learned from the
// upstream's refusals, with no headers to read it from.
func (v View) FromRefusals() bool { return v.RateFrom != rateUnknown && v.RateFrom != rateHeaders }

// PausedElsewhere is v paused until until by another replica that keeps
// the state together with this one (PauseReason "shared"), for a store
// shared by replicas to show a pause it learned from them.
func (v View) PausedElsewhere(until time.Time) View {
	v.PausedUntil, v.PauseReason = until, pauseShared
	return v
}

// BudgetView is one learned budget.
type BudgetView struct {
	Known     bool
	Limit     float64 // the window's size, as corrected by refusals
	Available float64
	PerSecond float64
}

// windowView is what a pool learned of fixed windows (View.Window).
type windowView struct {
	// Allowance and Length are the window's size and span; zero while
	// not known.
	Allowance int
	Length    time.Duration
	// Stated: the upstream named the boundary in its hints, when the
	// shape was learned (or, before, of the closure under way); otherwise
	// it was found by knocking.
	Stated bool
	// ClosedUntil is the stated boundary of a closure under way; Closed
	// says one is (its end is not known when it is silent).
	Closed      bool
	ClosedUntil time.Time
}

// String says what the pool learned of its windows and from what: "window
// of 200 per 10s, learned from refusals whose waits end at one boundary".
func (v *windowView) String() string {
	if v == nil {
		return ""
	}
	why := "learned from refusals whose waits end at one boundary"
	if !v.Stated {
		why = "learned from admissions resuming after silent refusals"
	}
	if v.Allowance == 0 {
		if v.Stated {
			return "window suspected: refusals whose waits end at one boundary"
		}
		return "window suspected: silent refusals for a second and more"
	}
	length := v.Length.Round(time.Second)
	if v.Length < 10*time.Second {
		length = v.Length.Round(100 * time.Millisecond)
	}
	return "window of " + strconv.Itoa(v.Allowance) + " per " + length.String() + ", " + why
}
