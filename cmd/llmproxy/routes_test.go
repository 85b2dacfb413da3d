package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
)

// TestRouteSettingsAreRead: every per-route setting lands in its route's
// settings, for the default upstream and for named routes whose names
// hold '-' and '.'.
func TestRouteSettingsAreRead(t *testing.T) {
	c, err := loadConfig(map[string]string{
		"LLMPROXY_ROUTES":                         "anthropic=https://api.anthropic.com,my-ollama=http://127.0.0.1:11434,my=http://127.0.0.1:1,gw.v2=http://127.0.0.1:2",
		"LLMPROXY_ROUTE_DEFAULT_RPM":              "600",
		"LLMPROXY_ROUTE_DEFAULT_TPM":              "150000.5",
		"LLMPROXY_ROUTE_DEFAULT_MIN_GAP":          "50ms",
		"LLMPROXY_ROUTE_DEFAULT_PRIORITY":         "low",
		"LLMPROXY_ROUTE_ANTHROPIC_CONCURRENCY":    "16",
		"LLMPROXY_ROUTE_ANTHROPIC_LIMITS":         "start",
		"LLMPROXY_ROUTE_MY_OLLAMA_LOCAL":          "true",
		"LLMPROXY_ROUTE_MY_OLLAMA_LOCAL_FAIRNESS": "10s",
		"LLMPROXY_ROUTE_MY_OLLAMA_CONCURRENCY":    "4",
		"LLMPROXY_ROUTE_MY_RPM":                   "60",
		"LLMPROXY_ROUTE_GW_V2_LIMITS":             "Ceiling",
		"LLMPROXY_ROUTE_GW_V2_SHARED_LIMIT":       "credential",
		"LLMPROXY_GLOBAL_CONCURRENCY":             "64",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]proxy.RouteSettings{
		"anthropic": {Limits: limit.Limits{Concurrency: 16, Start: true}},
		"my-ollama": {Local: true, LocalFairness: 10 * time.Second, Limits: limit.Limits{Concurrency: 4}},
		"my":        {Limits: limit.Limits{RPM: 60}},
		"gw.v2":     {Limits: limit.Limits{PerCredential: true}},
	}
	for _, r := range c.routes {
		if r.Settings != want[r.Name] {
			t.Errorf("route %s: %+v, want %+v", r.Name, r.Settings, want[r.Name])
		}
	}
	wantDefault := proxy.RouteSettings{Priority: lanequeue.Low,
		Limits: limit.Limits{RPM: 600, TPM: 150000.5, MinGap: 50 * time.Millisecond}}
	if c.defaultRoute != wantDefault {
		t.Errorf("default route: %+v, want %+v", c.defaultRoute, wantDefault)
	}
	if c.GlobalConcurrency != 64 {
		t.Errorf("global concurrency %d", c.GlobalConcurrency)
	}
	if d := describeRoute(c.defaultRoute); d != "600 rpm, 150000.5 tpm, min gap 50ms, as ceiling, priority low" {
		t.Errorf("described as %q", d)
	}
	for _, r := range c.routes {
		if d := describeRoute(r.Settings); r.Name == "gw.v2" && d != "one limit per credential" {
			t.Errorf("gw.v2 described as %q", d)
		}
	}
}

// TestNoRouteVariablesNoSettings: without LLMPROXY_ROUTE_* nothing is
// configured and every limit is learned.
func TestNoRouteVariablesNoSettings(t *testing.T) {
	c, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if c.defaultRoute != (proxy.RouteSettings{}) || c.GlobalConcurrency != 0 {
		t.Errorf("default route %+v, global %d", c.defaultRoute, c.GlobalConcurrency)
	}
	for _, r := range c.routes {
		if r.Settings != (proxy.RouteSettings{}) {
			t.Errorf("route %s: %+v", r.Name, r.Settings)
		}
	}
}

// TestRouteSettingErrors: each bad variable stops the start with one line
// that names it and says what is wrong.
func TestRouteSettingErrors(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"LLMPROXY_ROUTE_FOO_RPM": "5"}, "LLMPROXY_ROUTE_FOO_RPM: no route of that name (LLMPROXY_ROUTE_<NAME>_<SETTING>; names: ANTHROPIC, DEFAULT)"},
		{map[string]string{"LLMPROXY_ROUTE_ANTHROPIC_RPMS": "5"}, "LLMPROXY_ROUTE_ANTHROPIC_RPMS: unknown setting RPMS (one of RPM, TPM, CONCURRENCY, MIN_GAP, LIMITS, SHARED_LIMIT, LOCAL, LOCAL_FAIRNESS, SERVICE_TIER, FLEX_FALLBACK, BUDGET_USD, PRIORITY)"},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_RPM": "fast"}, `LLMPROXY_ROUTE_DEFAULT_RPM: "fast" is not a number from 0.0001 to 1e+12`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_RPM": "0"}, `LLMPROXY_ROUTE_DEFAULT_RPM: "0" is not a number from 0.0001 to 1e+12`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_TPM": "-5"}, `LLMPROXY_ROUTE_DEFAULT_TPM: "-5" is not a number from 0.0001 to 1e+12`},
		// So slow a rate that its spacing overflowed and turned pacing off.
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_RPM": "1e-12"}, `LLMPROXY_ROUTE_DEFAULT_RPM: "1e-12" is not a number from 0.0001 to 1e+12`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_RPM": "0.0000999"}, `LLMPROXY_ROUTE_DEFAULT_RPM: "0.0000999" is not a number from 0.0001 to 1e+12`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_TPM": "1.0000001e12"}, `LLMPROXY_ROUTE_DEFAULT_TPM: "1.0000001e12" is not a number from 0.0001 to 1e+12`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_TPM": "NaN"}, `LLMPROXY_ROUTE_DEFAULT_TPM: "NaN" is not a number from 0.0001 to 1e+12`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_CONCURRENCY": "0"}, `LLMPROXY_ROUTE_DEFAULT_CONCURRENCY: "0" is not a whole number of at least 1`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_MIN_GAP": "100"}, `LLMPROXY_ROUTE_DEFAULT_MIN_GAP: "100" is not a positive duration such as 200ms`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_SHARED_LIMIT": "key"}, `LLMPROXY_ROUTE_DEFAULT_SHARED_LIMIT: "key" is not model or credential`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_LIMITS": "hard"}, `LLMPROXY_ROUTE_DEFAULT_LIMITS: "hard" is not ceiling or start`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_LOCAL": "yes"}, `LLMPROXY_ROUTE_DEFAULT_LOCAL: "yes" is not true or false`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_PRIORITY": "urgent"}, `LLMPROXY_ROUTE_DEFAULT_PRIORITY: "urgent" is not high or low`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_LOCAL": "true", "LLMPROXY_ROUTE_DEFAULT_LOCAL_FAIRNESS": "500ms"}, `LLMPROXY_ROUTE_DEFAULT_LOCAL_FAIRNESS: "500ms" is not a duration of at least 1s`},
		{map[string]string{"LLMPROXY_ROUTE_DEFAULT_LOCAL_FAIRNESS": "5s"}, "LLMPROXY_ROUTE_DEFAULT_LOCAL_FAIRNESS: set only for a local route (LLMPROXY_ROUTE_DEFAULT_LOCAL=true)"},
		{map[string]string{"LLMPROXY_ROUTES": "a-b=http://x,a.b=http://y"}, `LLMPROXY_ROUTES: route "a.b" and route "a-b" are both A_B in LLMPROXY_ROUTE_A_B_* variables; rename one`},
		{map[string]string{"LLMPROXY_ROUTES": "default=http://x"}, `LLMPROXY_ROUTES: route "default" and the default upstream are both DEFAULT in LLMPROXY_ROUTE_DEFAULT_* variables; rename one`},
		{map[string]string{"LLMPROXY_GLOBAL_CONCURRENCY": "-1"}, "LLMPROXY_GLOBAL_CONCURRENCY: -1 is below the minimum 0"},
	} {
		_, err := loadConfig(tc.env)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v:\n got %v\nwant %s", tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error of more than one line", tc.env)
		}
	}
}

