package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/upstream"
)

// attempt makes one upstream attempt bounded by deadline until the answer's
// headers arrive; after that only the client's own cancellation and Stop end
// it. deadline is serve's context: it ends at the request's deadline, when
// the client goes and at Stop.
func (p *Proxy) attempt(deadline context.Context, r *http.Request, req *request) (upstream.Result, *attemptWatch, bool) {
	actx, cancel := context.WithCancel(req.keep.parent())
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
	if wire := req.spend.wire(); wire != nil {
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(wire)), int64(len(wire))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(wire)), nil }
	} else if req.body.size > 0 {
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
	req.keep.sentNow()
	for {
		actx, cancelFlex := flexContext(ctx, req)
		defer cancelFlex()
		onFlex := req.spend.onFlex
		res, watch, timedOut := p.attempt(actx, r, req)
		defer watch.end()
		req.attempt = watch
		if res.Resp != nil {
			p.metrics.route(req.route).upstreamLat.Observe(res.Latency.Seconds())
			req.upstreamID = upstreamRequestID(res.Resp.Header)
		}
		now := p.cfg.Clock.Now()
		d := decide(res, req.tries, p.policy, now, req.deadline, p.cfg.Rand())
		d, timedOut = p.decideTier(ctx, req, res, onFlex, timedOut, now, d)
		var pausedUntil time.Time
		var held bool
		if !d.quiet {
			pausedUntil, held = slot.Report(req.spend.heard(d.report))
		}
		if req.retryOff && d.action == actRetry {
			// The lane learned from the answer as from any (its pause,
			// its pace); the client takes the answer as it is.
			d.action, d.why = actGiveUp, "x-llmproxy-retry: off"
		}
		if req.trace != nil {
			traceAnswer(req, res, d)
		}
		switch {
		case req.keep.parent().Err() != nil:
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
		after := d.retryWait(pausedUntil, held)
		wait := req.trace.StartWait(true, after)
		if !p.waited(w, r, req, wait, d.waitRetry(ctx, slot, after)) {
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

// decideTier revises d, the decision on res, the answer to an attempt
// of req that asked for flex (onFlex) or not, when flex said no (see
// flexDecide): a flex attempt cut at flexUntil (timedOut while the
// request's own context, ctx, lives) goes at standard, as does a flex
// refusal once flex retries would leave standard no time. A standard
// success teaches how long standard takes.
func (p *Proxy) decideTier(ctx context.Context, req *request, res upstream.Result, onFlex, timedOut bool, now time.Time, d decision) (decision, bool) {
	switch {
	case onFlex && timedOut && ctx.Err() == nil:
		return p.flexDecide(req, flexBusy, now, 1, d), false
	case onFlex && req.retryOff:
		if flexAnswerOf(res, req.target.Path) != flexServed {
			d.report = reportOf(upstream.Result{}) // the client takes it; the lane learns nothing
		}
	case onFlex:
		if a := flexAnswerOf(res, req.target.Path); a != flexServed {
			d = p.flexDecide(req, a, now, p.cfg.Rand(), d)
		}
	case !onFlex && d.action == actPass && res.Resp != nil && res.Resp.StatusCode < 300 && req.spend.asked != "":
		p.tiers.noteStandard(req.route, req.spend.model, res.Latency)
	}
	return d, timedOut
}

// waitRetry waits after before the retry d decided: in the lane (see
// lanequeue.Slot.WaitRetry), or, when d is quiet, holding its place
// and permit, as the same dispatch.
func (d decision) waitRetry(ctx context.Context, slot *lanequeue.Slot, after time.Duration) error {
	if !d.quiet {
		return slot.WaitRetry(ctx, after)
	}
	t := time.NewTimer(after)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
