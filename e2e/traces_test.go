package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/internal/otlptest"
	"github.com/llmproxy/llmproxy/internal/tracing"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/proxy"
)

// The client's trace: its trace id, and its span the proxy's continues.
const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// seenUpstream records the traceparent of every request the upstream
// gets, by the credential it came with.
type seenUpstream struct {
	mu  sync.Mutex
	tps map[string][]string
}

func (s *seenUpstream) note(h http.Header) {
	key := h.Get("X-Api-Key")
	if key == "" {
		key = strings.TrimPrefix(h.Get("Authorization"), "Bearer ")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tps == nil {
		s.tps = map[string][]string{}
	}
	s.tps[key] = append(s.tps[key], h.Get("Traceparent"))
}

func (s *seenUpstream) of(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tps[key]...)
}

// noting is a RoundTripper that notes each request's traceparent.
type noting struct {
	base http.RoundTripper
	seen *seenUpstream
}

func (n noting) RoundTrip(r *http.Request) (*http.Response, error) {
	n.seen.note(r.Header)
	return n.base.RoundTrip(r)
}

// tracedRequest is what a trace of one request must show.
type tracedRequest struct {
	key           string   // its credential, in no span
	lane          string   // x-llmproxy-lane of its answer
	server        string   // the server span's name
	attempt       string   // the attempt spans' name
	model         string   // gen_ai.request.model
	provider      string   // gen_ai.provider.name; "" = none
	statuses      []string // each attempt's status
	verdicts      []string // and verdict
	input, output int64    // the answer's usage
	upstream      []string // the traceparents the upstream got
}

// checkTrace finds want's trace among spans (the one whose server span
// has its lane) and checks it: under the client's trace, the server span
// with its lane wait, its attempts and a retry wait for each retry as
// children, their names and attributes, each attempt's traceparent the
// one the upstream got; and that no export holds the key or its hash.
func checkTrace(t *testing.T, rcv *otlptest.Receiver, want tracedRequest) {
	t.Helper()
	spans := rcv.Spans()
	var server *otlptest.Span
	for i, s := range spans {
		if s.Name == want.server && s.Attrs["llmproxy.lane"] == want.lane {
			server = &spans[i]
		}
	}
	if server == nil {
		t.Fatalf("no server span %q of lane %s among %d spans", want.server, want.lane, len(spans))
	}
	if server.TraceID != clientTraceID || server.ParentID != clientSpanID || server.Kind.String() != "SPAN_KIND_SERVER" {
		t.Errorf("server span in trace %s under %s (%v), want the client's %s under %s", server.TraceID, server.ParentID, server.Kind, clientTraceID, clientSpanID)
	}
	wantAttrs := func(s otlptest.Span, kv map[string]string) {
		t.Helper()
		for k, v := range kv {
			if s.Attrs[k] != v {
				t.Errorf("span %q: %s = %q, want %q", s.Name, k, s.Attrs[k], v)
			}
		}
		if _, has := s.Attrs["gen_ai.provider.name"]; want.provider == "" && has {
			t.Errorf("span %q names a provider the route does not tell: %q", s.Name, s.Attrs["gen_ai.provider.name"])
		}
	}
	retries := fmt.Sprint(len(want.statuses) - 1)
	usage := map[string]string{"gen_ai.usage.input_tokens": fmt.Sprint(want.input), "gen_ai.usage.output_tokens": fmt.Sprint(want.output)}
	serverWant := map[string]string{"http.request.method": "POST", "http.response.status_code": "200", "llmproxy.outcome": "ok",
		"llmproxy.retries": retries, "llmproxy.priority": "high", "gen_ai.request.model": want.model, "gen_ai.operation.name": "chat"}
	if want.provider != "" {
		serverWant["gen_ai.provider.name"] = want.provider
	}
	for k, v := range usage {
		serverWant[k] = v
	}
	wantAttrs(*server, serverWant)
	if server.Resource["service.name"] == "" || server.Scope != "github.com/llmproxy/llmproxy" {
		t.Errorf("resource %v, scope %q", server.Resource, server.Scope)
	}

	var waits, retryWaits, attempts []otlptest.Span
	for _, s := range spans {
		if s.TraceID != server.TraceID || s.ParentID != server.SpanID {
			continue
		}
		switch s.Name {
		case "lane wait":
			waits = append(waits, s)
		case "retry wait":
			retryWaits = append(retryWaits, s)
		case want.attempt:
			attempts = append(attempts, s)
		default:
			t.Errorf("unexpected child span %q", s.Name)
		}
	}
	if len(waits) != 1 || len(attempts) != len(want.statuses) || len(retryWaits) != len(want.statuses)-1 {
		t.Fatalf("children: %d lane waits, %d attempts named %q, %d retry waits; want 1, %d, %d",
			len(waits), len(attempts), want.attempt, len(retryWaits), len(want.statuses), len(want.statuses)-1)
	}
	wantAttrs(waits[0], map[string]string{"llmproxy.lane": want.lane, "llmproxy.priority": "high", "llmproxy.wait.ahead": "0", "llmproxy.wait.retry": "false"})
	for _, w := range retryWaits {
		if r := w.Attrs["llmproxy.wait.reasons"]; !strings.HasPrefix(r, `["pause"`) {
			t.Errorf("the retry after a 429 waited for %s, want the pause first", r)
		}
	}
	sortByAttempt(attempts)
	if len(want.upstream) != len(attempts) {
		t.Errorf("the upstream got %d requests (traceparents %q), want %d", len(want.upstream), want.upstream, len(attempts))
	}
	for i, a := range attempts {
		kv := map[string]string{"llmproxy.attempt": fmt.Sprint(i + 1), "http.response.status_code": want.statuses[i],
			"llmproxy.verdict": want.verdicts[i], "gen_ai.request.model": want.model}
		if a.Kind.String() != "SPAN_KIND_CLIENT" {
			t.Errorf("attempt %d is a %v span", i+1, a.Kind)
		}
		if i < len(attempts)-1 {
			kv["llmproxy.action"] = "retry"
		} else {
			kv["llmproxy.action"] = "pass"
			for k, v := range usage {
				kv[k] = v
			}
		}
		wantAttrs(a, kv)
		if tp := "00-" + a.TraceID + "-" + a.SpanID + "-01"; i < len(want.upstream) && want.upstream[i] != tp {
			t.Errorf("the upstream got traceparent %q for attempt %d, want its span's %q", want.upstream[i], i+1, tp)
		}
	}
	hash := lanequeue.HashCredential(want.key)
	for _, secret := range []string{want.key, hash, hash[:32]} {
		if rcv.Contains(secret) {
			t.Errorf("an export holds %q, the key or its hash", secret)
		}
	}
}

