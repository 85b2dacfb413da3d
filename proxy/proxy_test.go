package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmproxy/llmproxy/backoff"
	"github.com/llmproxy/llmproxy/internal/setting"
	"github.com/llmproxy/llmproxy/lanequeue"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "sk-test-abcdefghijklmnop"

// testClient is the tests' HTTP client: a request the proxy never answers
// fails its test in seconds, not at the test binary's timeout.
var testClient = &http.Client{Timeout: 20 * time.Second}

// harness is a proxy in front of an httptest upstream whose handler the
// test chooses.
type harness struct {
	t        *testing.T
	upstream *httptest.Server
	proxy    *Proxy
	front    *httptest.Server
	logs     *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarness(t *testing.T, up http.Handler, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, logs: &syncBuffer{}}
	h.upstream = httptest.NewServer(up)
	u, _ := url.Parse(h.upstream.URL)
	cfg := Config{
		Upstream:   u,
		MaxRetries: 5,
		MaxWait:    10 * time.Second,
		Backoff:    backoff.Policy{Base: time.Millisecond, Max: 5 * time.Millisecond},
		Logger:     slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Lanes:      lanequeue.TableConfig{Lane: lanequeue.Config{Concurrency: 4, MaxConcurrency: 4}},
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.proxy = p
	h.front = httptest.NewServer(p)
	t.Cleanup(func() {
		h.front.Close()
		h.upstream.Close()
		if tr, ok := cfg.Transport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
		if tr, ok := p.cfg.Transport.(interface{ CloseIdleConnections() }); ok {
			tr.CloseIdleConnections()
		}
	})
	return h
}

func (h *harness) post(path, body string, hdr ...string) *http.Response {
	h.t.Helper()
	req, _ := http.NewRequest("POST", h.front.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type proxyErr struct {
	Error struct {
		Message, Type, Code string
	}
}

func decodeErr(t *testing.T, resp *http.Response) proxyErr {
	t.Helper()
	var e proxyErr
	body := readAll(t, resp.Body)
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	if !strings.HasPrefix(e.Error.Message, "llmproxy: ") {
		t.Fatalf("message %q does not start with llmproxy:", e.Error.Message)
	}
	return e
}

func TestForwardsToConfiguredUpstream(t *testing.T) {
	var got *http.Request
	var gotBody string
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		gotBody = readAll(t, r.Body)
		w.Header().Set("X-Upstream", "yes")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}), nil)
	resp := h.post("/v1/chat/completions?x=1", `{"model":"gpt-test","messages":[]}`,
		"Connection", "X-Hop", "X-Hop", "secret", "Keep-Alive", "timeout=5")
	if resp.StatusCode != 200 || readAll(t, resp.Body) != `{"ok":true}` {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got.URL.Path != "/v1/chat/completions" || got.URL.RawQuery != "x=1" || gotBody != `{"model":"gpt-test","messages":[]}` {
		t.Fatalf("upstream saw %s %q body %q", got.URL.Path, got.URL.RawQuery, gotBody)
	}
	if got.Header.Get("Authorization") != "Bearer "+testKey {
		t.Fatal("credential not forwarded")
	}
	for _, hop := range []string{"X-Hop", "Keep-Alive"} {
		if got.Header.Get(hop) != "" {
			t.Fatalf("hop-by-hop header %s forwarded", hop)
		}
	}
	if resp.Header.Get("X-Upstream") != "yes" {
		t.Fatal("upstream header not passed back")
	}
	lane := resp.Header.Get("X-Llmproxy-Lane")
	if len(lane) != 12 || resp.Header.Get("X-Llmproxy-Queue-Ms") == "" || resp.Header.Get("X-Llmproxy-Retries") != "0" {
		t.Fatalf("x-llmproxy headers: %v", resp.Header)
	}
	want := lanequeue.Key{CredentialHash: lanequeue.HashCredential(testKey), Path: "/v1/chat/completions", Model: "gpt-test"}.ID()
	if lane != want {
		t.Fatalf("lane %s, want %s (key+path+model)", lane, want)
	}
}

func TestNamedRouteStripsPrefix(t *testing.T) {
	var defaultHits atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { defaultHits.Add(1) }), func(c *Config) {})
	var routePath string
	anth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		routePath = r.URL.Path
		fmt.Fprint(w, "anthropic")
	}))
	defer anth.Close()
	au, _ := url.Parse(anth.URL + "/base")
	uu, _ := url.Parse(h.upstream.URL)
	p, err := New(Config{Upstream: uu, Routes: []Route{{Name: "anthropic", URL: au}}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()
	resp, err := http.Post(front.URL+"/anthropic/v1/messages", "application/json", strings.NewReader(`{"model":"claude"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b := readAll(t, resp.Body); b != "anthropic" || routePath != "/base/v1/messages" {
		t.Fatalf("route got path %q body %q", routePath, b)
	}
	if defaultHits.Load() != 0 {
		t.Fatal("default upstream was called")
	}
}

func TestRequestCannotChooseTheHost(t *testing.T) {
	var paths []string
	var mu sync.Mutex
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
	}), nil)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("request reached another host: %s", r.URL)
	}))
	defer evil.Close()
	evilHost := strings.TrimPrefix(evil.URL, "http://")

	raw := func(reqLine string, extra string) string {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.front.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "%s\r\nHost: %s\r\n%sContent-Length: 0\r\nConnection: close\r\n\r\n", reqLine, evilHost, extra)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return fmt.Sprint(resp.StatusCode)
	}
	if s := raw("POST "+evil.URL+"/v1/chat/completions HTTP/1.1", ""); s != "400" {
		t.Fatalf("absolute-form: status %s, want 400", s)
	}
	if s := raw("CONNECT "+evilHost+" HTTP/1.1", ""); s != "405" && s != "400" {
		t.Fatalf("CONNECT: status %s, want 405", s)
	}
	if s := raw("POST /../../v1/x HTTP/1.1", "X-Forwarded-Host: "+evilHost+"\r\n"); s != "200" {
		t.Fatalf("dot segments: status %s", s)
	}
	if s := raw("POST //"+evilHost+"/v1/y HTTP/1.1", ""); s != "200" {
		t.Fatalf("double slash: status %s", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 2 || paths[0] != "/v1/x" {
		t.Fatalf("upstream paths %q", paths)
	}
}

func TestAbsorbs429AndRetriesWithTheSameBody(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readAll(t, r.Body)
		if body != `{"model":"m","n":1}` {
			t.Errorf("attempt %d body %q", calls.Load(), body)
		}
		if calls.Add(1) <= 2 {
			w.Header().Set("Retry-After-Ms", "20")
			w.WriteHeader(429)
			fmt.Fprint(w, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
			return
		}
		fmt.Fprint(w, "ok")
	}), nil)
	start := time.Now()
	resp := h.post("/v1/chat/completions", `{"model":"m","n":1}`)
	if resp.StatusCode != 200 || readAll(t, resp.Body) != "ok" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if resp.Header.Get("X-Llmproxy-Retries") != "2" || calls.Load() != 3 {
		t.Fatalf("retries header %q, calls %d", resp.Header.Get("X-Llmproxy-Retries"), calls.Load())
	}
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Fatalf("answered after %v: the retry-after-ms hint of 20ms twice was not honoured", el)
	}
}

func TestHardQuota429ReturnsAtOnceWithoutRetry(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	if resp.StatusCode != 429 || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d, x-should-retry %q", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
	}
	if !strings.Contains(readAll(t, resp.Body), "insufficient_quota") || calls.Load() != 1 {
		t.Fatalf("calls %d", calls.Load())
	}
}

func TestLongRetryAfterIsPassedBack(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`)
	}), func(c *Config) { c.MaxRetryAfter = time.Minute })
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	if resp.StatusCode != 429 || resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") != "3600" || calls.Load() != 1 {
		t.Fatalf("status %d headers %v calls %d", resp.StatusCode, resp.Header, calls.Load())
	}
}

