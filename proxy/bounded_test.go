package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmproxy/llmproxy/limit"
)

// metricLanes is each lane label of the proxy's /metrics with its number
// of series.
func metricLanes(t *testing.T, p *Proxy) map[string]int {
	t.Helper()
	rec := httptest.NewRecorder()
	p.AdminHandler(Health{}).ServeHTTP(rec, localRequest("GET", "/metrics"))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	lanes := map[string]int{}
	for _, m := range laneLabel.FindAllStringSubmatch(rec.Body.String(), -1) {
		lanes[m[1]]++
	}
	return lanes
}

// laneLabel finds a series' lane label in the metrics' text.
var laneLabel = regexp.MustCompile(`[{,]lane="([^"]*)"`)

// TestRandomKeysTheUpstreamRefusesLeaveNoLanes: 300 requests, each with a
// made-up key the upstream answers 401, after one with the real key that
// learned a window of 600 requests: no lane is left for the made-up keys,
// /metrics names the real lane alone, with the window it learned.
func TestRandomKeysTheUpstreamRefusesLeaveNoLanes(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasPrefix(r.URL.Path, "/v1/nowhere/") {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error":{"message":"Invalid URL","type":"invalid_request_error"}}`)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}}`)
			return
		}
		w.Header().Set("X-Ratelimit-Limit-Requests", "600")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "599")
		w.Header().Set("X-Ratelimit-Reset-Requests", "100ms")
		fmt.Fprint(w, `{}`)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	real := resp.Header.Get("X-Llmproxy-Lane")
	for i := range 300 {
		resp := h.post(fmt.Sprintf("/v1/chat/completions/%d", i), fmt.Sprintf(`{"model":"m-%d"}`, i), "Authorization", fmt.Sprint("Bearer sk-made-up-", i))
		readAll(t, resp.Body)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("made-up key %d: status %d, want the upstream's 401", i, resp.StatusCode)
		}
	}
	lanes := metricLanes(t, h.proxy)
	if len(lanes) != 1 || lanes[real] == 0 {
		t.Errorf("lanes in /metrics: %d (%v), want the real lane's alone", len(lanes), firstKeys(lanes, 5))
	}
	if st := laneState(h.proxy, "m"); st.ID != real || st.RequestsLimit != 600 {
		t.Errorf("real lane %s learned a window of %v, want %s with 600", st.ID, st.RequestsLimit, real)
	}
	if _, total := h.proxy.lanes.Busiest(1, false); total != 1 {
		t.Errorf("%d lanes in the table, want the real one alone", total)
	}

	// Made-up keys on paths the upstream answers 404 before it looks at
	// the key: their lanes stay, but /metrics names 200 lanes at most,
	// the real one among them, and sums the others under "other".
	for i := range 300 {
		resp := h.post(fmt.Sprintf("/v1/nowhere/%d", i), `{"model":"m"}`, "Authorization", fmt.Sprint("Bearer sk-other-", i))
		readAll(t, resp.Body)
	}
	lanes = metricLanes(t, h.proxy)
	if len(lanes) != 201 || lanes[real] == 0 || lanes["other"] == 0 {
		t.Errorf("%d lanes in /metrics, want 200 (the real one among them) and \"other\"", len(lanes))
	}
}

// firstKeys is at most n of m's keys, for a message.
func firstKeys(m map[string]int, n int) []string {
	var out []string
	for k := range m {
		if len(out) == n {
			break
		}
		out = append(out, strings.Clone(k))
	}
	return out
}

// TestMegabyteModelNamesStayBounded: 60 requests, each naming a distinct
// model of a megabyte, on a route whose models share one limit (so each
// lane names the others): /lanes stays under 128 KiB (it was 380 KB),
// and no span's name or attribute holds more than a lane's key does.
func TestMegabyteModelNamesStayBounded(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		fmt.Fprint(w, `{}`)
	}), func(c *Config) {
		c.MemoryBodyBytes = 4 << 20 // the model is read from bodies this large
		traced(rec)(c)
		c.Lanes.RouteLimits = map[string]limit.Limits{"": {PerCredential: true}}
	})
	for i := range 60 {
		model := fmt.Sprintf("%02d", i) + strings.Repeat("m", 1<<20)
		readAll(t, h.post("/v1/chat/completions", `{"model":"`+model+`"}`).Body)
	}
	for q, most := range map[string]int{"/lanes": 128 << 10, "/lanes?history=1": 256 << 10} {
		w := httptest.NewRecorder()
		h.proxy.AdminHandler(Health{}).ServeHTTP(w, localRequest("GET", q))
		var page struct {
			Total int `json:"total"`
			Lanes []struct {
				Model string   `json:"model"`
				With  []string `json:"shares_limit_with"`
				More  int      `json:"shares_limit_with_more"`
			} `json:"lanes"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || page.Total != 60 {
			t.Fatalf("%s: %d lanes, %v; want 60", q, page.Total, err)
		}
		if n := w.Body.Len(); n > most {
			t.Errorf("%s is %d bytes for 60 lanes, want under %d KiB", q, n, most>>10)
		}
		if l := page.Lanes[0]; len(l.Model) > 200 || len(l.With)+l.More != 59 {
			t.Errorf("%s: a lane's model of %d bytes sharing with %d named and %d more, want at most 200 bytes and 59 in all", q, len(l.Model), len(l.With), l.More)
		}
	}
	waitFor(t, func() bool { return len(spansNamed(rec, "POST /*")) == 60 })
	for _, s := range rec.Ended() {
		if len(s.Name()) > 256 {
			t.Fatalf("a span named with %d bytes", len(s.Name()))
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.Emit(); len(v) > 256 {
				t.Fatalf("span %.80q: %s holds %d bytes", s.Name(), kv.Key, len(v))
			}
		}
	}
}

// TestAMegabytePathIsLoggedBounded: the request's log line names a path of
// a megabyte by its bounded form, as lanes and spans do.
func TestAMegabytePathIsLoggedBounded(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		fmt.Fprint(w, `{}`)
	}), nil)
	readAll(t, h.post("/v1/"+strings.Repeat("p", 1<<20), `{"model":"m"}`).Body)
	waitFor(t, func() bool { return strings.Contains(h.logs.String(), "path=") })
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if len(line) > 4<<10 {
			t.Fatalf("a log line of %d bytes: %.200s", len(line), line)
		}
	}
}
