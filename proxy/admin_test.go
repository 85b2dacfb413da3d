package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/llmproxy/llmproxy/internal/buildinfo"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
)

const testAdminToken = "s3cret-admin-token"

// tokenAdmin serves the admin endpoints of a fresh proxy behind opts.
func tokenAdmin(t *testing.T, opts ...AdminOption) *httptest.Server {
	t.Helper()
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.AdminHandler(Health{}, opts...))
	t.Cleanup(srv.Close)
	return srv
}

// adminGet asks path with the given Authorization header (none when
// empty), without following redirects.
func adminGet(t *testing.T, c *http.Client, url, auth string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if c == nil {
		c = &http.Client{}
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// adminSend sends method to url with host as its Host (the URL's when
// empty), body and the header pairs hdr, and reads the answer's status
// and error.
func adminSend(t *testing.T, method, url, host, body string, hdr ...string) (int, apiError) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e apiError
	_ = json.Unmarshal([]byte(readAll(t, resp.Body)), &e)
	return resp.StatusCode, e
}

var guardedPaths = []string{"/lanes", "/lanes?history=1", "/metrics", "/ui", "/ui/", "/"}

// TestAdminTokenGuardsTheLaneViews: with a token set, /lanes, /metrics,
// /ui and the redirects to it answer 401 (OpenAI-format JSON, with
// WWW-Authenticate: Bearer) without the token or with a wrong one, and
// serve with the right one.
func TestAdminTokenGuardsTheLaneViews(t *testing.T) {
	srv := tokenAdmin(t, RequireToken(testAdminToken))
	for _, path := range guardedPaths {
		for _, auth := range []string{"", "Bearer wrong", "Bearer " + testAdminToken + "x", "Bearer " + testAdminToken[:5], "Basic " + testAdminToken, testAdminToken} {
			resp := adminGet(t, nil, srv.URL+path, auth)
			if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s with %q: %d %q, want 401 with WWW-Authenticate: Bearer", path, auth, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			var e apiError
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Code != "invalid_admin_token" || !strings.HasPrefix(e.Error.Message, "llmproxy: ") {
				t.Errorf("%s with %q: body %s, want an OpenAI-format error", path, auth, b)
			}
			if strings.Contains(string(b), testAdminToken) {
				t.Errorf("%s: the 401 shows the token", path)
			}
		}
		for _, auth := range []string{"Bearer " + testAdminToken, "bearer " + testAdminToken} {
			if resp := adminGet(t, nil, srv.URL+path, auth); resp.StatusCode >= 400 {
				t.Errorf("%s with the token (%q): %d", path, auth[:6], resp.StatusCode)
			}
		}
	}
}

// TestAdminTokenLeavesHealthOpen: load balancers and the container's
// HEALTHCHECK ask /healthz and /readyz without a token.
func TestAdminTokenLeavesHealthOpen(t *testing.T) {
	srv := tokenAdmin(t, RequireToken(testAdminToken))
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp := adminGet(t, nil, srv.URL+path, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("%s without a token: %d", path, resp.StatusCode)
		}
	}
}

// TestAdminWithoutTokenIsOpen: no token, no change.
func TestAdminWithoutTokenIsOpen(t *testing.T) {
	for _, opts := range [][]AdminOption{nil, {RequireToken("")}} {
		srv := tokenAdmin(t, opts...)
		for _, path := range guardedPaths {
			if resp := adminGet(t, nil, srv.URL+path, ""); resp.StatusCode >= 400 {
				t.Errorf("%s without a token configured: %d", path, resp.StatusCode)
			}
		}
	}
}

