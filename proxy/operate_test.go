package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
)

// opsHarness is a proxy (h) before a counting upstream, with its admin
// endpoints served on loopback (admin) behind opts.
type opsHarness struct {
	*harness
	admin    *httptest.Server
	arrivals chan time.Time // each upstream request's arrival
	served   atomic.Int64
}

func newOpsHarness(t *testing.T, mod func(*Config), opts ...AdminOption) *opsHarness {
	t.Helper()
	o := &opsHarness{arrivals: make(chan time.Time, 100)}
	o.harness = newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.arrivals <- time.Now()
		o.served.Add(1)
		w.Header().Set("X-Ratelimit-Limit-Requests", "100")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "99")
		w.Header().Set("X-Ratelimit-Reset-Requests", "600ms")
		fmt.Fprint(w, `{}`)
	}), mod)
	o.admin = loopbackAdmin(t, o.proxy, opts...)
	return o
}

// loopbackAdmin serves p's admin endpoints behind opts on a loopback
// listener that the handler knows is one (ListenerAddr).
func loopbackAdmin(t *testing.T, p *Proxy, opts ...AdminOption) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = p.AdminHandler(Health{}, append(opts, ListenerAddr(srv.Listener.Addr().String()))...)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// localRequest is an admin request addressed to localhost, as the
// endpoints without a token want it.
func localRequest(method, path string) *http.Request {
	req := httptest.NewRequest(method, path, nil)
	req.Host = "localhost:9090"
	return req
}

