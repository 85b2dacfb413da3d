package proxy

import (
	"log/slog"
	"net/http"
)

// finish logs the request's one line and counts it. It never logs headers,
// the query or anything else that may carry a credential.
func (p *Proxy) finish(r *http.Request, req *request) {
	lane := ""
	if req.lane != nil {
		lane = req.lane.ID()
		req.lane.CountAnswer(req.status)
	}
	level := slog.LevelInfo
	if req.status == 0 || req.status >= 500 {
		level = slog.LevelWarn
	}
	p.log.LogAttrs(r.Context(), level, "request",
		slog.String("request_id", req.id),
		slog.String("upstream_request_id", req.upstreamID),
		slog.String("lane", lane),
		slog.String("route", req.route),
		slog.String("method", r.Method),
		slog.String("path", req.target.Path),
		slog.Int("status", req.status),
		slog.Int64("queue_ms", req.queueWait.Milliseconds()),
		slog.Int("retries", req.retries),
		slog.Int64("upstream_ms", req.upstream.Milliseconds()),
	)
}
