package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/state"
)

// TestStatusShowsTheLanesOfARunningProxy runs the proxy, sends one request
// through it, and checks that `llmproxy status` prints that request's lane,
// model and hashed key, and never the key itself.
func TestStatusShowsTheLanesOfARunningProxy(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer up.Close()
	ctx, stop := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	exit := make(chan int, 1)
	var mu sync.Mutex
	var logs bytes.Buffer
	go func() {
		exit <- run(ctx, nil, nil, map[string]string{
			"LLMPROXY_ADDR": "127.0.0.1:0", "LLMPROXY_ADMIN_ADDR": "127.0.0.1:0", "LLMPROXY_UPSTREAM": up.URL,
		}, io.Discard, lockedWriter{&mu, &logs}, func(p, a string) { addrs <- [2]string{p, a} })
	}()
	defer func() {
		stop()
		<-exit
	}()
	a := <-addrs
	req, _ := http.NewRequest("POST", "http://"+a[0]+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-status"}`))
	req.Header.Set("Authorization", "Bearer sk-status-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	lane := resp.Header.Get("X-Llmproxy-Lane")
	resp.Body.Close()

	var out, errOut bytes.Buffer
	if code := run(ctx, nil, []string{"status"}, map[string]string{"LLMPROXY_ADMIN_ADDR": a[1]}, &out, &errOut, nil); code != 0 {
		t.Fatalf("status exited %d: %s", code, errOut.String())
	}
	got := out.String()
	for _, want := range []string{lane, "gpt-status", "/v1/chat/completions", "redis: off", "1 lanes"} {
		if !strings.Contains(got, want) {
			t.Errorf("status output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "sk-status-secret") {
		t.Fatal("status printed the API key")
	}
}

func TestStatusWatchRefreshesUntilStopped(t *testing.T) {
	var calls int
	var mu sync.Mutex
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		fmt.Fprint(w, `{"redis":"ok","lanes":[{"id":"abc123","path":"/v1/x","queued":4,"requests_per_second":2,"drain_seconds":2.2,"outcomes":{"ok":7,"upstream_cut":1,"client_gone":2}}]}`)
	}))
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	code := status(ctx, []string{"-w", "-interval", "20ms"}, admin.Listener.Addr().String(), "", &out, io.Discard)
	mu.Lock()
	n := calls
	mu.Unlock()
	if code != 0 || n < 2 {
		t.Fatalf("exit %d after %d refreshes, want 0 and several", code, n)
	}
	if !strings.Contains(out.String(), "\x1b[2J") {
		t.Fatalf("want in-place refreshes:\n%q", out.String())
	}
	// The proxy's drain estimate, rounded; 7 done; 1 failed (the client
	// that left is no failure).
	if !regexp.MustCompile(`abc123 .* 4 +0 +0 +7 +1 +0 +2 .* 2s `).MatchString(out.String()) {
		t.Fatalf("want 4 queued, 7 done, 1 failed, drains in 2s:\n%q", out.String())
	}
}

func TestStatusFailsWhenTheProxyCannotBeReached(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	var errOut bytes.Buffer
	if code := run(context.Background(), nil, []string{"status", "-admin", addr}, nil, io.Discard, &errOut, nil); code == 0 {
		t.Fatal("status exited 0 with nothing listening")
	}
	if !strings.Contains(errOut.String(), "cannot reach") {
		t.Fatalf("stderr: %q", errOut.String())
	}
}

// TestStatusSendsTheAdminToken: with LLMPROXY_ADMIN_TOKEN set, the admin
// listener refuses /lanes without it, `llmproxy status` sends it, and the
// container's healthcheck still needs none.
func TestStatusSendsTheAdminToken(t *testing.T) {
	const token = "status-admin-token"
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t), "LLMPROXY_ADMIN_TOKEN": token})
	if a := post(pr.proxy, "gpt-token"); a.status != http.StatusOK {
		t.Fatalf("request through the proxy: %v", a)
	}
	resp, err := http.Get("http://" + pr.admin + "/lanes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/lanes without the token: %d, want 401", resp.StatusCode)
	}

	var out, errOut bytes.Buffer
	if code := run(context.Background(), nil, []string{"status"}, map[string]string{"LLMPROXY_ADMIN_ADDR": pr.admin, "LLMPROXY_ADMIN_TOKEN": token}, &out, &errOut, nil); code != 0 {
		t.Fatalf("status with the token exited %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "gpt-token") {
		t.Errorf("status output lacks the lane:\n%s", out.String())
	}
	errOut.Reset()
	if code := run(context.Background(), nil, []string{"status"}, map[string]string{"LLMPROXY_ADMIN_ADDR": pr.admin}, io.Discard, &errOut, nil); code != 1 || !strings.Contains(errOut.String(), "LLMPROXY_ADMIN_TOKEN") {
		t.Errorf("status without the token: exit %d, %q; want 1 and a hint at LLMPROXY_ADMIN_TOKEN", code, errOut.String())
	}
	if code := run(context.Background(), nil, []string{"healthcheck"}, map[string]string{"LLMPROXY_ADMIN_ADDR": pr.admin}, io.Discard, io.Discard, nil); code != 0 {
		t.Errorf("healthcheck without the token: exit %d", code)
	}
	if strings.Contains(pr.logs.String(), token) {
		t.Errorf("the token was logged:\n%s", pr.logs.String())
	}
}

