package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// heapNow is the live heap plus goroutine stacks after a full collection.
func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// BenchmarkMemoryPerQueuedRequest: what one request waiting in a lane's
// queue costs the proxy process, its connection's goroutine and buffers
// included: 2,000 requests with a 1 KiB body sent over their own loopback
// connections to a real server, one at the upstream, the rest queued.
// Run with -benchtime=1x; reports bytes per queued request. Compare
// BenchmarkMemoryPerQueuedRequestFloor, what net/http itself holds for a
// request whose handler waits.
func BenchmarkMemoryPerQueuedRequest(b *testing.B) {
	const n = 2000
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	defer close(release)
	u, _ := url.Parse(up.URL)
	p, err := New(Config{Upstream: u, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Lanes: lanequeue.TableConfig{Lane: lanequeue.Config{Concurrency: 1, MaxConcurrency: 1}}})
	if err != nil {
		b.Fatal(err)
	}
	measureWaiting(b, p, n, func() bool {
		st := p.States()
		return len(st) == 1 && st[0].Queued == n-1
	})
}

// BenchmarkMemoryPerQueuedRequestFloor is the floor under
// BenchmarkMemoryPerQueuedRequest: the same requests to a handler that
// reads the body and waits, as net/http holds them with nothing of the
// proxy's.
func BenchmarkMemoryPerQueuedRequestFloor(b *testing.B) {
	const n = 2000
	release := make(chan struct{})
	var waiting atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		waiting.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		waiting.Add(-1)
		runtime.KeepAlive(body)
	})
	defer close(release)
	measureWaiting(b, h, n, func() bool { return waiting.Load() == n })
}

// measureWaiting sends n requests with a 1 KiB body to h over their own
// loopback connections, waits until all wait (waited), and reports the
// heap and stacks they hold, per request.
func measureWaiting(b *testing.B, h http.Handler, n int, waited func() bool) {
	front := httptest.NewServer(h)
	defer front.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 1000) + `"}]}`
	raw := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	for range b.N {
		before := heapNow()
		conns := make([]net.Conn, 0, n)
		for range n {
			c, err := net.Dial("tcp", front.Listener.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.Write([]byte(raw)); err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !waited() {
			if time.Now().After(deadline) {
				b.Fatal("not all waiting")
			}
			time.Sleep(10 * time.Millisecond)
		}
		after := heapNow()
		b.ReportMetric(float64(after-before)/float64(n), "B/queued-request")
		for _, c := range conns {
			c.Close()
		}
	}
}

// BenchmarkMemoryPerLane: what an idle lane costs in the table, with the
// longest model name and path a key keeps (see lanequeue.NewKey).
func BenchmarkMemoryPerLane(b *testing.B) {
	const n = 10000
	for range b.N {
		tb := lanequeue.NewTable(lanequeue.TableConfig{MaxLanes: n})
		before := heapNow()
		for i := range n {
			slot, err := tb.Acquire(context.Background(), lanequeue.Request{Route: "anthropic", Credential: fmt.Sprint("sk-", i),
				Path: "/v1/" + strings.Repeat("p", 200) + fmt.Sprint(i), Model: strings.Repeat("m", 200) + fmt.Sprint(i)})
			if err != nil {
				b.Fatal(err)
			}
			slot.Done(200, string(OutcomeOK), -1)
		}
		after := heapNow()
		b.ReportMetric(float64(after-before)/n, "B/lane")
		runtime.KeepAlive(tb)
	}
}
