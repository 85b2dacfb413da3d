package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/llmproxy/llmproxy/upstream"
)

// writeCounter counts the writes made on the connections it dials.
type writeCounter struct {
	mu     sync.Mutex
	writes int
}

type countedConn struct {
	net.Conn
	c *writeCounter
}

func (c countedConn) Write(b []byte) (int, error) {
	c.c.mu.Lock()
	c.c.writes++
	c.c.mu.Unlock()
	return c.Conn.Write(b)
}

// TestARequestGoesUpInOneWrite: a request body held in memory is sent
// with its headers in one write (one packet on the wire), not after them
// in a second, for a first attempt and for a retry alike.
func TestARequestGoesUpInOneWrite(t *testing.T) {
	var tries sync.Mutex
	n := 0
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tries.Lock()
		n++
		first := n == 1
		tries.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(body)
	}))
	defer up.Close()
	counter := &writeCounter{}
	tr := upstream.NewTransport()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countedConn{c, counter}, nil
	}
	u, _ := url.Parse(up.URL)
	p, err := New(Config{Upstream: u, Transport: tr, MaxRetries: 1, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 4000) + `"}]}`
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer k")
	w := httptest.NewRecorder()
	p.ServeHTTP(w, req)
	if w.Code != 200 || w.Body.String() != body {
		t.Fatalf("status %d, body of %d bytes", w.Code, w.Body.Len())
	}
	counter.mu.Lock()
	defer counter.mu.Unlock()
	if counter.writes != 2 {
		t.Errorf("two attempts took %d writes, want one each", counter.writes)
	}
}

// TestALateDeadlineLeavesNoWatchOnStop: when the deadline's end reaches an
// attempt's watch only after the attempt ended (the watch runs in a
// goroutine of its own), it registers nothing on Stop: each such
// registration would live as long as the process.
func TestALateDeadlineLeavesNoWatchOnStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		var cancels atomic.Int32
		a := &attemptWatch{p: p, cancel: func() { cancels.Add(1) }, unwatch: func() bool { return false }, headers: true}
		a.end()
		a.deadlineDone() // late, after end
		p.Stop()
		synctest.Wait()
		if n := cancels.Load(); n != 1 {
			t.Fatalf("the attempt was cancelled %d times; a second at Stop means a watch outlived it", n)
		}
	})
}