// sortByAttempt orders attempt spans by their llmproxy.attempt.
func sortByAttempt(spans []otlptest.Span) {
	for i := 1; i < len(spans); i++ {
		for j := i; j > 0 && spans[j].Attrs["llmproxy.attempt"] < spans[j-1].Attrs["llmproxy.attempt"]; j-- {
			spans[j], spans[j-1] = spans[j-1], spans[j]
		}
	}
}

// traceEnv is the OTEL_* environment of a proxy exporting to rcv, set in
// the process too, where the SDK reads it: a batch delay of a minute, so
// that spans go only when the proxy shuts down.
func traceEnv(t *testing.T, rcv *otlptest.Receiver) map[string]string {
	env := map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.URL(),
		"OTEL_BSP_SCHEDULE_DELAY":     "60000",
		"OTEL_SERVICE_NAME":           "llmproxy-e2e",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	return env
}

// TestTracesInProcess: the proxy, in process, with the exporter Setup
// makes from the environment, in front of the mock upstream: an OpenAI
// SDK request refused once for the rate and then answered, and an
// Anthropic SDK one on the anthropic route, each under the client's
// traceparent, make their traces at a real OTLP receiver, flushed at
// shutdown.
func TestTracesInProcess(t *testing.T) {
	rcv := otlptest.Start(t)
	tracer, shutdown, err := tracing.Setup(context.Background(), traceEnv(t, rcv), "e2e", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || tracer == nil {
		t.Fatalf("tracing.Setup: %v, %v", tracer, err)
	}
	seen := &seenUpstream{}
	s := newStack(t, mockupstream.Config{}, func(c *proxy.Config) {
		c.Tracer = tracer
		c.Transport = noting{base: c.Transport, seen: seen}
	})
	s.mock.SetRetryAfter(50 * time.Millisecond)
	const oaKey, anKey = "sk-trace-openai-0123456789", "sk-ant-trace-0123456789"
	s.mock.InjectFailures(oaKey, 429)

	var oaResp *http.Response
	oa, an := s.openai(oaKey), s.anthropic(anKey)
	chat, err := oa.Chat.Completions.New(context.Background(), chatParams("gpt-test", "hello"),
		option.WithHeader("traceparent", clientParent), option.WithResponseInto(&oaResp))
	if err != nil {
		t.Fatal(err)
	}
	var anResp *http.Response
	msg, err := an.Messages.New(context.Background(), messageParams("hello"),
		aoption.WithHeader("traceparent", clientParent), aoption.WithResponseInto(&anResp))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	checkTrace(t, rcv, tracedRequest{key: oaKey, lane: oaResp.Header.Get("X-Llmproxy-Lane"), server: "POST /*", attempt: "chat gpt-test",
		model: "gpt-test", statuses: []string{"429", "200"}, verdicts: []string{"rate_refused", "accepted"},
		input: chat.Usage.PromptTokens, output: chat.Usage.CompletionTokens, upstream: seen.of(oaKey)})
	checkTrace(t, rcv, tracedRequest{key: anKey, lane: anResp.Header.Get("X-Llmproxy-Lane"), server: "POST /anthropic/*",
		attempt: "chat claude-test", model: "claude-test", provider: "anthropic", statuses: []string{"200"}, verdicts: []string{"accepted"},
		input: msg.Usage.InputTokens, output: msg.Usage.OutputTokens, upstream: seen.of(anKey)})
}

// TestTracesFromTheBinary: the real program, started with
// OTEL_EXPORTER_OTLP_ENDPOINT set, in front of the mock upstream: a
// request refused once and then answered makes its trace at the receiver
// when SIGTERM stops the program (the batch delay is a minute), the
// upstream having got each attempt's traceparent.
func TestTracesFromTheBinary(t *testing.T) {
	bin := llmproxyBinary(t)
	rcv := otlptest.Start(t)
	env := traceEnv(t, rcv)
	mock := startMockUpstream(t, mockupstream.Config{})
	mock.SetRetryAfter(50 * time.Millisecond)
	const key = "sk-trace-binary-0123456789"
	mock.InjectFailures(key, 429)
	seen := &seenUpstream{}
	mockURL, _ := url.Parse(mock.URL())
	rp := httputil.NewSingleHostReverseProxy(mockURL)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.note(r.Header)
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	var extra []string
	for k, v := range env {
		extra = append(extra, k+"="+v)
	}
	rep := startReplica(t, "llmproxy traced", bin, front.URL, extra...)

	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	client := openai.NewClient(option.WithBaseURL("http://"+rep.addr+"/v1"), option.WithAPIKey(key), option.WithHTTPClient(hc))
	var resp *http.Response
	chat, err := client.Chat.Completions.New(context.Background(), chatParams("gpt-test", "hello"),
		option.WithHeader("traceparent", clientParent), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	hc.CloseIdleConnections()
	if n := len(rcv.Spans()); n != 0 {
		t.Fatalf("%d spans exported before the stop, within the batch delay", n)
	}
	if clean, err := rep.stop(10 * time.Second); !clean || err != nil {
		t.Fatalf("llmproxy did not stop on SIGTERM: %v", err)
	}
	if strings.Contains(rep.stderr.String(), key) {
		t.Error("the program's log holds the key")
	}
	if !strings.Contains(rep.stderr.String(), "exporting traces over OTLP") {
		t.Errorf("no start-up line about traces:\n%s", rep.stderr.String())
	}
	checkTrace(t, rcv, tracedRequest{key: key, lane: resp.Header.Get("X-Llmproxy-Lane"), server: "POST /*", attempt: "chat gpt-test",
		model: "gpt-test", statuses: []string{"429", "200"}, verdicts: []string{"rate_refused", "accepted"},
		input: chat.Usage.PromptTokens, output: chat.Usage.CompletionTokens, upstream: seen.of(key)})
	if got := rcv.Spans()[0].Resource["service.name"]; got != "llmproxy-e2e" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", got)
	}
}