func TestRetriesExhaustedReturnsUpstreamsLastAnswer(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.WriteHeader(503)
		fmt.Fprintf(w, `{"error":{"message":"overloaded %d","type":"server_error","code":"server_is_overloaded"}}`, n)
	}), func(c *Config) { c.MaxRetries = 2 })
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	body := readAll(t, resp.Body)
	if resp.StatusCode != 503 || resp.Header.Get("X-Should-Retry") != "false" || !strings.Contains(body, "overloaded 3") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if calls.Load() != 3 || resp.Header.Get("X-Llmproxy-Retries") != "2" {
		t.Fatalf("calls %d", calls.Load())
	}
}

// Zero retries means none, in Config as in LLMPROXY_MAX_RETRIES: one
// call, and the upstream's failure goes to the client.
func TestZeroRetriesMeansNone(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(503)
	}), func(c *Config) { c.MaxRetries = 0 })
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	if resp.StatusCode != 503 || calls.Load() != 1 {
		t.Fatalf("status %d after %d calls, want 503 after 1", resp.StatusCode, calls.Load())
	}
	if _, err := New(Config{MaxRetries: -1}); err == nil || !strings.Contains(err.Error(), "MaxRetries") {
		t.Fatalf("New with MaxRetries -1: %v, want an error naming MaxRetries", err)
	}
}

