// Package upstream makes one attempt at the upstream and classifies its
// answer: success, retryable, or final. It owns the outbound transport and
// the rules for which headers cross the proxy; it does not decide whether or
// when to retry (that is the proxy's job) and does not queue.
package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// NewTransport returns the one outbound transport: a keep-alive pool sized
// for many concurrent requests to few hosts, HTTP/2 to TLS upstreams, no
// overall timeout (LLM answers can take minutes; the caller's context bounds
// each attempt).
func NewTransport() *http.Transport {
	dialer := newDialer()
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          2048,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
}

// newDialer bounds a connection attempt to 10 s, so an upstream that never
// answers is an error to retry, not a request held for its whole budget,
// and keeps idle pooled connections alive with TCP keep-alives.
func newDialer() *net.Dialer {
	return &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
}

// Outcome is how the proxy should treat an attempt's answer.
type Outcome int

const (
	// Success: pass the answer to the client (2xx, and any status the
	// proxy has no reason to retry, like 3xx).
	Success Outcome = iota
	// Retryable: a 429 that is not a hard quota, 408, 500, 502, 503, 504,
	// 529, or a connection error. Waiting may help.
	Retryable
	// Final: an error waiting cannot fix; pass it to the client as is.
	Final
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Retryable:
		return "retryable"
	default:
		return "final"
	}
}

// MaxErrorBody is how much of an error answer is read to classify it. The
// rest is not lost: Result.Resp.Body still yields the whole body.
const MaxErrorBody = 64 << 10

// Result is one attempt.
type Result struct {
	// Resp is the upstream answer, nil on a connection error. For error
	// statuses its Body has been partly read to classify it and is rewound.
	Resp    *http.Response
	Err     error // transport error when Resp is nil
	Outcome Outcome
	Limits  headerparse.Limits
	Error   headerparse.ErrorInfo // for the error statuses read (see readsBody)
	// Quota says whether the answer spent a quota waiting cannot renew
	// (headerparse.QuotaOf); such an answer is Final.
	Quota headerparse.Quota
	// Hint is the upstream's own word on when to try again: retry-after-ms,
	// Retry-After, a "try again in" message, or the reset of an exhausted
	// window. HasHint is false when it said nothing.
	Hint    time.Duration
	HasHint bool
	// Unreachable: the connection could not be made at all (DNS or dial
	// failure). Worth a quick retry or two, not a long one.
	Unreachable bool
	Latency     time.Duration // until the response headers arrived
}

// retryableStatus lists the statuses that waiting may fix.
func retryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout, 529:
		return true
	}
	return false
}

// readsBody reports whether an answer's error body is read to classify
// it: a status waiting may fix, and those a quota or spend limit answers
// with (400: a quota's code or quotaId; 402: no credits; 403: Azure API
// Management's quota).
func readsBody(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusPaymentRequired, http.StatusForbidden:
		return true
	}
	return retryableStatus(code)
}

// RetryableStatus reports whether a status is one an SDK would retry and the
// proxy retries too; the proxy marks such answers x-should-retry: false when
// it hands them to the client.
func RetryableStatus(code int) bool { return retryableStatus(code) || code == http.StatusConflict }

