package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// TestRequestIDsAreRandomHex: every request id is 16 lower-case hex digits
// and ids do not repeat, so the ids of replicas can be told apart.
func TestRequestIDsAreRandomHex(t *testing.T) {
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := newRequestID()
		if !hex16.MatchString(id) {
			t.Fatalf("request id %q is not 16 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("request id %q repeated within 1000", id)
		}
		seen[id] = true
	}
}

// TestTargetURLKeepsTheClientsPathUnderTheBase: the client's path is
// appended to the upstream's base path, cleaned so it cannot climb out,
// with a trailing slash kept as the client sent it.
func TestTargetURLKeepsTheClientsPathUnderTheBase(t *testing.T) {
	base, _ := url.Parse("https://user:pw@api.example.com/base/")
	for _, tc := range []struct{ rest, query, want string }{
		{"/v1/chat/completions", "", "https://api.example.com/base/v1/chat/completions"},
		{"v1/models/", "", "https://api.example.com/base/v1/models/"},
		{"/", "", "https://api.example.com/base/"},
		{"", "a=1", "https://api.example.com/base/?a=1"},
		{"/../../etc/passwd", "", "https://api.example.com/base/etc/passwd"},
		{"/v1/./x//y/", "k=v", "https://api.example.com/base/v1/x/y/?k=v"},
	} {
		if got := targetURL(base, tc.rest, tc.query).String(); got != tc.want {
			t.Errorf("targetURL(%q, %q) = %s, want %s", tc.rest, tc.query, got, tc.want)
		}
	}
}

// TestServerErrorsAndCutsAreLoggedAtWarn: an answer the client got as a
// 5xx is logged at warn, a 4xx at debug; a cut answer's line says why,
// and a whole one carries no error.
func TestServerErrorsAndCutsAreLoggedAtWarn(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		switch {
		case strings.Contains(r.URL.Path, "five-hundred"):
			w.WriteHeader(500)
		case strings.Contains(r.URL.Path, "bad"):
			w.WriteHeader(400)
		case strings.Contains(r.URL.Path, "cut"):
			w.Header().Set("Content-Length", "100")
			fmt.Fprint(w, "short")
			return
		}
		fmt.Fprint(w, `{}`)
	}), func(c *Config) { c.MaxRetries = 0 })
	for _, p := range []string{"/v1/five-hundred", "/v1/bad", "/v1/ok"} {
		readAll(t, h.post(p, `{"model":"m"}`).Body)
	}
	// The cut answer may break off before its headers reach the client.
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/cut", strings.NewReader(`{"model":"m"}`))
	if resp, err := testClient.Do(req); err == nil {
		_, _ = readAllErr(resp)
		resp.Body.Close()
	}
	waitFor(t, func() bool { return strings.Count(h.logs.String(), "msg=request ") == 4 })
	lines := map[string]string{}
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if m := regexp.MustCompile(`msg=request .*path=(/v1/[a-z-]+)`).FindStringSubmatch(l); m != nil {
			lines[m[1]] = l
		}
	}
	for path, level := range map[string]string{"/v1/five-hundred": "WARN", "/v1/bad": "DEBUG", "/v1/ok": "DEBUG", "/v1/cut": "WARN"} {
		if !strings.Contains(lines[path], "level="+level) {
			t.Errorf("%s logged as %q, want level %s", path, lines[path], level)
		}
	}
	if !strings.Contains(lines["/v1/cut"], "outcome=upstream_cut") || !strings.Contains(lines["/v1/cut"], " err=") {
		t.Errorf("the cut answer's line %q does not say why", lines["/v1/cut"])
	}
	if strings.Contains(lines["/v1/ok"], " err=") {
		t.Errorf("a whole answer's line %q carries an error", lines["/v1/ok"])
	}
}

// readAllErr reads a body that may break off.
func readAllErr(resp *http.Response) (string, error) {
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String(), err
		}
	}
}

// TestBudgetFollowsTheSDKsTimeoutWhenItIsShorter: X-Stainless-Timeout
// shortens the request's budget below LLMPROXY_MAX_WAIT; a timeout of
// zero, negative, unreadable or longer than the budget leaves it as it is.
func TestBudgetFollowsTheSDKsTimeoutWhenItIsShorter(t *testing.T) {
	p := &Proxy{cfg: Config{MaxWait: 10 * time.Minute}}
	now := time.Unix(1_000_000, 0)
	for v, want := range map[string]time.Duration{
		"":      10 * time.Minute,
		"30":    30 * time.Second,
		"0.5":   500 * time.Millisecond,
		"0":     10 * time.Minute,
		"-5":    10 * time.Minute,
		"junk":  10 * time.Minute,
		"NaN":   10 * time.Minute,
		"3600":  10 * time.Minute,
		"1e300": 10 * time.Minute,
	} {
		r, _ := http.NewRequest("POST", "/v1/x", nil)
		if v != "" {
			r.Header.Set("X-Stainless-Timeout", v)
		}
		if got := p.budget(r, now).Sub(now); got != want {
			t.Errorf("X-Stainless-Timeout %q: budget %v, want %v", v, got, want)
		}
	}
}