func TestUnreachableUpstreamIs502(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	u, _ := url.Parse(dead)
	h := newHarness(t, http.NotFoundHandler(), func(c *Config) { c.Upstream = u; c.MaxRetries = 10 })
	resp := h.post("/v1/chat/completions?api_key=sk-in-query-123", `{"model":"m"}`)
	if resp.StatusCode != 502 || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	e := decodeErr(t, resp)
	if e.Error.Code != "upstream_unreachable" || strings.Contains(e.Error.Message, "sk-in-query") {
		t.Fatalf("error %+v", e)
	}
	if got := resp.Header.Get("X-Llmproxy-Retries"); got != "2" {
		t.Fatalf("retries = %s, want 2: a refused connection is retried briefly, not MaxRetries times", got)
	}
}

func TestBodyLimit(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }),
		func(c *Config) { c.MaxBodyBytes = 100 })
	big := strings.Repeat("x", 101)
	resp := h.post("/v1/embeddings", big)
	if resp.StatusCode != 413 || decodeErr(t, resp).Error.Code != "request_too_large" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Chunked, so the size is only known while reading.
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/embeddings", io.MultiReader(strings.NewReader(big), strings.NewReader(big)))
	req.ContentLength = -1
	resp2, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	if resp2.StatusCode != 413 || calls.Load() != 0 {
		t.Fatalf("chunked: status %d, upstream calls %d", resp2.StatusCode, calls.Load())
	}
	if ok := h.post("/v1/embeddings", strings.Repeat("y", 100)); ok.StatusCode != 200 {
		t.Fatalf("body at the limit: status %d", ok.StatusCode)
	}
}

func TestStreamReachesClientBeforeUpstreamFinishes(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}), nil)
	defer close(release)
	if line := firstLineWithin(t, h, "/v1/chat/completions", `{"model":"m","stream":true}`); line != "data: {\"n\":1}\n" {
		t.Fatalf("first line %q", line)
	}
}

func TestCredentialNeverLogged(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"x"}}`)
	}), nil)
	h.post("/v1/chat/completions?key="+testKey, `{"model":"m"}`)
	h.post("/v1/messages", `{"model":"m"}`, "Authorization", "", "X-Api-Key", testKey)
	logs := h.logs.String()
	if !strings.Contains(logs, "msg=request") {
		t.Fatalf("no request log line: %q", logs)
	}
	if strings.Contains(logs, testKey) || strings.Contains(logs, "sk-test") {
		t.Fatalf("credential in logs: %s", logs)
	}
}

func TestStainlessTimeoutShortensTheDeadline(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"type":"requests","code":"rate_limit_exceeded","message":"x"}}`)
	}), nil)
	start := time.Now()
	resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Stainless-Timeout", "1")
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("took %v with a 1s client timeout", el)
	}
	if resp.StatusCode != 429 || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestAdminEndpoints(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), nil)
	h.post("/v1/chat/completions", `{"model":"m"}`)
	admin := httptest.NewServer(h.proxy.AdminHandler(Health{}))
	defer admin.Close()
	get := func(p string) (int, string) {
		resp, err := http.Get(admin.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, readAll(t, resp.Body)
	}
	if c, _ := get("/healthz"); c != 200 {
		t.Fatalf("healthz %d", c)
	}
	if c, _ := get("/readyz"); c != 200 {
		t.Fatalf("readyz %d", c)
	}
	c, m := get("/metrics")
	for _, name := range []string{"llmproxy_requests_total", "llmproxy_upstream_attempts_total", "llmproxy_lane_queue_depth",
		"llmproxy_lane_in_flight", "llmproxy_lane_concurrency_limit", "llmproxy_queue_wait_seconds", "llmproxy_upstream_latency_seconds"} {
		if !strings.Contains(m, name) {
			t.Fatalf("metrics (%d) lack %s", c, name)
		}
	}
	_, lanes := get("/lanes")
	if !strings.Contains(lanes, `"key_hash"`) || strings.Contains(lanes, testKey) {
		t.Fatalf("lanes: %s", lanes)
	}
}

