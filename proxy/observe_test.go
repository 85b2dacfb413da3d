package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// counterValue is the value of the llmproxy counter name with these labels
// (all of them must match), summed over the series that match.
func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// gaugeValue is the value of the llmproxy gauge name, summed over its
// series.
func gaugeValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// TestEveryAnswerIsCountedByOutcome: a whole 200 is ok; a 200 whose
// stream breaks off is upstream_cut, not a success; the upstream's 400 is
// upstream_error; a body over the limit is proxy_error and counted by its
// code; a client that leaves while queued is client_gone.
func TestEveryAnswerIsCountedByOutcome(t *testing.T) {
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock() // also when the test fails: the upstream's handler must end
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cut":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "/v1/bad":
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":{"message":"no"}}`)
		case "/v1/slow":
			<-release
			fmt.Fprint(w, `{}`)
		default:
			fmt.Fprint(w, `{}`)
		}
	}), func(c *Config) {
		c.MaxBodyBytes = 64
		c.Lanes.Lane.Concurrency, c.Lanes.Lane.MaxConcurrency = 1, 1
	})
	reg := h.proxy.cfg.Gatherer
	readAll(t, h.post("/v1/ok", `{"model":"m"}`).Body)
	cut := h.post("/v1/cut", `{"model":"c"}`)
	if _, err := io.ReadAll(cut.Body); err == nil {
		t.Fatal("the cut stream ended cleanly")
	}
	readAll(t, h.post("/v1/bad", `{"model":"b"}`).Body)
	if r := h.post("/v1/ok", `{"model":"`+strings.Repeat("x", 100)+`"}`); r.StatusCode != 413 {
		t.Fatalf("large body: %d", r.StatusCode)
	}
	// One slow request holds the only slot of model s; a second one waits
	// and its client gives up.
	go func() { h.post("/v1/slow", `{"model":"s"}`).Body.Close() }()
	waitFor(t, func() bool { return laneInFlight(h.proxy, "s") == 1 })
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/slow", strings.NewReader(`{"model":"s"}`))
	req.Header.Set("Authorization", "Bearer "+testKey) // the same lane
	cl := &http.Client{Timeout: 200 * time.Millisecond}
	if _, err := cl.Do(req); err == nil {
		t.Fatal("the queued request was answered")
	}
	// The proxy has seen the client go before the slot frees.
	waitFor(t, func() bool { return laneQueued(h.proxy, "s") == 0 })
	unblock()
	laneIdle(t, h.proxy)

	want := []struct {
		labels map[string]string
		n      float64
	}{
		{map[string]string{"status": "200", "outcome": "ok"}, 2},
		{map[string]string{"status": "200", "outcome": "upstream_cut"}, 1},
		{map[string]string{"status": "400", "outcome": "upstream_error"}, 1},
		{map[string]string{"status": "0", "outcome": "client_gone"}, 1},
	}
	waitFor(t, func() bool { return counterValue(t, reg, "llmproxy_requests_total", want[3].labels) == 1 })
	for _, w := range want {
		if got := counterValue(t, reg, "llmproxy_requests_total", w.labels); got != w.n {
			t.Errorf("requests_total%v = %v, want %v", w.labels, got, w.n)
		}
	}
	if got := counterValue(t, reg, "llmproxy_proxy_errors_total", map[string]string{"code": "request_too_large", "status": "413", "route": ""}); got != 1 {
		t.Errorf("proxy_errors_total{code=request_too_large} = %v, want 1", got)
	}
	if logs := h.logs.String(); !strings.Contains(logs, "level=WARN msg=request") || !strings.Contains(logs, "outcome=upstream_cut") {
		t.Errorf("the cut answer was not logged as a warning:\n%s", logs)
	}
}

func laneInFlight(p *Proxy, model string) int { return laneState(p, model).InFlight }

func laneQueued(p *Proxy, model string) int { return laneState(p, model).Queued }

