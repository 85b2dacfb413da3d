package tracing

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmproxy/llmproxy/internal/bound"
)

// recorded returns a Tracer whose spans rec keeps.
func recorded() (*Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))), rec
}

// attrs is a span's attributes by key, each as its value's string form.
func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// byName is the ended span named name; the test fails when there is not
// exactly one.
func byName(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		var names []string
		for _, s := range rec.Ended() {
			names = append(names, s.Name())
		}
		t.Fatalf("%d spans named %q among %q, want 1", len(found), name, names)
	}
	return found[0]
}

// wantAttrs fails the test unless s has each of want (key: value).
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %q: %s = %q, want %q (all: %v)", s.Name(), k, got[k], v, got)
		}
	}
}

// TestARequestsSpansMakeOneTree: the server span continues the incoming
// traceparent; the lane wait, both attempts and the retry wait are its
// children; the attempts' traceparents go upstream, each its own span's;
// every span has the attributes its stage knows.
func TestARequestsSpansMakeOneTree(t *testing.T) {
	tr, rec := recorded()
	const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := httptest.NewRequest("POST", "/anthropic/v1/messages?key=sk-query", nil)
	r.Header.Set("Traceparent", incoming)
	rq := tr.Start(r, "anthropic", "req-1")
	rq.Describe("claude-x", "chat", "anthropic", "eval-7")
	w := rq.StartWait(false, 0)
	w.End(Queued{Lane: "abc123", Priority: "high", Ahead: 2, Reasons: []string{"pace", "concurrency"}})
	var sent []string
	for i, status := range []int{429, 200} {
		out := httptest.NewRequest("POST", "https://api.anthropic.com/v1/messages?key=sk-query", nil)
		out.Header.Set("Traceparent", incoming)
		rq.StartAttempt(out)
		sent = append(sent, out.Header.Get("Traceparent"))
		if i == 0 {
			rq.Answered(status, "up-1", "", "rate_refused", "retry", 1500*time.Millisecond)
			rw := rq.StartWait(true, 0)
			rw.End(Queued{Lane: "abc123", Priority: "high", Reasons: []string{"pause"}})
			continue
		}
		rq.Answered(status, "up-2", "", "accepted", "pass", 0)
		rq.Usage(12, 34)
	}
	rq.End(200, "ok", 1, "")

	server := byName(t, rec, "POST /anthropic/*")
	if got := server.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("trace id %s, want the incoming traceparent's", got)
	}
	if server.Parent().SpanID().String() != "00f067aa0ba902b7" || !server.Parent().IsRemote() || server.SpanKind() != trace.SpanKindServer {
		t.Errorf("server span's parent %v (kind %v), want the incoming span, remote", server.Parent(), server.SpanKind())
	}
	wantAttrs(t, server, map[string]string{"http.request.method": "POST", "url.path": "/anthropic/v1/messages", "http.route": "/anthropic/*",
		"llmproxy.route": "anthropic", "llmproxy.request_id": "req-1", "llmproxy.lane": "abc123", "llmproxy.priority": "high", "llmproxy.client": "eval-7",
		"gen_ai.request.model": "claude-x", "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
		"gen_ai.usage.input_tokens": "12", "gen_ai.usage.output_tokens": "34",
		"http.response.status_code": "200", "llmproxy.outcome": "ok", "llmproxy.retries": "1"})

	wait := byName(t, rec, "lane wait")
	wantAttrs(t, wait, map[string]string{"llmproxy.lane": "abc123", "llmproxy.priority": "high", "llmproxy.wait.ahead": "2", "llmproxy.client": "eval-7",
		"llmproxy.wait.reasons": `["pace","concurrency"]`, "llmproxy.wait.retry": "false"})
	retryWait := byName(t, rec, "retry wait")
	wantAttrs(t, retryWait, map[string]string{"llmproxy.wait.reasons": `["pause"]`, "llmproxy.wait.retry": "true", "llmproxy.wait.backoff_ms": "0"})

	var attempts []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "chat claude-x" {
			attempts = append(attempts, s)
		}
	}
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans named \"chat claude-x\", want 2", len(attempts))
	}
	for _, s := range append([]sdktrace.ReadOnlySpan{wait, retryWait}, attempts...) {
		if s.Parent().SpanID() != server.SpanContext().SpanID() || s.SpanContext().TraceID() != server.SpanContext().TraceID() {
			t.Errorf("span %q is not a child of the server span", s.Name())
		}
	}
	for i, s := range attempts {
		if s.SpanKind() != trace.SpanKindClient {
			t.Errorf("attempt %d is a %v span, want client", i+1, s.SpanKind())
		}
		want := fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID())
		if sent[i] != want {
			t.Errorf("attempt %d sent traceparent %q upstream, want its own span's %q", i+1, sent[i], want)
		}
		wantAttrs(t, s, map[string]string{"llmproxy.attempt": fmt.Sprint(i + 1), "server.address": "api.anthropic.com", "server.port": "443",
			"url.full": "https://api.anthropic.com/v1/messages", "gen_ai.request.model": "claude-x", "gen_ai.provider.name": "anthropic"})
	}
	wantAttrs(t, attempts[0], map[string]string{"http.response.status_code": "429", "llmproxy.verdict": "rate_refused",
		"llmproxy.action": "retry", "llmproxy.retry.wait_ms": "1500", "error.type": "429", "llmproxy.upstream_request_id": "up-1"})
	if attempts[0].Status().Code != codes.Error {
		t.Errorf("the refused attempt's status %v, want an error", attempts[0].Status())
	}
	wantAttrs(t, attempts[1], map[string]string{"http.response.status_code": "200", "llmproxy.verdict": "accepted", "llmproxy.action": "pass",
		"gen_ai.usage.input_tokens": "12", "gen_ai.usage.output_tokens": "34"})
	if _, ok := attrs(attempts[0])["gen_ai.usage.input_tokens"]; ok {
		t.Error("the refused attempt carries the answer's usage")
	}
	if attempts[1].Status().Code == codes.Error || server.Status().Code == codes.Error {
		t.Errorf("the answered attempt's status %v, the server span's %v; want neither an error", attempts[1].Status(), server.Status())
	}
	// The retried attempt ended at its answer, the answered one with the
	// request.
	if !attempts[0].EndTime().Before(retryWait.StartTime().Add(time.Nanosecond)) || attempts[1].EndTime().After(server.EndTime()) {
		t.Error("the retried attempt's span outlived its answer, or the answered one the request")
	}
	for _, s := range rec.Ended() {
		for k, v := range attrs(s) {
			if strings.Contains(v, "sk-query") {
				t.Errorf("span %q: %s = %q holds the query's key", s.Name(), k, v)
			}
		}
	}
}

