package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
)

// needChromium returns the path of a Chromium to drive, or skips the test;
// with LLMPROXY_E2E_REQUIRE_CHROMIUM=1 (CI) a missing browser fails it.
func needChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LLMPROXY_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("LLMPROXY_E2E_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("no chromium on PATH (apt-get install -y chromium)")
	}
	t.Skip("no chromium on PATH; apt-get install -y chromium")
	return ""
}

// artifactDir is where the test leaves its screenshots: LLMPROXY_ARTIFACTS,
// or e2e/artifacts.
func artifactDir(t *testing.T) string {
	dir := os.Getenv("LLMPROXY_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser starts a headless Chromium with the flags this closed machine
// needs (no background connections) and a fresh profile, for at most
// timeout.
func browser(t *testing.T, width, height int, timeout time.Duration) (context.Context, context.CancelFunc) {
	exe := needChromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(width, height),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	return ctx, func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	}
}

// pageLane is what the dashboard shows of a lane.
type pageLane struct {
	ID       string `json:"id"`
	Model    string `json:"model"`
	KeyHash  string `json:"key_hash"`
	Path     string `json:"path"`
	Queued   string `json:"queued"`
	InFlight string `json:"in_flight"`
	Done     string `json:"done"`
	Waiting  string `json:"waiting"`
	Belief   string `json:"belief"`
	Paused   bool   `json:"paused"`
	Bars     int    `json:"bars"`
}

type pageView struct {
	Renders int        `json:"renders"`
	Lanes   []pageLane `json:"lanes"`
}

// readPage reads the lane rows off the page through the DOM, as a person
// reads the table.
const readPage = `(() => {
  const f = (tr, name) => { const e = tr.querySelector('[data-field="' + name + '"]'); return e ? e.textContent.trim() : null; };
  return {
    renders: Number(document.getElementById("updated").dataset.n || 0),
    lanes: [...document.querySelectorAll("tr.lane")].map(tr => ({
      id: tr.dataset.lane, model: f(tr, "model"), key_hash: f(tr, "key_hash"), path: f(tr, "path"),
      queued: f(tr, "queued"), in_flight: f(tr, "in_flight"), done: f(tr, "done"), waiting: f(tr, "waiting"),
      belief: f(tr, "belief") || "",
      paused: tr.classList.contains("paused"), bars: tr.querySelectorAll("svg rect").length,
    })),
  };
})()`

func (v pageView) lane(id string) (pageLane, bool) {
	for _, l := range v.Lanes {
		if l.ID == id {
			return l, true
		}
	}
	return pageLane{}, false
}

type lanesJSON struct {
	Redis string            `json:"redis"`
	Lanes []lanequeue.State `json:"lanes"`
}

func getLanes(t *testing.T, admin string) lanesJSON {
	t.Helper()
	resp, err := http.Get(admin + "/lanes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out lanesJSON
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDashboardShowsWhatLanesSays drives the dashboard in real headless
// Chromium while two keys' evals flow through the proxy against a
// rate-limited mock, a third key's upstream pauses its lane, and a fourth
// key's upstream sends no rate-limit headers:
//   - the page lists exactly the lanes /lanes lists, with their model, path
//     and key hash, and a done count between two /lanes readings taken
//     around the page's reading;
//   - the counts move without a reload, and the throughput chart fills;
//   - the paused lane stands out and says why; a degraded Redis shows a
//     banner;
//   - each lane says what its group believes and why: the headers' rate,
//     or for the silent upstream the rate learned from its behaviour and
//     which limit binds;
//   - no API key is anywhere on the page;
//   - at phone width nothing overflows sideways.
//
// Screenshots at 1280×800 and 390×844 are left in LLMPROXY_ARTIFACTS (or
// e2e/artifacts) as the test's artefacts. LLMPROXY_E2E_DASHBOARD_WARMUP (a
// duration, at most 5m) lets the traffic run that long first, for a
// screenshot with minutes of chart; docs/dashboard.png was taken so.
func TestDashboardShowsWhatLanesSays(t *testing.T) {
	warmup, _ := time.ParseDuration(os.Getenv("LLMPROXY_E2E_DASHBOARD_WARMUP"))
	warmup = min(max(warmup, 0), 5*time.Minute)
	ctx, stop := browser(t, 1280, 800, 90*time.Second+warmup)
	defer stop()

	// A route whose upstream pauses its lane for longer than the test: a
	// 429 with a hint of a minute past the warm-up.
	hint := strconv.Itoa(int((warmup + time.Minute).Seconds()))
	pausing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", hint)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`)
	}))
	defer pausing.Close()
	// A route whose upstream explains nothing (no rate-limit headers, no
	// Retry-After): its lane learns its limit from what the upstream does.
	silent := mockupstream.New(mockupstream.Config{RPM: 300, Latency: 50 * time.Millisecond, NoHeaders: true})
	defer silent.Close()
	s := newStack(t, mockupstream.Config{RPM: 600, Latency: 80 * time.Millisecond}, func(c *proxy.Config) {
		u := mustURL(t, pausing.URL)
		// The pausing route is a local model server's (one model); the
		// silent one has a configured ceiling above what it allows.
		c.Routes = append(c.Routes, proxy.Route{Name: "pausing", URL: u, Settings: proxy.RouteSettings{Local: true}},
			proxy.Route{Name: "silent", URL: mustURL(t, silent.URL()), Settings: proxy.RouteSettings{Limits: limit.Limits{RPM: 600}}})
		c.MaxWait, c.MaxRetryAfter = 10*time.Minute, 10*time.Minute
		c.GlobalConcurrency = 100
	})
	var degraded atomic.Bool
	// On loopback, and told so: without a token, changes need it.
	admin := httptest.NewUnstartedServer(nil)
	admin.Config.Handler = s.proxy.AdminHandler(proxy.Health{Shared: func() string {
		if degraded.Load() {
			return "degraded"
		}
		return "ok"
	}}, proxy.ListenerAddr(admin.Listener.Addr().String()))
	admin.Start()
	defer admin.Close()

	keys := map[string]string{"gpt-dash-a": "sk-dashboard-secret-a", "gpt-dash-b": "sk-dashboard-secret-b"}
	trafficCtx, stopTraffic := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for model, key := range keys {
		client := s.openai(key)
		for range 12 { // 12 clients per key; 10 requests a second are allowed per key
			wg.Add(1)
			go func() {
				defer wg.Done()
				until := time.Now().Add(warmup + time.Minute)
				for i := 0; (i < 30 || time.Now().Before(until) && warmup > 0) && trafficCtx.Err() == nil; i++ {
					_, _ = client.Chat.Completions.New(trafficCtx, chatParams(model, "hello"))
				}
			}()
		}
	}
	silentClient := s.openai("sk-dashboard-secret-s", option.WithBaseURL(s.front.URL+"/silent/v1"))
	for range 6 { // 6 clients; 5 requests a second are allowed
		wg.Add(1)
		go func() {
			defer wg.Done()
			until := time.Now().Add(warmup + time.Minute)
			for i := 0; (i < 30 || time.Now().Before(until) && warmup > 0) && trafficCtx.Err() == nil; i++ {
				_, _ = silentClient.Chat.Completions.New(trafficCtx, chatParams("gpt-silent", "hello"))
			}
		}()
	}
	defer func() {
		stopTraffic()
		wg.Wait()
	}()
	go func() {
		req, _ := http.NewRequestWithContext(trafficCtx, "POST", s.front.URL+"/pausing/v1/chat/completions", strings.NewReader(`{"model":"gpt-paused"}`))
		req.Header.Set("Authorization", "Bearer sk-dashboard-secret-p")
		if resp, err := s.httpClient().Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, func() bool {
		l := getLanes(t, admin.URL).Lanes
		if len(l) != 4 {
			return false
		}
		for _, st := range l {
			switch st.Model {
			case "gpt-paused":
			case "gpt-silent":
				if st.Outcomes["ok"] == 0 || st.RateFrom == "" || st.Bound == "" {
					return false
				}
			default:
				if st.Outcomes["ok"] == 0 || st.Queued == 0 {
					return false
				}
			}
		}
		return true
	})

	time.Sleep(warmup)
	var view pageView
	read := func() pageView {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[pageView](readPage))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// waitRenders waits until the page has rendered n more times.
	waitRenders := func(n int) {
		t.Helper()
		start := read().Renders
		deadline := time.Now().Add(15 * time.Second)
		for read().Renders < start+n {
			if time.Now().After(deadline) {
				t.Fatalf("the page stopped refreshing at render %d", start)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(admin.URL+"/ui"),
		chromedp.WaitVisible(chromedp.CSS(`tr.lane[data-lane]`)),
	); err != nil {
		t.Fatal(err)
	}

	// The page's reading falls between two of /lanes: the second render
	// after `before` fetched after it.
	before := getLanes(t, admin.URL)
	waitRenders(2)
	view = read()
	after := getLanes(t, admin.URL)
	if len(view.Lanes) != len(after.Lanes) || len(after.Lanes) != 4 {
		t.Fatalf("page shows %d lanes, /lanes %d: %+v", len(view.Lanes), len(after.Lanes), view.Lanes)
	}
	doneBefore := map[string]int64{}
	for _, st := range before.Lanes {
		doneBefore[st.ID] = st.Outcomes["ok"]
	}
	for _, st := range after.Lanes {
		pl, ok := view.lane(st.ID)
		if !ok {
			t.Fatalf("lane %s (%s) of /lanes is not on the page", st.ID, st.Model)
		}
		if pl.Model != st.Model || pl.KeyHash != st.KeyHash || pl.Path != st.Path {
			t.Errorf("lane %s: page shows %q %q %q, /lanes %q %q %q", st.ID, pl.Model, pl.KeyHash, pl.Path, st.Model, st.KeyHash, st.Path)
		}
		done := atoi(t, pl.Done)
		if done < doneBefore[st.ID] || done > st.Outcomes["ok"] {
			t.Errorf("lane %s: page shows %d done, /lanes %d before and %d after", st.Model, done, doneBefore[st.ID], st.Outcomes["ok"])
		}
	}

	// The paused lane stands out and says why.
	for _, st := range after.Lanes {
		if st.Model != "gpt-paused" {
			continue
		}
		pl, _ := view.lane(st.ID)
		if !pl.Paused || !strings.Contains(pl.Waiting, "rate_limited") {
			t.Errorf("the paused lane shows paused=%v, waiting %q", pl.Paused, pl.Waiting)
		}
	}

	// Each lane says what its group believes and why: the dashboard's
	// keys their rate from the headers; the silent upstream's the rate it
	// was seen to admit (or, before two refusals measured it, the rate it
	// was sending when refused), where that figure comes from, what binds,
	// and the ceiling its route configures.
	learnedFromBehaviour := regexp.MustCompile(`^rate [0-9.]+/(s|min) learned from (admitted rate|sending rate|hint|probe)` +
		`( · concurrency [0-9]+ (named by the upstream|learned from refusals at [0-9]+ in flight))? · bound: (rate|concurrency)` +
		` · configured 600 rpm \(ceiling\)$`)
	for _, st := range after.Lanes {
		pl, _ := view.lane(st.ID)
		switch st.Model {
		case "gpt-paused":
		case "gpt-silent":
			if !learnedFromBehaviour.MatchString(pl.Belief) {
				t.Errorf("the silent upstream's lane says %q; /lanes: bound %q, rate_from %q, admitted_rate %.3g, concurrency_from %q",
					pl.Belief, st.Bound, st.RateFrom, st.AdmittedRate, st.ConcurrencyFrom)
			}
		default:
			if !regexp.MustCompile(`^rate [0-9.]+/(s|min) from headers$`).MatchString(pl.Belief) {
				t.Errorf("lane %s says %q, want its rate from headers", st.Model, pl.Belief)
			}
		}
	}

	// The global cap and the local route show above the lanes.
	type extras struct {
		Global string `json:"global"`
		Local  string `json:"local"`
	}
	ex, err := chromedp.Run(ctx, chromedp.Evaluate[extras](`(() => ({
	  global: document.getElementById("global").hidden ? "" : document.getElementById("global").textContent.trim(),
	  local: [...document.querySelectorAll("#local-routes [data-route]")].map(e => e.textContent.trim()).join("|"),
	}))()`))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^global cap [0-9]+/100`).MatchString(ex.Global) {
		t.Errorf("global cap shows %q", ex.Global)
	}
	if !strings.HasPrefix(ex.Local, "/pausing (local): gpt-paused loaded · 0 swaps") {
		t.Errorf("local route shows %q", ex.Local)
	}

	// An operator's changes show: a held route's lane waits for a release,
	// held by admin since when; limits set at run time say so, on the lane
	// and above the lanes.
	adminDo(t, "POST", admin.URL+"/admin/routes/pausing/hold", "")
	adminDo(t, "PUT", admin.URL+"/admin/routes/silent/limits", `{"rpm": 600}`)
	waitRenders(2)
	view = read()
	for _, st := range getLanes(t, admin.URL).Lanes {
		pl, _ := view.lane(st.ID)
		switch st.Model {
		case "gpt-paused":
			if !regexp.MustCompile(`^a releaseheld by admin since \d\d:\d\d`).MatchString(pl.Waiting) {
				t.Errorf("the held lane's waiting shows %q", pl.Waiting)
			}
		case "gpt-silent":
			if !strings.HasSuffix(pl.Belief, " · rpm 600 set at run time") {
				t.Errorf("the silent lane, its limits set at run time, says %q", pl.Belief)
			}
		}
	}
	changed, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`[...document.querySelectorAll("#routes-changed [data-route]")].map(e => e.textContent.trim()).join("|")`))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^route pausing: held by admin since \d\d:\d\d\|route silent: rpm 600 set at run time$`).MatchString(changed) {
		t.Errorf("the routes changed show %q", changed)
	}
	adminDo(t, "POST", admin.URL+"/admin/routes/pausing/release", "")

	// Counts move without a reload.
	first := view
	waitRenders(3)
	moved := read()
	grew := 0
	for _, pl := range moved.Lanes {
		if was, ok := first.lane(pl.ID); ok && atoi(t, pl.Done) > atoi(t, was.Done) {
			grew++
		}
		if pl.Model != "gpt-paused" && pl.Bars == 0 {
			t.Errorf("lane %s: the throughput chart is empty", pl.Model)
		}
	}
	if grew < 2 {
		t.Errorf("done counts did not move on the page: %+v then %+v", first.Lanes, moved.Lanes)
	}

	// No key anywhere on the page.
	html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(html, "sk-dashboard-secret") {
		t.Fatal("an API key is on the page")
	}

	dir := artifactDir(t)
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	writeArtifact(t, filepath.Join(dir, "dashboard-1280x800.png"), shot)

	// A degraded Redis shows its banner.
	degraded.Store(true)
	waitRenders(2)
	banner, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!document.getElementById("degraded").hidden`))
	if err != nil {
		t.Fatal(err)
	}
	if !banner {
		t.Error("no banner for a degraded Redis")
	}
	degraded.Store(false)

	// A phone: the rows become cards and nothing overflows sideways.
	if err := chromedp.Do(ctx,
		chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile),
		chromedp.Sleep(1500*time.Millisecond),
	); err != nil {
		t.Fatal(err)
	}
	overflow, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
	if err != nil {
		t.Fatal(err)
	}
	if shot, err = chromedp.Run(ctx, chromedp.CaptureScreenshot()); err != nil {
		t.Fatal(err)
	}
	writeArtifact(t, filepath.Join(dir, "dashboard-phone.png"), shot)
	if overflow {
		t.Error("the page is wider than a phone's screen")
	}
	if err := chromedp.Cancel(ctx); err != nil {
		t.Log("closing the browser:", err)
	}
}

// adminDo sends an admin endpoint a change, failing the test unless it
// answers 200.
func adminDo(t *testing.T, method, url, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
}

func writeArtifact(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(path)
	t.Logf("screenshot: %s (%d bytes)", abs, len(b))
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("not a count: %q", s)
	}
	return n
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestDashboardShowsShapesAndSharedLimits drives the dashboard in real
// headless Chromium while one route's upstream counts in fixed windows and
// another's two models draw on one limit of their key: the page says
// each lane's shape and what its limit is shared with, as /lanes does.
func TestDashboardShowsShapesAndSharedLimits(t *testing.T) {
	ctx, stop := browser(t, 1280, 800, 90*time.Second)
	defer stop()
	// 2 s windows of 20, counted from each window's first request,
	// refused with Retry-After in whole seconds alone.
	windowed := mockupstream.New(mockupstream.Config{RPM: 600, Window: 2 * time.Second, Latency: 50 * time.Millisecond,
		NoLimitHeaders: true, NoHint: true, RetryAfterSeconds: true})
	defer windowed.Close()
	// The default upstream: one 20/s bucket per key, whatever the model,
	// with OpenAI's headers.
	s := newStack(t, mockupstream.Config{RPM: 1200, Latency: 50 * time.Millisecond}, func(c *proxy.Config) {
		c.Routes = append(c.Routes, proxy.Route{Name: "gateway", URL: mustURL(t, windowed.URL())})
	})
	admin := httptest.NewServer(s.proxy.AdminHandler(proxy.Health{}))
	defer admin.Close()

	trafficCtx, stopTraffic := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	shared := s.openai("sk-dashboard-shared")
	gateway := s.openai("sk-dashboard-window", option.WithBaseURL(s.front.URL+"/gateway/v1"))
	for i := range 20 {
		wg.Go(func() {
			for trafficCtx.Err() == nil {
				if i%2 == 0 {
					_, _ = gateway.Chat.Completions.New(trafficCtx, chatParams("gpt-window", "hello"))
				} else {
					_, _ = shared.Chat.Completions.New(trafficCtx, chatParams([]string{"gpt-a", "gpt-b"}[i/2%2], "hello"))
				}
			}
		})
	}
	defer func() {
		stopTraffic()
		wg.Wait()
	}()
	byModel := func() map[string]lanequeue.State {
		m := map[string]lanequeue.State{}
		for _, st := range getLanes(t, admin.URL).Lanes {
			m[st.Model] = st
		}
		return m
	}
	var seen map[string]lanequeue.State
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		seen = byModel()
		if strings.HasPrefix(seen["gpt-window"].Shape, "window of 20 per 2") && len(seen["gpt-a"].SharesLimitWith) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s the windowed lane's shape is %q; gpt-a shares with %v",
				seen["gpt-window"].Shape, seen["gpt-a"].SharesLimitWith)
		}
	}
	lanes := byModel()
	if st := lanes["gpt-a"]; !slices.Equal(st.SharesLimitWith, []string{"gpt-b"}) || st.SharedBecause != "headers move together" {
		t.Fatalf("/lanes: gpt-a shares with %v (%q)", st.SharesLimitWith, st.SharedBecause)
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(admin.URL+"/ui"),
		chromedp.WaitVisible(chromedp.CSS(`tr.lane[data-lane]`)),
	); err != nil {
		t.Fatal(err)
	}
	type shown struct {
		Shape  string `json:"shape"`
		Shared string `json:"shared"`
	}
	read := func(id string) shown {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[shown](`(() => {
		  const tr = document.querySelector('tr.lane[data-lane="`+id+`"]');
		  const f = name => { const e = tr && tr.querySelector('[data-field="' + name + '"]'); return e ? e.textContent.trim() : ""; };
		  return { shape: f("shape"), shared: f("shared") };
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	deadline := time.Now().Add(10 * time.Second)
	var win, a shown
	for time.Now().Before(deadline) {
		win, a = read(lanes["gpt-window"].ID), read(lanes["gpt-a"].ID)
		if win.Shape != "" && a.Shared != "" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !regexp.MustCompile(`^window of 20 per 2(\.[0-9])?s, learned from refusals whose waits end at one boundary$`).MatchString(win.Shape) {
		t.Errorf("the windowed lane shows %q", win.Shape)
	}
	if a.Shared != "shares a limit with gpt-b (headers move together)" {
		t.Errorf("gpt-a's lane shows %q", a.Shared)
	}
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	writeArtifact(t, filepath.Join(artifactDir(t), "dashboard-shapes-1280x800.png"), shot)
}

// TestDashboardNotesQuotaSessionsShareAndClients renders, in real headless
// Chromium, the page's own row for a lane as /lanes describes it (the
// JSON a lanequeue.State marshals to) with a spent quota, two WebSocket
// sessions, this replica's share of the shared limits while Redis is
// away, and two named clients: each is said under the lane's name. A
// lane with none of them gets no notes.
func TestDashboardNotesQuotaSessionsShareAndClients(t *testing.T) {
	ctx, stop := browser(t, 1280, 800, 60*time.Second)
	defer stop()
	s := newStack(t, mockupstream.Config{RPM: 1200, Latency: 10 * time.Millisecond}, nil)
	admin := httptest.NewServer(s.proxy.AdminHandler(proxy.Health{}))
	defer admin.Close()
	lane, err := json.Marshal(lanequeue.State{ID: "beef00000001", Model: "gpt-notes", Concurrency: 8, Sessions: 2,
		Quota: "quota spent until 00:00 PT", Shared: "degraded",
		Share:   &limit.ShareView{Replicas: 3, Concurrency: 2, RequestsPerSecond: 3.34, TokensPerSecond: 1000},
		Clients: []lanequeue.ClientState{{Name: "big-eval", Queued: 480, Dispatched: 20}, {Name: "check", Queued: 2, Dispatched: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := json.Marshal(lanequeue.State{ID: "beef00000002", Model: "gpt-plain", Concurrency: 8})
	type shown struct {
		Quota, Sessions, Share, Clients string
		PlainNotes                      int
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(admin.URL+"/ui"), chromedp.WaitReady("body")); err != nil {
		t.Fatal(err)
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[shown](`(() => {
		  const tr = row(`+string(lane)+`, Date.now());
		  const f = name => { const e = tr.querySelector('[data-field="' + name + '"]'); return e ? e.textContent.trim() : ""; };
		  const plain = row(`+string(plain)+`, Date.now());
		  return { Quota: f("quota"), Sessions: f("sessions"), Share: f("share"), Clients: f("clients"),
		           PlainNotes: plain.querySelectorAll(".notes").length };
		})()`))
	if err != nil {
		t.Fatal(err)
	}
	want := shown{Quota: "quota spent until 00:00 PT", Sessions: "2 WebSocket sessions",
		Share:   "this replica keeps to 1/3 of the shared limits: concurrency 2, 3.3/s, tokens 1000/s",
		Clients: "clients: big-eval 480 queued, 20 sent; check 2 queued, 1 sent"}
	if got != want {
		t.Fatalf("the page's notes:\n%+v\nwant\n%+v", got, want)
	}
}

// TestDashboardShowsRunsAndTheirSpend: a run's row, as /lanes has it:
// its requests and its cost, and the spend over the lanes.
func TestDashboardShowsRunsAndTheirSpend(t *testing.T) {
	ctx, stop := browser(t, 1280, 800, 60*time.Second)
	defer stop()
	prices, err := cost.Parse([]byte(costPrices))
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, mockupstream.Config{Latency: 10 * time.Millisecond, Prices: mockPrices}, func(c *proxy.Config) { c.Prices = prices })
	admin := httptest.NewServer(s.proxy.AdminHandler(proxy.Health{}))
	defer admin.Close()
	client := s.openai("sk-dashboard-runs", option.WithHeader("X-Llmproxy-Run", "nightly-eval"))
	for range 3 {
		if _, err := client.Chat.Completions.New(context.Background(), chatParams("gpt-4o-mini", "hello")); err != nil {
			t.Fatal(err)
		}
	}
	var lanes struct {
		Runs []struct {
			Requests int    `json:"requests"`
			CostUSD  string `json:"cost_usd"`
		} `json:"runs"`
	}
	resp, err := http.Get(admin.URL + "/lanes")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&lanes)
	resp.Body.Close()
	runs := lanes.Runs
	if err != nil || len(runs) != 1 || runs[0].Requests != 3 {
		t.Fatalf("runs %+v (%v)", runs, err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(admin.URL+"/ui"), chromedp.WaitVisible(chromedp.CSS(`tr[data-run="nightly-eval"]`))); err != nil {
		t.Fatal(err)
	}
	type shown struct{ Requests, Cost, Spent, LaneSpent string }
	got, err := chromedp.Run(ctx, chromedp.Evaluate[shown](`(() => {
		  const tr = document.querySelector('tr[data-run="nightly-eval"]');
		  const f = name => tr.querySelector('[data-field="' + name + '"]').textContent.trim();
		  return { Requests: f("requests"), Cost: f("cost"), Spent: document.getElementById("t-spent").textContent,
		           LaneSpent: document.querySelector('tr.lane [data-field="spent"]').textContent };
		})()`))
	if err != nil {
		t.Fatal(err)
	}
	if want := (shown{Requests: "3", Cost: "$" + runs[0].CostUSD, Spent: "$" + fmt.Sprintf("%.6f", mustDollars(t, runs[0].CostUSD)),
		LaneSpent: "$" + runs[0].CostUSD}); got != want {
		t.Fatalf("the page shows %+v, want %+v", got, want)
	}
}

func mustDollars(t *testing.T, s string) float64 {
	t.Helper()
	a, err := cost.ParseDollars(s)
	if err != nil {
		t.Fatal(err)
	}
	return a.Dollars()
}