// TestStatusSaysWhatTheLaneBelievesAndWhy: the BELIEVES column tells the
// rate the lane's group learned and where from, the concurrency limit
// when the upstream showed it, and which of the two binds.
func TestStatusSaysWhatTheLaneBelievesAndWhy(t *testing.T) {
	for _, c := range []struct {
		name string
		s    lanequeue.State
		want string
	}{
		{"nothing learned", lanequeue.State{Concurrency: 8}, ""},
		{"headers", lanequeue.State{Concurrency: 8, Learned: "headers", RateFrom: "headers", RequestsPerSecond: 9.994},
			"rate 9.99/s from headers"},
		{"headers corrected", lanequeue.State{Concurrency: 8, Learned: "headers", RateFrom: "headers", RequestsPerSecond: 10, Corrected: true},
			"rate 10/s from headers, corrected by refusals"},
		{"headers, tokens only", lanequeue.State{Learned: "headers", RateFrom: "headers", TokensPerSecond: 1500},
			"tokens 1500/s from headers"},
		{"admitted rate", lanequeue.State{Concurrency: 8, Learned: "refusals", RateFrom: "admitted rate", AdmittedRate: 19.62, RequestsPerSecond: 19.03, Bound: "rate"},
			"rate 19.6/s learned from admitted rate, bound: rate"},
		{"hint", lanequeue.State{Learned: "refusals", RateFrom: "hint", AdmittedRate: 5, Bound: "rate"},
			"rate 5/s learned from hint, bound: rate"},
		{"probe", lanequeue.State{Learned: "refusals", RateFrom: "probe", AdmittedRate: 22, Bound: "rate"},
			"rate 22/s learned from probe, bound: rate"},
		{"refusals at a level", lanequeue.State{Concurrency: 8, Learned: "refusals", RateFrom: "admitted rate", AdmittedRate: 40,
			ConcurrencyFrom: "refusals at 8 in flight", Bound: "concurrency"},
			"rate 40/s learned from admitted rate, concurrency 8 learned from refusals at 8 in flight, bound: concurrency"},
		{"words", lanequeue.State{Concurrency: 4, ConcurrencyFrom: "words", Bound: "concurrency"},
			"concurrency 4 named by the upstream, bound: concurrency"},
		{"an older proxy", lanequeue.State{Learned: "refusals", RequestsPerSecond: 3}, "rate 3/s learned from refusals"},
		{"a window", lanequeue.State{Concurrency: 8, Shape: "window of 200 per 10s, learned from refusals whose waits end at one boundary"},
			"window of 200 per 10s, learned from refusals whose waits end at one boundary"},
		{"a shared limit", lanequeue.State{Learned: "headers", RateFrom: "headers", RequestsPerSecond: 20,
			SharesLimitWith: []string{"gpt-4o", "gpt-4.1"}, SharedBecause: "headers move together"},
			"rate 20/s from headers, shares a limit with gpt-4o, gpt-4.1 (headers move together)"},
		{"a limit shared by many", lanequeue.State{SharesLimitWith: []string{"a", "b", "c", "d"}, SharedBecause: "configured"},
			"shares a limit with 4 other models (configured)"},
		{"some named, more counted", lanequeue.State{SharesLimitWith: []string{"a", "b"}, SharesLimitWithMore: 2, SharedBecause: "configured"},
			"shares a limit with 4 other models (configured)"},
		{"three named, none counted", lanequeue.State{SharesLimitWith: []string{"a", "b", "c"}, SharedBecause: "configured"},
			"shares a limit with a, b, c (configured)"},
	} {
		if got := believes(c.s); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}

	// On the table, from what /lanes answers.
	var out bytes.Buffer
	printStatus(&out, lanesReply{Lanes: []lanequeue.State{{
		ID: "beef00000001", Path: "/v1/chat/completions", Model: "silent", Concurrency: 8, InFlight: 8,
		Learned: "refusals", RequestsPerSecond: 19.03, Bound: "concurrency", RateFrom: "admitted rate",
		AdmittedRate: 19.62, ConcurrencyFrom: "refusals at 8 in flight",
	}}}, "http://127.0.0.1:9090", time.Unix(0, 0))
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 4 || !strings.HasSuffix(strings.TrimSpace(lines[2]), "BELIEVES") {
		t.Fatalf("want a BELIEVES column last:\n%s", out.String())
	}
	want := "rate 19.6/s learned from admitted rate, concurrency 8 learned from refusals at 8 in flight, bound: concurrency"
	if !strings.HasPrefix(lines[3], "beef00000001 ") || !strings.HasSuffix(strings.TrimSpace(lines[3]), want) {
		t.Fatalf("the lane's line does not end with %q:\n%s", want, out.String())
	}
	t.Log("\n" + out.String())
}

