package proxy

import (
	"log/slog"
	"net/http"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// finish logs the request's line and counts it. It never logs headers, the
// query or anything else that may carry a credential. Answers that went
// as they should are logged at debug; proxy-made 5xx, upstream 5xx and cut
// answers at warn.
func (p *Proxy) finish(r *http.Request, req *request) {
	if req.outcome == "" {
		req.outcome = lanequeue.OutcomeClientGone // left before anything was decided
	}
	lane := ""
	if req.lane != nil {
		lane = req.lane.ID()
		req.lane.CountAnswer(req.status, req.outcome)
	}
	level := slog.LevelDebug
	if req.outcome == lanequeue.OutcomeUpstreamCut || req.outcome == lanequeue.OutcomeClientStalled || req.status >= 500 {
		level = slog.LevelWarn
	}
	if !p.log.Enabled(r.Context(), level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("request_id", req.id),
		slog.String("upstream_request_id", req.upstreamID),
		slog.String("lane", lane),
		slog.String("route", req.route),
		slog.String("method", r.Method),
		slog.String("path", req.target.Path),
		slog.Int("status", req.status),
		slog.String("outcome", string(req.outcome)),
		slog.Int64("queue_ms", req.queueWait.Milliseconds()),
		slog.Int("retries", req.retries),
		slog.Int64("upstream_ms", req.upstream.Milliseconds()),
	}
	if req.cutErr != "" {
		attrs = append(attrs, slog.String("err", req.cutErr))
	}
	p.log.LogAttrs(r.Context(), level, "request", attrs...)
}