// TestRouteVariablesAreNotUnknown: valid per-route variables get no
// "unknown variable" warning (bad ones stop the start instead).
func TestRouteVariablesAreNotUnknown(t *testing.T) {
	env := map[string]string{"LLMPROXY_ROUTE_DEFAULT_RPM": "600", "LLMPROXY_ROUTE_ANTHROPIC_LOCAL": "false", "LLMPROXY_GLOBAL_CONCURRENCY": "8"}
	if u := unknownVariables(env); len(u) != 0 {
		t.Errorf("unknown: %+v", u)
	}
}

// TestHelpListsRouteSettings: -h names every per-route setting with its
// default.
func TestHelpListsRouteSettings(t *testing.T) {
	var b bytes.Buffer
	printUsage(&b)
	for _, s := range routeSettings {
		if line := "LLMPROXY_ROUTE_<NAME>_" + s.name + " [" + s.def + "]"; !strings.Contains(b.String(), line) {
			t.Errorf("-h lacks %q", line)
		}
	}
	if !strings.Contains(b.String(), "LLMPROXY_GLOBAL_CONCURRENCY") {
		t.Error("-h lacks LLMPROXY_GLOBAL_CONCURRENCY")
	}
}

// TestProgramAppliesRouteSettings: the real program, started with a
// configured default route, a local route and a global cap, logs each
// route's settings and shows them on /lanes once a request went through.
func TestProgramAppliesRouteSettings(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	}))
	defer up.Close()
	pr := startProgram(t, map[string]string{
		"LLMPROXY_UPSTREAM":                 up.URL,
		"LLMPROXY_ROUTES":                   "ollama=" + up.URL,
		"LLMPROXY_ROUTE_DEFAULT_RPM":        "600",
		"LLMPROXY_ROUTE_DEFAULT_LIMITS":     "start",
		"LLMPROXY_ROUTE_OLLAMA_LOCAL":       "true",
		"LLMPROXY_ROUTE_OLLAMA_CONCURRENCY": "2",
		"LLMPROXY_GLOBAL_CONCURRENCY":       "16",
	})
	for _, path := range []string{"/v1/chat/completions", "/ollama/v1/chat/completions"} {
		resp, err := http.Post("http://"+pr.proxy+path, "application/json", strings.NewReader(`{"model":"llama"}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, want := range []string{`msg="route settings" route=DEFAULT settings="600 rpm, as start"`,
		`msg="route settings" route=ollama settings="concurrency 2, as ceiling, local (fairness 30s)"`} {
		if !strings.Contains(pr.logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, pr.logs)
		}
	}
	r := pr.lanes(t)
	if r.Global == nil || r.Global.Limit != 16 {
		t.Errorf("global: %+v", r.Global)
	}
	if len(r.LocalRoutes) != 1 || r.LocalRoutes[0].Route != "ollama" || r.LocalRoutes[0].Loaded != "llama" {
		t.Errorf("local routes: %+v", r.LocalRoutes)
	}
	seen := map[string]int{}
	for _, l := range r.Lanes {
		c := l.Configured
		seen[l.Route]++
		switch l.Route {
		case "":
			if c == nil || c.RPM != 600 || c.Mode != "start" {
				t.Errorf("default lane configured %+v", c)
			}
		case "ollama":
			if c == nil || c.Concurrency != 2 || c.Mode != "ceiling" || l.Concurrency != 2 {
				t.Errorf("ollama lane configured %+v, limit %d", c, l.Concurrency)
			}
		default:
			t.Errorf("a lane of route %q, which no request went to", l.Route)
		}
	}
	// One request went to each route: /lanes shows each its lane, so the
	// checks above looked at something.
	if seen[""] != 1 || seen["ollama"] != 1 {
		t.Errorf("/lanes lists lanes by route %v, want one of the default route and one of ollama", seen)
	}
}

// TestRatesAtTheirBoundsAreTaken: RPM and TPM take their bounds,
// limit.PerMinuteBounds, themselves.
func TestRatesAtTheirBoundsAreTaken(t *testing.T) {
	c, err := loadConfig(map[string]string{"LLMPROXY_ROUTE_DEFAULT_RPM": "0.0001", "LLMPROXY_ROUTE_DEFAULT_TPM": "1e12"})
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := limit.PerMinuteBounds(); c.defaultRoute.Limits.RPM != lo || c.defaultRoute.Limits.TPM != hi {
		t.Fatalf("%+v", c.defaultRoute.Limits)
	}
}