// TestCutErrorsNeverShowTheQuery: the reason logged for a cut answer has
// the request's query (where a Gemini key may be) taken out, and is left
// as it is when there is no query.
func TestCutErrorsNeverShowTheQuery(t *testing.T) {
	withKey, _ := url.Parse("https://up.example/v1beta/models/x:streamGenerateContent?alt=sse&key=secret-key")
	err := &url.Error{Op: "Post", URL: withKey.String(), Err: errors.New("stream error near alt=sse&key=secret-key: reset")}
	if got := redactErr(err, withKey); strings.Contains(got, "secret-key") || got != "stream error near …: reset" {
		t.Errorf("redactErr = %q, want the query taken out", got)
	}
	plain, _ := url.Parse("https://up.example/v1/chat/completions")
	if got := redactErr(errors.New("unexpected EOF"), plain); got != "unexpected EOF" {
		t.Errorf("redactErr without a query = %q, want it unchanged", got)
	}
}

// TestBodiesExactlyFillingTheBufferCapAreTaken: LLMPROXY_MAX_BUFFERED_BYTES
// is the most that may be held, not one byte less, for bodies of known
// and of unknown length.
func TestBodiesExactlyFillingTheBufferCapAreTaken(t *testing.T) {
	body := `{"model":"m","pad":"` + strings.Repeat("x", 1000) + `"}`
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		fmt.Fprint(w, `{}`)
	}), func(c *Config) { c.MaxBufferedBytes = int64(len(body)) })
	if resp := h.post("/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("known length at the cap: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", io.MultiReader(strings.NewReader(body)))
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("unknown length at the cap: %d", resp.StatusCode)
	}
	if over := h.post("/v1/chat/completions", body+" "); over.StatusCode != 429 {
		t.Fatalf("one byte over the cap: %d, want 429", over.StatusCode)
	}
}

// TestRouteNamesAreLettersDigitsAndDotDashUnderscore: the first and last
// letters and digits of each range are allowed, their neighbours are not.
func TestRouteNamesAreLettersDigitsAndDotDashUnderscore(t *testing.T) {
	for _, ok := range []string{"azAZ09", "a", "z", "A", "Z", "0", "9", "my.route_v-2"} {
		if !ValidRouteName(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"`", "{", "@", "[", "/", ":", "a b", "é", "", ".", ".."} {
		if ValidRouteName(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestPanicBeforeAnyByteStillAbortsTheAnswer: a failure after the status
// went out, before any of the body did, breaks the connection; no JSON
// error is appended to the 200.
func TestPanicBeforeAnyByteStillAbortsTheAnswer(t *testing.T) {
	rt := rtFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: &panickyBody{n: 1}, ContentLength: -1}, nil
	})
	h := newHarness(t, http.NotFoundHandler(), func(c *Config) { c.Transport = rt })
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := testClient.Do(req)
	if err != nil {
		return // broken before the status reached the client: also no JSON appended
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil || strings.Contains(string(body), "internal_error") {
		t.Fatalf("status %d, body %q, err %v: want a broken answer without a JSON error in it", resp.StatusCode, body, err)
	}
}

// TestTheProxysOwnHeadersWinOverTheUpstreams: an upstream (or a proxy in
// front of it) that sends x-llmproxy-* headers cannot set what the client
// reads as the lane, queue time or retries.
func TestTheProxysOwnHeadersWinOverTheUpstreams(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("X-Llmproxy-Lane", "forged")
		w.Header().Set("X-Llmproxy-Retries", "99")
		fmt.Fprint(w, `{}`)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	if l := resp.Header.Get("X-Llmproxy-Lane"); l != laneState(h.proxy, "m").ID {
		t.Errorf("lane header %q, want the proxy's lane %s", l, laneState(h.proxy, "m").ID)
	}
	if r := resp.Header.Get("X-Llmproxy-Retries"); r != "0" {
		t.Errorf("retries header %q, want 0", r)
	}
}

// TestRetryAfterStaysOnAnswersThatAreNotSuccesses: the upstream's
// Retry-After is taken off 2xx answers only.
func TestRetryAfterStaysOnAnswersThatAreNotSuccesses(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("Retry-After", "7")
		if strings.HasSuffix(r.URL.Path, "/300") {
			w.WriteHeader(300)
		}
		fmt.Fprint(w, `{}`)
	}), nil)
	ok := h.post("/v1/200", `{"model":"m"}`)
	readAll(t, ok.Body)
	if ok.StatusCode != 200 || ok.Header.Get("Retry-After") != "" {
		t.Errorf("200: Retry-After %q, want none", ok.Header.Get("Retry-After"))
	}
	multi := h.post("/v1/300", `{"model":"m"}`)
	readAll(t, multi.Body)
	if multi.StatusCode != 300 || multi.Header.Get("Retry-After") != "7" {
		t.Errorf("%d: Retry-After %q, want 7 passed on", multi.StatusCode, multi.Header.Get("Retry-After"))
	}
}

