package lanequeue

import (
	"github.com/llmproxy/llmproxy/limit"
	"math"
	"time"
)

// ChangeKind names what changed in a lane's state.
type ChangeKind uint8

const (
	// LimitsChanged: the group learned its limits or where they come from
	// changed, a window's size or a pace learned from refusals moved by
	// more than a tenth, or refusals began to overrule the headers.
	LimitsChanged ChangeKind = iota + 1
	// Paused: an answer started a pause of the group (not an extension of
	// one under way).
	Paused
	// ConcurrencyChanged: the group's concurrency limit moved. Rises are
	// reported at most once a second, from the last level reported; falls
	// at once.
	ConcurrencyChanged
	// Evicted: the lane left the table.
	Evicted
)

func (k ChangeKind) String() string {
	switch k {
	case LimitsChanged:
		return "limits"
	case Paused:
		return "paused"
	case ConcurrencyChanged:
		return "concurrency"
	case Evicted:
		return "evicted"
	}
	return "unknown"
}

// Change is one state change of a lane's group, reported through
// TableConfig.OnChange outside every lock. It holds no credential.
type Change struct {
	Kind ChangeKind
	Lane *Lane
	At   time.Time
	// Status and Verdict are of the answer that caused it (Paused,
	// ConcurrencyChanged, LimitsChanged).
	Status  int
	Verdict limit.Verdict
	// View is the group's state after the change.
	View limit.View
	// From is the previous concurrency limit (ConcurrencyChanged).
	From int
	// PauseReason and PauseFor describe a pause (Paused).
	PauseReason string
	PauseFor    time.Duration
	// Reason says why a lane was evicted: "idle" or "table_full".
	Reason string
	// SharesLimitWith and SharedBecause say which other models draw on
	// the lane's limit and why (LimitsChanged; see State).
	SharesLimitWith []string
	SharedBecause   string
}

// seen is what the group last reported of itself, to tell changes from
// noise.
type seen struct {
	learned            string
	shape              string
	corrected          bool
	reqLimit, tokLimit float64
	reqRate            float64
	conc               int
	concAt             time.Time
}

// concReportEvery bounds how often rises of the concurrency limit are
// reported: slow start raises it many times a second.
const concReportEvery = time.Second

// moved reports whether a differs from b by more than a tenth of the larger.
func moved(a, b float64) bool {
	return math.Abs(a-b) > 0.1*math.Max(math.Abs(a), math.Abs(b))
}

// changesLocked compares the view of lim, l's limit, after an answer with
// what it last reported, and returns the changes to report; shared says
// the answer showed lim shared with other models. Requires g.mu held.
func (g *group) changesLocked(l *Lane, lim *pool, r limit.Report, v limit.View, now time.Time, out []Change, shared bool) []Change {
	s := &lim.seen
	base := Change{Lane: l, At: now, Status: r.Status, Verdict: r.Verdict, View: v}
	base.SharesLimitWith, base.SharedBecause = lim.sharedWith(l.key.Model)
	// A window's rate from headers moves with every answer's remaining
	// count; only its size says the limit changed. A pace learned from
	// refusals is its rate.
	shape := v.Window.String()
	limits := shared || shape != s.shape || v.Learned != s.learned || v.Corrected != s.corrected ||
		moved(v.Requests.Limit, s.reqLimit) || moved(v.Tokens.Limit, s.tokLimit) ||
		v.FromRefusals() && moved(v.Requests.PerSecond, s.reqRate)
	if limits {
		c := base
		c.Kind = LimitsChanged
		out = append(out, c)
		s.learned, s.corrected, s.shape = v.Learned, v.Corrected, shape
		s.reqLimit, s.tokLimit = v.Requests.Limit, v.Tokens.Limit
		s.reqRate = v.Requests.PerSecond
	}
	if s.conc == 0 {
		s.conc, s.concAt = g.cfg.Concurrency, now
	}
	if v.Concurrency != s.conc && (v.Concurrency < s.conc || now.Sub(s.concAt) >= concReportEvery) {
		c := base
		c.Kind, c.From = ConcurrencyChanged, s.conc
		out = append(out, c)
		s.conc, s.concAt = v.Concurrency, now
	}
	return out
}
