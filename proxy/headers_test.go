package proxy

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestHopByHopHeadersNeverReachTheClient: the upstream's hop-by-hop
// headers, and those its Connection header names, stay between the proxy
// and the upstream; its other headers reach the client.
func TestHopByHopHeadersNeverReachTheClient(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Connection", "X-Upstream-Hop, X-Other-Hop")
		hd.Set("X-Upstream-Hop", "between proxy and upstream")
		hd.Set("X-Other-Hop", "also")
		hd.Set("Keep-Alive", "timeout=5")
		hd.Set("Proxy-Authenticate", `Basic realm="upstream"`)
		hd.Set("Proxy-Connection", "keep-alive")
		hd.Set("Upgrade", "h2c")
		hd.Set("X-End-To-End", "kept")
		fmt.Fprint(w, `{}`)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	for _, name := range []string{"X-Upstream-Hop", "X-Other-Hop", "Keep-Alive", "Proxy-Authenticate", "Proxy-Connection", "Upgrade"} {
		if v := resp.Header.Get(name); v != "" {
			t.Errorf("hop-by-hop header %s: %q reached the client", name, v)
		}
	}
	if c := resp.Header.Get("Connection"); strings.Contains(strings.ToLower(c), "hop") {
		t.Errorf("the upstream's Connection header %q reached the client", c)
	}
	if resp.Header.Get("X-End-To-End") != "kept" {
		t.Error("an end-to-end header was dropped")
	}
}

// TestRequestIDsAreRandomHex: every request id is 16 lower-case hex digits
// and ids do not repeat, so the ids of replicas can be told apart.
func TestRequestIDsAreRandomHex(t *testing.T) {
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := newRequestID()
		if !hex16.MatchString(id) {
			t.Fatalf("request id %q is not 16 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("request id %q repeated within 1000", id)
		}
		seen[id] = true
	}
}

// TestTheProxysOwnHeadersWinOverTheUpstreams: an upstream (or a proxy in
// front of it) that sends x-llmproxy-* headers cannot set what the client
// reads as the lane, queue time or retries.
func TestTheProxysOwnHeadersWinOverTheUpstreams(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("X-Llmproxy-Lane", "forged")
		w.Header().Set("X-Llmproxy-Retries", "99")
		fmt.Fprint(w, `{}`)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	if l := resp.Header.Get("X-Llmproxy-Lane"); l != laneState(h.proxy, "m").ID {
		t.Errorf("lane header %q, want the proxy's lane %s", l, laneState(h.proxy, "m").ID)
	}
	if r := resp.Header.Get("X-Llmproxy-Retries"); r != "0" {
		t.Errorf("retries header %q, want 0", r)
	}
}

// TestRetryAfterStaysOnAnswersThatAreNotSuccesses: the upstream's
// Retry-After is taken off 2xx answers only.
func TestRetryAfterStaysOnAnswersThatAreNotSuccesses(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("Retry-After", "7")
		if strings.HasSuffix(r.URL.Path, "/300") {
			w.WriteHeader(300)
		}
		fmt.Fprint(w, `{}`)
	}), nil)
	ok := h.post("/v1/200", `{"model":"m"}`)
	readAll(t, ok.Body)
	if ok.StatusCode != 200 || ok.Header.Get("Retry-After") != "" {
		t.Errorf("200: Retry-After %q, want none", ok.Header.Get("Retry-After"))
	}
	multi := h.post("/v1/300", `{"model":"m"}`)
	readAll(t, multi.Body)
	if multi.StatusCode != 300 || multi.Header.Get("Retry-After") != "7" {
		t.Errorf("%d: Retry-After %q, want 7 passed on", multi.StatusCode, multi.Header.Get("Retry-After"))
	}
}
