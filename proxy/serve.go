package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/llmproxy/llmproxy/internal/bound"
	"github.com/llmproxy/llmproxy/lanequeue"
)

func (p *Proxy) routeHandler(route string, base *url.URL, prefix string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.serve(w, r, route, base, strings.TrimPrefix(r.URL.Path, prefix))
	}
}

// targetURL joins the configured upstream with the client's path. The host
// always comes from configuration; the path is cleaned so dot segments
// cannot climb above the upstream's base path.
func targetURL(base *url.URL, rest, rawQuery string) *url.URL {
	if !strings.HasPrefix(rest, "/") {
		rest = "/" + rest
	}
	clean := path.Clean(rest) // the path itself when it is clean: no allocation
	if strings.HasSuffix(rest, "/") && clean != "/" {
		clean += "/"
	}
	u := *base
	u.Path = strings.TrimSuffix(base.Path, "/") + clean
	u.RawPath = ""
	u.RawQuery = rawQuery
	u.Fragment = ""
	u.User = nil
	return &u
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, route string, base *url.URL, rest string) {
	now := p.cfg.Clock.Now()
	req := &request{route: route, target: targetURL(base, rest, r.URL.RawQuery), arrived: now,
		id: newRequestID(), used: -1}
	w.Header()["X-Llmproxy-Request-Id"] = req.headerValue(idValue, req.id)
	defer func() { p.finish(r, req) }() // reads req.trace as it is when the request ends
	req.trace = p.cfg.Tracer.Start(r, route, req.id)
	said, err := readSay(r.Header)
	req.deadline, req.retryOff = p.deadline(r, now, said.maxWait), said.retryOff
	req.spend.asked, req.spend.run, req.spend.runBudget = said.tier, said.run, said.budget
	cred := credentialOf(r.Header, r.URL.RawQuery)
	req.keep, req.keep.cred, req.keep.post, req.keep.client, req.keep.maxWait = said.keep, cred, r.Method == http.MethodPost, r.Context(), said.maxWait
	if p.stopping() {
		err = errShutdown // whatever the client said
	}
	if err != nil {
		unread(w, r)
		p.failRequest(w, req, err)
		return
	}

	defer p.releaseBody(req)
	if err = p.readBody(w, r, req, cred); err != nil {
		p.failRequest(w, req, err)
		return
	}
	if w = p.keepOn(w, req); w == nil {
		return // answered from the journal, or by a call it joined
	}
	defer p.keepDone(req)
	lr, err := p.laneRequest(r, req, cred)
	if err != nil {
		p.failRequest(w, req, err)
		return
	}
	req.priority = lr.Priority
	p.describe(req, lr)

	ctx, cancel := context.WithDeadline(req.keep.parent(), req.keep.bound(req.deadline))
	defer cancel()
	defer context.AfterFunc(p.stopped, cancel)()
	if ends := req.spend.ended; ends != nil { // a budget found spent ends its wait
		defer context.AfterFunc(ends, cancel)()
	}
	wait := req.trace.StartWait(false, 0)
	req.slot, err = p.lanes.Acquire(ctx, lr)
	err = req.spend.why(err)
	req.laneID = laneOf(req.slot, err)
	req.queueWait = p.cfg.Clock.Now().Sub(now)
	w.Header()["X-Llmproxy-Lane"] = req.headerValue(laneValue, req.laneID)
	if !p.waited(w, r, req, wait, err) {
		return
	}
	p.metrics.route(route).queueWait.Observe(req.queueWait.Seconds())
	if err = p.reserve(req); err != nil {
		p.failRequest(w, req, err)
		return
	}
	p.forward(ctx, w, r, req)
}

// laneOf is the ID of the lane that gave slot, or refused it with err.
func laneOf(slot *lanequeue.Slot, err error) string {
	if err == nil {
		return slot.ID()
	}
	var refused interface{ LaneID() string }
	if errors.As(err, &refused) {
		return refused.LaneID()
	}
	return ""
}

// finish logs the request's line and counts it. It never logs headers, the
// query or anything else that may carry a credential. Answers that went
// as they should are logged at debug; proxy-made 5xx, upstream 5xx and cut
// answers at warn.
func (p *Proxy) finish(r *http.Request, req *request) {
	if req.outcome == "" {
		req.outcome = OutcomeClientGone // left before anything was decided
	}
	if p.costly(req) {
		p.settle(req)
		p.spends.note(req.laneID, &req.spend, req.outcome == OutcomeOK, req.used, req.prompted)
	}
	if req.slot != nil {
		req.slot.PromptCounted(req.prompted)
		req.slot.Done(req.status, string(req.outcome), req.used)
	} else if req.laneID != "" { // its lane refused it
		p.lanes.Answered(req.laneID, req.status, string(req.outcome))
	}
	req.trace.End(req.status, string(req.outcome), req.retries, req.cutErr)
	level := slog.LevelDebug
	if req.outcome == OutcomeUpstreamCut || req.outcome == OutcomeClientStalled || req.status >= 500 {
		level = slog.LevelWarn
	}
	if !p.log.Enabled(r.Context(), level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("request_id", req.id),
		slog.String("upstream_request_id", req.upstreamID),
		slog.String("lane", req.laneID),
		slog.String("route", req.route),
		slog.String("method", r.Method),
		slog.String("path", bound.Field(req.target.Path)),
		slog.Int("status", req.status),
		slog.String("outcome", string(req.outcome)),
		slog.Int64("queue_ms", req.queueWait.Milliseconds()),
		slog.Int("retries", req.retries),
		slog.Int64("upstream_ms", req.upstreamTime.Milliseconds()),
	}
	if req.cutErr != "" {
		attrs = append(attrs, slog.String("err", req.cutErr))
	}
	p.log.LogAttrs(r.Context(), level, "request", attrs...)
}
