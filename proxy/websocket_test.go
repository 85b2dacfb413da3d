package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// realtimeUpstream is a WebSocket server in the Realtime API's place: it
// echoes every message; "close-NNNN" makes it close with that code; the
// close code it got from the other side goes to closes. Its first refuse
// handshakes get a bare 429. A request that is not an upgrade gets a 200.
type realtimeUpstream struct {
	refuse     int32
	handshakes atomic.Int32
	mu         sync.Mutex
	closes     []websocket.StatusCode
	protocols  []string
}

func (u *realtimeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		fmt.Fprint(w, `{"ok":true}`)
		return
	}
	if u.handshakes.Add(1) <= u.refuse {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"realtime"}})
	if err != nil {
		return
	}
	u.mu.Lock()
	u.protocols = append(u.protocols, c.Subprotocol())
	u.mu.Unlock()
	c.SetReadLimit(1 << 20)
	ctx := context.Background()
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			u.mu.Lock()
			u.closes = append(u.closes, websocket.CloseStatus(err))
			u.mu.Unlock()
			return
		}
		var code int
		if _, e := fmt.Sscanf(string(msg), "close-%d", &code); e == nil {
			c.Close(websocket.StatusCode(code), "asked to")
			return
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			return
		}
	}
}

func (u *realtimeUpstream) closeCodes() []websocket.StatusCode {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]websocket.StatusCode(nil), u.closes...)
}

func dialRealtime(t *testing.T, h *harness) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(h.front.URL, "http") + "/v1/realtime?model=gpt-realtime"
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		Subprotocols: []string{"realtime"},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + testKey}},
	})
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	if resp.Header.Get("X-Llmproxy-Lane") == "" {
		t.Error("the 101 answer has no x-llmproxy-lane")
	}
	c.SetReadLimit(1 << 20)
	return c
}

// TestWebSocketFramesPassBothWaysAndCloseCodesArePassed: a real client
// and server joined through the proxy: text and binary messages go and
// come back whole, the subprotocol is agreed end to end, the server's
// close code reaches the client and the client's reaches the server; the
// open session shows in /lanes (on the lane of the query's model) and in
// llmproxy_websocket_sessions, and neither after it closed.
func TestWebSocketFramesPassBothWaysAndCloseCodesArePassed(t *testing.T) {
	up := &realtimeUpstream{}
	h := newHarness(t, up, nil)
	admin := newAdmin(t, h)
	ctx := context.Background()

	c := dialRealtime(t, h)
	if c.Subprotocol() != "realtime" {
		t.Errorf("subprotocol %q, want realtime", c.Subprotocol())
	}
	big := bytes.Repeat([]byte{0, 1, 2, 250}, 100<<10/4) // past the 16-bit length
	for _, m := range []struct {
		typ  websocket.MessageType
		data []byte
	}{{websocket.MessageText, []byte(`{"type":"session.update"}`)}, {websocket.MessageBinary, big}, {websocket.MessageText, []byte("x")}} {
		if err := c.Write(ctx, m.typ, m.data); err != nil {
			t.Fatal(err)
		}
		typ, got, err := c.Read(ctx)
		if err != nil || typ != m.typ || !bytes.Equal(got, m.data) {
			t.Fatalf("echo of a %v message of %d bytes: %v, %d bytes, %v", m.typ, len(m.data), typ, len(got), err)
		}
	}
	lanes := admin("/lanes")
	if !strings.Contains(lanes, `"sessions": 1`) || !strings.Contains(lanes, `"model": "gpt-realtime"`) {
		t.Errorf("/lanes while the session is open does not show it on the model's lane: %s", lanes)
	}
	if got := gauge(t, admin("/metrics"), "llmproxy_websocket_sessions"); got != "1" {
		t.Errorf("llmproxy_websocket_sessions while open: %s, want 1", got)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("close-4001")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != 4001 {
		t.Fatalf("the client got %v, want the server's close code 4001", err)
	}
	waitFor(t, func() bool { return h.proxy.Sessions() == 0 })

	c2 := dialRealtime(t, h)
	if err := c2.Close(4000, "done"); err != nil {
		t.Logf("client close: %v", err)
	}
	waitFor(t, func() bool {
		cc := up.closeCodes()
		return len(cc) == 1 && cc[0] == 4000
	})
	waitFor(t, func() bool { return h.proxy.Sessions() == 0 })
	if got := gauge(t, admin("/metrics"), "llmproxy_websocket_sessions"); got != "0" {
		t.Errorf("llmproxy_websocket_sessions after both closed: %s, want 0", got)
	}
	if lanes := admin("/lanes"); strings.Contains(lanes, `"sessions"`) {
		t.Errorf("/lanes still shows sessions: %s", lanes)
	}
}

// TestAWebSocketSessionHoldsNoPermit: with a lane concurrency of one, a
// request on the same lane is answered while a session is open.
func TestAWebSocketSessionHoldsNoPermit(t *testing.T) {
	up := &realtimeUpstream{}
	h := newHarness(t, up, func(c *Config) {
		c.Lanes.Lane = lanequeue.Config{Concurrency: 1, MinConcurrency: 1, MaxConcurrency: 1}
	})
	c := dialRealtime(t, h)
	defer c.CloseNow()
	resp := h.post("/v1/realtime?model=gpt-realtime", `{"model":"gpt-realtime"}`)
	readAll(t, resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmproxy-Lane") == "" {
		t.Fatalf("a request beside an open session: %d", resp.StatusCode)
	}
}

// TestARefusedHandshakeIsAbsorbed: a handshake the upstream refuses with
// a bare 429 is retried in its lane like a refused request; the client
// only sees the session that follows.
func TestARefusedHandshakeIsAbsorbed(t *testing.T) {
	up := &realtimeUpstream{refuse: 2}
	h := newHarness(t, up, nil)
	c := dialRealtime(t, h)
	defer c.CloseNow()
	ctx := context.Background()
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != "ping" {
		t.Fatalf("echo after two refused handshakes: %q, %v", got, err)
	}
	if n := up.handshakes.Load(); n != 3 {
		t.Fatalf("the upstream saw %d handshakes, want 3 (two refused)", n)
	}
}

// TestShutdownClosesSessionsWithGoingAway: CloseSessions, as shutdown
// calls it after the drain, sends both sides a close frame with 1001
// (going away) and waits until the session has ended.
func TestShutdownClosesSessionsWithGoingAway(t *testing.T) {
	up := &realtimeUpstream{}
	h := newHarness(t, up, nil)
	c := dialRealtime(t, h)
	ctx := context.Background()
	if err := c.Write(ctx, websocket.MessageText, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(ctx); err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, _, err := c.Read(ctx)
		read <- err
	}()
	h.proxy.Stop()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h.proxy.CloseSessions(cctx)
	if h.proxy.Sessions() != 0 {
		t.Fatal("CloseSessions returned with a session open")
	}
	if err := <-read; websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("the client got %v, want close 1001", err)
	}
	waitFor(t, func() bool {
		cc := up.closeCodes()
		return len(cc) == 1 && cc[0] == websocket.StatusGoingAway
	})
}

