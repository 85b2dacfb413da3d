package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/upstream"
)

// testPrices: standard $1/M input and $2/M output, flex half.
var testPrices = func() *cost.Table {
	t, err := cost.Parse([]byte(`{"models":{"m":{"max_output":1000,"standard":{"input":1,"output":2},"flex":{"input":0.5,"output":1}},
		"noflex":{"standard":{"input":1,"output":2}}}}`))
	if err != nil {
		panic(err)
	}
	return t
}()

// flexUpstream answers chats as OpenAI's flex tier does: a flex request
// is refused ("Resource Unavailable") while refuse says so, answers after
// flexDelay, and says which tier served it; model "noflex" has no flex.
type flexUpstream struct {
	refuse    atomic.Int64 // flex refusals still to give
	flexDelay time.Duration
	calls     atomic.Int64
	flexCalls atomic.Int64
	mu        sync.Mutex
	bodies    []string
	headers   []http.Header
}

func (f *flexUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies, f.headers = append(f.bodies, string(b)), append(f.headers, r.Header.Clone())
	f.mu.Unlock()
	var q struct {
		Model         string `json:"model"`
		ServiceTier   string `json:"service_tier"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	json.Unmarshal(b, &q)
	tier := "default"
	if q.ServiceTier == "flex" {
		f.flexCalls.Add(1)
		if q.Model == "noflex" {
			w.WriteHeader(400)
			io.WriteString(w, `{"error":{"message":"Flex is not available for this model.","type":"invalid_request_error","param":"service_tier","code":null}}`)
			return
		}
		if f.refuse.Add(-1) >= 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"message":"Resource Unavailable: no flex capacity","type":"server_error","code":"resource_unavailable"}}`)
			return
		}
		select {
		case <-time.After(f.flexDelay):
		case <-r.Context().Done():
			return
		}
		tier = "flex"
	}
	usage := `{"prompt_tokens":1000,"completion_tokens":500,"total_tokens":1500}`
	if !q.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","service_tier":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":%s}`, tier, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: {\"id\":\"x\",\"service_tier\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n", tier)
	if q.StreamOptions != nil && q.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"service_tier\":%q,\"choices\":[],\"usage\":%s}\n\n", tier, usage)
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

func costHarness(t *testing.T, up http.Handler, mod func(*Config)) *harness {
	return newHarness(t, up, func(c *Config) {
		c.Prices = testPrices
		if mod != nil {
			mod(c)
		}
	})
}

const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":500}`

