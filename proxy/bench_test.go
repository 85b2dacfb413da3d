package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const benchAnswer = `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"tok 1 tok 2 tok 3"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15}}`

// cannedTransport answers every attempt at once, so the benchmark measures
// the proxy's own work per request, not a network. Each answer is made
// afresh, its headers and body, as a transport makes them.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(*http.Request) (*http.Response, error) {
	h := http.Header{
		"Content-Type":                   {"application/json"},
		"X-Ratelimit-Limit-Requests":     {"10000"},
		"X-Ratelimit-Remaining-Requests": {"9999"},
		"X-Ratelimit-Reset-Requests":     {"6ms"},
	}
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader(benchAnswer)), ContentLength: int64(len(benchAnswer))}, nil
}

// benchBody is the benchmarks' chat request.
var benchBody = []byte(`{"model":"gpt-test","messages":[{"role":"user","content":"Say hello in three words."}],"max_tokens":16}`)

// benchClient sends requests to a handler the way the benchmarks do: one
// request and one response writer, reused, so that what is measured is
// the handler's work and not the harness's.
type benchClient struct {
	req  *http.Request
	body *bytes.Reader
	w    benchWriter
}

func newBenchClient() *benchClient {
	c := &benchClient{body: bytes.NewReader(benchBody), w: benchWriter{h: http.Header{}}}
	c.req = httptest.NewRequest("POST", "/v1/chat/completions", nil)
	c.req.Header.Set("Authorization", "Bearer sk-bench")
	c.req.Header.Set("Content-Type", "application/json")
	c.req.Body, c.req.ContentLength = io.NopCloser(c.body), int64(len(benchBody))
	return c
}

// send serves one request with h and returns the status it answered.
// The request has a context of its own, cancelled when it is served, as a
// server gives each request.
func (c *benchClient) send(h http.Handler) int {
	c.body.Reset(benchBody)
	clear(c.w.h)
	c.w.status = 0
	ctx, cancel := context.WithCancel(context.Background())
	h.ServeHTTP(&c.w, c.req.WithContext(ctx))
	cancel()
	return c.w.status
}

// benchWriter is a response writer that keeps the status and drops the
// body; it takes write deadlines and flushes as a server's does.
type benchWriter struct {
	h      http.Header
	status int
}

func (w *benchWriter) Header() http.Header { return w.h }

func (w *benchWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *benchWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}

func (w *benchWriter) Flush() {}

func (w *benchWriter) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkServeHTTP: one unlimited lane, a chat request in, a JSON answer
// out, through the whole handler (routing, lane key, queue, attempt,
// header learning, usage metering, logging to a discarded handler).
// Compare BenchmarkServeHTTPLeastProxy, the same harness around the least
// a proxy must do.
func BenchmarkServeHTTP(b *testing.B) { benchServe(b, nil) }

// BenchmarkServeHTTPNamedClient is BenchmarkServeHTTP with each request
// naming its client (x-llmproxy-client), one of four per lane: what fair
// turns cost.
func BenchmarkServeHTTPNamedClient(b *testing.B) {
	var n atomic.Int32
	benchServe(b, func(c *benchClient) {
		c.req.Header.Set(clientHeader, "eval-"+strconv.Itoa(int(n.Add(1)%4)))
	})
}

// BenchmarkServeHTTPSDKRetryCount is BenchmarkServeHTTP with the header
// every OpenAI and Anthropic SDK request carries, X-Stainless-Retry-Count:
// what keeping a call for a retry to join costs a request with the
// journal off.
func BenchmarkServeHTTPSDKRetryCount(b *testing.B) {
	benchServe(b, func(c *benchClient) { c.req.Header.Set(retryCountHeader, "0") })
}

// benchServe runs BenchmarkServeHTTP with each goroutine's client made
// ready by prepare (nil: as it is).
func benchServe(b *testing.B, prepare func(*benchClient)) {
	u, _ := url.Parse("http://upstream.test")
	p, err := New(Config{Upstream: u, Transport: cannedTransport{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := newBenchClient()
		if prepare != nil {
			prepare(c)
		}
		for pb.Next() {
			if status := c.send(p); status != 200 {
				b.Fatalf("status %d", status)
			}
		}
	})
}

// BenchmarkServeHTTPLeastProxy is the floor under BenchmarkServeHTTP: the
// same harness and answers around a handler that only reads the body,
// makes the upstream request, copies the answer's headers and body back.
func BenchmarkServeHTTPLeastProxy(b *testing.B) {
	rt := cannedTransport{}
	least := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		out, _ := http.NewRequestWithContext(r.Context(), r.Method, "http://upstream.test"+r.URL.Path, bytes.NewReader(body))
		out.Header = r.Header.Clone()
		resp, err := rt.RoundTrip(out)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := newBenchClient()
		for pb.Next() {
			if status := c.send(least); status != 200 {
				b.Fatalf("status %d", status)
			}
		}
	})
}

// maxAllocsPerRequest is the most allocations BenchmarkServeHTTP may
// make per request, its harness's included, and maxSDKAllocsPerRequest
// the most BenchmarkServeHTTPSDKRetryCount may: an SDK's request is kept
// for a retry to join (its tape), journal off (see
// TestServeHTTPAllocatesAtMostMaxAllocsPerRequest).
const (
	maxAllocsPerRequest    = 48
	maxSDKAllocsPerRequest = 62
)

// TestServeHTTPAllocatesAtMostMaxAllocsPerRequest holds the hot path to
// its allocations: a chat through the whole handler, as
// BenchmarkServeHTTP sends it, makes at most maxAllocsPerRequest; with an
// SDK's X-Stainless-Retry-Count, at most maxSDKAllocsPerRequest. CI runs
// it without the race detector, which allocates on its own.
func TestServeHTTPAllocatesAtMostMaxAllocsPerRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; CI runs this test without it")
	}
	t.Run("plain", func(t *testing.T) { allocsPerRequest(t, nil, maxAllocsPerRequest) })
	t.Run("sdk", func(t *testing.T) {
		allocsPerRequest(t, func(c *benchClient) { c.req.Header.Set(retryCountHeader, "0") }, maxSDKAllocsPerRequest)
	})
}

// allocsPerRequest fails t when a request of a client made ready by
// prepare (nil: as it is) makes more than most allocations.
func allocsPerRequest(t *testing.T, prepare func(*benchClient), most int) {
	u, _ := url.Parse("http://upstream.test")
	p, err := New(Config{Upstream: u, Transport: cannedTransport{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c := newBenchClient()
	if prepare != nil {
		prepare(c)
	}
	c.send(p) // the lane, the pools
	const runs = 500
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		if status := c.send(p); status != 200 {
			t.Fatalf("status %d", status)
		}
	}
	runtime.ReadMemStats(&after)
	perRequest := float64((after.Mallocs - before.Mallocs) / runs) // whole ones, as testing.AllocsPerRun counts
	t.Logf("%.2f allocations per request (at most %d)", perRequest, most)
	if perRequest > float64(most) {
		t.Errorf("%.2f allocations per request, over the most of %d: see go test -bench BenchmarkServeHTTP -memprofile", perRequest, most)
	}
}