// TestASessionOpenedAfterCloseSessionsIsClosed: a session whose 101 went
// out as shutdown was closing the sessions (the drain does not wait for a
// hijacked connection, so shutdown may count the sessions before this one
// is counted) is closed with 1001 as soon as it opens, without Stop.
func TestASessionOpenedAfterCloseSessionsIsClosed(t *testing.T) {
	up := &realtimeUpstream{}
	h := newHarness(t, up, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.proxy.CloseSessions(ctx) // none open yet
	c := dialRealtime(t, h)
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("a session opened after CloseSessions: the client got %v, want close 1001", err)
	}
}

// TestCloseFrameIsWhatAPeerReads: the proxy's own close frames carry
// their code, masked when they go to the upstream (as a client's must be).
func TestCloseFrameIsWhatAPeerReads(t *testing.T) {
	for _, masked := range []bool{false, true} {
		f := closeFrame(1001, masked)
		var buf [14]byte
		head, n, err := readFrameHead(bufioReader(f), buf[:])
		if err != nil || n != 2 || head[0] != 0x88 || (head[1]&0x80 != 0) != masked {
			t.Fatalf("masked=%v: head % x, length %d, %v", masked, head, n, err)
		}
		payload := f[len(head):]
		if masked {
			key := head[2:6]
			payload = []byte{payload[0] ^ key[0], payload[1] ^ key[1]}
		}
		if code := int(payload[0])<<8 | int(payload[1]); code != 1001 {
			t.Fatalf("masked=%v: code %d, want 1001", masked, code)
		}
	}
	if _, _, err := readFrameHead(bufioReader([]byte{0x82, 127, 0xff, 0, 0, 0, 0, 0, 0, 0}), make([]byte, 14)); err == nil {
		t.Fatal("a frame longer than 2^62 bytes was taken")
	}
	if _, _, err := readFrameHead(bufioReader([]byte{0x82}), make([]byte, 14)); !errors.Is(err, errUnexpectedEOF) {
		t.Fatalf("half a header: %v", err)
	}
}

var errUnexpectedEOF = io.ErrUnexpectedEOF

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
