package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// oneLaneOfOne is a proxy whose lane sends one request at a time, so that
// of four requests one is at the upstream and three wait in the queue.
func oneLaneOfOne(upstream, shutdownTimeout string) map[string]string {
	return map[string]string{
		"LLMPROXY_UPSTREAM": upstream, "LLMPROXY_SHUTDOWN_TIMEOUT": shutdownTimeout,
		"LLMPROXY_LANE_CONCURRENCY": "1", "LLMPROXY_LANE_MAX_CONCURRENCY": "1",
	}
}

// sendFour sends four requests to one lane and returns once one is at the
// upstream and three are queued.
func sendFour(t *testing.T, pr *program) <-chan answer {
	t.Helper()
	answers := make(chan answer, 4)
	for range 4 {
		go func() { answers <- post(pr.proxy, "m") }()
	}
	eventually(t, 5*time.Second, "one request in flight and three queued", func() bool {
		q, f := pr.underWay(t)
		return q == 3 && f == 1
	})
	return answers
}

// wantShuttingDown checks that all four requests got the proxy's 503
// shutting_down JSON answer within d, not a dropped connection.
func wantShuttingDown(t *testing.T, answers <-chan answer, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for i := range 4 {
		select {
		case a := <-answers:
			if a.err != nil || a.status != http.StatusServiceUnavailable || a.code != "shutting_down" || a.retry != "1" {
				t.Errorf("request %d got %v, want 503 shutting_down with Retry-After 1", i, a)
			}
		case <-timeout:
			t.Fatalf("only %d of 4 requests answered within %v", i, d)
		}
	}
}

// TestDrainTimeoutAnswersWhatIsLeftWith503: when LLMPROXY_SHUTDOWN_TIMEOUT
// passes with one request at a silent upstream and three queued, every one
// of them gets a 503 shutting_down answer (not a closed connection), and
// the program exits 0 soon after the timeout.
func TestDrainTimeoutAnswersWhatIsLeftWith503(t *testing.T) {
	pr := startProgram(t, oneLaneOfOne(silentUpstream(t), "300ms"))
	answers := sendFour(t, pr)
	start := time.Now()
	pr.stop()
	wantShuttingDown(t, answers, 3*time.Second)
	if code := pr.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("stopped %v after the signal, want just after the 300ms timeout", d)
	}
	logs := pr.logs.String()
	if !strings.Contains(logs, "drain ended early") || !strings.Contains(logs, "by=timeout") || !strings.Contains(logs, "under_way=4") {
		t.Errorf("no info line for the drain cut short by the timeout with 4 requests under way:\n%s", logs)
	}
}

// TestSecondSignalEndsTheDrainAtOnce: during a long drain a second
// SIGTERM answers what is left with 503 shutting_down right away.
func TestSecondSignalEndsTheDrainAtOnce(t *testing.T) {
	pr := startProgram(t, oneLaneOfOne(silentUpstream(t), "30s"))
	answers := sendFour(t, pr)
	pr.stop()
	eventually(t, time.Second, "/readyz 503 after the first signal", func() bool { return pr.readyz(t) == http.StatusServiceUnavailable })
	select {
	case a := <-answers:
		t.Fatalf("a request was answered by the first signal alone: %v", a)
	case <-time.After(200 * time.Millisecond): // still draining
	}
	start := time.Now()
	pr.again <- syscall.SIGTERM
	wantShuttingDown(t, answers, 3*time.Second)
	if code := pr.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stopped %v after the second signal", d)
	}
	if logs := pr.logs.String(); !strings.Contains(logs, "by=signal") || !strings.Contains(logs, "under_way=4") {
		t.Errorf("no info line for the drain cut short by a signal with 4 requests under way:\n%s", logs)
	}
}

// TestReadyzFailsAtTheFirstSignal: /readyz answers 503 as soon as the stop
// signal comes, while a request is still at the upstream; that request
// still completes and the program exits 0.
func TestReadyzFailsAtTheFirstSignal(t *testing.T) {
	finish := make(chan struct{})
	inUpstream := make(chan struct{}, 1)
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inUpstream <- struct{}{}
		select {
		case <-finish:
			fmt.Fprint(w, "done")
		case <-r.Context().Done():
		}
	}))
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": up, "LLMPROXY_SHUTDOWN_TIMEOUT": "10s"})
	if code := pr.readyz(t); code != http.StatusOK {
		t.Fatalf("readyz before the signal: %d", code)
	}
	got := make(chan answer, 1)
	go func() { got <- post(pr.proxy, "m") }()
	<-inUpstream
	pr.stop()
	eventually(t, 100*time.Millisecond, "/readyz 503 right after the signal", func() bool { return pr.readyz(t) == http.StatusServiceUnavailable })
	select {
	case a := <-got:
		t.Fatalf("the request in flight ended before the upstream answered: %v", a)
	default:
	}
	close(finish)
	if a := <-got; a.status != http.StatusOK || a.body != "done" {
		t.Fatalf("in-flight request got %v", a)
	}
	if code := pr.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestShutdownClosesWebSocketSessionsAfterTheDrain: a WebSocket session
// open at SIGTERM goes on while the drain lasts, then both its client and
// its upstream get a close frame with 1001 (going away), and the program
// exits 0.
func TestShutdownClosesWebSocketSessionsAfterTheDrain(t *testing.T) {
	upClosed := make(chan websocket.StatusCode, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		for {
			typ, msg, err := c.Read(context.Background())
			if err != nil {
				upClosed <- websocket.CloseStatus(err)
				return
			}
			c.Write(context.Background(), typ, msg)
		}
	}))
	defer up.Close()
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": up.URL, "LLMPROXY_SHUTDOWN_TIMEOUT": "5s"})
	ctx := context.Background()
	c, _, err := websocket.Dial(ctx, "ws://"+pr.proxy+"/v1/realtime?model=m", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// The session is counted a moment after its 101: the stop below is
	// sent once it is, so that the log line has a session to count.
	deadline := time.Now().Add(5 * time.Second)
	for !sessionsOpen(t, pr.admin) {
		if time.Now().After(deadline) {
			t.Fatal("the session was not counted within 5s of its handshake")
		}
		time.Sleep(5 * time.Millisecond)
	}
	pr.stop()
	// The drain has nothing to wait for; the session still works until
	// the proxy closes it.
	read := make(chan error, 1)
	go func() {
		for {
			if _, _, err := c.Read(ctx); err != nil {
				read <- err
				return
			}
		}
	}()
	select {
	case err := <-read:
		if websocket.CloseStatus(err) != websocket.StatusGoingAway {
			t.Fatalf("the client got %v, want close 1001", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the session was not closed within 5s of the signal")
	}
	select {
	case code := <-upClosed:
		if code != websocket.StatusGoingAway {
			t.Fatalf("the upstream got close %d, want 1001", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream's side was not closed")
	}
	if code := pr.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(pr.logs.String(), "closing WebSocket sessions") {
		t.Errorf("no log line for the sessions closed:\n%s", pr.logs)
	}
}

// sessionsOpen reports whether the admin listener at admin counts a
// WebSocket session open.
func sessionsOpen(t *testing.T, admin string) bool {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(page), "\nllmproxy_websocket_sessions 1\n")
}
