package proxy

import (
	"net/http"
	"strconv"
)

// writeFailure answers err as replyFor maps it and counts it for route;
// stopping: the proxy is stopping (see errorReply.shutdownWins).
func (p *Proxy) writeFailure(w http.ResponseWriter, route string, err error, stopping bool) int {
	r := replyFor(err, p.cfg.Clock.Now())
	if stopping && r.shutdownWins {
		r = replyFor(errShutdown, p.cfg.Clock.Now())
	}
	r.write(w)
	p.metrics.proxyErrors.WithLabelValues(route, r.code, strconv.Itoa(r.status)).Inc()
	return r.status
}

// failRequest answers req with the proxy's own error.
func (p *Proxy) failRequest(w http.ResponseWriter, req *request, err error) {
	req.status = p.writeFailure(w, req.route, err, p.stopping())
	req.outcome = OutcomeProxyError
}

// setLLMHeaders adds the x-llmproxy-* headers every answer carries.
func setLLMHeaders(h http.Header, req *request) {
	if req.laneID != "" {
		h["X-Llmproxy-Lane"] = req.headerValue(laneValue, req.laneID)
	}
	h["X-Llmproxy-Queue-Ms"] = req.headerValue(queueValue, strconv.FormatInt(req.queueWait.Milliseconds(), 10))
	h["X-Llmproxy-Retries"] = req.headerValue(retriesValue, strconv.Itoa(req.retries))
}
