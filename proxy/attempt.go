package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/upstream"
)

// attempt makes one upstream attempt bounded by the budget until the answer's
// headers arrive; after that only the client's own cancellation ends it.
func (p *Proxy) attempt(budget context.Context, r *http.Request, req *request) (upstream.Result, context.CancelFunc, bool) {
	actx, cancelAttempt := context.WithCancel(r.Context())
	unwatch := context.AfterFunc(p.stopped, cancelAttempt) // Stop cuts the attempt, answer included
	cancel := func() {
		unwatch()
		cancelAttempt()
	}
	var mu sync.Mutex
	headers, timedOut := false, false
	stop := context.AfterFunc(budget, func() {
		mu.Lock()
		defer mu.Unlock()
		if !headers {
			timedOut = true
			cancel()
		}
	})
	out, _ := http.NewRequestWithContext(actx, r.Method, req.target.String(), http.NoBody)
	out.Header = upstream.OutboundHeader(r.Header)
	out.Header.Del(priorityHeader)
	out.Header["X-Llmproxy-Request-Id"] = req.idHeader // to match the upstream's logs with ours
	if req.upgrade {
		// Hop-by-hop, so dropped above; the handshake needs them.
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", "websocket")
	}
	if req.body.size > 0 {
		b := &req.body
		out.Body, out.ContentLength = io.NopCloser(b.reader()), b.size
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(b.reader()), nil }
	}
	res := upstream.Do(p.cfg.Transport, out, p.cfg.Clock.Now())
	mu.Lock()
	headers = true
	late := timedOut
	mu.Unlock()
	stop()
	req.upstreamTime += res.Latency
	return res, cancel, late
}

// forward runs the attempts and answers the client. The slot is held
// throughout, retries included.
func (p *Proxy) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) {
	slot := req.slot
	for {
		res, cancel, timedOut := p.attempt(ctx, r, req)
		defer cancel()
		req.cancelAttempt = cancel
		if res.Resp != nil {
			p.metrics.upstreamLat.WithLabelValues(req.route).Observe(res.Latency.Seconds())
			req.upstreamID = upstreamRequestID(res.Resp.Header)
		}
		now := p.cfg.Clock.Now()
		d := decide(res, req.tries, p.policy, now, req.deadline, p.cfg.Rand())
		held := slot.Report(d.report(res, now))
		switch {
		case r.Context().Err() != nil:
			res.Discard()
			req.outcome = lanequeue.OutcomeClientGone
			return
		case timedOut:
			res.Discard()
			p.giveUp(w, req, upstream.Result{}, "request budget ran out waiting for the upstream's answer")
			return
		case d.action == pass && res.Resp != nil && res.Resp.StatusCode == http.StatusSwitchingProtocols && req.upgrade:
			p.join(w, req, res)
			return
		case d.action == pass:
			p.respond(w, req, res, true)
			return
		case d.action == giveUp:
			p.giveUp(w, req, res, d.why)
			return
		}
		res.Discard()
		req.retries++
		req.tries = d.next
		after := d.wait
		if d.pauseGroup && held {
			after = 0 // the group holds the retry: its pause, or its concurrency limit
		}
		if err := slot.WaitRetry(ctx, after); err != nil {
			p.refuse(w, r, req, err)
			return
		}
	}
}

// giveUp hands the client the upstream's own last answer, or a proxy error
// when there is none, marked so SDKs do not retry on top of the proxy.
func (p *Proxy) giveUp(w http.ResponseWriter, req *request, res upstream.Result, why string) {
	if res.Resp != nil {
		p.log.Debug("giving up on retries", "lane", req.laneID, "status", res.Resp.StatusCode, "reason", why)
		p.respond(w, req, res, false)
		return
	}
	setLLMHeaders(w.Header(), req)
	err := fail(failBudget, why)
	if res.Err != nil {
		err = fail(failUnreachable, "upstream "+req.target.Host+" unreachable: "+redactErr(res.Err, req.target)+" ("+why+")")
	}
	p.failRequest(w, req, err)
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

// redactErr returns a transport error without the URL's query, which a
// client may have used for an api key.
func redactErr(err error, u *url.URL) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	s := err.Error()
	if u.RawQuery != "" {
		s = strings.ReplaceAll(s, u.RawQuery, "…")
	}
	return s
}
