package proxy

import (
	"context"
	"io"
	"net/http"

	"github.com/llmproxy/llmproxy/upstream"
)

// attempt makes one upstream attempt bounded by deadline until the answer's
// headers arrive; after that only the client's own cancellation and Stop end
// it. deadline is serve's context: it ends at the request's deadline, when
// the client goes and at Stop.
func (p *Proxy) attempt(deadline context.Context, r *http.Request, req *request) (upstream.Result, *attemptWatch, bool) {
	actx, cancel := context.WithCancel(r.Context())
	a := &attemptWatch{p: p, cancel: cancel}
	a.unwatch = context.AfterFunc(deadline, a.deadlineDone)
	// Built as http.NewRequestWithContext builds it, without parsing the
	// URL the proxy already has, or a header map it replaces.
	out := (&http.Request{
		Method: r.Method, URL: req.target, Host: req.target.Host,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: upstream.OutboundHeader(r.Header), Body: http.NoBody,
	}).WithContext(actx)
	for _, name := range clientHeaders {
		delete(out.Header, name) // canonical, as the server made them
	}
	out.Header["X-Llmproxy-Request-Id"] = req.idHeader() // to match the upstream's logs with ours
	if req.upgrade {
		// Hop-by-hop, so dropped above; the handshake needs them.
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", "websocket")
	}
	if req.body.size > 0 {
		b := &req.body
		out.Body, out.ContentLength = b.reader(), b.size
		out.GetBody = func() (io.ReadCloser, error) { return b.reader(), nil }
	}
	req.trace.StartAttempt(out) // its traceparent in out's header
	res := upstream.Do(p.cfg.Transport, out, p.cfg.Clock.Now())
	a.mu.Lock()
	a.headers = true
	late := a.timedOut
	a.mu.Unlock()
	req.upstreamTime += res.Latency
	return res, a, late
}

// forward runs the attempts and answers the client. The slot is held
// throughout, retries included.
func (p *Proxy) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) {
	slot := req.slot
	for {
		res, watch, timedOut := p.attempt(ctx, r, req)
		defer watch.end()
		req.attempt = watch
		if res.Resp != nil {
			p.metrics.route(req.route).upstreamLat.Observe(res.Latency.Seconds())
			req.upstreamID = upstreamRequestID(res.Resp.Header)
		}
		now := p.cfg.Clock.Now()
		d := decide(res, req.tries, p.policy, now, req.deadline, p.cfg.Rand())
		pausedUntil, concurrencyBound := slot.Report(d.report)
		if req.retryOff && d.action == actRetry {
			// The lane learned from the answer as from any (its pause,
			// its pace); the client takes the answer as it is.
			d.action, d.why = actGiveUp, "x-llmproxy-retry: off"
		}
		if req.trace != nil {
			traceAnswer(req, res, d)
		}
		switch {
		case r.Context().Err() != nil:
			res.Discard()
			req.outcome = OutcomeClientGone
			return
		case timedOut:
			res.Discard()
			p.giveUp(w, req, upstream.Result{}, "the request's deadline passed waiting for the upstream's answer")
			return
		case d.action == actPass && res.Resp != nil && res.Resp.StatusCode == http.StatusSwitchingProtocols && req.upgrade:
			p.join(w, req, res)
			return
		case d.action == actPass:
			p.respond(w, req, res, true)
			return
		case d.action == actGiveUp:
			p.giveUp(w, req, res, d.why)
			return
		}
		res.Discard()
		watch.end() // now, not when the request ends: nothing waits on a discarded attempt
		req.retries++
		req.tries = d.next
		after := d.retryWait(pausedUntil, concurrencyBound)
		wait := req.trace.StartWait(true, after)
		err := slot.WaitRetry(ctx, after)
		if !p.waited(w, r, req, wait, err) {
			return
		}
	}
}

// upstreamRequestID is the provider's own id for an answer: OpenAI's
// x-request-id, Anthropic's request-id. Cut short: it is only for logs.
func upstreamRequestID(h http.Header) string {
	id := h.Get("X-Request-Id")
	if id == "" {
		id = h.Get("Request-Id")
	}
	if len(id) > 128 {
		id = id[:128]
	}
	return id
}
