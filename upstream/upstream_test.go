package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func answer(status int, body string, hdr ...string) http.RoundTripper {
	return rtFunc(func(r *http.Request) (*http.Response, error) {
		h := http.Header{}
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Set(hdr[i], hdr[i+1])
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}, nil
	})
}

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func TestClassification(t *testing.T) {
	rateLimited := `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`
	for _, tc := range []struct {
		name    string
		rt      http.RoundTripper
		outcome Outcome
		hint    time.Duration
		hasHint bool
	}{
		{"200", answer(200, "{}"), Success, 0, false},
		{"400 final", answer(400, `{"error":{"type":"invalid_request_error"}}`), Final, 0, false},
		{"401 final", answer(401, ""), Final, 0, false},
		{"429 retry-after-ms", answer(429, rateLimited, "Retry-After-Ms", "1500", "Retry-After", "2"), Retryable, 1500 * time.Millisecond, true},
		{"429 retry-after seconds", answer(429, rateLimited, "Retry-After", "3"), Retryable, 3 * time.Second, true},
		{"429 try-again message", answer(429, `{"error":{"message":"Please try again in 1.574s.","type":"tokens","code":"rate_limit_exceeded"}}`), Retryable, 1574 * time.Millisecond, true},
		{"429 reset header", answer(429, rateLimited, "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Limit-Requests", "10", "X-Ratelimit-Reset-Requests", "750ms"), Retryable, 750 * time.Millisecond, true},
		{"429 no hint", answer(429, rateLimited), Retryable, 0, false},
		{"429 insufficient_quota", answer(429, `{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"quota"}}`, "Retry-After", "1"), Final, 0, false},
		{"429 spend cap", answer(429, `{"type":"error","error":{"type":"rate_limit_error","message":"cap","details":{"error_code":"enforced_spend_limit_reached"}}}`), Final, 0, false},
		{"429 too large", answer(429, `{"error":{"message":"Request too large for gpt-4 ... Limit 30000, Requested 31538.","type":"tokens","code":"rate_limit_exceeded"}}`), Final, 0, false},
		{"503", answer(503, `{"error":{"type":"server_error","code":"server_is_overloaded","message":"busy"}}`), Retryable, 0, false},
		{"529", answer(529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`), Retryable, 0, false},
		{"500", answer(500, "oops"), Retryable, 0, false},
		{"502", answer(502, ""), Retryable, 0, false},
		{"504", answer(504, ""), Retryable, 0, false},
		{"408", answer(408, ""), Retryable, 0, false},
		{"connection reset", rtFunc(func(*http.Request) (*http.Response, error) { return nil, errors.New("read: connection reset by peer") }), Retryable, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", "http://upstream.test/v1/chat/completions", nil)
			r := Do(tc.rt, req, now)
			if r.Outcome != tc.outcome || r.HasHint != tc.hasHint || r.Hint != tc.hint {
				t.Fatalf("got outcome %v hint %v/%v; want %v %v/%v",
					r.Outcome, r.Hint, r.HasHint, tc.outcome, tc.hint, tc.hasHint)
			}
		})
	}
}

func TestErrorBodyIsKeptWhole(t *testing.T) {
	big := `{"error":{"type":"requests","code":"rate_limit_exceeded","message":"` + strings.Repeat("x", MaxErrorBody) + `"}}`
	req, _ := http.NewRequest("POST", "http://upstream.test/", nil)
	r := Do(answer(429, big), req, now)
	b, _ := io.ReadAll(r.Resp.Body)
	if string(b) != big {
		t.Fatalf("body changed: %d bytes, want %d", len(b), len(big))
	}
}

func TestCancelledAttemptIsFinal(t *testing.T) {
	req, _ := http.NewRequest("POST", "http://upstream.test/", nil)
	ctx, cancel := context.WithCancel(req.Context())
	cancel()
	r := Do(rtFunc(func(*http.Request) (*http.Response, error) { return nil, ctx.Err() }), req.WithContext(ctx), now)
	if r.Outcome != Final {
		t.Fatalf("outcome %v, want final", r.Outcome)
	}
}

func TestOutboundHeaderDropsHopByHopAndEncoding(t *testing.T) {
	in := http.Header{}
	in.Set("Authorization", "Bearer k")
	in.Set("Connection", "keep-alive, X-Private")
	in.Set("X-Private", "1")
	in.Set("Accept-Encoding", "br")
	in.Set("Te", "trailers")
	in.Set("Expect", "100-continue")
	in.Set("Content-Type", "application/json")
	out := OutboundHeader(in)
	for _, k := range []string{"Connection", "X-Private", "Accept-Encoding", "Te", "Expect"} {
		if out.Get(k) != "" {
			t.Errorf("%s forwarded", k)
		}
	}
	if out.Get("Authorization") != "Bearer k" || out.Get("Content-Type") != "application/json" {
		t.Fatalf("end-to-end headers lost: %v", out)
	}
	if in.Get("X-Private") != "1" {
		t.Fatal("input header modified")
	}
	out["Authorization"][0] = "changed"
	if in.Get("Authorization") != "Bearer k" {
		t.Fatal("the values are the client's, not copies")
	}
}

// TestCopyEndToEndLeavesOutHopAndSkipped: an answer's headers reach the
// client but the hop-by-hop ones, those its Connection names and those
// the caller skips; what the client's header already held stays.
func TestCopyEndToEndLeavesOutHopAndSkipped(t *testing.T) {
	src := http.Header{}
	src.Set("Connection", "close, X-Hop")
	src.Set("X-Hop", "1")
	src.Set("Transfer-Encoding", "chunked")
	src.Set("Keep-Alive", "timeout=5")
	src.Set("X-Skipped", "1")
	src.Set("Content-Type", "application/json")
	src.Add("X-Twice", "a")
	src.Add("X-Twice", "b")
	dst := http.Header{"X-Own": {"mine"}}
	CopyEndToEnd(dst, src, func(name string) bool { return name == "X-Skipped" })
	want := http.Header{"X-Own": {"mine"}, "Content-Type": {"application/json"}, "X-Twice": {"a", "b"}}
	if !reflect.DeepEqual(dst, want) {
		t.Fatalf("copied %v, want %v", dst, want)
	}
	dst = http.Header{}
	CopyEndToEnd(dst, src, nil)
	if dst.Get("X-Skipped") != "1" || dst.Get("X-Hop") != "" {
		t.Fatalf("with no skip: %v", dst)
	}
}

func TestDialFailureIsUnreachable(t *testing.T) {
	req, _ := http.NewRequest("POST", "http://127.0.0.1:1/", nil)
	r := Do(NewTransport(), req, now)
	if r.Outcome != Retryable || !r.Unreachable {
		t.Fatalf("outcome %v unreachable %v (%v)", r.Outcome, r.Unreachable, r.Err)
	}
	req, _ = http.NewRequest("POST", "http://no-such-host.invalid/", nil)
	if r := Do(NewTransport(), req, now); !r.Unreachable {
		t.Fatalf("DNS failure not unreachable: %v", r.Err)
	}
}

func TestTransportSpeaksHTTP2ToTLSUpstreams(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Proto", r.Proto)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	r := Do(tr, req, now)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	defer r.Resp.Body.Close()
	if got := r.Resp.Header.Get("X-Proto"); got != "HTTP/2.0" {
		t.Fatalf("upstream saw %s, want HTTP/2.0", got)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestDialTimeoutIsRetryable(t *testing.T) {
	req, _ := http.NewRequest("POST", "http://upstream.test/", nil)
	r := Do(rtFunc(func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
	}), req, now)
	if r.Outcome != Retryable || !r.Unreachable {
		t.Fatalf("outcome %v unreachable %v", r.Outcome, r.Unreachable)
	}
}

// TestOutboundHeaderDropsClientAddressClaims: what a client claims about
// its address or earlier proxies does not reach the upstream; its own
// headers do.
func TestOutboundHeaderDropsClientAddressClaims(t *testing.T) {
	in := http.Header{}
	for _, k := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "True-Client-Ip"} {
		in.Set(k, "203.0.113.9")
	}
	in.Set("Authorization", "Bearer k")
	in.Set("Openai-Beta", "assistants=v2")
	out := OutboundHeader(in)
	for k := range in {
		keep := k == "Authorization" || k == "Openai-Beta"
		if got := out.Get(k); keep != (got != "") {
			t.Errorf("%s: %q after OutboundHeader", k, got)
		}
	}
}

// TestTransportBoundsIdleConnectionsAndHandshakes: pooled connections the
// upstream no longer uses are closed after about a minute and a half, and a
// connection attempt or TLS handshake that stalls fails in seconds, not
// never.
func TestTransportBoundsIdleConnectionsAndHandshakes(t *testing.T) {
	tr := NewTransport()
	if tr.IdleConnTimeout < time.Minute || tr.IdleConnTimeout > 5*time.Minute {
		t.Errorf("idle connections kept %v, want about 90s", tr.IdleConnTimeout)
	}
	if tr.TLSHandshakeTimeout < time.Second || tr.TLSHandshakeTimeout > 30*time.Second {
		t.Errorf("TLS handshake bound %v, want about 10s", tr.TLSHandshakeTimeout)
	}
	d := newDialer()
	if d.Timeout < time.Second || d.Timeout > 30*time.Second {
		t.Errorf("a connection attempt may take %v, want about 10s", d.Timeout)
	}
	if d.KeepAlive < 10*time.Second {
		t.Errorf("TCP keep-alive every %v, want about 30s", d.KeepAlive)
	}
	if tr.MaxIdleConnsPerHost < 256 {
		t.Errorf("%d idle connections per host: a busy lane would reconnect all the time", tr.MaxIdleConnsPerHost)
	}
}

// TestRetryableStatusIsWhatSDKsRetry: the statuses SDKs retry on their own
// (408, 409, 429, 5xx) are marked, so the proxy can tell them not to
// retry what it already did; others are left to the SDK.
func TestRetryableStatusIsWhatSDKsRetry(t *testing.T) {
	for code, want := range map[int]bool{200: false, 400: false, 401: false, 404: false, 408: true, 409: true, 429: true, 500: true, 502: true, 503: true, 504: true, 529: true} {
		if got := RetryableStatus(code); got != want {
			t.Errorf("RetryableStatus(%d) = %v, want %v", code, got, want)
		}
	}
}

// TestQuotaAnswers: an answer that spends a quota waiting cannot renew is
// final, says so in Quota, with when it renews where the answer says;
// other answers spend none, and the bodies read to tell are kept whole.
func TestQuotaAnswers(t *testing.T) {
	geminiDay := `{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}`
	for _, tc := range []struct {
		name    string
		rt      http.RoundTripper
		outcome Outcome
		spent   bool
		renews  time.Time
	}{
		{"gemini per day", answer(429, geminiDay), Final, true, time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)},
		{"insufficient quota", answer(429, `{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}`), Final, true, time.Time{}},
		{"groq per day", answer(429, `{"error":{"message":"Rate limit reached on requests per day (RPD): Limit 10, Used 10, Requested 1.","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "90"),
			Final, true, now.Add(90 * time.Second)},
		{"apim 403", answer(403, `{"statusCode":403,"message":"Out of call volume quota. Quota will be replenished in 00:10:00."}`), Final, true, now.Add(10 * time.Minute)},
		{"402", answer(402, `{"error":{"code":402,"message":"Insufficient credits"}}`), Final, true, time.Time{}},
		{"anthropic usage limit 400: words on a 400 are not read", answer(400, `{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits."}}`), Final, false, time.Time{}},
		{"echoed per day field", answer(400, `{"error":{"message":"Unrecognized request argument supplied: per day (try again in 744h","type":"invalid_request_error","param":null,"code":null}}`), Final, false, time.Time{}},
		{"403 with a month's Retry-After", answer(403, `Forbidden`, "Retry-After", "2678000"), Final, false, time.Time{}},
		{"403 permission", answer(403, `{"type":"error","error":{"type":"permission_error","message":"no"}}`), Final, false, time.Time{}},
		{"400 invalid", answer(400, `{"error":{"type":"invalid_request_error","message":"bad"}}`), Final, false, time.Time{}},
		{"429 rate limit", answer(429, `{"error":{"type":"requests","code":"rate_limit_exceeded"}}`), Retryable, false, time.Time{}},
		{"404 not read", answer(404, `{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}`), Final, false, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", "http://upstream.test/v1/chat/completions", nil)
			r := Do(tc.rt, req, now)
			if r.Outcome != tc.outcome || r.Quota.Spent != tc.spent || !r.Quota.Renews.Equal(tc.renews) {
				t.Fatalf("outcome %v, quota %+v; want %v, spent %v renewing %v", r.Outcome, r.Quota, tc.outcome, tc.spent, tc.renews)
			}
			b, _ := io.ReadAll(r.Resp.Body)
			if len(b) == 0 {
				t.Fatal("the body was lost in reading it")
			}
		})
	}
}