func laneState(p *Proxy, model string) lanequeue.State {
	for _, s := range p.States() {
		if s.Model == model {
			return s
		}
	}
	return lanequeue.State{}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// limitedThenRefusedOnce answers with request-window headers (and token
// ones with tokens set): a 429 with a 50ms hint the first time (n counts),
// then a success.
func limitedThenRefusedOnce(w http.ResponseWriter, n *atomic.Int32, tokens bool) {
	w.Header().Set("X-Ratelimit-Limit-Requests", "600")
	w.Header().Set("X-Ratelimit-Remaining-Requests", "599")
	w.Header().Set("X-Ratelimit-Reset-Requests", "100ms")
	if tokens {
		w.Header().Set("X-Ratelimit-Limit-Tokens", "100000")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "99000")
		w.Header().Set("X-Ratelimit-Reset-Tokens", "1s")
	}
	if n.Add(1) == 1 {
		w.Header().Set("Retry-After-Ms", "50")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"type":"requests","code":"rate_limit_exceeded","message":"slow down"}}`)
		return
	}
	fmt.Fprint(w, `{}`)
}

// TestLaneChangesAreLoggedAtInfoRequestsAtDebug: at info, a pause with its
// reason, the limits learned and the concurrency limit's fall each get a
// line; the per-request lines only show at debug. No line holds the key
// or the query.
func TestLaneChangesAreLoggedAtInfoRequestsAtDebug(t *testing.T) {
	var n atomic.Int32
	logs := &syncBuffer{}
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limitedThenRefusedOnce(w, &n, false)
	}), func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	resp := h.post("/v1/chat/completions?api-version=secretquery", `{"model":"m"}`)
	readAll(t, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	out := logs.String()
	for _, want := range []string{
		`msg="lane paused"`, "reason=rate_limited", "status=429",
		`msg="lane limits changed"`, "learned_from=headers", "requests_limit=600",
		`bound="" rate_from=headers concurrency_from=""`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("info log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "msg=request") {
		t.Errorf("a per-request line at info:\n%s", out)
	}
	if strings.Contains(out, testKey) || strings.Contains(out, "secretquery") {
		t.Errorf("log holds the key or the query:\n%s", out)
	}
}

// TestLimitsLearnedFromBehaviourAreLogged: an upstream that sends no
// rate-limit headers admits a request, then refuses one with a 200 ms
// hint. The "lane limits changed" line says the pace was learned from
// refusals, from the hint (one request per 201 ms: a millisecond hint is
// read a grain late, as it may be cut), and that the rate is what binds.
func TestLimitsLearnedFromBehaviourAreLogged(t *testing.T) {
	var n atomic.Int32
	logs := &syncBuffer{}
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			w.Header().Set("Retry-After-Ms", "200")
			w.WriteHeader(429)
			fmt.Fprint(w, `{"error":{"type":"requests","code":"rate_limit_exceeded","message":"slow down"}}`)
			return
		}
		fmt.Fprint(w, `{}`)
	}), func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	for range 2 {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`)
		readAll(t, resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, `msg="lane limits changed"`) {
			line = l
		}
	}
	for _, want := range []string{
		"learned_from=refusals", "bound=rate", "rate_from=hint", "admitted_rate=4.98 ", `concurrency_from=""`, "status=429",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("the limits line lacks %q:\n%s", want, logs.String())
		}
	}
	t.Log(line)
	const rate = 1 / 0.201
	if v := gaugeValue(t, h.proxy.cfg.Gatherer, "llmproxy_lane_admitted_rate"); math.Abs(v-rate) > 1e-9 {
		t.Errorf("llmproxy_lane_admitted_rate %v, want %v", v, rate)
	}
	if st := laneState(h.proxy, "m"); st.Bound != "rate" || st.RateFrom != "hint" || math.Abs(st.AdmittedRate-rate) > 1e-9 {
		t.Errorf("/lanes: bound %q, rate_from %q, admitted_rate %v", st.Bound, st.RateFrom, st.AdmittedRate)
	}
}

// TestEveryMetricIsDocumented: after traffic that makes every series
// appear (learned limits, a pause, a proxy error), the names the proxy
// exports and the metric table of docs/operations.md are the same set,
// Redis' own series and llmproxy_build_info aside (redisstate and
// cmd/llmproxy register them; their tests cover them).
func TestEveryMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(llmproxy_[a-z0-9_]+)` \\|").FindAllSubmatch(doc, -1) {
		documented[string(m[1])] = true
	}
	var n atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery == "priced" { // a priced answer, for the spend's series
			fmt.Fprint(w, `{"usage":{"prompt_tokens":10,"completion_tokens":5}}`)
			return
		}
		limitedThenRefusedOnce(w, &n, true)
	}), func(c *Config) {
		c.Prices = testPrices
		c.MaxBodyBytes = 64
		// Configured limits, the global cap and a local route have their
		// series too.
		c.Default.Limits.Concurrency = 64
		c.GlobalConcurrency = 100
		c.Routes = append(c.Routes, Route{Name: "local", URL: c.Upstream, Settings: RouteSettings{Local: true}})
	})
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
	readAll(t, h.post("/v1/chat/completions", `{"model":"`+strings.Repeat("x", 100)+`"}`).Body)
	readAll(t, h.post("/local/v1/chat/completions", `{"model":"m"}`).Body)
	readAll(t, h.post("/v1/chat/completions?priced", `{"model":"m"}`, "X-Llmproxy-Run", "r").Body)
	fams, err := h.proxy.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
	}
	for name := range exported {
		if !documented[name] {
			t.Errorf("%s is exported but not in the metric table of docs/operations.md", name)
		}
	}
	for name := range documented {
		if !exported[name] && !strings.HasPrefix(name, "llmproxy_redis_") && name != "llmproxy_build_info" {
			t.Errorf("%s is in the metric table of docs/operations.md but not exported", name)
		}
	}
}

// TestDashboardIsServedSelfContained: /ui is one HTML page that loads
// nothing from elsewhere (no script, style, font or image address), under
// a policy that lets it talk to its own origin only; / leads to it; and
// /lanes?history=1 gives each lane the chart's history, /lanes not.
func TestDashboardIsServedSelfContained(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) }), nil)
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
	waitFor(t, func() bool { return laneState(h.proxy, "m").Outcomes["ok"] == 1 })
	admin := httptest.NewServer(h.proxy.AdminHandler(Health{}))
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page := readAll(t, resp.Body)
	if resp.Request.URL.Path != "/ui" || resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/ led to %s: %d %s", resp.Request.URL.Path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("policy %q", csp)
	}
	// The SVG namespace is a name, not an address the page loads.
	rest := strings.ReplaceAll(page, `"http://www.w3.org/2000/svg"`, "")
	if m := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(|<link|src=`).FindString(rest); m != "" {
		t.Errorf("the page refers to something outside it: %q", m)
	}
	if !strings.Contains(page, `fetch("lanes?history=1"`) {
		t.Error("the page does not read /lanes")
	}
	var plain, hist struct {
		Lanes []lanequeue.State `json:"lanes"`
	}
	for _, c := range []struct {
		path string
		into any
	}{{"/lanes", &plain}, {"/lanes?history=1", &hist}} {
		r, err := http.Get(admin.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.NewDecoder(r.Body).Decode(c.into); err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
	}
	if len(plain.Lanes) != 1 || plain.Lanes[0].History != nil {
		t.Errorf("/lanes: %+v", plain.Lanes)
	}
	if len(hist.Lanes) != 1 || hist.Lanes[0].History == nil || sumOf(hist.Lanes[0].History.Answers) != 1 {
		t.Errorf("/lanes?history=1: %+v", hist.Lanes)
	}
}

