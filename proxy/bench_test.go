package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

const benchAnswer = `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"tok 1 tok 2 tok 3"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15}}`

// cannedTransport answers every attempt at once, so the benchmark measures
// the proxy's own work per request, not a network.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(*http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("X-Ratelimit-Limit-Requests", "10000")
	h.Set("X-Ratelimit-Remaining-Requests", "9999")
	h.Set("X-Ratelimit-Reset-Requests", "6ms")
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader(benchAnswer)), ContentLength: int64(len(benchAnswer))}, nil
}

// BenchmarkServeHTTP: one unlimited lane, a chat request in, a JSON answer
// out, through the whole handler (routing, lane key, queue, attempt,
// header learning, usage metering, logging to a discarded handler).
func BenchmarkServeHTTP(b *testing.B) {
	u, _ := url.Parse("http://upstream.test")
	p, err := New(Config{Upstream: u, Transport: cannedTransport{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"model":"gpt-test","messages":[{"role":"user","content":"Say hello in three words."}],"max_tokens":16}`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("POST", "/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-bench")
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			p.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d", w.Code)
			}
		}
	})
}