func laneIdle(t *testing.T, p *Proxy) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		busy := false
		for _, s := range p.States() {
			if s.InFlight != 0 || s.Queued != 0 {
				busy = true
			}
		}
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lanes still busy: %+v", p.States())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestSlotReleasedWhenUpstreamBreaksMidStream(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the upstream drops the connection mid-answer
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the client saw a clean end of a broken stream")
	}
	laneIdle(t, h.proxy)
}

type panicTransport struct{}

func (panicTransport) RoundTrip(*http.Request) (*http.Response, error) { panic("transport bug") }

func TestPanicGivesJSON500AndReleasesTheSlot(t *testing.T) {
	h := newHarness(t, http.NotFoundHandler(), func(c *Config) { c.Transport = panicTransport{} })
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	if resp.StatusCode != 500 || decodeErr(t, resp).Error.Code != "internal_error" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	laneIdle(t, h.proxy)
	if !strings.Contains(h.logs.String(), "transport bug") {
		t.Fatal("panic not logged")
	}
	// The proxy still serves after the panic.
	if resp := h.post("/v1/chat/completions", `{"model":"m"}`); resp.StatusCode != 500 {
		t.Fatalf("second request: status %d", resp.StatusCode)
	}
}

func TestStalledAnswerIsCutAfterMaxWait(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never sends another byte
	}), func(c *Config) { c.MaxWait = 300 * time.Millisecond })
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
	// The proxy must cut it, not the test client's own timeout: wait a
	// fixed 5 s (16 times the bound), then fail.
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		read <- err
	}()
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("a stalled stream ended cleanly")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a stream silent past the 300 ms idle bound was not cut within 5 s")
	}
	laneIdle(t, h.proxy)
}

type panickyBody struct{ n int }

func (b *panickyBody) Read(p []byte) (int, error) {
	if b.n++; b.n == 1 {
		return copy(p, "data: {\"n\":1}\n\n"), nil
	}
	panic("body bug")
}

func (b *panickyBody) Close() error { return nil }

