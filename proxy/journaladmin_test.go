package proxy

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmproxy/llmproxy/state"
)

// adminServe sends method path to h with the header pairs hdr, addressed
// to localhost, and returns the recorder.
func adminServe(h http.Handler, method, path string, hdr ...string) *httptest.ResponseRecorder {
	req := localRequest(method, path)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// jsonLines reads an answer of JSON lines, one object each.
func jsonLines(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q (%v)", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// TestJournalEndpointsListExportAndRemove: a proxy that recorded a JSON
// answer and a stream in a run lists them (GET /journal, /lanes'
// journal), shows them without bodies, exports them with their requests
// and answers (JSON as JSON, the stream as its text), never with the
// API key, and removes the run.
func TestJournalEndpointsListExportAndRemove(t *testing.T) {
	h, j := journalHarness(t, &numberedUpstream{}, "record")
	readAll(t, h.post("/v1/chat/completions", `{"model":"m","messages":[]}`, runHeader, "r1").Body)
	stream := readAll(t, h.post("/v1/chat/completions", `{"model":"m","messages":[],"stream":true}`, runHeader, "r1").Body)
	readAll(t, h.post("/v1/chat/completions", `{"model":"n"}`, runHeader, "r2").Body)
	waitEntries(t, j, 3)
	admin := h.proxy.AdminHandler(Health{}, ListenerAddr("127.0.0.1:9090"))

	rec := adminServe(admin, "GET", "/journal")
	var overview struct {
		Stats state.Stats      `json:"stats"`
		Runs  []state.RunStats `json:"runs"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &overview); err != nil || rec.Code != 200 {
		t.Fatalf("/journal: %d %s (%v)", rec.Code, rec.Body, err)
	}
	if overview.Stats.Entries != 3 || len(overview.Runs) != 2 || overview.Runs[0].Run != "r1" || overview.Runs[0].Entries != 2 {
		t.Fatalf("/journal: %+v", overview)
	}
	var lanes struct{ Journal *state.Stats }
	if err := json.Unmarshal(adminServe(admin, "GET", "/lanes").Body.Bytes(), &lanes); err != nil || lanes.Journal == nil || lanes.Journal.Entries != 3 {
		t.Fatalf("/lanes' journal: %+v (%v)", lanes.Journal, err)
	}

	rec = adminServe(admin, "GET", "/journal/show?run=r1")
	shown := jsonLines(t, rec.Body.String())
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/x-ndjson" || len(shown) != 2 {
		t.Fatalf("/journal/show: %d %s %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	for _, l := range shown {
		if l["run"] != "r1" || len(l["key"].(string)) != 12 || l["answer_bytes"].(float64) == 0 || l["request_bytes"].(float64) == 0 || l["answer"] != nil {
			t.Errorf("a shown entry: %v", l)
		}
	}

	rec = adminServe(admin, "GET", "/journal/export")
	exported := jsonLines(t, rec.Body.String())
	if rec.Code != 200 || len(exported) != 3 || strings.Contains(rec.Body.String(), testKey) {
		t.Fatalf("/journal/export: %d\n%s", rec.Code, rec.Body)
	}
	byStream := map[bool]map[string]any{}
	for _, l := range exported[:2] {
		byStream[l["stream"].(bool)] = l
	}
	if a, ok := byStream[false]["answer"].(map[string]any); !ok || a["call"] == nil {
		t.Errorf("a JSON answer, exported: %#v", byStream[false]["answer"])
	}
	if byStream[true]["answer"] != stream {
		t.Errorf("a stream, exported: %#v, want %q", byStream[true]["answer"], stream)
	}
	if r, ok := exported[2]["request"].(map[string]any); !ok || r["model"] != "n" || exported[2]["run"] != "r2" {
		t.Errorf("r2's entry: %v", exported[2])
	}

	if rec := adminServe(admin, "DELETE", "/journal"); rec.Code != 400 || !strings.Contains(rec.Body.String(), "?all=1") {
		t.Fatalf("DELETE without a run: %d %s", rec.Code, rec.Body)
	}
	if rec := adminServe(admin, "DELETE", "/journal?run=r1"); rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{
  "removed": 2
}` {
		t.Fatalf("DELETE r1: %d %s", rec.Code, rec.Body)
	}
	if n := j.Stats().Entries; n != 1 {
		t.Fatalf("%d entries left, want r2's", n)
	}
	if rec := adminServe(admin, "DELETE", "/journal?all=1"); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"removed": 1`) || j.Stats().Entries != 0 {
		t.Fatalf("DELETE all: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(h.logs.String(), `msg="journal: entries removed" run=r1 all=false entries=2 by=local`) {
		t.Errorf("the removal is not logged:\n%s", h.logs)
	}
}

// TestJournalEndpointsWithoutAJournal: a proxy with no state file
// answers the journal's endpoints 404 in the OpenAI format, and /lanes
// has no journal; an unknown method gets 405 with Allow.
func TestJournalEndpointsWithoutAJournal(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	admin := p.AdminHandler(Health{}, ListenerAddr("127.0.0.1:9090"))
	for _, tc := range [][2]string{{"GET", "/journal"}, {"GET", "/journal/show"}, {"GET", "/journal/export?run=x"}, {"DELETE", "/journal?all=1"}} {
		rec := adminServe(admin, tc[0], tc[1])
		var e apiError
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != 404 || e.Error.Code != "not_found" || !strings.Contains(e.Error.Message, "LLMPROXY_STATE") {
			t.Errorf("%s %s: %d %s", tc[0], tc[1], rec.Code, rec.Body)
		}
	}
	if rec := adminServe(admin, "GET", "/lanes"); strings.Contains(rec.Body.String(), `"journal"`) {
		t.Errorf("/lanes names a journal:\n%s", rec.Body)
	}
	if rec := adminServe(admin, "POST", "/journal"); rec.Code != 405 || rec.Header().Get("Allow") != "GET, DELETE" {
		t.Errorf("POST /journal: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}

// TestJournalEndpointsAreGuarded: behind a token each endpoint answers
// 401 without it; without a token, a listener not bound to loopback
// lists the journal (as /lanes) but neither exports its answers nor
// removes them, and a page of another site removes nothing.
func TestJournalEndpointsAreGuarded(t *testing.T) {
	h, j := journalHarness(t, &numberedUpstream{}, "record")
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`, runHeader, "r1").Body)
	waitEntries(t, j, 1)
	paths := [][2]string{{"GET", "/journal"}, {"GET", "/journal/show"}, {"GET", "/journal/export?run=r1"}, {"DELETE", "/journal?run=nobody"}}
	guarded := h.proxy.AdminHandler(Health{}, RequireToken(testAdminToken))
	for _, tc := range paths {
		if rec := adminServe(guarded, tc[0], tc[1]); rec.Code != 401 {
			t.Errorf("%s %s without the token: %d", tc[0], tc[1], rec.Code)
		}
		if rec := adminServe(guarded, tc[0], tc[1], "Authorization", "Bearer wrong-token-0123456789"); rec.Code != 401 {
			t.Errorf("%s %s with another token: %d", tc[0], tc[1], rec.Code)
		}
		if rec := adminServe(guarded, tc[0], tc[1], "Authorization", "Bearer "+testAdminToken); rec.Code != 200 {
			t.Errorf("%s %s with the token: %d %s", tc[0], tc[1], rec.Code, rec.Body)
		}
	}
	open := h.proxy.AdminHandler(Health{}, ListenerAddr("0.0.0.0:9090"))
	for _, tc := range []struct {
		method, path string
		status       int
	}{{"GET", "/journal", 200}, {"GET", "/journal/show", 200}, {"GET", "/journal/export", 404}, {"DELETE", "/journal?all=1", 403}} {
		if rec := adminServe(open, tc.method, tc.path); rec.Code != tc.status {
			t.Errorf("%s %s on 0.0.0.0 without a token: %d, want %d: %s", tc.method, tc.path, rec.Code, tc.status, rec.Body)
		}
	}
	loop := h.proxy.AdminHandler(Health{}, ListenerAddr("127.0.0.1:9090"))
	if rec := adminServe(loop, "DELETE", "/journal?all=1", "Sec-Fetch-Site", "cross-site"); rec.Code != 403 {
		t.Errorf("DELETE from another site: %d", rec.Code)
	}
	if j.Stats().Entries != 1 {
		t.Fatal("a refused DELETE removed entries")
	}
	if rec := adminServe(loop, "GET", "/journal/export"); rec.Code != 200 || len(jsonLines(t, rec.Body.String())) != 1 {
		t.Errorf("export on loopback without a token: %d %s", rec.Code, rec.Body)
	}
}