// TestAFlexRefusalIsAbsorbedOnFlexAndTeachesTheLaneNothing: two flex
// refusals, then a flex answer; the client gets it priced at flex, the
// lane was never paused and holds its concurrency.
func TestAFlexRefusalIsAbsorbedOnFlexAndTeachesTheLaneNothing(t *testing.T) {
	up := &flexUpstream{}
	up.refuse.Store(2)
	h := costHarness(t, up, nil)
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Tier", "flex")
	body := readAll(t, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get(servedTierHeader); got != "flex" {
		t.Errorf("served tier %q, want flex", got)
	}
	// 1,000 in at $0.5/M and 500 out at $1/M.
	if got := resp.Header.Get(costHeader); got != "0.001" {
		t.Errorf("cost %q, want 0.001", got)
	}
	if n := up.flexCalls.Load(); n != 3 {
		t.Errorf("%d flex attempts, want 3", n)
	}
	for _, s := range h.proxy.States() {
		if !s.PausedUntil.IsZero() {
			t.Errorf("lane %s paused by a flex refusal until %v", s.ID, s.PausedUntil)
		}
	}
	for _, hd := range up.headers {
		for _, name := range []string{tierHeader, runHeader, budgetHeader} {
			if hd.Get(name) != "" {
				t.Errorf("%s went upstream", name)
			}
		}
	}
}

// TestAModelWithoutFlexIsLearnedAndGoesAtStandard: its first request
// meets the 400 and goes at standard; the next one asks standard at once.
func TestAModelWithoutFlexIsLearnedAndGoesAtStandard(t *testing.T) {
	up := &flexUpstream{}
	h := costHarness(t, up, func(c *Config) { c.Default.ServiceTier = cost.Flex })
	noflex := strings.Replace(chat, `"m"`, `"noflex"`, 1)
	for i := range 2 {
		resp := h.post("/v1/chat/completions", noflex)
		readAll(t, resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get(servedTierHeader) != "standard" {
			t.Fatalf("request %d: %d served %q", i, resp.StatusCode, resp.Header.Get(servedTierHeader))
		}
		// Standard: 1,000 at $1/M and 500 at $2/M.
		if got := resp.Header.Get(costHeader); got != "0.002" {
			t.Errorf("cost %q, want 0.002", got)
		}
	}
	if n := up.flexCalls.Load(); n != 1 {
		t.Errorf("%d flex attempts, want 1 (the model learned)", n)
	}
}

// TestFlexGivesWayToStandardBeforeTheDeadline: flex answers slower than
// the request's deadline allows; the answer comes at standard in time.
func TestFlexGivesWayToStandardBeforeTheDeadline(t *testing.T) {
	up := &flexUpstream{flexDelay: 5 * time.Second}
	h := costHarness(t, up, nil)
	start := time.Now()
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Tier", "flex", "X-Llmproxy-Max-Wait", "2")
	readAll(t, resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get(servedTierHeader) != "standard" {
		t.Fatalf("status %d, served %q", resp.StatusCode, resp.Header.Get(servedTierHeader))
	}
	if took := time.Since(start); took >= 2*time.Second {
		t.Errorf("answered after %v, past its 2s deadline", took)
	}
}

// TestFlexNeverStaysOnFlex: with FLEX_FALLBACK=never the refusals are
// absorbed on flex only, and the client gets the last one at its
// deadline.
func TestFlexNeverStaysOnFlex(t *testing.T) {
	up := &flexUpstream{}
	up.refuse.Store(1 << 30)
	h := costHarness(t, up, func(c *Config) { c.Default.ServiceTier, c.Default.FlexNever = cost.Flex, true })
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Max-Wait", "0.3")
	readAll(t, resp.Body)
	// The last flex refusal, or the deadline's 504 when it came during
	// a retry's wait.
	if resp.StatusCode != 429 && resp.StatusCode != 504 {
		t.Fatalf("status %d, want the flex refusal or the deadline", resp.StatusCode)
	}
	if up.flexCalls.Load() < 2 {
		t.Errorf("%d flex attempts: the refusals were not absorbed", up.flexCalls.Load())
	}
	if up.calls.Load() != up.flexCalls.Load() {
		t.Errorf("%d calls, %d of them flex: a standard one went", up.calls.Load(), up.flexCalls.Load())
	}
}

// TestAStreamIsAskedForItsUsageAndTheClientDoesNotSeeIt: the proxy asks
// for include_usage, prices the stream in its trailer, and takes the
// usage chunk out; a client that asked for it keeps it.
func TestAStreamIsAskedForItsUsageAndTheClientDoesNotSeeIt(t *testing.T) {
	up := &flexUpstream{}
	h := costHarness(t, up, nil)
	stream := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}],"max_tokens":500}`
	resp := h.post("/v1/chat/completions", stream)
	b, err := io.ReadAll(resp.Body)
	body := string(b)
	if err != nil {
		t.Fatalf("%v after %q; log %s", err, body, h.logs.String())
	}
	if strings.Contains(body, `"usage"`) || !strings.Contains(body, "[DONE]") || !strings.Contains(body, `"hi"`) {
		t.Errorf("the client got %q", body)
	}
	if got := resp.Trailer.Get(costHeader); got != "0.002" {
		t.Errorf("cost trailer %q, want 0.002", got)
	}
	if !strings.Contains(up.bodies[0], `"include_usage":true`) {
		t.Errorf("upstream body %s", up.bodies[0])
	}
	asked := strings.Replace(stream, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
	resp = h.post("/v1/chat/completions", asked)
	if body := readAll(t, resp.Body); !strings.Contains(body, `"usage"`) {
		t.Errorf("a client that asked for usage lost it: %q", body)
	}
}

// TestARunsBudgetStopsWithinOneRequestOfItsCap: a run of $0.01 with
// requests bounded at $0.003 each (1,000 output tokens at $2/M plus the
// prompt) and costing $0.002: four go (0.008), the fifth would pass the
// cap and gets budget_exhausted with its spend and cap; the upstream
// never sees it.
func TestARunsBudgetStopsWithinOneRequestOfItsCap(t *testing.T) {
	up := &flexUpstream{}
	h := costHarness(t, up, nil)
	hdr := []string{"X-Llmproxy-Run", "eval-1", "X-Llmproxy-Budget-Usd", "0.01"}
	big := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":1000}`
	var codes []int
	for range 6 {
		resp := h.post("/v1/chat/completions", big, hdr...)
		body := readAll(t, resp.Body)
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == 429 {
			var e struct {
				Error struct {
					Code      string `json:"code"`
					SpentUSD  string `json:"spent_usd"`
					BudgetUSD string `json:"budget_usd"`
				} `json:"error"`
			}
			json.Unmarshal([]byte(body), &e)
			if e.Error.Code != "budget_exhausted" || e.Error.SpentUSD != "0.008" || e.Error.BudgetUSD != "0.01" ||
				resp.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("refusal %s (x-should-retry %q)", body, resp.Header.Get("X-Should-Retry"))
			}
		}
	}
	if fmt.Sprint(codes) != "[200 200 200 200 429 429]" {
		t.Errorf("statuses %v", codes)
	}
	if up.calls.Load() != 4 {
		t.Errorf("%d upstream calls, want 4", up.calls.Load())
	}
	runs := h.proxy.spends.Runs()
	if len(runs) != 1 || runs[0].Name != "eval-1" || runs[0].CostUSD != "0.008" || runs[0].Requests != 6 ||
		runs[0].Failures != 2 || runs[0].InputTokens != 4000 || runs[0].ByTier["standard"] != "0.008" {
		t.Errorf("runs %+v", runs)
	}
	// Another run of the same key is not held by this one's cap.
	resp := h.post("/v1/chat/completions", big, "X-Llmproxy-Run", "eval-2", "X-Llmproxy-Budget-Usd", "0.01")
	readAll(t, resp.Body)
	if resp.StatusCode != 200 {
		t.Errorf("another run: %d", resp.StatusCode)
	}
}

