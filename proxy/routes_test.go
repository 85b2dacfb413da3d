package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPriorityHeaderStaysHere: x-llmproxy-priority decides the order in
// the lane and never reaches the upstream; a value other than high or
// low is a 400 that says so.
func TestPriorityHeaderStaysHere(t *testing.T) {
	var seen atomic.Value
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("X-Llmproxy-Priority") + "|")
		w.Write([]byte(`{}`))
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Llmproxy-Priority", "low")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if v := seen.Load(); v != "|" {
		t.Errorf("upstream saw x-llmproxy-priority %q", v)
	}
	resp = h.post("/v1/chat/completions", `{"model":"m"}`, "X-Llmproxy-Priority", "urgent")
	if resp.StatusCode != 400 {
		t.Fatalf("bad priority: status %d, want 400", resp.StatusCode)
	}
	if e := decodeErr(t, resp); e.Error.Code != "invalid_priority" || !strings.Contains(e.Error.Message, "high or low") {
		t.Errorf("bad priority: %+v", e)
	}
}

// TestGlobalCapHoldsAcrossLanesAndAPausedLaneHoldsNone: 100 lanes (one key
// each) under a global cap of 5, and one more lane whose first answer is
// a 429 with Retry-After 2: the upstream never sees more than 5 at once,
// and the 100 finish while the refused request waits out its pause, which
// holds none of the cap.
func TestGlobalCapHoldsAcrossLanesAndAPausedLaneHoldsNone(t *testing.T) {
	var in, most atomic.Int64
	var refused atomic.Bool
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer sk-paused" && refused.CompareAndSwap(false, true) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
			w.Write([]byte(`{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`))
			return
		}
		n := in.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		in.Add(-1)
		w.Write([]byte(`{}`))
	}), func(c *Config) { c.GlobalConcurrency = 5 })

	pausedDone := make(chan time.Time, 1)
	go func() {
		req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("Authorization", "Bearer sk-paused")
		resp, err := testClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		pausedDone <- time.Now()
	}()
	for !refused.Load() {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
			req.Header.Set("Authorization", fmt.Sprintf("Bearer sk-%d", i))
			resp, err := testClient.Do(req)
			if err != nil || resp.StatusCode != 200 {
				failed.Add(1)
			}
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	pausedWaiting := len(pausedDone) == 0
	if failed.Load() > 0 {
		t.Fatalf("%d requests failed", failed.Load())
	}
	// The 100 ran while the refused request waited out its pause, and the
	// upstream saw all 5 of the cap's places taken at once: the paused
	// lane held none of them (holding one, the 100 would see 4 at most).
	if !pausedWaiting {
		t.Fatalf("the refused request's pause was over before the 100 finished: the test shows nothing")
	}
	if m := most.Load(); m != 5 {
		t.Errorf("upstream saw %d at once while a lane was paused, want the cap's 5", m)
	}
	st, ok := h.proxy.lanes.CapStats()
	if !ok || st.Limit != 5 || st.Most > 5 {
		t.Errorf("global cap stats %+v", st)
	}
	if v := gaugeValue(t, h.proxy.cfg.Gatherer, "llmproxy_global_concurrency_limit"); v != 5 {
		t.Errorf("llmproxy_global_concurrency_limit %v, want 5", v)
	}
	if d := <-pausedDone; d.Sub(start) < time.Second {
		t.Errorf("the refused request did not wait out its pause")
	}
}

// TestLocalRouteServesOneModelAtATime: requests interleaving three models
// on a local route reach the upstream one model at a time, and /lanes
// shows the loaded model and the swaps made and avoided.
func TestLocalRouteServesOneModelAtATime(t *testing.T) {
	var mu sync.Mutex
	in := map[string]int{}
	mostModels := 0
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Model string }
		json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		in[body.Model]++
		mostModels = max(mostModels, len(in))
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		if in[body.Model]--; in[body.Model] == 0 {
			delete(in, body.Model)
		}
		mu.Unlock()
		w.Write([]byte(`{}`))
	}), func(c *Config) {
		u, _ := url.Parse(c.Upstream.String())
		c.Routes = []Route{{Name: "ollama", URL: u, Settings: RouteSettings{Local: true}}}
	})
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", h.front.URL+"/ollama/v1/chat/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"m%d"}`, i%3)))
			resp, err := testClient.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("request %d: %v", i, err)
			}
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if mostModels != 1 {
		t.Errorf("%d models in flight at once at the upstream, want 1", mostModels)
	}
	routes := h.proxy.lanes.GateStats()
	if len(routes) != 1 || routes[0].Route != "ollama" || routes[0].Loaded == "" {
		t.Fatalf("local routes %+v", routes)
	}
	if r := routes[0]; r.Swaps+r.SwapsAvoided < 2 || r.Swaps > 30 || r.InFlight != 0 {
		t.Errorf("gate stats %+v", r)
	}
	if v := gaugeValue(t, h.proxy.cfg.Gatherer, "llmproxy_local_model_loaded"); v != 1 {
		t.Errorf("llmproxy_local_model_loaded sums to %v, want 1 (one model)", v)
	}
	fams, _ := h.proxy.cfg.Gatherer.Gather()
	swaps := -1.0
	for _, f := range fams {
		if f.GetName() == "llmproxy_local_model_swaps_total" {
			swaps = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if swaps != float64(routes[0].Swaps) {
		t.Errorf("llmproxy_local_model_swaps_total %v, want %d", swaps, routes[0].Swaps)
	}
	var page struct {
		LocalRoutes []struct {
			Route       string `json:"route"`
			LoadedModel string `json:"loaded_model"`
		} `json:"local_routes"`
	}
	rec := httptest.NewRecorder()
	h.proxy.AdminHandler(Health{}).ServeHTTP(rec, localRequest("GET", "/lanes"))
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.LocalRoutes) != 1 || page.LocalRoutes[0].LoadedModel == "" {
		t.Errorf("/lanes local_routes: %s (%v)", rec.Body.String(), err)
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
