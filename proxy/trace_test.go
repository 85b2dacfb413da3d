package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmproxy/llmproxy/backoff"
	"github.com/llmproxy/llmproxy/internal/tracing"
	"github.com/llmproxy/llmproxy/lanequeue"
)

// traced is a Config change that gives the proxy a Tracer whose spans
// rec keeps.
func traced(rec *tracetest.SpanRecorder) func(*Config) {
	return func(c *Config) {
		c.Tracer = tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	}
}

// spanAttrs is a span's attributes by key, in their string form.
func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// spansNamed are the ended spans named name.
func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// oneSpan is the one ended span named name.
func oneSpan(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	s := spansNamed(rec, name)
	if len(s) != 1 {
		t.Fatalf("%d spans named %q, want 1", len(s), name)
	}
	return s[0]
}

// checkAttrs fails the test unless s has each of want.
func checkAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	got := spanAttrs(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %q: %s = %q, want %q", s.Name(), k, got[k], v)
		}
	}
}

// traceparents records the traceparent of each request an upstream gets.
type traceparents struct {
	mu   sync.Mutex
	seen []string
}

func (tp *traceparents) note(r *http.Request) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.seen = append(tp.seen, r.Header.Get("Traceparent"))
}

func (tp *traceparents) all() []string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]string(nil), tp.seen...)
}

// TestTraceOfARequestRefusedThenAnswered: a request the upstream refuses
// for the rate once, then answers, makes one trace under the client's:
// the server span, its lane wait, both attempts (each the traceparent
// the upstream got) and the retry's wait for the pause, with the lane,
// the priority, the verdicts, the GenAI attributes of the route and the
// answer's usage; no span holds the key or its hash.
func TestTraceOfARequestRefusedThenAnswered(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	var tps traceparents
	var n int
	var mu sync.Mutex
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		tps.note(r)
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if first {
			w.Header().Set("Retry-After-Ms", "20")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
			return
		}
		w.Header().Set("Request-Id", "req_up_2")
		fmt.Fprint(w, `{"type":"message","usage":{"input_tokens":7,"output_tokens":3}}`)
	}), func(c *Config) {
		traced(rec)(c)
		c.Routes = []Route{{Name: "anthropic", URL: c.Upstream}}
	})
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	resp := h.post("/anthropic/v1/messages", `{"model":"claude-t","max_tokens":5,"messages":[]}`,
		"Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01", "X-Llmproxy-Priority", "low", "X-Llmproxy-Client", "eval-1")
	readAll(t, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	waitFor(t, func() bool { return len(spansNamed(rec, "POST /anthropic/*")) == 1 })

	server := oneSpan(t, rec, "POST /anthropic/*")
	if server.SpanContext().TraceID().String() != traceID {
		t.Errorf("trace %s, want the client's %s", server.SpanContext().TraceID(), traceID)
	}
	checkAttrs(t, server, map[string]string{"llmproxy.lane": resp.Header.Get("X-Llmproxy-Lane"), "llmproxy.priority": "low",
		"llmproxy.route": "anthropic", "llmproxy.request_id": resp.Header.Get("X-Llmproxy-Request-Id"),
		"llmproxy.outcome": "ok", "llmproxy.retries": "1", "http.response.status_code": "200", "llmproxy.client": "eval-1",
		"gen_ai.request.model": "claude-t", "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
		"gen_ai.usage.input_tokens": "7", "gen_ai.usage.output_tokens": "3"})
	wait := oneSpan(t, rec, "lane wait")
	checkAttrs(t, wait, map[string]string{"llmproxy.lane": resp.Header.Get("X-Llmproxy-Lane"), "llmproxy.priority": "low",
		"llmproxy.wait.ahead": "0", "llmproxy.client": "eval-1"})
	retryWait := oneSpan(t, rec, "retry wait")
	// The pause, and after it maybe the pace the group's slow start
	// spreads its requests by.
	checkAttrs(t, retryWait, map[string]string{"llmproxy.wait.backoff_ms": "0", "llmproxy.wait.retry": "true"})
	if r := spanAttrs(retryWait)["llmproxy.wait.reasons"]; r != `["pause"]` && r != `["pause","pace"]` {
		t.Errorf("the retry waited for %s, want the pause", r)
	}
	attempts := spansNamed(rec, "chat claude-t")
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attempts))
	}
	checkAttrs(t, attempts[0], map[string]string{"llmproxy.attempt": "1", "http.response.status_code": "429",
		"llmproxy.verdict": "rate_refused", "llmproxy.action": "retry", "llmproxy.retry.wait_ms": "21", "error.type": "429"}) // 20 asked, a grain late
	checkAttrs(t, attempts[1], map[string]string{"llmproxy.attempt": "2", "http.response.status_code": "200",
		"llmproxy.verdict": "accepted", "llmproxy.action": "pass", "llmproxy.upstream_request_id": "req_up_2",
		"gen_ai.usage.input_tokens": "7", "gen_ai.usage.output_tokens": "3", "gen_ai.provider.name": "anthropic"})
	for _, s := range append([]sdktrace.ReadOnlySpan{wait, retryWait}, attempts...) {
		if s.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("span %q is not the server span's child", s.Name())
		}
	}
	sent := tps.all()
	for i, s := range attempts {
		if want := fmt.Sprintf("00-%s-%s-01", traceID, s.SpanContext().SpanID()); i >= len(sent) || sent[i] != want {
			t.Errorf("the upstream got traceparents %q; attempt %d's should be %q", sent, i+1, want)
		}
	}
	noSecretIn(t, rec)
}