// do sends method path with body ("": none) to the admin listener, with
// auth as its Authorization header ("": none), and returns the answer and
// its body.
func (o *opsHarness) do(method, path, body, auth string) (*http.Response, string) {
	o.t.Helper()
	req, _ := http.NewRequest(method, o.admin.URL+path, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		o.t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp, readAll(o.t, resp.Body)
}

// mustDo is do, failing the test unless the answer is a 200.
func (o *opsHarness) mustDo(method, path, body string) string {
	o.t.Helper()
	resp, b := o.do(method, path, body, "")
	if resp.StatusCode != http.StatusOK {
		o.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return b
}

// lanes is /lanes' answer.
func (o *opsHarness) lanes() lanesBody {
	o.t.Helper()
	var l lanesBody
	if err := json.Unmarshal([]byte(o.mustDo("GET", "/lanes", "")), &l); err != nil {
		o.t.Fatal(err)
	}
	return l
}

type lanesBody struct {
	Lanes  []lanequeue.State `json:"lanes"`
	Routes []routeView       `json:"routes"`
}

// send sends one request in the background; its status arrives on the
// channel.
func (o *opsHarness) send() <-chan int {
	ch := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", o.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := testClient.Do(req)
		if err != nil {
			ch <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ch <- resp.StatusCode
	}()
	return ch
}

// routeLimits reads a route's limits view.
func (o *opsHarness) routeLimits(route string) routeView {
	o.t.Helper()
	var v routeView
	if err := json.Unmarshal([]byte(o.mustDo("GET", "/admin/routes/"+route+"/limits", "")), &v); err != nil {
		o.t.Fatal(err)
	}
	return v
}

// TestLimitsSetAtRunTimePaceTheRoute: 600 RPM put on the default route
// spaces its requests 100 ms apart at the upstream; /lanes and the route's
// limits say who set what; the change is one log line naming who asked;
// a field left out stays, null clears one, DELETE goes back to the
// route's own.
func TestLimitsSetAtRunTimePaceTheRoute(t *testing.T) {
	o := newOpsHarness(t, nil)
	if s := <-o.send(); s != 200 { // the lane is there before the change
		t.Fatal(s)
	}
	<-o.arrivals
	var v routeView
	if err := json.Unmarshal([]byte(o.mustDo("PUT", "/admin/routes/default/limits", `{"rpm": 600}`)), &v); err != nil {
		t.Fatal(err)
	}
	if v.Route != "default" || v.Limits.RPM != 600 || v.Limits.Mode != "ceiling" || v.Configured.RPM != 0 || v.Set == nil || v.Set.By != "local" {
		t.Fatalf("the answer to the change: %+v", v)
	}
	var statuses []<-chan int
	sent := time.Now()
	for range 5 {
		statuses = append(statuses, o.send())
	}
	var last time.Time
	for i, ch := range statuses {
		if s := <-ch; s != 200 {
			t.Fatalf("request %d: %d", i, s)
		}
	}
	for range 5 {
		if at := <-o.arrivals; at.After(last) {
			last = at
		}
	}
	// The first went no sooner than they were sent, the fifth 400 ms
	// after it.
	if took := last.Sub(sent); took < 400*time.Millisecond {
		t.Errorf("the fifth request reached the upstream %v after the five were sent; 600 a minute spaces them 100ms apart (≥ 400ms)", took)
	}
	l := o.lanes()
	if len(l.Lanes) != 1 || l.Lanes[0].RuntimeLimits == nil || l.Lanes[0].RuntimeLimits.RPM != 600 || l.Lanes[0].RuntimeLimits.By != "local" {
		t.Fatalf("/lanes: %+v", l.Lanes)
	}
	if len(l.Routes) != 1 || l.Routes[0].Route != "default" || l.Routes[0].Limits.RPM != 600 {
		t.Fatalf("/lanes' routes: %+v", l.Routes)
	}
	if logs := o.logs.String(); !strings.Contains(logs, `msg="admin change" route=default op=limits by=local limits="600 rpm, as ceiling"`) {
		t.Errorf("no log line of the change:\n%s", logs)
	}
	o.mustDo("PUT", "/admin/routes/default/limits", `{"concurrency": 2, "min_gap": "50ms", "mode": "start"}`)
	if v := o.routeLimits("default"); *v.Limits != (limitsJSON{RPM: 600, Concurrency: 2, MinGap: "50ms", Mode: "start"}) {
		t.Fatalf("after a change of the others: %+v, want rpm 600 kept", v.Limits)
	}
	o.mustDo("PUT", "/admin/routes/DEFAULT/limits", `{"rpm": null, "tpm": 0, "min_gap": "", "mode": null}`)
	if v := o.routeLimits("default"); *v.Limits != (limitsJSON{Concurrency: 2, Mode: "ceiling"}) || v.Set == nil {
		t.Fatalf("after clearing rpm and the gap: %+v", v.Limits)
	}
	o.mustDo("DELETE", "/admin/routes/default/limits", "")
	if v := o.routeLimits("default"); *v.Limits != *v.Configured || v.Set != nil {
		t.Fatalf("after DELETE: %+v, set %+v; want the route's own", v.Limits, v.Set)
	}
	if l := o.lanes(); l.Lanes[0].RuntimeLimits != nil || len(l.Routes) != 0 {
		t.Fatalf("/lanes after DELETE: %+v, routes %+v", l.Lanes[0].RuntimeLimits, l.Routes)
	}
}

// TestBadLimitsAre400sNamingTheField: every field a change cannot use
// gets a 400 in the OpenAI format whose param names it, and changes
// nothing; a body that is no object names no field.
func TestBadLimitsAre400sNamingTheField(t *testing.T) {
	o := newOpsHarness(t, nil)
	for _, tc := range []struct{ body, param string }{
		{`{"rpm": -1}`, "rpm"}, {`{"rpm": "600"}`, "rpm"}, {`{"tpm": 2e12}`, "tpm"},
		{`{"concurrency": 2.5}`, "concurrency"}, {`{"concurrency": -1}`, "concurrency"}, {`{"concurrency": 2000000}`, "concurrency"},
		{`{"min_gap": "soon"}`, "min_gap"}, {`{"min_gap": 5}`, "min_gap"}, {`{"min_gap": "-1s"}`, "min_gap"}, {`{"min_gap": "25h"}`, "min_gap"},
		{`{"mode": "fast"}`, "mode"}, {`{"mode": 3}`, "mode"}, {`{"rpm": 60, "burst": 5}`, "burst"},
		{`[1]`, ""}, {`not json`, ""}, {``, ""}, {`null`, ""},
		// So slow a rate that its spacing overflowed and turned pacing off.
		{`{"rpm": 1e-12}`, "rpm"}, {`{"rpm": 0.0000999}`, "rpm"}, {`{"tpm": 1e-12}`, "tpm"}, {`{"rpm": 1.0000001e12}`, "rpm"},
		// Bytes after the object: a second change, or junk glued on.
		{`{"rpm": 60} {"rpm": 1}`, ""}, {`{"rpm": 60}x`, ""}, {`{"rpm": 60}]`, ""}, {`{"rpm": 60}"`, ""},
	} {
		resp, b := o.do("PUT", "/admin/routes/default/limits", tc.body, "")
		var e apiError
		if err := json.Unmarshal([]byte(b), &e); err != nil || resp.StatusCode != 400 || e.Error.Code != "invalid_admin_request" ||
			!strings.HasPrefix(e.Error.Message, "llmproxy: ") {
			t.Errorf("%s: %d %s, want a 400 invalid_admin_request", tc.body, resp.StatusCode, b)
			continue
		}
		if param := ""; e.Error.Param != nil && *e.Error.Param != tc.param || e.Error.Param == nil && tc.param != param {
			t.Errorf("%s: param %v, want %q", tc.body, e.Error.Param, tc.param)
		}
		if tc.param != "" && !strings.Contains(e.Error.Message, tc.param) {
			t.Errorf("%s: message %q does not name %s", tc.body, e.Error.Message, tc.param)
		}
	}
	if v := o.routeLimits("default"); v.Set != nil || v.Limits.RPM != 0 {
		t.Fatalf("a refused change changed the limits: %+v", v)
	}
}

// TestUnknownRoutesAndLanesAre404s: a route or lane the proxy does not
// have is a 404 that lists the routes or says where the lanes are; a lane
// ID that cannot be one is a 400.
func TestUnknownRoutesAndLanesAre404s(t *testing.T) {
	o := newOpsHarness(t, nil)
	for _, tc := range []struct{ method, path, code string }{
		{"GET", "/admin/routes/nope/limits", "not_found"},
		{"PUT", "/admin/routes/nope/limits", "not_found"},
		{"POST", "/admin/routes/nope/hold", "not_found"},
		{"POST", "/admin/lanes/abcdef012345/hold", "not_found"},
		{"POST", "/admin/lanes/abcdef012345/clear", "not_found"},
		{"POST", "/admin/lanes/ABCDEF/hold", "invalid_admin_request"},
		{"POST", "/admin/lanes/x-y/release", "invalid_admin_request"},
		{"POST", "/admin/lanes/" + strings.Repeat("a", 65) + "/hold", "invalid_admin_request"},
	} {
		resp, b := o.do(tc.method, tc.path, `{}`, "")
		var e apiError
		if err := json.Unmarshal([]byte(b), &e); err != nil || e.Error.Code != tc.code {
			t.Errorf("%s %s: %d %s, want %s", tc.method, tc.path, resp.StatusCode, b, tc.code)
		}
	}
	if _, b := o.do("POST", "/admin/routes/nope/release", "", ""); !strings.Contains(b, `routes: default`) {
		t.Errorf("an unknown route's 404 does not list the routes: %s", b)
	}
}

// TestAHoldWaitsAndAReleaseSends: a held route's request waits, refused
// nothing, while /lanes says who holds it since when; released, it goes.
// A lane held by its ID holds its next request as well.
func TestAHoldWaitsAndAReleaseSends(t *testing.T) {
	o := newOpsHarness(t, nil)
	before := time.Now()
	o.mustDo("POST", "/admin/routes/default/hold", "")
	ch := o.send()
	waitFor(t, func() bool { l := o.lanes(); return len(l.Lanes) == 1 && l.Lanes[0].Queued == 1 })
	st := o.lanes().Lanes[0]
	if st.Held != "route" || st.HeldBy != "local" || st.HeldSince.Before(before.Add(-time.Second)) || o.served.Load() != 0 {
		t.Fatalf("held route: %+v, %d served", st, o.served.Load())
	}
	if l := o.lanes(); len(l.Routes) != 1 || l.Routes[0].Held == nil || l.Routes[0].Held.By != "local" {
		t.Fatalf("/lanes' routes: %+v", l.Routes)
	}
	o.mustDo("POST", "/admin/routes/default/release", "")
	if s := <-ch; s != 200 {
		t.Fatalf("after the release: %d", s)
	}
	id := o.lanes().Lanes[0].ID
	var held map[string]any
	if err := json.Unmarshal([]byte(o.mustDo("POST", "/admin/lanes/"+id+"/hold", "")), &held); err != nil || held["lane"] != id || held["op"] != "hold" || held["by"] != "local" {
		t.Fatalf("the answer to a lane's hold: %v (%v)", held, err)
	}
	ch = o.send()
	waitFor(t, func() bool { return o.lanes().Lanes[0].Queued == 1 })
	if st := o.lanes().Lanes[0]; st.Held != "lane" || o.served.Load() != 1 {
		t.Fatalf("held lane: held %q, %d served", st.Held, o.served.Load())
	}
	o.mustDo("POST", "/admin/lanes/"+id+"/release", "")
	if s := <-ch; s != 200 {
		t.Fatalf("after the lane's release: %d", s)
	}
	if logs := o.logs.String(); !strings.Contains(logs, `msg="admin change" lane=`+id+` op=release by=local`) {
		t.Errorf("no log line of the lane's release:\n%s", logs)
	}
}

// TestAHoldPastTheDeadlineAnswersAsAPause: a request whose deadline
// passes while its route is held gets the answer of a pause past its
// deadline: 429 wait_exceeds_budget, Retry-After, x-should-retry: false,
// and a message that says a hold held it.
func TestAHoldPastTheDeadlineAnswersAsAPause(t *testing.T) {
	o := newOpsHarness(t, func(c *Config) { c.MaxWait = 300 * time.Millisecond })
	o.mustDo("POST", "/admin/routes/default/hold", "")
	resp := o.post("/v1/chat/completions", `{"model":"m"}`)
	e := decodeErr(t, resp)
	if resp.StatusCode != 429 || e.Error.Code != "wait_exceeds_budget" || e.Error.Type != "rate_limit_error" ||
		resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("%d %+v Retry-After %q x-should-retry %q", resp.StatusCode, e, resp.Header.Get("Retry-After"), resp.Header.Get("X-Should-Retry"))
	}
	if !strings.Contains(e.Error.Message, "hold") {
		t.Errorf("message %q does not say a hold held it", e.Error.Message)
	}
	if o.served.Load() != 0 {
		t.Fatal("a held request reached the upstream")
	}
}

// TestAClearForgetsWhatTheLaneLearned: a lane's clear drops the budget
// its limit learned from the upstream's headers, and /lanes says who
// cleared it.
func TestAClearForgetsWhatTheLaneLearned(t *testing.T) {
	o := newOpsHarness(t, nil)
	if s := <-o.send(); s != 200 {
		t.Fatal(s)
	}
	st := o.lanes().Lanes[0]
	if st.RequestsLimit != 100 {
		t.Fatalf("set-up: learned a limit of %v, want 100", st.RequestsLimit)
	}
	o.mustDo("POST", "/admin/lanes/"+st.ID+"/clear", "")
	st = o.lanes().Lanes[0]
	if st.RequestsLimit != 0 || st.Learned != "" || st.ClearedBy != "local" || st.ClearedAt.IsZero() {
		t.Fatalf("after the clear: %+v", st)
	}
	if s := <-o.send(); s != 200 {
		t.Fatal(s)
	}
	o.mustDo("POST", "/admin/routes/default/clear", "")
	if st := o.lanes().Lanes[0]; st.RequestsLimit != 0 {
		t.Fatalf("after the route's clear the lane knows %v", st.RequestsLimit)
	}
}

// TestWritesNeedTheTokenWhenThereIsOne: with an admin token the changes
// need it (401 without), the log and /lanes name who asked by the
// token's hash, never the token; the login cookie names it the same.
func TestWritesNeedTheTokenWhenThereIsOne(t *testing.T) {
	o := newOpsHarness(t, nil, RequireToken(testAdminToken))
	sum := sha256.Sum256([]byte(testAdminToken))
	who := "token:" + hex.EncodeToString(sum[:])[:8]
	if resp, _ := o.do("POST", "/admin/routes/default/hold", "", ""); resp.StatusCode != 401 {
		t.Fatalf("a hold without the token: %d", resp.StatusCode)
	}
	if resp, _ := o.do("PUT", "/admin/routes/default/limits", `{"rpm":1}`, "Bearer wrong"); resp.StatusCode != 401 {
		t.Fatalf("a change with a wrong token: %d", resp.StatusCode)
	}
	resp, b := o.do("POST", "/admin/routes/default/hold", "", "Bearer "+testAdminToken)
	if resp.StatusCode != 200 || !strings.Contains(b, `"by": "`+who+`"`) {
		t.Fatalf("a hold with the token: %d %s, want by %s", resp.StatusCode, b, who)
	}
	req, _ := http.NewRequest("POST", o.admin.URL+"/admin/routes/default/release", nil)
	req.AddCookie(&http.Cookie{Name: adminCookie, Value: hex.EncodeToString(sum[:])})
	if resp, err := testClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a release with the login cookie: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	logs := o.logs.String()
	if strings.Count(logs, "by="+who) != 2 || strings.Contains(logs, testAdminToken) {
		t.Fatalf("the log names who asked otherwise, or shows the token:\n%s", logs)
	}

	// A good cookie does not carry a wrong Bearer token in: the change
	// would be logged under the wrong token's hash.
	req, _ = http.NewRequest("POST", o.admin.URL+"/admin/routes/default/hold", nil)
	req.AddCookie(&http.Cookie{Name: adminCookie, Value: hex.EncodeToString(sum[:])})
	req.Header.Set("Authorization", "Bearer not-the-admin-token")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b = readAll(t, resp.Body)
	resp.Body.Close()
	wrong := sha256.Sum256([]byte("not-the-admin-token"))
	if resp.StatusCode != 401 || strings.Contains(o.logs.String(), hex.EncodeToString(wrong[:4])) {
		t.Fatalf("a cookie with a wrong Bearer token: %d %s; log:\n%s", resp.StatusCode, b, o.logs.String())
	}
	// Another scheme (a proxy in front's Basic) leaves the cookie to decide.
	req, _ = http.NewRequest("GET", o.admin.URL+"/lanes", nil)
	req.AddCookie(&http.Cookie{Name: adminCookie, Value: hex.EncodeToString(sum[:])})
	req.SetBasicAuth("ops", "pass")
	if resp, err := testClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/lanes with the cookie and Basic credentials: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestWithoutATokenOnlyALoopbackListenerTakesChanges: with no admin
// token, a change reaches a listener bound to loopback, whoever the peer
// claims to be, and is refused (403) by one bound elsewhere even from a
// loopback peer (a sidecar, a port-forward); the reads stay open as
// /lanes is; a page of another site may not write.
func TestWithoutATokenOnlyALoopbackListenerTakesChanges(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	handlers := map[string]http.Handler{}
	for _, addr := range []string{"127.0.0.1:9090", "[::1]:9090", ":9090", "0.0.0.0:9090", "[::]:9090", "192.0.2.1:9090", ""} {
		handlers[addr] = p.AdminHandler(Health{}, ListenerAddr(addr))
	}
	handlers["none"] = p.AdminHandler(Health{})
	serve := func(listener, method, path, remote string, hdr ...string) (int, string, string) {
		req := localRequest(method, path)
		req.RemoteAddr = remote
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		handlers[listener].ServeHTTP(rec, req)
		var e apiError
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		return rec.Code, e.Error.Code, e.Error.Message
	}
	for _, tc := range []struct {
		listener, method, path, remote string
		hdr                            []string
		status                         int
		code                           string
	}{
		{"127.0.0.1:9090", "POST", "/admin/routes/default/hold", "192.0.2.7:5000", nil, 200, ""},
		{"[::1]:9090", "POST", "/admin/routes/default/release", "127.0.0.1:5000", nil, 200, ""},
		{":9090", "POST", "/admin/routes/default/hold", "127.0.0.1:5000", nil, 403, "admin_write_refused"},
		{"0.0.0.0:9090", "DELETE", "/admin/routes/default/limits", "[::1]:5000", nil, 403, "admin_write_refused"},
		{"[::]:9090", "PUT", "/admin/routes/default/limits", "127.0.0.1:5000", nil, 403, "admin_write_refused"},
		{"192.0.2.1:9090", "POST", "/admin/routes/default/clear", "127.0.0.1:5000", nil, 403, "admin_write_refused"},
		{"", "POST", "/admin/lanes/ab/hold", "127.0.0.1:5000", nil, 403, "admin_write_refused"},
		{"none", "POST", "/admin/routes/default/hold", "127.0.0.1:5000", nil, 403, "admin_write_refused"},
		{":9090", "GET", "/admin/routes", "192.0.2.7:5000", nil, 200, ""},
		{":9090", "GET", "/admin/routes/default/limits", "192.0.2.7:5000", nil, 200, ""},
		{"127.0.0.1:9090", "POST", "/admin/routes/default/hold", "127.0.0.1:5000", []string{"Origin", "http://evil.example"}, 403, "admin_write_refused"},
		{"127.0.0.1:9090", "POST", "/admin/routes/default/hold", "127.0.0.1:5000", []string{"Origin", "::bad"}, 403, "admin_write_refused"},
		{"127.0.0.1:9090", "POST", "/admin/routes/default/hold", "127.0.0.1:5000", []string{"Sec-Fetch-Site", "cross-site"}, 403, "admin_write_refused"},
		{"127.0.0.1:9090", "POST", "/admin/routes/default/hold", "127.0.0.1:5000", []string{"Sec-Fetch-Site", "same-origin", "Origin", "http://localhost:9090"}, 200, ""},
		{"127.0.0.1:9090", "POST", "/admin/routes/default/release", "[::1]:5000", []string{"Sec-Fetch-Site", "none"}, 200, ""},
	} {
		status, code, msg := serve(tc.listener, tc.method, tc.path, tc.remote, tc.hdr...)
		if status != tc.status || code != tc.code {
			t.Errorf("%s %s on %q from %s %v: %d %q, want %d %q", tc.method, tc.path, tc.listener, tc.remote, tc.hdr, status, code, tc.status, tc.code)
		}
		// The refusal says why, and how to allow it.
		if code == "admin_write_refused" && tc.hdr == nil && (!strings.Contains(msg, "LLMPROXY_ADMIN_TOKEN") || !strings.Contains(msg, "loopback")) {
			t.Errorf("%s on %q: the refusal does not say why: %s", tc.path, tc.listener, msg)
		}
	}
}

// TestWithATokenAPageOfAnotherSiteMayNotWriteEither: the token proves who
// asks, not that a page of another site did not send the request with
// it; a change that carries the token (as a header or the login cookie)
// is refused (403) from a page of another site as it is without one,
// served from the listener's own page or from no page, and the refused
// ones change nothing.
func TestWithATokenAPageOfAnotherSiteMayNotWriteEither(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.AdminHandler(Health{}, RequireToken(testAdminToken)))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	sum := sha256.Sum256([]byte(testAdminToken))
	bearer := []string{"Authorization", "Bearer " + testAdminToken}
	cookie := []string{"Cookie", adminCookie + "=" + hex.EncodeToString(sum[:])}
	send := func(hdr ...string) (int, string) {
		t.Helper()
		status, e := adminSend(t, "POST", srv.URL+"/admin/routes/default/hold", "", "", hdr...)
		return status, e.Error.Code
	}
	for _, proof := range [][]string{bearer, cookie} {
		for _, page := range [][]string{
			{"Origin", "http://evil.example"},
			{"Sec-Fetch-Site", "cross-site"},
			{"Sec-Fetch-Site", "same-site", "Origin", "http://admin.evil.example"},
		} {
			if status, code := send(append(slices.Clone(proof), page...)...); status != http.StatusForbidden || code != "admin_write_refused" {
				t.Errorf("a hold with %s from a page of another site (%v): %d %q, want 403 admin_write_refused", proof[0], page, status, code)
			}
		}
	}
	p.ops.mu.Lock()
	changed := len(p.ops.routes)
	p.ops.mu.Unlock()
	if changed != 0 {
		t.Fatalf("a refused request changed a route: %d changed", changed)
	}
	if status, code := send(bearer...); status != http.StatusOK {
		t.Errorf("a hold with the token from no page: %d %q, want 200", status, code)
	}
	if status, code := send(append(slices.Clone(cookie), "Sec-Fetch-Site", "same-origin", "Origin", "http://"+host)...); status != http.StatusOK {
		t.Errorf("a hold with the cookie from the listener's own page: %d %q, want 200", status, code)
	}
}

// TestTheChangesAnswerTheirMethods: each endpoint that changes lanes
// answers 405 to another method, with the methods it answers.
func TestTheChangesAnswerTheirMethods(t *testing.T) {
	o := newOpsHarness(t, nil)
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/admin/routes/default/hold", "POST"},
		{"GET", "/admin/lanes/abc/clear", "POST"},
		{"POST", "/admin/routes/default/limits", "GET, PUT, DELETE"},
		{"POST", "/admin/routes", "GET"},
		{"PUT", "/lanes", "GET"},
	} {
		if resp, _ := o.do(tc.method, tc.path, "", ""); resp.StatusCode != 405 || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d, Allow %q; want 405, %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
		}
	}
}