// TestANewTraceWithoutAValidTraceparent: a request without a
// traceparent, or with one that is not valid, starts a trace of its own,
// and its attempts send their own traceparent in its place.
func TestANewTraceWithoutAValidTraceparent(t *testing.T) {
	for _, incoming := range []string{"", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "garbage"} {
		tr, rec := recorded()
		r := httptest.NewRequest("GET", "/v1/models", nil)
		if incoming != "" {
			r.Header.Set("Traceparent", incoming)
		}
		rq := tr.Start(r, "", "req-2")
		out := httptest.NewRequest("GET", "http://127.0.0.1:9999/v1/models", nil)
		out.Header.Set("Traceparent", incoming)
		rq.StartAttempt(out)
		rq.Answered(0, "", "unreachable", "not_sent", "give_up", 0)
		rq.End(502, "proxy_error", 0, "")
		server := byName(t, rec, "GET /*")
		if server.Parent().IsValid() {
			t.Errorf("traceparent %q: the server span has parent %v, want a new trace", incoming, server.Parent())
		}
		attempt := byName(t, rec, "GET")
		if got := out.Header.Get("Traceparent"); !strings.Contains(got, attempt.SpanContext().SpanID().String()) {
			t.Errorf("traceparent %q: %q sent upstream, want the attempt's span", incoming, got)
		}
		wantAttrs(t, attempt, map[string]string{"error.type": "unreachable", "server.port": "9999", "llmproxy.action": "give_up"})
		wantAttrs(t, server, map[string]string{"error.type": "502", "http.route": "/*", "llmproxy.route": ""})
		if server.Status().Code != codes.Error {
			t.Errorf("traceparent %q: a 502's server span is not an error", incoming)
		}
	}
}

