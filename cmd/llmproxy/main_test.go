package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestDefaultsNeedNoConfiguration(t *testing.T) {
	c, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || c.AdminAddr != "127.0.0.1:9090" || c.upstreamURL.String() != "https://api.openai.com" {
		t.Fatalf("defaults: %+v", c)
	}
	if len(c.routes) != 1 || c.routes[0].Name != "anthropic" || c.routes[0].URL.String() != "https://api.anthropic.com" {
		t.Fatalf("routes: %+v", c.routes)
	}
}

// TestEmptyTurnsTheAdminListenerAndTheRoutesOff: an empty
// LLMPROXY_ADMIN_ADDR or LLMPROXY_ROUTES is a setting, not their
// default.
func TestEmptyTurnsTheAdminListenerAndTheRoutesOff(t *testing.T) {
	c, err := loadConfig(map[string]string{"LLMPROXY_ADMIN_ADDR": "", "LLMPROXY_ROUTES": ""})
	if err != nil {
		t.Fatal(err)
	}
	if c.AdminAddr != "" || len(c.routes) != 0 {
		t.Fatalf("admin %q, routes %+v; want none of either", c.AdminAddr, c.routes)
	}
}

func TestBadValueNamesTheVariable(t *testing.T) {
	for _, tc := range []struct{ env, val string }{
		{"LLMPROXY_MAX_WAIT", "soon"},
		{"LLMPROXY_MAX_WAIT", "-1s"},
		{"LLMPROXY_MAX_RETRIES", "many"},
		{"LLMPROXY_MAX_RETRIES", "-1"},
		{"LLMPROXY_UPSTREAM", "ftp://x"},
		{"LLMPROXY_UPSTREAM", "https://user:pw@x"},
		{"LLMPROXY_ROUTES", "anthropic"},
		{"LLMPROXY_ROUTES", "a*=https://x"},
		{"LLMPROXY_ROUTES", "{x}=https://x"},
		{"LLMPROXY_ROUTES", "a=https://x,a=https://y"},
		{"LLMPROXY_ADDR", "8080"},
		{"LLMPROXY_LOG_LEVEL", "loud"},
		{"LLMPROXY_LOG_FORMAT", "xml"},
		{"LLMPROXY_CLIENT_RATELIMIT_HEADERS", "rewrite"},
		{"LLMPROXY_LANE_CONCURRENCY", "0"},
		{"LLMPROXY_MAX_BODY_BYTES", "0"},
		{"LLMPROXY_REDIS_LEASE_TTL", "500ms"},
		{"LLMPROXY_REDIS_SLOW", "-1ms"},
		{"LLMPROXY_REDIS_URL", "http://u:pw@127.0.0.1"},
		{"LLMPROXY_ROUTE_NOPE_RPM", "600"},
		{"LLMPROXY_ROUTE_DEFAULT_MIN_GAP", "soon"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"},
		{"OTEL_TRACES_EXPORTER", "zipkin"},
		{"LLMPROXY_GLOBAL_CONCURRENCY", "-3"},
		{"LLMPROXY_MIN_BODY_RATE", "-1"},
	} {
		t.Run(tc.env+"="+tc.val, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(context.Background(), nil, nil, map[string]string{tc.env: tc.val}, io.Discard, &stderr, nil)
			out := stderr.String()
			if code == 0 || !strings.Contains(out, tc.env) || strings.Count(out, "\n") != 1 {
				t.Fatalf("exit %d, stderr %q: want one line naming %s", code, out, tc.env)
			}
		})
	}
}

func TestHelpListsEveryVariable(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), nil, []string{"-h"}, nil, &out, io.Discard, nil); code != 0 {
		t.Fatalf("exit %d", code)
	}
	typ := reflect.TypeOf(config{})
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Tag.Get("env")
		if name == "" {
			continue
		}
		if !strings.Contains(out.String(), "LLMPROXY_"+name+" ") {
			t.Errorf("-h lacks LLMPROXY_%s", name)
		}
		if def := typ.Field(i).Tag.Get("envDefault"); !strings.Contains(out.String(), "["+def+"]") {
			t.Errorf("-h lacks the default of LLMPROXY_%s", name)
		}
	}
}

func TestExampleEnvDocumentsEveryVariable(t *testing.T) {
	b, err := readFile("../../config.example.env")
	if err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeOf(config{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		if f.Tag.Get("env") == "" {
			continue
		}
		line := "LLMPROXY_" + f.Tag.Get("env") + "=" + f.Tag.Get("envDefault")
		if !strings.Contains(b, line) {
			t.Errorf("config.example.env lacks %q", line)
		}
	}
}

// TestRunServesAndDrainsOnStop starts the real program on free ports, sends
// a request that is still in flight when the stop signal comes, and checks
// it completes and the program exits 0.
func TestRunServesAndDrainsOnStop(t *testing.T) {
	inUpstream := make(chan struct{})
	finish := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inUpstream)
		<-finish
		fmt.Fprint(w, "done")
	}))
	defer up.Close()
	ctx, stop := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	exit := make(chan int, 1)
	var logs bytes.Buffer
	var mu sync.Mutex
	go func() {
		exit <- run(ctx, nil, nil, map[string]string{
			"LLMPROXY_ADDR": "127.0.0.1:0", "LLMPROXY_ADMIN_ADDR": "127.0.0.1:0",
			"LLMPROXY_UPSTREAM": up.URL, "LLMPROXY_SHUTDOWN_TIMEOUT": "10s",
		}, io.Discard, lockedWriter{&mu, &logs}, func(p, a string) { addrs <- [2]string{p, a} })
	}()
	a := <-addrs
	resp, err := http.Get("http://" + a[1] + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v", err)
	}
	resp.Body.Close()

	got := make(chan string, 1)
	go func() {
		resp, err := http.Post("http://"+a[0]+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- string(b)
	}()
	<-inUpstream
	stop()
	time.Sleep(50 * time.Millisecond) // let Shutdown close the listener
	// The admin listener stays up while draining, and says so.
	if resp, err := http.Get("http://" + a[1] + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz while draining: %v %v, want 503", resp, err)
	} else {
		resp.Body.Close()
	}
	if _, err := http.Get("http://" + a[0] + "/v1/models"); err == nil {
		t.Error("new connections still accepted after the stop signal")
	}
	close(finish)
	if b := <-got; b != "done" {
		t.Fatalf("in-flight request got %q", b)
	}
	if code := <-exit; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func readFile(name string) (string, error) {
	b, err := os.ReadFile(name)
	return string(b), err
}