// noSecretIn fails the test if any span's attribute holds the test's
// key or its hash.
func noSecretIn(t *testing.T, rec *tracetest.SpanRecorder) {
	t.Helper()
	hash := lanequeue.HashCredential(testKey)
	for _, s := range rec.Ended() {
		for k, v := range spanAttrs(s) {
			if strings.Contains(v, testKey) || strings.Contains(v, hash) || strings.Contains(v, hash[:16]) {
				t.Errorf("span %q: %s = %q holds the key or its hash", s.Name(), k, v)
			}
		}
	}
}

// TestTraceparentPassesUntouchedWithoutATracer: with no Tracer the
// client's traceparent and tracestate reach the upstream as they came.
func TestTraceparentPassesUntouchedWithoutATracer(t *testing.T) {
	var tps traceparents
	var state string
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		tps.note(r)
		state = r.Header.Get("Tracestate")
		fmt.Fprint(w, `{}`)
	}), nil)
	const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp := h.post("/v1/chat/completions", `{"model":"m"}`, "Traceparent", incoming, "Tracestate", "vendor=x")
	readAll(t, resp.Body)
	if got := tps.all(); len(got) != 1 || got[0] != incoming || state != "vendor=x" {
		t.Fatalf("the upstream got traceparent %q, tracestate %q; want %q and vendor=x", got, state, incoming)
	}
}

// TestTraceOfWaitsThatEnd: a lane wait that ends without a slot names
// why in its span: the lane's queue full, the client gone; the request
// granted after them names the concurrency it waited for and the waiters
// ahead of it.
func TestTraceOfWaitsThatEnd(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	arrived := make(chan string, 8)
	h := newHarness(t, blockingUpstream(release, arrived), func(c *Config) {
		traced(rec)(c)
		c.Lanes.Lane = lanequeue.Config{Concurrency: 1, MaxConcurrency: 1, MaxQueue: 2}
	})
	statuses := make(chan int, 4)
	send := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := testClient.Do(req)
		if err != nil {
			statuses <- 0
			return
		}
		readAll(t, resp.Body)
		resp.Body.Close()
		statuses <- resp.StatusCode
	}
	lane := func() lanequeue.State { return h.proxy.States()[0] }
	go send(context.Background())
	<-arrived
	gone, leave := context.WithCancel(context.Background())
	go send(gone)
	waitFor(t, func() bool { return lane().Queued == 1 })
	go send(context.Background()) // granted once the first is answered
	waitFor(t, func() bool { return lane().Queued == 2 })
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the request past the queue got %d, want 429", resp.StatusCode)
	}
	leave()
	if s := <-statuses; s != 0 {
		t.Fatalf("the client that left got %d", s)
	}
	waitFor(t, func() bool { return lane().Queued == 1 })
	close(release)
	for range 2 {
		if s := <-statuses; s != 200 {
			t.Fatalf("status %d, want 200", s)
		}
	}
	waitFor(t, func() bool { return len(spansNamed(rec, "POST /*")) == 4 })
	failures := map[string]int{}
	for _, w := range spansNamed(rec, "lane wait") {
		a := spanAttrs(w)
		failures[a["error.type"]]++
		if a["error.type"] == "" && a["llmproxy.wait.reasons"] == `["concurrency"]` && a["llmproxy.wait.ahead"] != "1" {
			t.Errorf("the request behind the one that left waited with %s ahead, want 1", a["llmproxy.wait.ahead"])
		}
	}
	if want := map[string]int{"": 2, "queue_full": 1, "client_gone": 1}; fmt.Sprint(failures) != fmt.Sprint(want) {
		t.Errorf("lane waits by error.type %v, want %v", failures, want)
	}

	noSecretIn(t, rec)
}

