package proxy

import (
	"log/slog"
	"net/http"
)

// How a request's answer ended: the outcome label of
// llmproxy_requests_total.
const (
	outcomeOK            = "ok"             // a 1xx–3xx answer passed on whole
	outcomeUpstreamError = "upstream_error" // the upstream's own 4xx/5xx passed on
	outcomeProxyError    = "proxy_error"    // an error the proxy made
	outcomeUpstreamCut   = "upstream_cut"   // the upstream's answer broke off after the status went out
	outcomeClientGone    = "client_gone"    // the client left before or while being answered
	outcomeClientStalled = "client_stalled" // the client accepted nothing for the idle bound and was cut
)

// finish logs the request's line and counts it. It never logs headers, the
// query or anything else that may carry a credential. Answers that went
// as they should are logged at debug; proxy-made 5xx, upstream 5xx and cut
// answers at warn.
func (p *Proxy) finish(r *http.Request, req *request) {
	if req.outcome == "" {
		req.outcome = outcomeClientGone // left before anything was decided
	}
	lane := ""
	if req.lane != nil {
		lane = req.lane.ID()
		req.lane.CountAnswer(req.status, req.outcome)
	}
	level := slog.LevelDebug
	if req.outcome == outcomeUpstreamCut || req.outcome == outcomeClientStalled || req.status >= 500 {
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
		slog.String("outcome", req.outcome),
		slog.Int64("queue_ms", req.queueWait.Milliseconds()),
		slog.Int("retries", req.retries),
		slog.Int64("upstream_ms", req.upstream.Milliseconds()),
	}
	if req.cutErr != "" {
		attrs = append(attrs, slog.String("err", req.cutErr))
	}
	p.log.LogAttrs(r.Context(), level, "request", attrs...)
}