// TestQueuedRequestsOfASpentBudgetAreAnsweredAtOnce: a slow upstream
// and a lane of one; when the budget is found spent, the requests queued
// behind get budget_exhausted without waiting their turn.
func TestQueuedRequestsOfASpentBudgetAreAnsweredAtOnce(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-release
		}
		io.WriteString(w, `{"usage":{"prompt_tokens":1000,"completion_tokens":1000}}`)
	})
	h := costHarness(t, up, func(c *Config) {
		c.Lanes.Lane.Concurrency, c.Lanes.Lane.MaxConcurrency = 1, 1
		c.Budget = cost.Dollar / 1000 * 4 // $0.004 for the key
	})
	big := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":1000}`
	var wg sync.WaitGroup
	results := make(chan int, 5)
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post("/v1/chat/completions", big)
			readAll(t, resp.Body)
			results <- resp.StatusCode
		}()
		time.Sleep(20 * time.Millisecond) // in order: the first holds the slot
	}
	time.Sleep(100 * time.Millisecond)
	close(release) // the first costs $0.003: the next does not fit $0.004
	wg.Wait()
	close(results)
	ok, spent := 0, 0
	for code := range results {
		switch code {
		case 200:
			ok++
		case 429:
			spent++
		}
	}
	if ok != 1 || spent != 4 || calls.Load() != 1 {
		t.Errorf("%d answered, %d budget_exhausted, %d upstream calls; want 1, 4, 1", ok, spent, calls.Load())
	}
	// A new request is refused before it queues.
	resp := h.post("/v1/chat/completions", big)
	readAll(t, resp.Body)
	if resp.StatusCode != 429 || calls.Load() != 1 {
		t.Errorf("after: %d, %d calls", resp.StatusCode, calls.Load())
	}
}