// fleet is the Fleet of proxies in one test: a change one puts is
// applied at once by the others.
type fleet struct {
	mu      sync.Mutex
	watches []func(field, value string, first bool)
	puts    []string // field=value, in order
	err     error    // PutChange's
}

// member is one proxy's side of f: its own puts are not handed back.
type member struct {
	f  *fleet
	id int
}

func (m *member) PutChange(_ context.Context, field, value string) error {
	m.f.mu.Lock()
	m.f.puts = append(m.f.puts, field+"="+value)
	watches, err := append([]func(string, string, bool){}, m.f.watches...), m.f.err
	m.f.mu.Unlock()
	if err != nil {
		return err
	}
	for i, w := range watches {
		if i != m.id {
			w(field, value, false)
		}
	}
	return nil
}

func (m *member) WatchChanges(apply func(field, value string, first bool)) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	m.f.watches = append(m.f.watches, apply)
}

// TestChangesReachTheOtherReplicas: a change made on one proxy goes to
// the fleet and is applied by the other, which logs it as another
// replica's; a lane the other has not yet is held when it comes; limits
// named for a lane change nothing; a clear
// made before a replica started, a route it lacks and a change it cannot
// read are left alone; a fleet that cannot take a change is logged.
func TestChangesReachTheOtherReplicas(t *testing.T) {
	f := &fleet{}
	a := newOpsHarness(t, func(c *Config) { c.Fleet = &member{f, 0} })
	b := newOpsHarness(t, func(c *Config) { c.Fleet = &member{f, 1} })
	a.mustDo("PUT", "/admin/routes/default/limits", `{"rpm": 600, "concurrency": 3}`)
	if v := b.routeLimits("default"); v.Limits.RPM != 600 || v.Limits.Concurrency != 3 || v.Set == nil || v.Set.By != "local" {
		t.Fatalf("the other replica's limits: %+v", v)
	}
	if f.puts[0] != `route:default:limits={"op":"limits","limits":{"rpm":600,"tpm":0,"concurrency":3,"min_gap":"","mode":"ceiling"},"by":"local","at":`+mustJSON(t, b.routeLimits("default").Set.At)+`}` {
		t.Fatalf("the fleet got %s", f.puts[0])
	}
	if logs := b.logs.String(); !strings.Contains(logs, `msg="admin change from another replica" route=default op=limits by=local limits="600 rpm, concurrency 3, as ceiling"`) {
		t.Errorf("the other replica did not log the change:\n%s", logs)
	}
	if s := <-a.send(); s != 200 {
		t.Fatal(s)
	}
	id := a.lanes().Lanes[0].ID
	a.mustDo("POST", "/admin/lanes/"+id+"/hold", "")
	if f.puts[1] != "lane:"+id+":hold" && !strings.HasPrefix(f.puts[1], "lane:"+id+":hold=") {
		t.Fatalf("the fleet got %s", f.puts[1])
	}
	ch := b.send()
	waitFor(t, func() bool { l := b.lanes(); return len(l.Lanes) == 1 && l.Lanes[0].Queued == 1 })
	if st := b.lanes().Lanes[0]; st.ID != id || st.Held != "lane" {
		t.Fatalf("the other replica's lane: %+v", st)
	}
	b.proxy.applyFleet("lane:"+id+":limits", mustJSON(t, adminChange{Op: "reset", By: "local"}), false)
	if st := b.lanes().Lanes[0]; st.Held != "lane" {
		t.Fatalf("limits named for a lane, which are a route's, released it: %+v", st)
	}
	a.mustDo("POST", "/admin/lanes/"+id+"/release", "")
	if s := <-ch; s != 200 {
		t.Fatalf("after the release on the first replica: %d", s)
	}
	if !strings.HasPrefix(f.puts[2], "lane:"+id+":hold=") {
		t.Fatalf("a release is not the hold's field: %s", f.puts[2])
	}
	a.mustDo("POST", "/admin/routes/default/hold", "")
	if l := b.lanes(); l.Lanes[0].Held != "route" {
		t.Fatalf("the other replica's route is not held: %+v", l.Lanes[0])
	}
	a.mustDo("POST", "/admin/routes/default/release", "")
	c := adminChange{Op: "clear", By: "token:ffffffff", At: time.Now()}
	value := mustJSON(t, c)
	b.proxy.applyFleet("lane:"+id+":clear", value, true)
	if st := b.lanes().Lanes[0]; !st.ClearedAt.IsZero() {
		t.Fatal("a clear made before the replica started was applied")
	}
	b.proxy.applyFleet("lane:"+id+":clear", value, false)
	if st := b.lanes().Lanes[0]; st.ClearedBy != "token:ffffffff" {
		t.Fatalf("another replica's clear: %+v", st)
	}
	for _, bad := range [][2]string{
		{"route:nope:hold", mustJSON(t, adminChange{Op: "hold"})},
		{"key:x:hold", mustJSON(t, adminChange{Op: "hold"})},
		{"lane:XYZ:hold", mustJSON(t, adminChange{Op: "hold"})},
		{"route:default:hold", "{"},
		{"route:default:hold", mustJSON(t, adminChange{Op: "melt"})},
		{"route:default:limits", mustJSON(t, adminChange{Op: "limits"})},
		{"route:default:limits", `{"op":"limits","limits":{"rpm":-5}}`},
	} {
		b.proxy.applyFleet(bad[0], bad[1], false)
	}
	if n := strings.Count(b.logs.String(), "another replica's admin change ignored"); n != 7 {
		t.Errorf("%d changes it could not use logged, want 7:\n%s", n, b.logs.String())
	}
	if v := b.routeLimits("default"); v.Held != nil || v.Limits.RPM != 600 {
		t.Fatalf("a change it could not use changed the route: %+v", v)
	}
	b.proxy.applyFleet("route:default:limits", mustJSON(t, adminChange{Op: "reset", By: "local"}), false)
	if v := b.routeLimits("default"); v.Set != nil {
		t.Fatalf("another replica's reset: %+v", v)
	}
	f.err = errors.New("redis away")
	a.mustDo("POST", "/admin/routes/default/clear", "")
	if logs := a.logs.String(); !strings.Contains(logs, `msg="admin change not shared with the other replicas" route=default op=clear by=local err="redis away"`) {
		t.Errorf("a change the fleet did not take is not logged:\n%s", logs)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRoutesListEveryRouteAndTheChangedOnes: /admin/routes lists every
// route, the default first, with its own limits and what was changed;
// /lanes' routes lists the changed ones by name.
func TestRoutesListEveryRouteAndTheChangedOnes(t *testing.T) {
	o := newOpsHarness(t, func(c *Config) {
		u := mustParse(t, c.Upstream.String())
		c.Routes = []Route{{Name: "zeta", URL: u}, {Name: "alpha", URL: u, Settings: RouteSettings{Limits: limitsOf(t, `{"tpm": 9000, "min_gap": "1m30s"}`)}}}
	})
	o.mustDo("POST", "/admin/routes/zeta/hold", "")
	o.mustDo("PUT", "/admin/routes/alpha/limits", `{"concurrency": 2}`)
	var all struct{ Routes []routeView }
	if err := json.Unmarshal([]byte(o.mustDo("GET", "/admin/routes", "")), &all); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range all.Routes {
		names = append(names, r.Route)
	}
	if strings.Join(names, ",") != "default,alpha,zeta" {
		t.Fatalf("routes listed %v, want default, alpha, zeta", names)
	}
	if a := all.Routes[1]; *a.Configured != (limitsJSON{TPM: 9000, MinGap: "1m30s", Mode: "ceiling"}) ||
		*a.Limits != (limitsJSON{TPM: 9000, Concurrency: 2, MinGap: "1m30s", Mode: "ceiling"}) || a.Held != nil {
		t.Fatalf("alpha: %+v %+v", a.Configured, a.Limits)
	}
	if z := all.Routes[2]; z.Held == nil || z.Set != nil {
		t.Fatalf("zeta: %+v", z)
	}
	o.mustDo("PUT", "/admin/routes/alpha/limits", `{"concurrency": null}`)
	if v := o.routeLimits("alpha"); v.Limits.Concurrency != 0 || v.Limits.TPM != 9000 {
		t.Fatalf("alpha after concurrency null: %+v", v.Limits)
	}
	if l := o.lanes(); len(l.Routes) != 2 || l.Routes[0].Route != "alpha" || l.Routes[1].Route != "zeta" {
		t.Fatalf("/lanes' routes: %+v", l.Routes)
	}
	if resp, _ := o.do("GET", "/admin/routes//limits", "", ""); resp.StatusCode != 404 {
		t.Fatalf("a route with no name: %d", resp.StatusCode)
	}
	if resp, b := o.do("PUT", "/admin/routes/alpha/limits", `{"rpm": 1, "x": "`+strings.Repeat("a", maxAdminBody)+`"}`, ""); resp.StatusCode != 400 || !strings.Contains(b, "invalid_admin_request") {
		t.Fatalf("a body past the bound: %d %s", resp.StatusCode, b)
	}
}

// limitsOf is the limits a body sets over none.
func limitsOf(t *testing.T, body string) limit.Limits {
	t.Helper()
	l, err := parseLimits([]byte(body), limit.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestWithoutATokenEveryoneIsLocal: with no admin token, who asked is
// "local", whatever the request carries.
func TestWithoutATokenEveryoneIsLocal(t *testing.T) {
	o := newOpsHarness(t, nil)
	req, _ := http.NewRequest("POST", o.admin.URL+"/admin/routes/default/hold", nil)
	req.Header.Set("Authorization", "Bearer anything")
	req.AddCookie(&http.Cookie{Name: adminCookie, Value: "abcdef0123456789"})
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b := readAll(t, resp.Body)
	resp.Body.Close()
	if !strings.Contains(b, `"by": "local"`) {
		t.Fatalf("%s", b)
	}
}

func TestLimitsInWords(t *testing.T) {
	for _, tc := range []struct {
		l    limit.Limits
		want string
	}{
		{limit.Limits{}, "none"},
		{limit.Limits{RPM: 600}, "600 rpm, as ceiling"},
		{limit.Limits{TPM: 90000, MinGap: 200 * time.Millisecond, Start: true}, "90000 tpm, min gap 200ms, as start"},
		{limit.Limits{RPM: 1.5, Concurrency: 4}, "1.5 rpm, concurrency 4, as ceiling"},
	} {
		if got := describeLimits(tc.l); got != tc.want {
			t.Errorf("%+v reads %q, want %q", tc.l, got, tc.want)
		}
	}
}

// TestLimitsAtTheirBounds: the figures at the edges of what a change may
// set are taken: 0 clears, the highest stands.
func TestLimitsAtTheirBounds(t *testing.T) {
	o := newOpsHarness(t, nil)
	for _, tc := range []struct {
		body string
		want limitsJSON
	}{
		{`{"rpm": 1e12, "tpm": 0, "concurrency": 1000000, "min_gap": "24h"}`, limitsJSON{RPM: 1e12, Concurrency: 1000000, MinGap: "24h0m0s", Mode: "ceiling"}},
		{`{"rpm": 0, "tpm": 1e12, "concurrency": 0, "min_gap": "0s", "mode": ""}`, limitsJSON{TPM: 1e12, Mode: "ceiling"}},
		{`{"rpm": 0.0001, "tpm": 0.0001}`, limitsJSON{RPM: 1e-4, TPM: 1e-4, Mode: "ceiling"}},
		// Trailing white space is no second value.
		{"{\"rpm\": 60, \"tpm\": 0}\n\t ", limitsJSON{RPM: 60, Mode: "ceiling"}},
	} {
		var v routeView
		if err := json.Unmarshal([]byte(o.mustDo("PUT", "/admin/routes/default/limits", tc.body)), &v); err != nil || *v.Limits != tc.want {
			t.Errorf("%s: %+v (%v), want %+v", tc.body, v.Limits, err, tc.want)
		}
	}
	for _, id := range []string{strings.Repeat("a", 64), "abcde"} {
		if resp, b := o.do("POST", "/admin/lanes/"+id+"/hold", "", ""); resp.StatusCode != 404 {
			t.Errorf("lane %s: %d %s, want 404: an ID of hex digits that no lane has", id, resp.StatusCode, b)
		}
	}
}

// TestLanesListNoRoutesUntilOneIsChanged: /lanes has "routes" only when
// an operator changed one.
func TestLanesListNoRoutesUntilOneIsChanged(t *testing.T) {
	o := newOpsHarness(t, nil)
	if b := o.mustDo("GET", "/lanes", ""); strings.Contains(b, `"routes"`) {
		t.Fatalf("/lanes lists routes though none changed: %s", b)
	}
	o.mustDo("POST", "/admin/routes/default/hold", "")
	if b := o.mustDo("GET", "/lanes", ""); !strings.Contains(b, `"routes"`) {
		t.Fatalf("/lanes lists no routes though one is held: %s", b)
	}
}
