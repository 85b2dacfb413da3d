package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/otlptest"
)

// TestRunExportsTracesAndFlushesThemAtStop: with OTEL_EXPORTER_OTLP_ENDPOINT
// set, the program says so at start, and a request's spans reach the
// receiver when it stops, though the batch delay is a minute: the drain's
// end flushes them.
func TestRunExportsTracesAndFlushesThemAtStop(t *testing.T) {
	rcv := otlptest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"usage":{"prompt_tokens":2,"completion_tokens":1}}`)
	}))
	defer up.Close()
	env := map[string]string{
		"LLMPROXY_ADDR": "127.0.0.1:0", "LLMPROXY_ADMIN_ADDR": "127.0.0.1:0", "LLMPROXY_UPSTREAM": up.URL,
		"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.URL(), "OTEL_BSP_SCHEDULE_DELAY": "60000", "OTEL_SERVICE_NAME": "llmproxy-test",
	}
	for k, v := range env {
		if strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, v) // the SDK reads the process' environment
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	exit := make(chan int, 1)
	var logs bytes.Buffer
	var mu sync.Mutex
	go func() {
		exit <- run(ctx, nil, nil, env, io.Discard, lockedWriter{&mu, &logs}, func(p, a string) { addrs <- [2]string{p, a} })
	}()
	a := <-addrs
	resp, err := http.Post("http://"+a[0]+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	time.Sleep(50 * time.Millisecond)
	if n := len(rcv.Spans()); n != 0 {
		t.Fatalf("%d spans exported before the stop, within the batch delay", n)
	}
	stop()
	if code := <-exit; code != 0 {
		t.Fatalf("exit %d", code)
	}
	spans := rcv.Spans()
	names := map[string]bool{}
	for _, s := range spans {
		names[s.Name] = true
		if s.Resource["service.name"] != "llmproxy-test" {
			t.Errorf("span %q of service %q", s.Name, s.Resource["service.name"])
		}
	}
	for _, want := range []string{"POST /*", "lane wait", "chat m"} {
		if !names[want] {
			t.Errorf("no span %q among %v after the stop", want, names)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "exporting traces over OTLP") || !strings.Contains(logs.String(), rcv.URL()) {
		t.Errorf("the log does not say where traces go:\n%s", logs.String())
	}
}

// TestTraceVariablesAreDocumented: -h, docs/traces.md and
// config.example.env each name every OpenTelemetry variable -h lists, and
// -h its default; docs/configuration.md names the endpoint.
func TestTraceVariablesAreDocumented(t *testing.T) {
	var help bytes.Buffer
	printUsage(&help)
	config, err := readFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(config, "| `OTEL_EXPORTER_OTLP_ENDPOINT` and the other standard `OTEL_*` |") {
		t.Error("docs/configuration.md lacks OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	doc, err := readFile("../../docs/traces.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := readFile("../../config.example.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range traceVariables {
		if !strings.Contains(help.String(), "  "+v.name+" ") || !strings.Contains(help.String(), "["+v.def+"]") {
			t.Errorf("-h lacks %s [%s]", v.name, v.def)
		}
		if !strings.Contains(doc, "| `"+v.name+"`") {
			t.Errorf("docs/traces.md's Variables lacks %s", v.name)
		}
		if !strings.Contains(example, "# "+v.name+"=") {
			t.Errorf("config.example.env lacks %s", v.name)
		}
	}
}
