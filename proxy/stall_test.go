package proxy

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestClientThatStopsReadingIsCut: a streaming client reads the status
// line and then nothing while the upstream keeps sending. Once it has
// accepted nothing for the idle bound (MaxWait), the proxy cuts it, frees
// its slot for the next request of the lane, ends the upstream call and
// counts the answer as client_stalled.
func TestClientThatStopsReadingIsCut(t *testing.T) {
	var upstreamDone atomic.Bool
	chunk := []byte("data: " + strings.Repeat("x", 64<<10) + "\n\n")
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/next" {
			w.Write([]byte(`{}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				break
			}
			w.(http.Flusher).Flush()
		}
		upstreamDone.Store(true)
	}), func(c *Config) {
		c.MaxWait = time.Second
		c.Lanes.Lane.Concurrency, c.Lanes.Lane.MaxConcurrency = 1, 1
	})
	conn, err := net.Dial("tcp", h.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := `{"model":"m","stream":true}`
	_, _ = conn.Write([]byte("POST /v1/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testKey +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	status, err := bufio.NewReaderSize(conn, 64).ReadString('\n')
	if err != nil || !strings.Contains(status, "200") {
		t.Fatalf("status line %q, %v", status, err)
	}
	// Now read nothing: after the idle bound the proxy cuts the client
	// and ends the upstream call.
	waitFor(t, func() bool {
		return counterValue(t, h.proxy.cfg.Gatherer, "llmproxy_requests_total", map[string]string{"outcome": "client_stalled", "status": "200"}) == 1
	})
	waitFor(t, upstreamDone.Load)
	// Its slot is free: the next request of the lane goes at once.
	if next := h.post("/v1/next", `{"model":"m"}`); next.StatusCode != 200 {
		t.Fatalf("next request: %d", next.StatusCode)
	}
	if !strings.Contains(h.logs.String(), "outcome=client_stalled") {
		t.Error("the cut was not logged")
	}
}
