package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/internal/tracing"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/tokens"
)

// What the client asks for, read from its request's headers (and, for
// its model, its body): its say over the request, its deadline, the
// credential that keys its lane, and what the lane table and the trace
// are told of it.

// priorityHeader is a request's priority within its lane, high or low;
// it is not sent upstream.
const priorityHeader = "X-Llmproxy-Priority"

// clientHeader names the client a request comes from (an eval, a user):
// the clients of a lane take turns. It is not sent upstream.
const clientHeader = "X-Llmproxy-Client"

// The client's say over its own request, in headers the upstream never
// sees (see attempt): x-llmproxy-max-wait shortens the request's deadline
// below MaxWait, as X-Stainless-Timeout does; x-llmproxy-retry: off hands
// the first answer back as the upstream sent it, a refusal or a failure
// included, instead of absorbing it.
const (
	maxWaitHeader = "X-Llmproxy-Max-Wait"
	retryHeader   = "X-Llmproxy-Retry"
)

// clientHeaders are the request headers that speak to the proxy alone.
var clientHeaders = [...]string{priorityHeader, clientHeader, maxWaitHeader, retryHeader, tierHeader, runHeader, budgetHeader, journalHeader}

// clientSay is what the client said in them.
type clientSay struct {
	maxWait  time.Duration // > 0: the time it asks for, before MaxWait caps it
	retryOff bool
	// tier, run and budget are x-llmproxy-tier, x-llmproxy-run and
	// x-llmproxy-budget-usd (see readCostSay).
	tier   cost.Tier
	run    string
	budget cost.Amount
	// keep is what it said of the journal and its retries (see
	// readKeepSay).
	keep keepSay
}

// readSay reads the client's say from h: x-llmproxy-max-wait, a number of
// seconds above 0 (one past any deadline asks for none shorter);
// x-llmproxy-retry, on (the default) or off, in any case. Any other value
// is an error naming its header.
func readSay(h http.Header) (clientSay, error) {
	var s clientSay
	if v, ok := h[maxWaitHeader]; ok {
		secs, err := strconv.ParseFloat(strings.TrimSpace(v[0]), 64)
		if err != nil || !(secs > 0) || math.IsInf(secs, 1) {
			return clientSay{}, fail(failBadMaxWait, "x-llmproxy-max-wait must be a number of seconds above 0, such as 30 or 2.5")
		}
		s.maxWait = time.Duration(math.MaxInt64)
		if secs < s.maxWait.Seconds() {
			s.maxWait = max(time.Duration(secs*float64(time.Second)), 1)
		}
	}
	if v, ok := h[retryHeader]; ok {
		switch strings.ToLower(strings.TrimSpace(v[0])) {
		case "off":
			s.retryOff = true
		case "on":
		default:
			return clientSay{}, fail(failBadRetry, "x-llmproxy-retry must be on or off")
		}
	}
	return s, readCostSay(h, &s)
}

// readCostSay reads into s what the client says of its request's cost:
// x-llmproxy-tier, flex or standard, in any case; x-llmproxy-run, a name
// as x-llmproxy-client's; x-llmproxy-budget-usd, a number of dollars
// above 0.
func readCostSay(h http.Header, s *clientSay) error {
	if v, ok := h[tierHeader]; ok {
		switch t := cost.Tier(strings.ToLower(strings.TrimSpace(v[0]))); t {
		case cost.Flex, cost.Standard:
			s.tier = t
		default:
			return fail(failBadTier, "x-llmproxy-tier must be flex or standard")
		}
	}
	if v, ok := h[runHeader]; ok {
		if s.run = v[0]; s.run == "" || !validClient(s.run) {
			return fail(failBadRun, "x-llmproxy-run must be a name of 1 to 64 visible ASCII characters, without spaces")
		}
	}
	if v, ok := h[budgetHeader]; ok {
		usd, err := strconv.ParseFloat(strings.TrimSpace(v[0]), 64)
		if err != nil || !(usd > 0) || usd > 9e9 {
			return fail(failBadBudget, "x-llmproxy-budget-usd must be a number of dollars above 0, such as 5 or 0.25")
		}
		if s.budget = cost.Amount(math.Round(usd * float64(cost.Dollar))); s.budget <= 0 {
			return fail(failBadBudget, "x-llmproxy-budget-usd must be at least 0.000000001 (a nano-dollar)")
		}
	}
	return readKeepSay(h, s)
}

// readKeepSay reads x-llmproxy-journal, X-Stainless-Retry-Count and
// Idempotency-Key from h into s.
func readKeepSay(h http.Header, s *clientSay) error {
	if v, ok := h[journalHeader]; ok {
		m, ok := journalModes[strings.ToLower(strings.TrimSpace(v[0]))]
		if !ok {
			return fail(failBadJournal, "x-llmproxy-journal must be record, replay, strict or off")
		}
		s.keep.mode, s.keep.said = m, true
	}
	if v, ok := h[retryCountHeader]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v[0]))
		s.keep.retry, s.keep.retries = err == nil && n > 0, true
	}
	for _, name := range [...]string{"X-Stainless-Timeout", "X-Stainless-Read-Timeout"} {
		if v, ok := h[name]; ok {
			if secs, err := strconv.ParseFloat(strings.TrimSpace(v[0]), 64); err == nil && secs > 0 && secs < 1e6 {
				s.keep.timeout = time.Duration(secs * float64(time.Second))
			}
		}
	}
	if v, ok := h[idempotencyHeader]; ok && len(v[0]) <= 256 {
		s.keep.idem = v[0]
	}
	return nil
}