func TestPanicAfterHeadersAbortsInsteadOfAppendingJSON(t *testing.T) {
	rt := rtFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: &panickyBody{}, ContentLength: -1}, nil
	})
	h := newHarness(t, http.NotFoundHandler(), func(c *Config) { c.Transport = rt })
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
	body, err := io.ReadAll(resp.Body)
	if err == nil || strings.Contains(string(body), "internal_error") {
		t.Fatalf("body %q, err %v: want a broken stream without a JSON error in it", body, err)
	}
	laneIdle(t, h.proxy)
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestRouteNamesMustBePlainSegments(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	for _, name := range []string{"a*", "{x}", "a/b", "", "..", "x y"} {
		if _, err := New(Config{Routes: []Route{{Name: name, URL: u}}}); err == nil {
			t.Errorf("route name %q accepted", name)
		}
	}
	if _, err := New(Config{Routes: []Route{{Name: "my-route_2.v1", URL: u}}}); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesAnUpstreamItCannotUse: a default upstream or a route URL
// that is not http(s), has no host, carries credentials or a query is
// refused by New (Config.Validate), naming which.
func TestNewRefusesAnUpstreamItCannotUse(t *testing.T) {
	good, _ := url.Parse("http://127.0.0.1:1")
	for _, raw := range []string{"ftp://example.com", "http://", "http://u:p@example.com", "https://example.com/?key=1"} {
		bad, _ := url.Parse(raw)
		var se *setting.Error
		if _, err := New(Config{Upstream: bad}); !errors.As(err, &se) || se.Field != "Upstream" {
			t.Errorf("upstream %q: New said %v, want an error on Upstream", raw, err)
		}
		_, err := New(Config{Upstream: good, Routes: []Route{{Name: "r", URL: bad}}})
		if !errors.As(err, &se) || se.Field != "Routes" || !strings.Contains(se.Problem, `route "r"`) {
			t.Errorf("route URL %q: New said %v, want an error on Routes naming the route", raw, err)
		}
	}
}

func TestRateLimitHeadersHiddenFromClientsUnlessPassed(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
		w.Header().Set("Anthropic-Ratelimit-Tokens-Remaining", "0")
		w.Header().Set("Retry-After", "3")
		w.Header().Set("X-Request-Id", "req_1")
	})
	strip := newHarness(t, up, nil)
	resp := strip.post("/v1/chat/completions", `{"model":"m"}`)
	for _, k := range []string{"X-Ratelimit-Remaining-Requests", "Anthropic-Ratelimit-Tokens-Remaining", "Retry-After"} {
		if resp.Header.Get(k) != "" {
			t.Errorf("strip: %s reached the client", k)
		}
	}
	if resp.Header.Get("X-Request-Id") != "req_1" {
		t.Error("strip: other headers lost")
	}
	pass := newHarness(t, up, func(c *Config) { c.PassRateLimitHeaders = true })
	resp = pass.post("/v1/chat/completions", `{"model":"m"}`)
	if resp.Header.Get("X-Ratelimit-Remaining-Requests") != "0" || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("pass: headers %v", resp.Header)
	}
}

func TestShouldRetryLeftAloneOnStatusesTheProxyDoesNotRetry(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(401)
		fmt.Fprint(w, `{"type":"error","error":{"type":"authentication_error","message":"bad key"}}`)
	}), nil)
	resp := h.post("/v1/messages", `{"model":"m"}`)
	if resp.StatusCode != 401 || resp.Header.Get("X-Should-Retry") != "" {
		t.Fatalf("status %d, x-should-retry %q: a 401 is the SDK's to judge", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
	}
}

// TestRequestIDGoesToClientUpstreamAndLog: every answer carries
// x-llmproxy-request-id; the upstream gets the same id; the request's log
// line holds it beside the upstream's own x-request-id.
func TestRequestIDGoesToClientUpstreamAndLog(t *testing.T) {
	var sentUp string
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sentUp = r.Header.Get("X-Llmproxy-Request-Id")
		w.Header().Set("X-Request-Id", "req_upstream_42")
		fmt.Fprint(w, `{}`)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	resp.Body.Close()
	id := resp.Header.Get("X-Llmproxy-Request-Id")
	if len(id) != 16 || id != sentUp {
		t.Fatalf("client got id %q, upstream got %q", id, sentUp)
	}
	if again := h.post("/v1/chat/completions", `{"model":"m"}`); again.Header.Get("X-Llmproxy-Request-Id") == id {
		t.Fatal("two requests share an id")
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "request_id="+id) || !strings.Contains(logs, "upstream_request_id=req_upstream_42") {
		t.Fatalf("log lacks the ids:\n%s", logs)
	}
}

// TestUnderWayCountsQueuedAndInFlight: UnderWay is what a drain waits for,
// the requests at the upstream and those queued behind them, over every
// lane; none once they are answered.
func TestUnderWayCountsQueuedAndInFlight(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 8)
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}), func(c *Config) {
		c.Lanes.Lane = lanequeue.Config{Concurrency: 1, MinConcurrency: 1, MaxConcurrency: 1}
	})
	if n := h.proxy.UnderWay(); n != 0 {
		t.Fatalf("under way before any request: %d", n)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { // not h.post: it may not fail the test from here
			defer wg.Done()
			req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
			req.Header.Set("Authorization", "Bearer "+testKey)
			if resp, err := testClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	<-arrived
	deadline := time.Now().Add(5 * time.Second)
	for h.proxy.UnderWay() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("under way %d with one request at the upstream and two queued, want 3", h.proxy.UnderWay())
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	deadline = time.Now().Add(5 * time.Second)
	for h.proxy.UnderWay() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("under way %d after every answer, want 0", h.proxy.UnderWay())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
