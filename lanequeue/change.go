package lanequeue

import (
	"context"
	"github.com/llmproxy/llmproxy/limit"
	"log/slog"
	"math"
	"strings"
	"time"
)

// changeKind names what changed in a lane's state.
type changeKind uint8

const (
	// changeLimits: the group learned its limits or where they come from
	// changed, a window's size or a pace learned from refusals moved by
	// more than a tenth, or refusals began to overrule the headers.
	changeLimits changeKind = iota + 1
	// changePaused: an answer started a pause of the group (not an extension of
	// one under way).
	changePaused
	// changeConcurrency: the group's concurrency limit moved. Rises are
	// reported at most once a second, from the last level reported; falls
	// at once.
	changeConcurrency
	// changeEvicted: the lane left the table.
	changeEvicted
)

func (k changeKind) String() string {
	switch k {
	case changeLimits:
		return "limits"
	case changePaused:
		return "paused"
	case changeConcurrency:
		return "concurrency"
	case changeEvicted:
		return "evicted"
	}
	return "unknown"
}

// change is one state change of a lane's group, reported through
// TableConfig.onChange outside every lock. It holds no credential.
type change struct {
	Kind changeKind
	Lane *Lane
	At   time.Time
	// Status and Verdict are of the answer that caused it (changePaused,
	// changeConcurrency, changeLimits).
	Status  int
	Verdict limit.Verdict
	// View is the group's state after the change.
	View limit.View
	// From is the previous concurrency limit (changeConcurrency).
	From int
	// PauseReason and PauseFor describe a pause (changePaused).
	PauseReason string
	PauseFor    time.Duration
	// Reason says why a lane was evicted: "idle" or "table_full".
	Reason string
	// SharesLimitWith and SharedBecause say which other models draw on
	// the lane's limit and why (changeLimits; see State).
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
func (g *group) changesLocked(l *Lane, lim *pool, r limit.Report, v limit.View, now time.Time, out []change, shared bool) []change {
	s := &lim.seen
	base := change{Lane: l, At: now, Status: r.Status, Verdict: r.Verdict, View: v}
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
		c.Kind = changeLimits
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
		c.Kind, c.From = changeConcurrency, s.conc
		out = append(out, c)
		s.conc, s.concAt = v.Concurrency, now
	}
	return out
}

// log writes one info line for a lane's state change: limits
// learned or changed, a pause and why, the concurrency limit moving, the
// lane leaving the table. Lanes are named by their hashed id; no key.
func (c change) log(log *slog.Logger) {
	ctx := context.Background()
	if !log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	k := c.Lane.key
	attrs := []slog.Attr{
		slog.String("lane", c.Lane.id),
		slog.String("route", k.Route),
		slog.String("model", k.Model),
	}
	v := c.View
	var msg string
	switch c.Kind {
	case changeLimits:
		msg = "lane limits changed"
		attrs = append(attrs, slog.String("learned_from", v.Learned), slog.Bool("corrected_by_refusals", v.Corrected))
		// What the group believes binds and why, as /lanes says it.
		attrs = append(attrs, slog.String("bound", v.Bound.String()), slog.String("rate_from", v.RateFrom.String()))
		if v.AdmittedRate > 0 {
			attrs = append(attrs, slog.Float64("admitted_rate", round2(v.AdmittedRate)))
		}
		attrs = append(attrs, slog.String("concurrency_from", v.ConcurrencyFrom))
		if shape := v.Window.String(); shape != "" {
			attrs = append(attrs, slog.String("shape", shape))
		}
		if len(c.SharesLimitWith) > 0 {
			attrs = append(attrs, slog.String("shares_limit_with", strings.Join(c.SharesLimitWith, ", ")),
				slog.String("shared_because", c.SharedBecause))
		}
		if v.Requests.Known {
			attrs = append(attrs, slog.Float64("requests_limit", round2(v.Requests.Limit)), slog.Float64("requests_per_second", round2(v.Requests.PerSecond)))
		}
		if v.Tokens.Known {
			attrs = append(attrs, slog.Float64("tokens_limit", round2(v.Tokens.Limit)), slog.Float64("tokens_per_second", round2(v.Tokens.PerSecond)))
		}
		attrs = append(attrs, slog.Int("status", c.Status))
	case changePaused:
		msg = "lane paused"
		attrs = append(attrs, slog.String("reason", c.PauseReason), slog.Int("status", c.Status),
			slog.Duration("for", c.PauseFor.Round(time.Millisecond)), slog.Time("until", c.At.Add(c.PauseFor)))
	case changeConcurrency:
		msg = "lane concurrency changed"
		attrs = append(attrs, slog.Int("from", c.From), slog.Int("to", v.Concurrency), slog.String("after", c.Verdict.String()))
		if v.ConcurrencyFrom != "" {
			// A limit the upstream showed, not one grown by answers.
			attrs = append(attrs, slog.String("concurrency_from", v.ConcurrencyFrom), slog.String("bound", v.Bound.String()))
		}
	case changeEvicted:
		msg = "lane evicted"
		attrs = append(attrs, slog.String("reason", c.Reason))
	default:
		return
	}
	log.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }
