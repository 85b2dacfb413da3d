package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/tokens"
	"github.com/llmproxy/llmproxy/upstream"
)

// priorityHeader is a request's priority within its lane, high or low;
// it is not sent upstream.
const priorityHeader = "X-Llmproxy-Priority"

// request is one client request on its way through the proxy.
type request struct {
	route     string
	target    *url.URL
	body      body
	lane      *lanequeue.Lane
	arrived   time.Time
	deadline  time.Time
	queueWait time.Duration
	retries   int               // re-sends, all causes: x-llmproxy-retries and the log
	tries     tally             // what the attempts met, for decide
	upstream  time.Duration     // sum of attempt latencies
	status    int               // what the client got; 0 = none was sent
	outcome   lanequeue.Outcome // how the answer ended
	cost      int64             // estimated tokens
	// cancelAttempt ends the current upstream attempt; the answer's idle
	// watchdog uses it.
	cancelAttempt context.CancelFunc
	cutErr        string   // why the upstream's answer broke off (an upstream_cut)
	id            string   // x-llmproxy-request-id
	idHeader      []string // {id}, the header value
	upstreamID    string   // the upstream's own request id, from its latest answer
	upgrade       bool     // a WebSocket handshake (see isUpgrade)
}

// newRequestID is a request's id: 16 hex digits, random, so ids from
// replicas do not collide.
func newRequestID() string {
	var b [16]byte
	v := rand.Uint64()
	const hexDigits = "0123456789abcdef"
	for i := range b {
		b[i] = hexDigits[v>>(60-4*i)&0xf]
	}
	return string(b[:])
}

func (p *Proxy) routeHandler(route string, base *url.URL, prefix string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.serve(w, r, route, base, strings.TrimPrefix(r.URL.Path, prefix))
	}
}

// targetURL joins the configured upstream with the client's path. The host
// always comes from configuration; the path is cleaned so dot segments
// cannot climb above the upstream's base path.
func targetURL(base *url.URL, rest, rawQuery string) *url.URL {
	clean := path.Clean("/" + rest)
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

// credential returns the first credential the request carries, in the
// places the big providers take one: Authorization (OpenAI's Bearer, and
// any other scheme whole), x-api-key (Anthropic), api-key (Azure OpenAI),
// x-goog-api-key and the key query parameter (Gemini's own API). Requests
// with different keys never share a lane.
func credential(h http.Header, rawQuery string) string {
	if v := h.Get("Authorization"); v != "" {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			return strings.TrimSpace(v[7:])
		}
		if id, ok := sigV4Credential(v); ok {
			return id
		}
		return v
	}
	for _, k := range []string{"X-Api-Key", "Api-Key", "X-Goog-Api-Key"} {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	return queryKey(rawQuery)
}

// sigV4Credential is what names the signer of an AWS Signature Version 4
// Authorization (Amazon Bedrock's own API): the access key ID, region and
// service of its Credential=, never the date or the signature, which
// change from request to request. ok is false for any other scheme, or a
// Credential= that does not have its five parts.
func sigV4Credential(auth string) (string, bool) {
	const scheme = "AWS4-HMAC-SHA256 "
	if len(auth) <= len(scheme) || !strings.EqualFold(auth[:len(scheme)], scheme) {
		return "", false
	}
	for _, part := range strings.Split(auth[len(scheme):], ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(part), "=")
		if name != "Credential" {
			continue
		}
		// AKID/yyyymmdd/region/service/aws4_request
		f := strings.Split(value, "/")
		if len(f) != 5 || f[0] == "" || f[4] != "aws4_request" {
			return "", false
		}
		return "sigv4 " + f[0] + "/" + f[2] + "/" + f[3], true
	}
	return "", false
}

// queryKey is the first key parameter of a raw query, unescaped when it
// can be; a value that does not unescape is still a distinct key.
func queryKey(rawQuery string) string {
	for rawQuery != "" {
		var part string
		part, rawQuery, _ = strings.Cut(rawQuery, "&")
		name, value, _ := strings.Cut(part, "=")
		if name != "key" || value == "" {
			continue
		}
		if v, err := url.QueryUnescape(value); err == nil {
			return v
		}
		return value
	}
	return ""
}

// modelOf reads the top-level "model" of a JSON body, "" when there is none.
func modelOf(body []byte) string {
	b := bytes.TrimLeft(body, " \t\r\n")
	if len(b) == 0 || b[0] != '{' {
		return ""
	}
	var v struct {
		Model string `json:"model"`
	}
	if json.Unmarshal(b, &v) != nil {
		return ""
	}
	return v.Model
}

// budget returns the request's deadline: MaxWait, shortened by the client's
// own X-Stainless-Timeout (seconds) when it sends one.
func (p *Proxy) budget(r *http.Request, now time.Time) time.Time {
	d := p.cfg.MaxWait
	if v := r.Header.Get("X-Stainless-Timeout"); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil && secs > 0 && secs < 1e7 {
			if c := time.Duration(secs * float64(time.Second)); c < d {
				d = c
			}
		}
	}
	return now.Add(d)
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, route string, base *url.URL, rest string) {
	now := p.cfg.Clock.Now()
	req := &request{route: route, target: targetURL(base, rest, r.URL.RawQuery), arrived: now, id: newRequestID()}
	req.idHeader = []string{req.id} // one value for both ways: neither side changes it
	w.Header()["X-Llmproxy-Request-Id"] = req.idHeader
	defer func() { p.finish(r, req) }()
	if p.stopping() {
		p.failRequest(w, req, errShutdown)
		return
	}

	defer p.releaseBody(req)
	if err := p.readBody(w, r, req); err != nil {
		p.failRequest(w, req, err)
		return
	}
	req.deadline = p.budget(r, now)
	req.upgrade = isUpgrade(r)
	key := laneKey(r, req, route)
	prio := p.settings[route].Priority
	if v := r.Header.Get(priorityHeader); v != "" {
		var ok bool
		if prio, ok = lanequeue.ParsePriority(strings.TrimSpace(v)); !ok {
			p.failRequest(w, req, fail(failBadPriority, "x-llmproxy-priority must be high or low"))
			return
		}
	}
	req.lane = p.lanes.Get(key)
	w.Header().Set("X-Llmproxy-Lane", req.lane.ID())

	ctx, cancel := context.WithDeadline(r.Context(), req.deadline)
	defer cancel()
	defer context.AfterFunc(p.stopped, cancel)()
	// A spooled body is not read for its prompt (that would take it into
	// memory): it reserves the default output, and its answer's usage
	// settles the rest.
	req.cost = tokens.Estimate(req.target.Path, req.body.mem)
	if gate := p.gates[route]; gate != nil {
		// A local server holds one model at a time: wait for this one's
		// turn before the lane's queue.
		leave, err := gate.Enter(ctx, key.Model)
		if err != nil {
			req.queueWait = p.cfg.Clock.Now().Sub(now)
			p.refuse(w, r, req, err)
			return
		}
		defer leave()
	}
	slot, err := req.lane.AcquirePriority(ctx, req.cost, prio)
	req.queueWait = p.cfg.Clock.Now().Sub(now)
	if err != nil {
		p.refuse(w, r, req, err)
		return
	}
	defer slot.Release()
	p.metrics.queueWait.WithLabelValues(route).Observe(req.queueWait.Seconds())
	p.forward(ctx, w, r, req, slot)
}

// laneKey is the key of r's lane on route: its credential's hash, its
// path and the model its body (or, for the Realtime API, its query)
// names.
func laneKey(r *http.Request, req *request, route string) lanequeue.Key {
	model := ""
	switch {
	case req.body.file != nil:
		model = modelOfSpool(req.body.reader())
	case req.upgrade:
		// The Realtime API names the model in the query.
		model = r.URL.Query().Get("model")
	default:
		model = modelOf(req.body.mem)
	}
	return lanequeue.Key{
		Route:          route,
		CredentialHash: lanequeue.HashCredential(credential(r.Header, r.URL.RawQuery)),
		Path:           lanequeue.Bounded(req.target.Path),
		Model:          lanequeue.Bounded(model),
	}
}

// refuse answers a request that never got a slot, or lost it waiting.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, req *request, err error) {
	if r.Context().Err() != nil {
		req.outcome = lanequeue.OutcomeClientGone // nobody to answer
		return
	}
	setLLMHeaders(w.Header(), req)
	p.failRequest(w, req, err)
}

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
	req.upstream += res.Latency
	return res, cancel, late
}

// forward runs the attempts and answers the client. The slot is held
// throughout, retries included.
func (p *Proxy) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request, slot *lanequeue.Slot) {
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
			p.join(w, req, res, slot)
			return
		case d.action == pass:
			p.respond(w, req, res, slot)
			return
		case d.action == giveUp:
			p.giveUp(w, req, res, d.why)
			return
		}
		res.Discard()
		req.retries++
		req.tries = d.next
		after := d.wait
		if d.pauseLane && held {
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
		p.log.Debug("giving up on retries", "lane", req.lane.ID(), "status", res.Resp.StatusCode, "reason", why)
		p.respond(w, req, res, nil)
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