// TestStatusShowsConfiguredLimitsTheCapAndLocalRoutes: what a route
// configures is a column beside what the lane believes; the global cap and
// each local route get a line above the table.
func TestStatusShowsConfiguredLimitsTheCapAndLocalRoutes(t *testing.T) {
	var out bytes.Buffer
	printStatus(&out, lanesReply{
		Lanes: []lanequeue.State{{ID: "beef00000002", Path: "/v1/chat/completions", Model: "llama", Concurrency: 4, Queued: 12, QueuedLow: 10,
			Configured: &limit.ConfiguredView{RPM: 600, Concurrency: 4, MinGapSecs: 0.05, Mode: "ceiling"}}},
		Global:      &lanequeue.CapStats{Limit: 64, InUse: 3, Waiting: 2, Most: 64},
		LocalRoutes: []lanequeue.GateStats{{Route: "ollama", Loaded: "llama", Swaps: 4, SwapsAvoided: 120, Waiting: 2}},
	}, "http://127.0.0.1:9090", time.Unix(0, 0))
	s := out.String()
	for _, want := range []string{
		"global cap: 3/64 in use, 2 groups waiting, at most 64 so far\n",
		"local route /ollama: llama loaded, 0 in flight, 2 waiting for their model, 4 swaps, 120 avoided\n",
		"CONFIGURED", "600rpm c4 gap50ms ceiling", "12 (10 low)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("status lacks %q:\n%s", want, s)
		}
	}
	if c := configured(lanequeue.State{Configured: &limit.ConfiguredView{TPM: 150000, Mode: "replaced"}}); c != "150000tpm replaced" {
		t.Errorf("configured = %q", c)
	}
	t.Log("\n" + s)
}

