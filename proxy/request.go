package proxy

import (
	"math/rand/v2"
	"net/url"
	"time"

	"github.com/llmproxy/llmproxy/internal/tracing"
	"github.com/llmproxy/llmproxy/lanequeue"
)

// request is one client request on its way through the proxy.
type request struct {
	route        string
	target       *url.URL
	body         body
	slot         *lanequeue.Slot // its place in its lane, from Acquire on
	laneID       string
	arrived      time.Time
	deadline     time.Time
	queueWait    time.Duration
	retries      int           // re-sends, all causes: x-llmproxy-retries and the log
	tries        attemptCounts // what the attempts met, for decide
	upstreamTime time.Duration // sum of attempt latencies
	status       int           // what the client got; 0 = none was sent
	outcome      Outcome       // how the answer ended
	used         int64         // tokens its answer's usage counted; -1: not known
	prompted     int64         // of used, the prompt's (input) tokens; 0: not known
	// attempt is the current upstream attempt's watch; the answer's idle
	// watchdog cancels it.
	attempt    *attemptWatch
	cutErr     string // why the upstream's answer broke off (an upstream_cut)
	id         string // x-llmproxy-request-id
	upstreamID string // the upstream's own request id, from its latest answer
	upgrade    bool   // a WebSocket handshake (Upgrade: websocket, read in ask.go)
	priority   lanequeue.Priority
	trace      *tracing.Request // its trace; nil without Config.Tracer
	// retryOff: the client said x-llmproxy-retry: off (see clientSay); the
	// first answer goes back as the upstream sent it.
	retryOff bool
	// spend is its cost side: tier, run, budgets, what it cost.
	spend spend
	// keep is its journal and join side (see keepOn).
	keep keepSay
	// headerValues back the x-llmproxy-* header values (see
	// headerValue), so that they cost no allocation of their own.
	headerValues [headerCount]string
}

// The x-llmproxy-* headers' places in request.headerValues.
const (
	idValue = iota
	laneValue
	queueValue
	retriesValue
	headerCount
)

// idHeader is the request id as a header's values.
func (req *request) idHeader() []string { return req.headerValues[idValue : idValue+1 : idValue+1] }

// headerValue sets the header value at place i to v and returns it as a
// header's values. Neither side changes a header value slice, so one may
// be set on both the client's answer and the upstream request.
func (req *request) headerValue(i int, v string) []string {
	req.headerValues[i] = v
	return req.headerValues[i : i+1 : i+1]
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

// attemptCounts counts what a request's attempts so far have met. Only
// failures use up maxRetries: a refusal the lane absorbs by waiting is
// bounded by the request's deadline, however many there are.
type attemptCounts struct {
	failures    int // 5xx, 408 and connection errors; checked against maxRetries
	refusals    int // rate and concurrency 429s in a row, up to the latest answer
	unreachable int // attempts in a row that made no connection
}
