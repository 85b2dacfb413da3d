package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

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

// attemptWatch ends an attempt: when the deadline comes before the answer's
// headers arrive (timedOut), and at Stop, before or after them.
type attemptWatch struct {
	p        *Proxy
	cancel   context.CancelFunc // cancels the attempt's context
	mu       sync.Mutex
	headers  bool        // the answer's headers arrived
	timedOut bool        // the deadline came first
	unwatch  func() bool // stops the AfterFunc in force
	ended    bool        // end ran: deadlineDone, if it runs late, registers nothing
}

// deadlineDone runs when attempt's deadline context ends. Before the
// headers it cuts the attempt. After them it cuts it at Stop; the
// request's deadline alone does not end an answer under way, which is
// then watched for Stop only.
func (a *attemptWatch) deadlineDone() {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.ended:
	case !a.headers:
		a.timedOut = true
		a.cancel()
	case a.p.stopping():
		a.cancel()
	default:
		a.unwatch = context.AfterFunc(a.p.stopped, a.cancel)
	}
}

// end stops watching and cancels the attempt's context; the answer's
// body is done with. A deadlineDone already started and waiting for the
// lock finds ended, so no watch on Stop outlives the attempt. Safe to
// call more than once.
func (a *attemptWatch) end() {
	a.mu.Lock()
	a.ended = true
	unwatch := a.unwatch
	a.mu.Unlock()
	unwatch()
	a.cancel()
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
		if req.retryOff && d.action == retry {
			// The lane learned from the answer as from any (its pause,
			// its pace); the client takes the answer as it is.
			d.action, d.why = giveUp, "x-llmproxy-retry: off"
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
		watch.end() // now, not when the request ends: nothing waits on a discarded attempt
		req.retries++
		req.tries = d.next
		after := d.retryWait(pausedUntil, concurrencyBound)
		wait := req.trace.StartWait(true, after)
		err := slot.WaitRetry(ctx, after)
		if wait != nil {
			p.endWait(wait, r, req, err)
		}
		if err != nil {
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
	err := fail(failDeadline, why)
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