// TestLanesRunOnTheProxysClock: a proxy given a clock gives it to its
// lanes when their configuration names none.
func TestLanesRunOnTheProxysClock(t *testing.T) {
	fc := clock.NewFake(time.Unix(2_000_000_000, 0))
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) }),
		func(c *Config) { c.Clock = fc })
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
	if got := laneState(h.proxy, "m").LastUsed; !got.Equal(fc.Now()) {
		t.Fatalf("lane last used at %v, want the proxy's clock %v", got, fc.Now())
	}
}

// firstLineWithin reads the first line of the answer to a POST of body to
// path, or fails the test after 5 s: the proxy held it back.
func firstLineWithin(t *testing.T, h *harness, path, body string) string {
	t.Helper()
	resp := h.post(path, body)
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		return line
	case <-time.After(5 * time.Second):
		t.Fatal("the first line did not reach the client while the upstream was still sending")
		return ""
	}
}

// TestEveryKindOfStreamIsPassedOnAsItArrives: answers of unknown length
// (chunked JSON lines) and event streams, even ones with a known length,
// reach the client as the upstream sends them, not when it has finished.
func TestEveryKindOfStreamIsPassedOnAsItArrives(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		first, rest := "{\"n\":1}\n", "{\"n\":2}\n"
		if strings.HasSuffix(r.URL.Path, "/sse-known-length") {
			first, rest = "data: {\"n\":1}\n\n", "data: [DONE]\n\n"
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Length", strconv.Itoa(len(first)+len(rest)))
		} else {
			w.Header().Set("Content-Type", "application/x-ndjson") // chunked: no length
		}
		fmt.Fprint(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, rest)
	}), nil)
	if line := firstLineWithin(t, h, "/v1/lines", `{"model":"m"}`); line != "{\"n\":1}\n" {
		t.Errorf("chunked lines: first line %q", line)
	}
	if line := firstLineWithin(t, h, "/v1/sse-known-length", `{"model":"m"}`); line != "data: {\"n\":1}\n" {
		t.Errorf("event stream with a length: first line %q", line)
	}
}

// TestSlowButSteadyAnswerIsNotCut: the idle bound is between bytes, not on
// the whole answer: a stream that sends something every 50 ms runs well
// past LLMPROXY_MAX_WAIT and arrives whole.
func TestSlowButSteadyAnswerIsNotCut(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 12 {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}), func(c *Config) { c.MaxWait = 250 * time.Millisecond })
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
	body, err := readAllErr(resp)
	if err != io.EOF || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("a steady 600 ms stream with a 250 ms idle bound: err %v, got %d bytes", err, len(body))
	}
}

// TestUsageMeterHoldsAtMostFourMiB: a JSON answer up to 4 MiB is kept to
// read its usage from; a larger one is passed on unmetered and the copy
// dropped, so an answer's size never grows the proxy past that.
func TestUsageMeterHoldsAtMostFourMiB(t *testing.T) {
	usage := []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7},"pad":"`)
	tail := []byte(`"}`)
	pad := bytes.Repeat([]byte("x"), maxMeteredBody-len(usage)-len(tail))

	var atCap bodyMeter
	for _, p := range [][]byte{usage, pad, tail} {
		atCap.Write(p)
	}
	if u, ok := atCap.Usage(); !ok || u.Total() != 7 {
		t.Fatalf("an answer of exactly 4 MiB: usage %+v, %v; want 7 tokens read", u, ok)
	}

	var over bodyMeter
	for _, p := range [][]byte{usage, pad, []byte("x"), tail} {
		if n, err := over.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v: the answer itself must pass whole", n, err)
		}
	}
	if _, ok := over.Usage(); ok || over.buf != nil {
		t.Fatalf("an answer over 4 MiB was metered (kept %d bytes)", len(over.buf))
	}
}