// TestAdminTokenLoginFromTheBrowser: /ui?token= sets an HttpOnly,
// SameSite=Strict cookie and sends the browser on to /ui without the
// token; with the cookie the page and the /lanes it polls are served. A
// wrong token sets nothing.
func TestAdminTokenLoginFromTheBrowser(t *testing.T) {
	srv := tokenAdmin(t, RequireToken(testAdminToken))
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}

	wrong := adminGet(t, browser, srv.URL+"/ui?token=wrong", "")
	if wrong.StatusCode != http.StatusUnauthorized || len(wrong.Cookies()) != 0 {
		t.Fatalf("wrong token: %d, cookies %v", wrong.StatusCode, wrong.Cookies())
	}

	login := adminGet(t, browser, srv.URL+"/ui?token="+testAdminToken, "")
	page, _ := io.ReadAll(login.Body)
	if login.StatusCode != http.StatusOK || !strings.Contains(string(page), `http-equiv="refresh" content="0;url=/ui"`) || strings.Contains(string(page), testAdminToken) {
		t.Fatalf("login: %d %s, want a page that moves on to /ui, without the token", login.StatusCode, page)
	}
	if rp := login.Header.Get("Referrer-Policy"); rp != "no-referrer" {
		t.Errorf("login answer Referrer-Policy %q: the token would leave in the Referer", rp)
	}
	if cc := login.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("login answer Cache-Control %q", cc)
	}
	cookies := login.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set %d cookies", len(cookies))
	}
	c := cookies[0]
	if c.Name != "llmproxy_admin" || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Errorf("cookie %+v, want llmproxy_admin, HttpOnly, SameSite=Strict, Path=/", c)
	}
	if c.Secure {
		t.Errorf("cookie Secure on a plain-HTTP admin listener: the browser would never send it back")
	}
	if strings.Contains(login.Header.Get("Set-Cookie"), testAdminToken) {
		t.Errorf("the cookie holds the token itself, not a digest of it")
	}

	for _, path := range []string{"/ui", "/lanes?history=1", "/metrics"} {
		if resp := adminGet(t, browser, srv.URL+path, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("%s with the cookie: %d", path, resp.StatusCode)
		}
	}
	forged := adminGet(t, nil, srv.URL+"/lanes", "")
	if forged.StatusCode != http.StatusUnauthorized {
		t.Errorf("/lanes without the cookie: %d", forged.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/lanes", nil)
	req.AddCookie(&http.Cookie{Name: "llmproxy_admin", Value: testAdminToken})
	if resp, err := testClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a cookie holding something else than the login's: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
}

// TestLanesShowConfiguredLimitsTheCapAndLocalRoutes: /lanes gives every
// lane of a route with configured limits its "configured" view, adds
// "global" with LLMPROXY_GLOBAL_CONCURRENCY and "local_routes" with a
// local route, and /metrics has their series; a proxy with none of them
// has none of it.
func TestLanesShowConfiguredLimitsTheCapAndLocalRoutes(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) })
	h := newHarness(t, up, func(c *Config) {
		c.Default.Limits = limit.Limits{RPM: 600, Concurrency: 8}
		c.GlobalConcurrency = 4
		c.Routes = append(c.Routes, Route{Name: "ollama", URL: c.Upstream, Settings: RouteSettings{Local: true}})
	})
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
	readAll(t, h.post("/ollama/v1/chat/completions", `{"model":"llama3"}`).Body)

	rec := httptest.NewRecorder()
	h.proxy.AdminHandler(Health{}).ServeHTTP(rec, localRequest("GET", "/lanes"))
	var page struct {
		Lanes       []lanequeue.State     `json:"lanes"`
		Global      *lanequeue.CapStats   `json:"global"`
		LocalRoutes []lanequeue.GateStats `json:"local_routes"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
		t.Fatal(err)
	}
	if g := page.Global; g == nil || g.Limit != 4 || g.InUse != 0 || g.Waiting != 0 || g.Most < 1 || g.Most > 4 {
		t.Errorf("/lanes global: %+v", page.Global)
	}
	if lr := page.LocalRoutes; len(lr) != 1 || lr[0].Route != "ollama" || lr[0].Loaded != "llama3" || lr[0].Loads != 1 || lr[0].Swaps != 0 || lr[0].FairnessSeconds <= 0 {
		t.Errorf("/lanes local_routes: %+v", lr)
	}
	if len(page.Lanes) != 2 {
		t.Fatalf("/lanes: %d lanes, want 2", len(page.Lanes))
	}
	for _, s := range page.Lanes {
		switch s.Route {
		case "":
			if c := s.Configured; c == nil || *c != (limit.ConfiguredView{RPM: 600, Concurrency: 8, Mode: "ceiling"}) {
				t.Errorf("default route's lane: configured %+v", c)
			}
		case "ollama":
			if s.Configured != nil {
				t.Errorf("local route's lane, which configures nothing: configured %+v", s.Configured)
			}
		}
		if s.QueuedLow != 0 {
			t.Errorf("lane %s: group_queued_low %d with nothing queued", s.ID, s.QueuedLow)
		}
	}

	fams, err := h.proxy.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// Keys are the name and the labels but lane, by label name.
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() != "lane" {
					key += " " + l.GetName() + "=" + l.GetValue()
				}
			}
			got[key] += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"llmproxy_lane_configured_limit kind=rpm":               600,
		"llmproxy_lane_configured_limit kind=concurrency":       8,
		"llmproxy_global_concurrency_limit":                     4,
		"llmproxy_global_concurrency_in_use":                    0,
		"llmproxy_global_concurrency_waiting_groups":            0,
		"llmproxy_local_model_swaps_total route=ollama":         0,
		"llmproxy_local_model_swaps_avoided_total route=ollama": 0,
		"llmproxy_local_model_waiting route=ollama":             0,
		"llmproxy_local_model_loaded model=llama3 route=ollama": 1,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (exported: %v), want %v", key, v, ok, want)
		}
	}
	for _, key := range []string{"llmproxy_lane_configured_limit kind=tpm", "llmproxy_lane_configured_limit kind=min_gap_seconds"} {
		if _, ok := got[key]; ok {
			t.Errorf("%s exported for a limit not configured", key)
		}
	}

	// None of it on a proxy without configured limits, cap or local route.
	plain := newHarness(t, up, nil)
	readAll(t, plain.post("/v1/chat/completions", `{"model":"m"}`).Body)
	rec = httptest.NewRecorder()
	plain.proxy.AdminHandler(Health{}).ServeHTTP(rec, localRequest("GET", "/lanes"))
	for _, field := range []string{`"global"`, `"local_routes"`, `"configured"`, `"group_queued_low"`} {
		if strings.Contains(rec.Body.String(), field) {
			t.Errorf("/lanes of a plain proxy has %s: %s", field, rec.Body.String())
		}
	}
	fams, err = plain.proxy.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if n := f.GetName(); strings.HasPrefix(n, "llmproxy_global_") || strings.HasPrefix(n, "llmproxy_local_model_") || n == "llmproxy_lane_configured_limit" {
			t.Errorf("a plain proxy exports %s", n)
		}
	}
}

// TestHealthzNamesTheBuild: /healthz says which build answers, adding the
// build's fields to {"status":"ok"}, and a proxy told nothing of its build
// answers as before.
func TestHealthzNamesTheBuild(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	build := buildinfo.Info{Version: "v1.2.0", Revision: "d795ecd518a7703f2521dc5d6d50489125b0c02e",
		Time: "2026-11-24T09:20:09Z", Modified: true, GoVersion: "go1.26.8"}
	for _, tc := range []struct {
		health Health
		want   map[string]any
	}{
		{Health{Build: build}, map[string]any{"status": "ok", "version": "v1.2.0", "revision": build.Revision,
			"time": build.Time, "modified": true, "goversion": "go1.26.8"}},
		{Health{}, map[string]any{"status": "ok"}},
	} {
		rec := httptest.NewRecorder()
		p.AdminHandler(tc.health).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		var got map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("/healthz = %v, want %v", got, tc.want)
		}
	}
}

// TestReadyzAnswers: ready and degraded are 200 with their word; not
// ready is the replies table's 503 not_ready, in the error shape every
// other proxy-made answer has, with the reason and Retry-After.
func TestReadyzAnswers(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	down := func(context.Context) error { return errors.New("draining") }
	redisDown := func() error { return errors.New("redis unreachable") }
	for _, tc := range []struct {
		name   string
		health Health
		status int
		body   string
	}{
		{"ready", Health{}, 200, `{"status":"ready"}`},
		{"degraded", Health{Degraded: redisDown}, 200, `{"status":"degraded","reason":"redis unreachable"}`},
		{"not ready", Health{Ready: down, Degraded: redisDown}, 503,
			`{"error":{"message":"llmproxy: not ready: draining","type":"server_error","param":null,"code":"not_ready"}}`},
	} {
		rec := httptest.NewRecorder()
		p.AdminHandler(tc.health).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		var got, want any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s: %v in %s", tc.name, err, rec.Body)
		}
		_ = json.Unmarshal([]byte(tc.body), &want)
		if rec.Code != tc.status || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, rec.Code, rec.Body, tc.status, tc.body)
		}
		if tc.status == 503 && rec.Header().Get("Retry-After") != "1" {
			t.Errorf("%s: Retry-After %q, want 1", tc.name, rec.Header().Get("Retry-After"))
		}
	}
}

// TestAdminUnknownPathsAnswerFromTheTable: a path the admin listener does
// not serve, or a method it does not answer, gets the replies table's
// JSON error like every other proxy-made answer, not chi's plain text.
func TestAdminUnknownPathsAnswerFromTheTable(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/nope", 404, "not_found"},
		{"POST", "/healthz", 405, "method_not_allowed"},
	} {
		rec := httptest.NewRecorder()
		p.AdminHandler(Health{}).ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		var body apiError
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tc.status || body.Error.Code != tc.code ||
			!strings.HasPrefix(body.Error.Message, "llmproxy: ") || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %q (%v), want %d with code %s", tc.method, tc.path, rec.Code, rec.Body, err, tc.status, tc.code)
		}
		if tc.status == 405 && rec.Header().Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", tc.method, tc.path)
		}
	}
}

// TestProfilesAreServedOnlyWhenAskedAndBehindTheToken: /debug/pprof/ is
// a 404 by default; WithProfiling serves the profiles, and behind a token
// only to a request that carries it.
func TestProfilesAreServedOnlyWhenAskedAndBehindTheToken(t *testing.T) {
	paths := []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/mutex?debug=1", "/debug/pprof/cmdline"}
	off := tokenAdmin(t)
	for _, path := range paths {
		if resp := adminGet(t, nil, off.URL+path, ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s without WithProfiling: %d, want 404", path, resp.StatusCode)
		}
	}
	on := tokenAdmin(t, RequireToken(testAdminToken), WithProfiling())
	for _, path := range paths {
		if resp := adminGet(t, nil, on.URL+path, ""); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", path, resp.StatusCode)
		}
		resp := adminGet(t, nil, on.URL+path, "Bearer "+testAdminToken)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || len(b) == 0 {
			t.Errorf("%s with the token: %d, %d bytes", path, resp.StatusCode, len(b))
		}
	}
}

// TestWithoutATokenOnlyLoopbackHostsAreAnswered is the DNS rebinding
// reproduction: a page whose name now resolves to 127.0.0.1 sends its
// requests with its own name as Host, and a matching Origin. Without a
// token, every endpoint but /healthz and /readyz refuses them (403,
// saying why and what to set), so the page can neither read the lanes
// and metrics nor slow or hold a route; requests addressed to localhost
// or a loopback address are served, and with a token the Host is not
// what decides.
func TestWithoutATokenOnlyLoopbackHostsAreAnswered(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := loopbackAdmin(t, p, WithProfiling())
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	send := func(method, path, host, body string, hdr ...string) (int, apiError) {
		t.Helper()
		return adminSend(t, method, srv.URL+path, host, body, hdr...)
	}
	evil := "evil.example:" + port
	page := []string{"Origin", "http://" + evil, "Sec-Fetch-Site", "same-origin"}
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/lanes", ""}, {"GET", "/metrics", ""}, {"GET", "/ui", ""}, {"GET", "/", ""},
		{"GET", "/admin/routes", ""}, {"GET", "/admin/routes/default/limits", ""},
		{"PUT", "/admin/routes/default/limits", `{"rpm": 0.001}`},
		{"POST", "/admin/routes/default/hold", ""},
		{"GET", "/debug/pprof/", ""},
	} {
		for _, host := range []string{evil, "evil.example", "localhost.evil.example:" + port, "127.0.0.1.nip.io:" + port, "192.0.2.1:" + port} {
			status, e := send(tc.method, tc.path, host, tc.body, page...)
			if status != http.StatusForbidden || e.Error.Code != "admin_host_refused" ||
				!strings.Contains(e.Error.Message, "LLMPROXY_ADMIN_TOKEN") || !strings.Contains(e.Error.Message, "localhost") {
				t.Errorf("%s %s with Host %s: %d %+v, want 403 admin_host_refused saying why", tc.method, tc.path, host, status, e.Error)
			}
		}
	}
	// Nothing the page sent was made.
	p.ops.mu.Lock()
	changed := len(p.ops.routes)
	p.ops.mu.Unlock()
	if changed != 0 {
		t.Fatalf("a refused request changed a route: %d changed", changed)
	}
	for _, host := range []string{"localhost:" + port, "LOCALHOST", "127.0.0.1:" + port, "127.9.9.9:" + port, "[::1]:" + port} {
		for _, path := range []string{"/lanes", "/metrics", "/admin/routes"} {
			if status, e := send("GET", path, host, ""); status != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d %+v, want 200", path, host, status, e.Error)
			}
		}
	}
	if status, e := send("POST", "/admin/routes/default/hold", "localhost:"+port, ""); status != http.StatusOK {
		t.Errorf("a hold addressed to localhost: %d %+v", status, e.Error)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, _ := send("GET", path, evil, "", page...); status != http.StatusOK {
			t.Errorf("%s with Host %s: %d, want 200 (probes come by any name)", path, evil, status)
		}
	}

	// With a token the Host is not checked: the token is the proof.
	guarded := tokenAdmin(t, RequireToken(testAdminToken))
	req, _ := http.NewRequest("GET", guarded.URL+"/lanes", nil)
	req.Host = "llmproxy-admin.internal:9090"
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/lanes with the token by another name: %d, want 200", resp.StatusCode)
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "LocalHost:9090": true, "127.0.0.1": true, "127.0.0.1:9090": true, "127.255.0.1:1": true,
		"[::1]:9090": true, "[::1]": true, "::1": true, "[::ffff:127.0.0.1]:80": true,
		"": false, ":9090": false, "0.0.0.0:9090": false, "[::]:9090": false, "[]": false, "[": false,
		"evil.example": false, "evil.example:9090": false, "localhost.evil.example": false, "localhost.": false,
		"127.0.0.1.nip.io": false, "128.0.0.1": false, "10.0.0.1:9090": false, "[2001:db8::1]:9090": false,
	} {
		if got := LoopbackHost(host); got != want {
			t.Errorf("LoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// TestWithoutATokenProfilesNeedALoopbackListener: LLMPROXY_PPROF on an
// admin listener bound elsewhere and without a token serves no profile;
// on loopback, or behind the token, it does.
func TestWithoutATokenProfilesNeedALoopbackListener(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		opts []AdminOption
		auth string
		want int
	}{
		{[]AdminOption{WithProfiling(), ListenerAddr(":9090")}, "", http.StatusNotFound},
		{[]AdminOption{WithProfiling(), ListenerAddr("0.0.0.0:9090")}, "", http.StatusNotFound},
		{[]AdminOption{WithProfiling()}, "", http.StatusNotFound},
		{[]AdminOption{WithProfiling(), ListenerAddr("127.0.0.1:9090")}, "", http.StatusOK},
		{[]AdminOption{WithProfiling(), ListenerAddr(":9090"), RequireToken(testAdminToken)}, "Bearer " + testAdminToken, http.StatusOK},
	} {
		req := localRequest("GET", "/debug/pprof/cmdline")
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		rec := httptest.NewRecorder()
		p.AdminHandler(Health{}, tc.opts...).ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("case %d: %d, want %d", i, rec.Code, tc.want)
		}
	}
	for _, tc := range []struct {
		token bool
		addr  string
		want  bool
	}{{false, "127.0.0.1:9090", true}, {false, ":9090", false}, {true, ":9090", true}, {true, "127.0.0.1:1", true}} {
		if got := profilesServed(tc.token, tc.addr); got != tc.want {
			t.Errorf("profilesServed(%v, %q) = %v", tc.token, tc.addr, got)
		}
	}
}