// TestAnAnswerThatBrokeOffMarksBothSpans: an answer cut after its status
// went out marks the attempt and the request errors, with why.
func TestAnAnswerThatBrokeOffMarksBothSpans(t *testing.T) {
	tr, rec := recorded()
	rq := tr.Start(httptest.NewRequest("POST", "/v1/chat/completions", nil), "", "req-3")
	rq.Describe("gpt-x", "chat", "", "")
	rq.StartAttempt(httptest.NewRequest("POST", "http://up.test/v1/chat/completions", nil))
	rq.Answered(200, "", "", "accepted", "pass", 0)
	rq.End(200, "upstream_cut", 0, "unexpected EOF")
	for _, s := range []sdktrace.ReadOnlySpan{byName(t, rec, "chat gpt-x"), byName(t, rec, "POST /*")} {
		if s.Status().Code != codes.Error || s.Status().Description != "unexpected EOF" {
			t.Errorf("span %q: status %v, want an error saying why", s.Name(), s.Status())
		}
	}
	wantAttrs(t, byName(t, rec, "POST /*"), map[string]string{"error.type": "upstream_cut", "llmproxy.outcome": "upstream_cut"})
	if _, ok := attrs(byName(t, rec, "POST /*"))["gen_ai.provider.name"]; ok {
		t.Error("an unknown provider is named")
	}
}

// TestAWaitThatFailedIsAnError: a wait refused (a full queue) names the
// code the client got and marks its span an error; a granted one is not.
func TestAWaitThatFailedIsAnError(t *testing.T) {
	tr, rec := recorded()
	rq := tr.Start(httptest.NewRequest("POST", "/v1/chat/completions", nil), "", "req-4")
	rq.StartWait(false, 0).End(Queued{Lane: "l1", Priority: "low", Failure: "queue_full"})
	rq.End(429, "proxy_error", 0, "")
	wait := byName(t, rec, "lane wait")
	wantAttrs(t, wait, map[string]string{"error.type": "queue_full", "llmproxy.priority": "low"})
	if wait.Status().Code != codes.Error {
		t.Errorf("a refused wait's status %v, want an error", wait.Status())
	}
	if _, ok := attrs(wait)["llmproxy.wait.reasons"]; ok {
		t.Error("a wait with no reasons carries the attribute")
	}
	if s := byName(t, rec, "POST /*"); s.Status().Code == codes.Error {
		t.Errorf("a 429's server span is an error: %v", s.Status())
	}
}

// TestAStartedAttemptEndsTheOneBefore: an attempt started while the one
// before is still open (its answer was not recorded) ends that one
// first, so that no span is left open.
func TestAStartedAttemptEndsTheOneBefore(t *testing.T) {
	tr, rec := recorded()
	rq := tr.Start(httptest.NewRequest("POST", "/v1/embeddings", nil), "", "req-5")
	rq.Describe("", "embeddings", "openai", "")
	rq.StartAttempt(httptest.NewRequest("POST", "http://up.test/v1/embeddings", nil))
	rq.StartAttempt(httptest.NewRequest("POST", "http://up.test/v1/embeddings", nil))
	if n := len(rec.Ended()); n != 1 {
		t.Fatalf("%d spans ended after the second attempt started, want the first attempt's", n)
	}
	rq.Usage(5, 0)
	rq.End(200, "ok", 1, "")
	if n := len(rec.Ended()); n != 3 {
		t.Fatalf("%d spans ended, want 3", n)
	}
	for _, s := range rec.Ended()[:2] {
		if s.Name() != "embeddings" {
			t.Errorf("attempt span named %q, want the operation alone when the model is not known", s.Name())
		}
	}
	if _, ok := attrs(rec.Ended()[0])["gen_ai.usage.input_tokens"]; ok {
		t.Error("the first attempt carries the usage of the second's answer")
	}
}

// TestNothingWithoutATracer: a nil Tracer starts nothing, and every
// method of what it returns does nothing; the attempt's traceparent is
// left as it came.
func TestNothingWithoutATracer(t *testing.T) {
	var tr *Tracer
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	rq := tr.Start(r, "", "req")
	if rq != nil {
		t.Fatal("a nil Tracer started a request")
	}
	rq.Describe("m", "chat", "openai", "c")
	w := rq.StartWait(false, 0)
	if w != nil {
		t.Fatal("a nil request started a wait")
	}
	w.End(Queued{Lane: "l"})
	out := httptest.NewRequest("POST", "http://up.test/v1/chat/completions", nil)
	out.Header.Set("Traceparent", "kept")
	rq.StartAttempt(out)
	rq.Answered(200, "", "", "accepted", "pass", 0)
	rq.Usage(1, 2)
	rq.End(200, "ok", 0, "")
	if got := out.Header.Get("Traceparent"); got != "kept" {
		t.Errorf("traceparent %q, want it untouched", got)
	}
}