// Do sends one attempt. req must carry the context that bounds the attempt
// and a body that can be read once (callers make a fresh one per attempt).
// now anchors relative reset headers.
func Do(rt http.RoundTripper, req *http.Request, now time.Time) Result {
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	r := Result{Latency: time.Since(start)}
	if err != nil {
		r.Err = err
		r.Outcome = Retryable
		var op *net.OpError
		var dns *net.DNSError
		r.Unreachable = errors.As(err, &dns) || errors.As(err, &op) && op.Op == "dial"
		if req.Context().Err() != nil {
			r.Outcome = Final // the caller gave up; a dial timeout is not that
		}
		return r
	}
	r.Resp = resp
	r.Limits = headerparse.Parse(resp.Header, now)
	if resp.StatusCode < 400 {
		r.Outcome = Success
		return r
	}
	if !readsBody(resp.StatusCode) {
		r.Outcome = Final
		return r
	}
	head, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
	resp.Body = &rewound{Reader: io.MultiReader(bytes.NewReader(head), resp.Body), Closer: resp.Body}
	r.Error = headerparse.ParseError(resp.StatusCode, head)
	r.Quota = headerparse.QuotaOf(resp.StatusCode, resp.Header, r.Error, now)
	if r.Error.Kind.Final() || !retryableStatus(resp.StatusCode) {
		r.Outcome = Final
		return r
	}
	r.Outcome = Retryable
	switch {
	case r.Limits.HasRetryAfter:
		r.Hint, r.HasHint = r.Limits.RetryAfter, true
	case r.Error.HasRetryIn:
		r.Hint, r.HasHint = r.Error.RetryIn, true
	default:
		if at, ok := r.Limits.ResumeAt(now); ok && resp.StatusCode == http.StatusTooManyRequests {
			r.Hint, r.HasHint = max(at.Sub(now), 0), true
		}
	}
	return r
}

type rewound struct {
	io.Reader
	io.Closer
}

// Discard drains a little of an unwanted answer and closes it, so the
// connection can be reused when the rest is short.
func (r Result) Discard() {
	if r.Resp == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, r.Resp.Body, 4<<10)
	_ = r.Resp.Body.Close()
}

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1, plus the
// de-facto ones, never forwarded in either direction; by canonical name,
// as a transport's and a server's header maps hold their names, so they
// are looked up without canonicalising them on every request.
var hopHeaders = names("Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade")

// notSentUp are the end-to-end headers a client's request does not take
// upstream: Accept-Encoding, so the transport negotiates gzip itself and
// hands the proxy plain bytes (it must read error bodies and usage);
// Expect, as the proxy has the whole body; the framing the transport
// sets; and what a client says about where it or earlier proxies are,
// which is neither checked nor needed upstream (an API provider sees the
// proxy): passing it on would let a client forge a source address in the
// provider's logs and leak internal addresses.
var notSentUp = names("Accept-Encoding", "Expect", "Content-Length", "Host",
	"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port",
	"X-Forwarded-Prefix", "X-Forwarded-Server", "X-Real-Ip", "X-Client-Ip", "True-Client-Ip")

func names(canonical ...string) map[string]bool {
	m := make(map[string]bool, len(canonical))
	for _, n := range canonical {
		m[n] = true
	}
	return m
}

// StripHopHeaders removes hop-by-hop headers, including any that Connection
// names, from h in place.
func StripHopHeaders(h http.Header) {
	dropConnectionNamed(h, h)
	for name := range hopHeaders {
		delete(h, name)
	}
}

// dropConnectionNamed deletes from h the headers that from's Connection
// names.
func dropConnectionNamed(h, from http.Header) {
	for _, v := range from["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name) // a name from the peer: canonicalised
			}
		}
	}
}

// CopyEndToEnd copies into dst the end-to-end headers of src, an answer's:
// all but the hop-by-hop ones (those src's Connection names included) and
// those skip reports. The value slices are src's, not copies.
func CopyEndToEnd(dst, src http.Header, skip func(name string) bool) {
	for k, vs := range src {
		if !hopHeaders[k] && (skip == nil || !skip(k)) {
			dst[k] = vs
		}
	}
	dropConnectionNamed(dst, src)
}

// OutboundHeader is the header set sent upstream for a client's header:
// its end-to-end headers but notSentUp, their values copied into one
// slice (as Header.Clone does), and nothing added that reveals the
// client.
func OutboundHeader(in http.Header) http.Header {
	n := 0
	for _, vs := range in {
		n += len(vs)
	}
	values := make([]string, n)
	h := make(http.Header, len(in))
	for k, vs := range in {
		if hopHeaders[k] || notSentUp[k] {
			continue
		}
		n := copy(values, vs)
		h[k], values = values[:n:n], values[n:]
	}
	dropConnectionNamed(h, in)
	return h
}
