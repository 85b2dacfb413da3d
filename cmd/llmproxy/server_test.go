package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func okUpstream(t *testing.T) string {
	return newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
}

// TestIdleKeepAliveConnectionsAreClosed: a keep-alive connection that
// sends nothing after its answer is closed after LLMPROXY_IDLE_TIMEOUT, on
// the proxy listener and on the admin listener.
func TestIdleKeepAliveConnectionsAreClosed(t *testing.T) {
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t), "LLMPROXY_IDLE_TIMEOUT": "300ms"})
	for _, c := range []struct{ addr, path string }{{pr.proxy, "/v1/models"}, {pr.admin, "/healthz"}} {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", c.path)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("%s: %s, close=%v; want a kept-alive 200", c.path, resp.Status, resp.Close)
		}
		start := time.Now()
		_ = conn.SetReadDeadline(start.Add(5 * time.Second))
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("%s: idle connection: %v, want it closed by the server", c.path, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: idle connection closed after %v, want about 300ms", c.path, d)
		}
	}
}

// TestSlowBodyIsRefusedWithinBodyTimeout: a body that trickles in one
// byte at a time, or stops after the headers, gets 400 body_read_error
// once LLMPROXY_BODY_TIMEOUT passes, instead of holding its connection.
func TestSlowBodyIsRefusedWithinBodyTimeout(t *testing.T) {
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t), "LLMPROXY_BODY_TIMEOUT": "1s"})
	for _, trickle := range []bool{true, false} {
		t.Run(fmt.Sprintf("trickle=%v", trickle), func(t *testing.T) {
			conn, err := net.Dial("tcp", pr.proxy)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
			stop := make(chan struct{})
			defer close(stop)
			if trickle {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
						if _, err := conn.Write([]byte(" ")); err != nil {
							return
						}
					}
				}()
			}
			_ = conn.SetReadDeadline(start.Add(6 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("after %v: %v, want a 400 answer", time.Since(start), err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			d := time.Since(start)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "body_read_error") || !strings.Contains(string(b), "LLMPROXY_BODY_TIMEOUT") {
				t.Fatalf("%s %s, want 400 body_read_error naming LLMPROXY_BODY_TIMEOUT", resp.Status, b)
			}
			if d < 900*time.Millisecond || d > 3*time.Second {
				t.Errorf("answered after %v, want about the 1s body timeout", d)
			}
		})
	}
}

// TestBodyTimeoutLeavesNormalRequestsAlone: a body that arrives in pieces
// within LLMPROXY_BODY_TIMEOUT is forwarded whole, and a streamed answer
// that lasts longer than the body timeout reaches the client whole: the
// bound is on the body, not on the request.
func TestBodyTimeoutLeavesNormalRequestsAlone(t *testing.T) {
	gotBody := make(chan string, 2)
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody <- string(b)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-time.After(1500 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: 2\n\n")
	}))
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": up, "LLMPROXY_BODY_TIMEOUT": "1s"})
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 2 { // the second request reuses the connection
		pr2, pw := io.Pipe()
		go func() {
			fmt.Fprint(pw, `{"model":`)
			time.Sleep(300 * time.Millisecond)
			fmt.Fprint(pw, `"m"}`)
			pw.Close()
		}()
		resp, err := client.Post("http://"+pr.proxy+"/v1/chat/completions", "application/json", pr2)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("request %d: reading the answer: %v", i, err)
		}
		if resp.StatusCode != http.StatusOK || string(b) != "data: 1\n\ndata: 2\n\n" {
			t.Fatalf("request %d: %s %q, want the whole stream", i, resp.Status, b)
		}
		if got := <-gotBody; got != `{"model":"m"}` {
			t.Fatalf("request %d: upstream got body %q", i, got)
		}
	}
}