// TestOtherMethodsAreNamedOther: a method that is not HTTP's does not
// name a span.
func TestOtherMethodsAreNamedOther(t *testing.T) {
	for method, want := range map[string]string{"GET": "GET", "DELETE": "DELETE", "PROPFIND": "_OTHER", "get": "_OTHER"} {
		if got := knownMethod(method); got != want {
			t.Errorf("knownMethod(%q) = %q, want %q", method, got, want)
		}
	}
	for _, m := range []string{http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodConnect, http.MethodOptions, http.MethodTrace} {
		if knownMethod(m) != m {
			t.Errorf("knownMethod(%q) is not itself", m)
		}
	}
}

func TestPortIsTheURLsOrItsSchemes(t *testing.T) {
	for raw, want := range map[string]int{"https://a.test": 443, "http://a.test": 80, "http://a.test:8080": 8080, "https://a.test:8443/x": 8443} {
		u, _ := url.Parse(raw)
		if got := port(u); got != want {
			t.Errorf("port(%s) = %d, want %d", raw, got, want)
		}
	}
}

func TestProviderName(t *testing.T) {
	for _, tc := range []struct{ route, upstream, want string }{
		{"", "https://api.openai.com", "openai"},
		{"anthropic", "https://api.anthropic.com", "anthropic"},
		{"anthropic", "http://127.0.0.1:8000", "anthropic"}, // the route's name tells
		{"", "http://127.0.0.1:8000", ""},
		{"local", "http://127.0.0.1:11434", ""},
		{"az", "https://my-res.openai.azure.com", "azure.ai.openai"},
		{"", "https://my-res.services.ai.azure.com", "azure.ai.inference"},
		{"", "https://x.inference.ai.azure.com", "azure.ai.inference"},
		{"", "https://generativelanguage.googleapis.com", "gcp.gemini"},
		{"", "https://us-central1-aiplatform.googleapis.com", "gcp.vertex_ai"},
		{"", "https://bedrock-runtime.us-east-1.amazonaws.com", "aws.bedrock"},
		{"", "https://s3.us-east-1.amazonaws.com", ""},
		{"", "https://bedrock-runtime.example.com", ""},
		{"", "https://API.Mistral.AI", "mistral_ai"},
		{"", "https://api.groq.com", "groq"},
		{"", "https://api.deepseek.com", "deepseek"},
		{"", "https://api.x.ai", "x_ai"},
		{"", "https://api.perplexity.ai", "perplexity"},
		{"", "https://api.cohere.com", "cohere"},
		{"", "https://api.cohere.ai", "cohere"},
		{"", "https://notapi.openai.com", ""},
		{"", "https://evil-api.openai.com.example", ""},
		{"Azure", "http://gateway.internal", "azure.ai.openai"},
		{"bedrock", "http://gateway.internal", "aws.bedrock"},
	} {
		u, _ := url.Parse(tc.upstream)
		if got := ProviderName(tc.route, u); got != tc.want {
			t.Errorf("ProviderName(%q, %s) = %q, want %q", tc.route, tc.upstream, got, tc.want)
		}
	}
	if got := ProviderName("openai", nil); got != "openai" {
		t.Errorf("ProviderName without a URL = %q, want the route's", got)
	}
}

func TestOperation(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/chat/completions":                     "chat",
		"/openai/deployments/gpt/chat/completions": "chat",
		"/v1/responses":                            "chat",
		"/v1/messages":                             "chat",
		"/v1/messages/":                            "chat",
		"/v1/threads/t1/messages":                  "",
		"/v1/completions":                          "text_completion",
		"/v1/embeddings":                           "embeddings",
		"/v1beta/models/gemini-2.0-flash:generateContent": "generate_content",
		"/v1beta/models/gemini:streamGenerateContent":     "generate_content",
		"/v1/models": "",
		"/v1/files":  "",
	} {
		if got := Operation(path); got != want {
			t.Errorf("Operation(%q) = %q, want %q", path, got, want)
		}
	}
}