// TestStatusNotesWhatALaneHasBeyondItsRow: under the table, a lane with a
// spent quota, WebSocket sessions, a share of the shared limits while
// Redis is away, or named clients gets one line saying so; a lane with
// none of these gets none.
func TestStatusNotesWhatALaneHasBeyondItsRow(t *testing.T) {
	var out bytes.Buffer
	printStatus(&out, lanesReply{Redis: "degraded", Lanes: []lanequeue.State{
		{ID: "beef00000001", Path: "/v1/chat/completions", Model: "a", Queued: 12, Quota: "quota spent until 00:00 PT", Sessions: 2,
			Share:   &limit.ShareView{Replicas: 3, Concurrency: 2, RequestsPerSecond: 3.333, TokensPerSecond: 1000},
			Clients: []lanequeue.ClientState{{Name: "big-eval", Queued: 10, Dispatched: 480}, {Name: "check", Queued: 2, Dispatched: 1}}},
		{ID: "beef00000002", Path: "/v1/chat/completions", Model: "b"},
	}}, "http://127.0.0.1:9090", time.Unix(0, 0))
	want := "beef00000001: quota spent until 00:00 PT; 2 WebSocket sessions; " +
		"Redis away: this replica keeps to 1/3 of the shared limits, concurrency 2, 3.33/s, tokens 1000/s; " +
		"clients: big-eval 10 queued, 480 sent; check 2 queued, 1 sent\n"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("no note line %q in:\n%s", want, out.String())
	}
	if strings.Contains(out.String(), "beef00000002:") {
		t.Fatalf("a lane with nothing to note got a line:\n%s", out.String())
	}
	if got := notes(lanequeue.State{Sessions: 1}); got != "1 WebSocket session" {
		t.Fatalf("one session: %q", got)
	}
}

// TestStatusShowsTheRunsAndWhatTheySpent: a run's row, with its cost by
// tier and its budget, and the lanes' spend, from a real proxy's /lanes.
func TestStatusShowsTheRunsAndWhatTheySpent(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"service_tier":"flex","usage":{"prompt_tokens":1000000,"completion_tokens":0}}`)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	prices, _ := cost.Parse([]byte(`{"models":{"m":{"standard":{"input":1,"output":1},"flex":{"input":0.5,"output":0.5}}}}`))
	p, err := proxy.New(proxy.Config{Upstream: u, Prices: prices})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":1}`))
	req.Header.Set("X-Llmproxy-Run", "eval-7")
	req.Header.Set("X-Llmproxy-Budget-Usd", "2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	admin := httptest.NewServer(p.AdminHandler(proxy.Health{}))
	defer admin.Close()
	r, err := fetchLanes(context.Background(), admin.Client(), admin.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printStatus(&out, r, admin.URL, time.Now())
	s := out.String()
	for _, want := range []string{"spend by lane: ", " $0.5\n", "RUN", "eval-7", "$0.5", "flex $0.5", "$2"} {
		if !strings.Contains(s, want) {
			t.Errorf("status lacks %q:\n%s", want, s)
		}
	}
}

func TestStatusShowsTheJournalsSize(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"ok":true}`) }))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	j, _ := st.Journal(0, 64<<20)
	p, err := proxy.New(proxy.Config{Upstream: u, Journal: j, JournalMode: "record"})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()
	resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	for deadline := time.Now().Add(5 * time.Second); j.Stats().Entries == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	admin := httptest.NewServer(p.AdminHandler(proxy.Health{}))
	defer admin.Close()
	r, err := fetchLanes(context.Background(), admin.Client(), admin.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printStatus(&out, r, admin.URL, time.Now())
	if s := out.String(); !strings.Contains(s, "journal: 1 answers") || !strings.Contains(s, "of 64.0 MiB") {
		t.Fatalf("status says:\n%s", s)
	}
}