// TestABudgetNeedsAPrice: a capped request for a model the table does
// not price is refused, clearly.
func TestABudgetNeedsAPrice(t *testing.T) {
	h := costHarness(t, &flexUpstream{}, nil)
	resp := h.post("/v1/chat/completions", `{"model":"unknown","messages":[]}`, "X-Llmproxy-Budget-Usd", "1")
	body := readAll(t, resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(body, "budget_unpriced") {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
}

func TestBadCostHeadersGet400NamingThem(t *testing.T) {
	h := costHarness(t, &flexUpstream{}, nil)
	for _, c := range [][2]string{
		{"X-Llmproxy-Tier", "cheap"}, {"X-Llmproxy-Run", "has space"}, {"X-Llmproxy-Run", strings.Repeat("r", 65)},
		{"X-Llmproxy-Budget-Usd", "-1"}, {"X-Llmproxy-Budget-Usd", "lots"},
	} {
		resp := h.post("/v1/chat/completions", chat, c[0], c[1])
		body := readAll(t, resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(strings.ToLower(body), strings.ToLower(c[0])) {
			t.Errorf("%s: %s: %d %s", c[0], c[1], resp.StatusCode, body)
		}
	}
}

// TestSpendIsShownInLanesAndMetrics: the run's row and the lane's spend
// in /lanes, the spend series in /metrics.
func TestSpendIsShownInLanesAndMetrics(t *testing.T) {
	h := costHarness(t, &flexUpstream{}, nil)
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Run", "r1")
	readAll(t, resp.Body)
	admin := httptest.NewServer(h.proxy.AdminHandler(Health{}))
	defer admin.Close()
	var lanes struct {
		Runs      []runView   `json:"runs"`
		LaneSpend []laneSpend `json:"lane_spend"`
	}
	if err := json.Unmarshal([]byte(adminBody(t, admin.URL+"/lanes")), &lanes); err != nil {
		t.Fatal(err)
	}
	if len(lanes.Runs) != 1 || lanes.Runs[0].Name != "r1" || lanes.Runs[0].CostUSD != "0.002" ||
		len(lanes.LaneSpend) != 1 || lanes.LaneSpend[0].CostUSD != "0.002" || lanes.LaneSpend[0].Priced != 1 {
		t.Errorf("/lanes: %+v", lanes)
	}
	metrics := adminBody(t, admin.URL+"/metrics")
	for _, want := range []string{`llmproxy_spend_usd_total{route="",tier="standard"} 0.002`, `llmproxy_run_spend_usd{key=`, `llmproxy_lane_spend_usd{lane=`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func adminBody(t *testing.T, u string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), "GET", u, nil)
	req.Host = "localhost"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}

// TestTheTraceSaysWhatTheAnswerCost: the server span carries the cost,
// the tier that served it and the run.
func TestTheTraceSaysWhatTheAnswerCost(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	up := &flexUpstream{}
	h := costHarness(t, up, traced(rec))
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Tier", "flex", "X-Llmproxy-Run", "traced-run")
	readAll(t, resp.Body)
	h.front.Close() // the handler has returned: its spans ended
	var server map[string]string
	for _, s := range rec.Ended() {
		if a := spanAttrs(s); a["llmproxy.request_id"] != "" && a["llmproxy.cost_usd"] != "" {
			server = a
		}
	}
	if server["llmproxy.cost_usd"] != "0.001" || server["llmproxy.served_tier"] != "flex" || server["llmproxy.run"] != "traced-run" {
		t.Errorf("the span's attributes: %v", server)
	}
}

// TestFlexAnswersAreReadByProvider: what each provider's answer to a
// flex request says of flex.
func TestFlexAnswersAreReadByProvider(t *testing.T) {
	const chatPath, gemini = "/v1/chat/completions", "/v1beta/models/gemini-2.5-flash:generateContent"
	for _, c := range []struct {
		status int
		code   string
		msg    string
		path   string
		want   flexAnswer
	}{
		{429, "resource_unavailable", "", chatPath, flexBusy},
		{429, "", "Resource Unavailable. Please retry.", chatPath, flexBusy},
		{429, "rate_limit_exceeded", "Rate limit reached for requests", chatPath, flexServed},
		{498, "", "", chatPath, flexBusy},
		{503, "", "The model is overloaded.", gemini, flexBusy},
		{503, "", "overloaded", chatPath, flexServed},
		{400, "unsupported_value", "Flex processing is not available for this model.", chatPath, flexUnsupported},
		{400, "", "Invalid value for service_tier", chatPath, flexUnsupported},
		{400, "", "messages is required", chatPath, flexServed},
		{200, "", "", chatPath, flexServed},
	} {
		res := upstream.Result{Resp: &http.Response{StatusCode: c.status}}
		res.Error.Code, res.Error.Message = c.code, c.msg
		if got := flexAnswerOf(res, c.path); got != c.want {
			t.Errorf("%d %q %q on %s: %d, want %d", c.status, c.code, c.msg, c.path, got, c.want)
		}
	}
	if got := flexAnswerOf(upstream.Result{}, chatPath); got != flexServed {
		t.Errorf("no answer: %d", got)
	}
	for path, want := range map[string]string{chatPath: "service_tier", "/v1/responses": "service_tier", "/v1/completions": "service_tier",
		gemini: "serviceTier", "/v1beta/models/x:streamGenerateContent": "serviceTier", "/v1/embeddings": "", "/v1/messages": ""} {
		if got := flexField(path); got != want {
			t.Errorf("flexField(%s) = %q, want %q", path, got, want)
		}
	}
}

func TestFlexBackoffIsShortAndCapped(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 250 * time.Millisecond, 2: 500 * time.Millisecond, 3: time.Second, 9: time.Second} {
		if got := flexBackoff(n, 0); got != want {
			t.Errorf("refusal %d: %v, want %v", n, got, want)
		}
		if got := flexBackoff(n, 0.999); got <= want/2 || got >= want {
			t.Errorf("refusal %d with the most jitter: %v", n, got)
		}
	}
}

// TestTheServedTierIsWhatTheAnswerSays: a flex request the upstream
// served at standard (its body says "default") is priced and named as
// standard.
func TestTheServedTierIsWhatTheAnswerSays(t *testing.T) {
	h := costHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		io.WriteString(w, `{"service_tier":"default","usage":{"prompt_tokens":1000,"completion_tokens":500}}`)
	}), nil)
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Tier", "flex")
	readAll(t, resp.Body)
	if got, cost := resp.Header.Get(servedTierHeader), resp.Header.Get(costHeader); got != "standard" || cost != "0.002" {
		t.Errorf("served %q at %q, want standard at 0.002", got, cost)
	}
}