// TestDescribeLeavesOutWhatIsNotKnown: an empty model, operation or
// provider is no attribute.
func TestDescribeLeavesOutWhatIsNotKnown(t *testing.T) {
	tr, rec := recorded()
	rq := tr.Start(httptest.NewRequest("POST", "/v1/x", nil), "", "r")
	rq.Describe("m", "", "", "")
	rq.End(200, "ok", 0, "")
	got := attrs(byName(t, rec, "POST /*"))
	var genAI []string
	for k := range got {
		if strings.HasPrefix(k, "gen_ai.") {
			genAI = append(genAI, k)
		}
	}
	if !slices.Equal(genAI, []string{"gen_ai.request.model"}) {
		t.Errorf("gen_ai attributes %q, want the model's alone", genAI)
	}
	if _, ok := got["llmproxy.client"]; ok {
		t.Error("a request naming no client has llmproxy.client")
	}
}

// TestStatusesMarkErrorsFromTheirBounds: an attempt's span is an error
// from 400 up, the request's from 500 up; no status (0) is no attribute.
func TestStatusesMarkErrorsFromTheirBounds(t *testing.T) {
	for _, tc := range []struct {
		attempt, request           int
		attemptError, requestError bool
	}{
		{0, 0, true, false}, // no answer: the attempt names its transport error
		{399, 499, false, false},
		{400, 500, true, true},
	} {
		tr, rec := recorded()
		rq := tr.Start(httptest.NewRequest("POST", "/v1/x", nil), "", "r")
		rq.StartAttempt(httptest.NewRequest("POST", "http://up.test/v1/x", nil))
		errType := ""
		if tc.attempt == 0 {
			errType = "transport_error"
		}
		rq.Answered(tc.attempt, "", errType, "failed", "give_up", 0)
		rq.End(tc.request, "ok", 0, "")
		for _, s := range []struct {
			span      sdktrace.ReadOnlySpan
			status    int
			wantError bool
		}{{byName(t, rec, "POST"), tc.attempt, tc.attemptError}, {byName(t, rec, "POST /*"), tc.request, tc.requestError}} {
			code, has := attrs(s.span)["http.response.status_code"]
			if has != (s.status > 0) || has && code != fmt.Sprint(s.status) {
				t.Errorf("status %d: span %q has status attribute %q (%v)", s.status, s.span.Name(), code, has)
			}
			if (s.span.Status().Code == codes.Error) != s.wantError {
				t.Errorf("status %d: span %q status %v, want an error %v", s.status, s.span.Name(), s.span.Status(), s.wantError)
			}
		}
	}
}

// TestWhatAClientNamesIsBoundedInSpans: a model and a path of a megabyte
// each reach no span whole: the span names, gen_ai.request.model,
// url.path and url.full carry them shortened as a lane's key shortens
// them, and the whole trace stays under 4 KiB.
func TestWhatAClientNamesIsBoundedInSpans(t *testing.T) {
	tr, rec := recorded()
	model, path := strings.Repeat("m", 1<<20), "/v1/"+strings.Repeat("p", 1<<20)
	r := httptest.NewRequest("POST", path, nil)
	rq := tr.Start(r, "", "req-1")
	rq.Describe(model, "chat", "openai", "")
	out := httptest.NewRequest("POST", "https://api.openai.com"+path, nil)
	rq.StartAttempt(out)
	rq.Answered(200, "", "", "accepted", "pass", 0)
	rq.End(200, "ok", 0, "")

	short := bound.Field(model)
	attempt := byName(t, rec, "chat "+short)
	wantAttrs(t, attempt, map[string]string{"gen_ai.request.model": short,
		"url.full": (&url.URL{Scheme: "https", Host: "api.openai.com", Path: bound.Field(path)}).String()})
	server := byName(t, rec, "POST /*")
	wantAttrs(t, server, map[string]string{"gen_ai.request.model": short, "url.path": bound.Field(path)})
	size := 0
	for _, s := range rec.Ended() {
		size += len(s.Name())
		for _, kv := range s.Attributes() {
			size += len(kv.Key) + len(kv.Value.Emit())
		}
	}
	if size > 4<<10 {
		t.Errorf("the trace holds %d bytes of names and attributes, want under 4 KiB", size)
	}
}