// TestTraceOfAnUnreachableUpstream: attempts that make no connection name
// it; the proxy's 502 marks the request's span an error.
func TestTraceOfAnUnreachableUpstream(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	h := newHarness(t, http.NotFoundHandler(), func(c *Config) {
		traced(rec)(c)
		c.Backoff = backoff.Policy{Base: 20 * time.Millisecond, Max: time.Second}
		c.Rand = func() float64 { return 0 } // no jitter: 20 ms, then 40
	})
	h.upstream.Close() // nothing listens there any more
	resp := h.post("/v1/embeddings", `{"model":"e","input":"x"}`)
	readAll(t, resp.Body)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	waitFor(t, func() bool { return len(spansNamed(rec, "POST /*")) == 1 })
	attempts := spansNamed(rec, "embeddings e")
	if len(attempts) != maxUnreachableRetries+1 {
		t.Fatalf("%d attempt spans, want %d", len(attempts), maxUnreachableRetries+1)
	}
	for _, a := range attempts {
		checkAttrs(t, a, map[string]string{"error.type": "unreachable", "llmproxy.verdict": "not_sent"})
		if _, ok := spanAttrs(a)["http.response.status_code"]; ok {
			t.Error("an attempt without an answer has a status")
		}
	}
	checkAttrs(t, attempts[len(attempts)-1], map[string]string{"llmproxy.action": "give_up"})
	checkAttrs(t, oneSpan(t, rec, "POST /*"), map[string]string{"error.type": "502", "http.response.status_code": "502", "llmproxy.outcome": "proxy_error"})
	if len(spansNamed(rec, "retry wait")) != maxUnreachableRetries {
		t.Errorf("%d retry waits, want %d", len(spansNamed(rec, "retry wait")), maxUnreachableRetries)
	}
	for i, w := range spansNamed(rec, "retry wait") {
		want := fmt.Sprint(20 << i)
		checkAttrs(t, w, map[string]string{"llmproxy.wait.backoff_ms": want})
		checkAttrs(t, attempts[i], map[string]string{"llmproxy.action": "retry", "llmproxy.retry.wait_ms": want})
	}
}

// TestTraceOfAnUpstreamThatHangsUp: an upstream that takes the
// connection and closes it without an answer is a transport error, not
// an unreachable one, in every attempt's span.
func TestTraceOfAnUpstreamThatHangsUp(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}), func(c *Config) {
		traced(rec)(c)
		c.MaxRetries = 1
	})
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	waitFor(t, func() bool { return len(spansNamed(rec, "POST /*")) == 1 })
	attempts := spansNamed(rec, "chat m")
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attempts))
	}
	for _, a := range attempts {
		checkAttrs(t, a, map[string]string{"error.type": "transport_error", "llmproxy.verdict": "not_sent"})
	}
}

// BenchmarkServeHTTPTraced is BenchmarkServeHTTP with every request
// traced (sampled, batched, exported to nowhere): the cost of traces
// when they are on.
func BenchmarkServeHTTPTraced(b *testing.B) {
	u, _ := url.Parse("http://upstream.test")
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer tp.Shutdown(context.Background())
	p, err := New(Config{Upstream: u, Transport: cannedTransport{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tracer: tracing.New(tp)})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := newBenchClient()
		for pb.Next() {
			if status := c.send(p); status != 200 {
				b.Fatalf("status %d", status)
			}
		}
	})
}

// TestWaitFailureNamesWhatTheClientGot: a failed wait's code is
// client_gone when the client left, shutting_down once Stop was called
// (whatever the lane said), else the code of the error the client gets.
func TestWaitFailureNamesWhatTheClientGot(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	if got := p.waitFailure(r, lanequeue.ErrQueueFull); got != "queue_full" {
		t.Errorf("a full queue: %q, want queue_full", got)
	}
	if got := p.waitFailure(r, laneDeadline); got != "budget_exceeded" {
		t.Errorf("a deadline: %q, want budget_exceeded", got)
	}
	gone, leave := context.WithCancel(context.Background())
	leave()
	if got := p.waitFailure(r.WithContext(gone), lanequeue.ErrQueueFull); got != "client_gone" {
		t.Errorf("a client that left: %q, want client_gone", got)
	}
	p.Stop()
	if got := p.waitFailure(r, laneDeadline); got != "shutting_down" {
		t.Errorf("after Stop: %q, want shutting_down", got)
	}
}