func sumOf(v []uint32) (n uint32) {
	for _, x := range v {
		n += x
	}
	return n
}

// TestLanesAnswersAPageOfTheBusiest: /lanes gives at most ?limit= lanes
// (200 by default), the busiest first, with the table's total.
func TestLanesAnswersAPageOfTheBusiest(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) }), nil)
	for i := range 5 {
		readAll(t, h.post("/v1/chat/completions", fmt.Sprintf(`{"model":"m%d"}`, i)).Body)
	}
	get := newAdmin(t, h)
	var page struct {
		Total int               `json:"total"`
		Lanes []lanequeue.State `json:"lanes"`
	}
	if err := json.Unmarshal([]byte(get("/lanes?limit=2")), &page); err != nil {
		t.Fatal(err)
	}
	if page.Total != 5 || len(page.Lanes) != 2 || page.Lanes[0].Model != "m4" {
		t.Fatalf("limit=2: total %d, %d lanes, first %q", page.Total, len(page.Lanes), page.Lanes[0].Model)
	}
	for _, q := range []string{"junk", "0", "-3"} {
		if err := json.Unmarshal([]byte(get("/lanes?limit="+q)), &page); err != nil || len(page.Lanes) != 5 {
			t.Fatalf("limit=%s, the default page: %d lanes, %v", q, len(page.Lanes), err)
		}
	}
}

// TestShapesAndSharedLimitsAreLogged: the "lane limits changed" line says
// a window's closure when a refusal names a wait of seconds after
// admissions, and which models a lane shares its limit with when their
// headers' counts move together.
func TestShapesAndSharedLimitsAreLogged(t *testing.T) {
	var mu sync.Mutex
	left, calls := 20, 0
	logs := &syncBuffer{}
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readAllQuiet(r)
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(body, `"gpt-window"`) {
			calls++
			if calls == 2 {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(429)
				fmt.Fprint(w, `{"error":{"type":"requests","code":"rate_limit_exceeded","message":"slow down"}}`)
				return
			}
			fmt.Fprint(w, `{}`)
			return
		}
		// One window of 20 for the key, whatever the model.
		left--
		w.Header().Set("X-Ratelimit-Limit-Requests", "20")
		w.Header().Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(left))
		w.Header().Set("X-Ratelimit-Reset-Requests", "1s")
		fmt.Fprint(w, `{}`)
	}), func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	for _, model := range []string{"gpt-a", "gpt-b", "gpt-window", "gpt-window"} {
		resp := h.post("/v1/chat/completions", `{"model":"`+model+`"}`)
		readAll(t, resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", model, resp.StatusCode)
		}
	}
	var shared, window []string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if !strings.Contains(l, `msg="lane limits changed"`) {
			continue
		}
		if strings.Contains(l, "model=gpt-b") && strings.Contains(l, "shares_limit_with") {
			shared = append(shared, l)
		}
		if strings.Contains(l, "model=gpt-window") && strings.Contains(l, "shape=") {
			window = append(window, l)
		}
	}
	if len(shared) == 0 || !strings.Contains(shared[0], `shares_limit_with=gpt-a shared_because="headers move together"`) {
		t.Errorf("no line says gpt-b shares a limit with gpt-a:\n%s", logs.String())
	}
	// The closure, suspected at the refusal, then the window learned when
	// it opened again: one request a window of about 2 s.
	if len(window) != 2 || !strings.Contains(window[0], `shape="window suspected: refusals whose waits end at one boundary" status=429`) ||
		!regexp.MustCompile(`shape="window of 1 per [12](\.[0-9])?s, learned from refusals whose waits end at one boundary" status=200`).MatchString(window[1]) {
		t.Errorf("the lines do not say gpt-window's upstream closed a window, then what it learned:\n%s", logs.String())
	}
}