// deadline is the request's deadline: MaxWait, shortened by the client's
// own X-Stainless-Timeout (seconds) when it sends one, and by maxWait, its
// x-llmproxy-max-wait, when that is above 0.
func (p *Proxy) deadline(r *http.Request, now time.Time, maxWait time.Duration) time.Time {
	d := p.cfg.MaxWait
	if maxWait > 0 {
		d = min(d, maxWait)
	}
	if v := r.Header.Get("X-Stainless-Timeout"); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil && secs > 0 && secs < 1e7 {
			if c := time.Duration(secs * float64(time.Second)); c < d {
				d = c
			}
		}
	}
	return now.Add(d)
}

// credentialOf returns the first credential the request carries, in the
// places the big providers take one: Authorization (OpenAI's Bearer, and
// any other scheme whole), x-api-key (Anthropic), api-key (Azure OpenAI),
// x-goog-api-key and the key query parameter (Gemini's own API). Requests
// with different keys never share a lane.
func credentialOf(h http.Header, rawQuery string) string {
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

// laneRequest is what the lane table needs of r (see lanequeue.Request):
// its lane's key, its estimated cost, its priority, the route's unless the
// client's x-llmproxy-priority says otherwise, and the client that
// x-llmproxy-client names; cred is r's credential. It notes whether r is
// a WebSocket handshake, and readies its cost side when it has one (see
// prepareSpend).
func (p *Proxy) laneRequest(r *http.Request, req *request, cred string) (lanequeue.Request, error) {
	req.upgrade = isUpgrade(r)
	prio := p.settings[req.route].Priority
	if v := r.Header.Get(priorityHeader); v != "" {
		if prio.UnmarshalText([]byte(strings.TrimSpace(v))) != nil {
			return lanequeue.Request{}, fail(failBadPriority, "x-llmproxy-priority must be high or low")
		}
	}
	client := r.Header.Get(clientHeader)
	if !validClient(client) {
		return lanequeue.Request{}, fail(failBadClient, "x-llmproxy-client must be a name of 1 to 64 visible ASCII characters, without spaces")
	}
	// One read of the body for its model and its cost. A spooled body is
	// not read for its prompt (that would take it into memory): it
	// reserves the default output, and its answer's usage settles the
	// rest.
	read := tokens.ReadRequest(req.target.Path, req.body.mem)
	switch {
	case req.body.file != nil:
		read.Model = modelOfSpool(req.body.reader())
	case req.upgrade: // the Realtime API names it in the query
		read.Model = r.URL.Query().Get("model")
	}
	if p.costly(req) {
		s := &req.spend
		s.model, s.estimate, s.output, s.outputLimited = read.Model, read.Cost, read.Output, read.OutputLimited
		s.client = r.Context()
		if s.run != "" || s.runBudget > 0 || p.cfg.Budget > 0 {
			s.key = shortHash(cred)
		}
		if err := p.prepareSpend(req); err != nil {
			return lanequeue.Request{}, err
		}
	}
	return lanequeue.Request{
		Route:      req.route,
		Credential: cred,
		Path:       req.target.Path,
		Model:      read.Model,
		Cost:       read.Cost,
		Output:     read.Output,
		Priority:   prio,
		Client:     client,
	}, nil
}

// maxClientName is the longest name x-llmproxy-client may give.
const maxClientName = 64

// validClient reports whether name may name a client: at most
// maxClientName bytes, each visible ASCII (no space, no control). "" is
// no name.
func validClient(name string) bool {
	if len(name) > maxClientName {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' {
			return false
		}
	}
	return true
}

// modelOfSpool reads the top-level "model" of a spooled JSON body, ""
// when there is none, through a window of 16 KiB, whatever the body's
// size: every value before it is checked and let go as it is read, and
// what follows it is not read. The key matches as tokens.ReadRequest's
// does (escapes decoded, in any case), but here the first one counts,
// where ReadRequest takes the last: reading on would mean reading the
// rest of the body. A model of more than 1 KiB as written is not read.
func modelOfSpool(r io.Reader) string {
	model, _ := tokens.FirstString(r, "model", 1<<10)
	return model
}

// isUpgrade reports whether r asks to switch to WebSocket.
func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && hasToken(r.Header.Values("Connection"), "upgrade")
}

// hasToken reports whether a comma-separated header holds token.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// describe tells req's trace what it asks for, lr: its model, of its
// route's provider, by its path's operation, for its client.
func (p *Proxy) describe(req *request, lr lanequeue.Request) {
	if req.trace == nil {
		return
	}
	req.trace.Describe(lr.Model, tracing.Operation(req.target.Path), p.providers[req.route], lr.Client)
}

// shortHash is the first 12 hex digits of cred's SHA-256, as the lanes
// show a key: enough to tell keys apart, far too few to guess one.
func shortHash(cred string) string {
	sum := sha256.Sum256([]byte(cred))
	return hex.EncodeToString(sum[:6])
}
