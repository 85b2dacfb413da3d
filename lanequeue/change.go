package lanequeue

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/internal/pacific"
)

// concReportEvery bounds how often rises of the concurrency limit are
// reported: slow start raises it many times a second.
const concReportEvery = time.Second

// log writes one info line for a lane's state change: limits
// learned or changed, a pause and why, the concurrency limit moving, the
// lane leaving the table. Lanes are named by their hashed id; no key.
func (c laneChange) log(log *slog.Logger) {
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
		msg, attrs = "lane limits changed", c.limitsAttrs(attrs)
	case changePaused:
		msg = "lane paused"
		attrs = append(attrs, slog.String("reason", c.Verdict.PauseReason().String()), slog.Int("status", c.Status),
			slog.Duration("for", c.PauseFor.Round(time.Millisecond)), slog.Time("until", c.At.Add(c.PauseFor)))
	case changeConcurrency:
		msg = "lane concurrency changed"
		attrs = append(attrs, slog.Int("from", c.From), slog.Int("to", v.Concurrency), slog.String("after", c.Verdict.String()))
		if v.ConcurrencyFrom.Known() {
			// A limit the upstream showed, not one grown by answers.
			attrs = append(attrs, slog.String("concurrency_from", v.ConcurrencyFrom.String()), slog.String("bound", v.Bound.String()))
		}
	case changeEvicted:
		msg = "lane evicted"
		attrs = append(attrs, slog.String("reason", c.Reason))
	case changeQuota:
		msg = "lane quota spent"
		attrs = append(attrs, slog.Int("status", c.Status))
		if c.QuotaUntil.IsZero() {
			attrs = append(attrs, slog.String("until", "not known"), slog.Duration("probe_every", quotaProbeEvery))
		} else {
			attrs = append(attrs, slog.Time("until", c.QuotaUntil), slog.String("pt", pacific.Clock(c.QuotaUntil, c.At)))
		}
	default:
		return
	}
	log.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
}

// limitsAttrs is attrs and what a changeLimits says: what the group
// learned, what it believes binds and why (as /lanes says it).
func (c laneChange) limitsAttrs(attrs []slog.Attr) []slog.Attr {
	v := c.View
	attrs = append(attrs, slog.String("learned_from", v.RateFrom.Learned()), slog.Bool("corrected_by_refusals", v.Corrected),
		slog.String("bound", v.Bound.String()), slog.String("rate_from", v.RateFrom.String()))
	if v.AdmittedRate > 0 {
		attrs = append(attrs, slog.Float64("admitted_rate", round2(v.AdmittedRate)))
	}
	attrs = append(attrs, slog.String("concurrency_from", v.ConcurrencyFrom.String()))
	if shape := v.Window.String(); shape != "" {
		attrs = append(attrs, slog.String("shape", shape))
	}
	if len(c.SharesLimitWith) > 0 {
		with := strings.Join(c.SharesLimitWith, ", ")
		if c.SharesLimitWithMore > 0 {
			with += " and " + strconv.Itoa(c.SharesLimitWithMore) + " more"
		}
		attrs = append(attrs, slog.String("shares_limit_with", with), slog.String("shared_because", c.SharedBecause))
	}
	if v.Requests.Known {
		attrs = append(attrs, slog.Float64("requests_limit", round2(v.Requests.Limit)), slog.Float64("requests_per_second", round2(v.Requests.PerSecond)))
	}
	if v.Tokens.Known {
		attrs = append(attrs, slog.Float64("tokens_limit", round2(v.Tokens.Limit)), slog.Float64("tokens_per_second", round2(v.Tokens.PerSecond)))
	}
	return append(attrs, slog.Int("status", c.Status))
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }
