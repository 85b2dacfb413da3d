package proxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStopAnswersQueuedAndWaitingRequests: with one request at a silent
// upstream and three queued behind it, Stop gives all four a 503
// shutting_down JSON answer with Retry-After at once, and a request that
// arrives after it the same; nothing holds a slot afterwards.
func TestStopAnswersQueuedAndWaitingRequests(t *testing.T) {
	hold := make(chan struct{})
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, `{}`)
	}), func(c *Config) { c.Lanes.Lane.Concurrency, c.Lanes.Lane.MaxConcurrency = 1, 1 })
	defer close(hold)
	type answer struct {
		status int
		code   string
		retry  string
	}
	answers := make(chan answer, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post("/v1/chat/completions", `{"model":"m"}`)
			answers <- answer{resp.StatusCode, decodeErr(t, resp).Error.Code, resp.Header.Get("Retry-After")}
		}()
	}
	waitFor(t, func() bool { s := laneState(h.proxy, "m"); return s.InFlight == 1 && s.Queued == 3 })
	h.proxy.Stop()
	wg.Wait()
	close(answers)
	for a := range answers {
		if a.status != 503 || a.code != "shutting_down" || a.retry != "1" {
			t.Errorf("after Stop: %+v, want 503 shutting_down, Retry-After 1", a)
		}
	}
	late := h.post("/v1/chat/completions", `{"model":"m"}`)
	if e := decodeErr(t, late); late.StatusCode != 503 || e.Error.Code != "shutting_down" {
		t.Fatalf("a request after Stop: %d %s", late.StatusCode, e.Error.Code)
	}
	laneIdle(t, h.proxy)
	if got := counterValue(t, h.proxy.cfg.Gatherer, "llmproxy_proxy_errors_total", map[string]string{"code": "shutting_down"}); got != 5 {
		t.Fatalf("shutting_down counted %v times, want 5", got)
	}
	if !strings.Contains(h.logs.String(), "outcome=proxy_error") {
		t.Fatal("the answers were not logged as the proxy's")
	}
}

// TestPacingPastTheDeadlineIsAnswered429AtOnce: after the upstream says its
// window is empty until a reset a minute away, a request with a 2 s deadline
// gets 429 wait_exceeds_budget within moments, with Retry-After at the
// reset and x-should-retry: false, instead of a 504 at its deadline.
func TestPacingPastTheDeadlineIsAnswered429AtOnce(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Limit-Requests", "1")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
		w.Header().Set("X-Ratelimit-Reset-Requests", "60s")
		fmt.Fprint(w, `{}`)
	}), nil)
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
	start := time.Now()
	resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Stainless-Timeout", "2")
	took := time.Since(start)
	e := decodeErr(t, resp)
	if resp.StatusCode != 429 || e.Error.Code != "wait_exceeds_budget" || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("got %d %s, x-should-retry %q", resp.StatusCode, e.Error.Code, resp.Header.Get("X-Should-Retry"))
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 55 || ra > 61 {
		t.Fatalf("Retry-After %q, want the reset about 60 s away", resp.Header.Get("Retry-After"))
	}
	if took >= 2*time.Second {
		t.Fatalf("the answer took %v: the deadline was sat out", took)
	}
}

// TestShutdownWinsOverWhatWaitingOrTheUpstreamFailed: once the proxy is
// stopping, a request that failed waiting or at the upstream is answered
// 503 shutting_down (its client retries elsewhere); one that failed by
// the client's own fault keeps its answer. Before the stop every kind
// keeps its own.
func TestShutdownWinsOverWhatWaitingOrTheUpstreamFailed(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[failKind]bool{
		failInternal: true, failQueueFull: true, failDeadline: true, failUnreachable: true, failWaitTooLong: true,
		failTooLarge: false, failBodyRead: false, failMethod: false, failAbsoluteURI: false, failBadPriority: false,
		failBadClient: false, failBadMaxWait: false, failBadRetry: false, failQuota: false, failAdminToken: false,
	} {
		for _, stopping := range []bool{false, true} {
			w := httptest.NewRecorder()
			status := p.writeFailure(w, "", fail(kind, "x"), stopping)
			shut := status == http.StatusServiceUnavailable && strings.Contains(w.Body.String(), "shutting_down")
			if shut != (want && stopping) || status != w.Code {
				t.Errorf("kind %d, stopping %v: answered %d %s; want shutting_down: %v", kind, stopping, status, w.Body.String(), want && stopping)
			}
		}
	}
}