// TestOnlyChatAndCompletionStreamsOfAPricedModelAreAskedForUsage: a
// Responses or Anthropic stream, and a stream of a model without a
// price, go upstream as the client wrote them.
func TestOnlyChatAndCompletionStreamsOfAPricedModelAreAskedForUsage(t *testing.T) {
	up := &flexUpstream{}
	h := costHarness(t, up, nil)
	for _, c := range [][2]string{
		{"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":5,"messages":[]}`},
		{"/v1/chat/completions", `{"model":"unpriced","stream":true,"messages":[]}`},
	} {
		readAll(t, h.post(c[0], c[1]).Body)
		up.mu.Lock()
		got := up.bodies[len(up.bodies)-1]
		up.mu.Unlock()
		if got != c[1] {
			t.Errorf("%s: upstream got %s", c[0], got)
		}
	}
}

// TestALargePricedAnswerArrivesWhole: a non-streamed answer over the 4
// MiB the proxy reads before its headers goes whole, unpriced.
func TestALargePricedAnswerArrivesWhole(t *testing.T) {
	big := `{"usage":{"prompt_tokens":1},"pad":"` + strings.Repeat("x", 5<<20) + `"}`
	h := costHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, big)
	}), nil)
	resp := h.post("/v1/chat/completions", chat)
	if body := readAll(t, resp.Body); body != big {
		t.Fatalf("the client got %d bytes of %d", len(body), len(big))
	}
	if resp.Header.Get(costHeader) != "" {
		t.Errorf("priced without its usage read: %q", resp.Header.Get(costHeader))
	}
}

// TestAnAnswerOfUnknownLengthIsPricedInItsHeaders: a JSON answer sent
// without a length (chunked, as a compressing upstream's is once
// uncompressed), pretty-printed, is priced before its headers go.
func TestAnAnswerOfUnknownLengthIsPricedInItsHeaders(t *testing.T) {
	h := costHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{\n  \"usage\": {\n    \"prompt_tokens\": 1000,\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, "    \"completion_tokens\": 500\n  }\n}\n")
	}), nil)
	resp := h.post("/v1/chat/completions", chat)
	readAll(t, resp.Body)
	if got := resp.Header.Get(costHeader); got != "0.002" {
		t.Errorf("cost %q, want 0.002 in the headers", got)
	}
}

// TestOneLargeRequestDoesNotSpendABudgetForTheSmallOnes: a request whose
// bound passes what is left is refused; one that fits still goes.
func TestOneLargeRequestDoesNotSpendABudgetForTheSmallOnes(t *testing.T) {
	h := costHarness(t, &flexUpstream{}, func(c *Config) { c.Budget = cost.Dollar / 100 })
	huge := `{"model":"m","messages":[],"max_tokens":100000000}`
	if resp := h.post("/v1/chat/completions", huge); resp.StatusCode != 429 {
		t.Fatalf("a $200 request under a $0.01 cap: %d", resp.StatusCode)
	}
	resp := h.post("/v1/chat/completions", chat)
	readAll(t, resp.Body)
	if resp.StatusCode != 200 {
		t.Errorf("a small request after it: %d", resp.StatusCode)
	}
}

// TestUnderRetryOffAFlexRefusalGoesBackAndTeachesNothing: the client
// that said x-llmproxy-retry: off gets the refusal; the lane is not
// paused by it.
func TestUnderRetryOffAFlexRefusalGoesBackAndTeachesNothing(t *testing.T) {
	up := &flexUpstream{}
	up.refuse.Store(1)
	h := costHarness(t, up, nil)
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Tier", "flex", "X-Llmproxy-Retry", "off")
	readAll(t, resp.Body)
	if resp.StatusCode != 429 || up.calls.Load() != 1 {
		t.Fatalf("%d after %d calls", resp.StatusCode, up.calls.Load())
	}
	for _, s := range h.proxy.States() {
		if !s.PausedUntil.IsZero() || s.Throttled != 0 {
			t.Errorf("lane %s learned from a flex refusal: paused until %v, throttled %d", s.ID, s.PausedUntil, s.Throttled)
		}
	}
}

func TestABudgetUnderANanoDollarIsRefused(t *testing.T) {
	h := costHarness(t, &flexUpstream{}, nil)
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Budget-Usd", "1e-12")
	if body := readAll(t, resp.Body); resp.StatusCode != 400 || !strings.Contains(body, "invalid_budget") {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
}

// TestAModelNamedAtLengthIsRememberedBounded: the flex memory keys a
// model as a lane does, bounded.
func TestAModelNamedAtLengthIsRememberedBounded(t *testing.T) {
	var tm tierMemory
	long := strings.Repeat("m", 1<<20)
	tm.markNoFlex("", long)
	for k := range tm.noFlexes {
		if len(k) > 1024 {
			t.Errorf("a key of %d bytes kept", len(k))
		}
	}
	if !tm.noFlex("", long) {
		t.Error("the long model was not remembered")
	}
}
