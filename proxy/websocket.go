package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/upstream"
)

// WebSocket pass-through (the Realtime API). An upgrade request is keyed
// and queued like any request, and a refused handshake is absorbed and
// retried like a refused request. Once the upstream answers 101 the proxy
// gives the permit back (a session is not held against the lane's
// concurrency), answers the client 101 and joins the two connections,
// frame by frame, until either side closes. The frames pass as they are:
// control frames, close codes and extensions included.

// Close codes the proxy sends itself (RFC 6455, 7.4.1).
const (
	closeGoingAway = 1001 // the proxy is shutting down
)

// join answers the client 101 and relays frames between it and the
// upstream until either side closes, or the proxy closes the session at
// shutdown.
func (p *Proxy) join(w http.ResponseWriter, req *request, res upstream.Result) {
	resp := res.Resp
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
		resp.Body.Close()
		p.failRequest(w, req, fail(failInternal, "the upstream switched to a protocol other than WebSocket"))
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		p.failRequest(w, req, fail(failInternal, "this connection cannot carry a WebSocket (HTTP/2 or a wrapped writer): "+err.Error()))
		return
	}
	// The server's read and write deadlines (for the body, the answer)
	// stay on a hijacked connection: a session has none.
	conn.SetDeadline(time.Time{})
	// A session holds no permit: the lane's next request may go.
	closed := req.slot.OpenSession()
	defer closed()
	req.status, req.outcome = http.StatusSwitchingProtocols, OutcomeOK

	h := resp.Header.Clone()
	upstream.StripHopHeaders(h)
	h.Set("Connection", "Upgrade")
	h.Set("Upgrade", "websocket")
	h["X-Llmproxy-Request-Id"] = req.idHeader()
	setLLMHeaders(h, req)
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	h.Write(brw)
	brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		conn.Close()
		up.Close()
		req.outcome = OutcomeClientGone
		return
	}

	s := &session{client: conn, clientR: brw.Reader, upstream: up, upR: bufio.NewReader(up),
		toClient: make(chan struct{}, 1), toUpstream: make(chan struct{}, 1), done: make(chan struct{})}
	p.sessionsMu.Lock()
	p.sessions[s] = struct{}{}
	shutting := p.sessionsClosed
	p.sessionsMu.Unlock()
	defer func() {
		p.sessionsMu.Lock()
		delete(p.sessions, s)
		p.sessionsMu.Unlock()
	}()
	// A session whose 101 went out as the proxy was closing them (the
	// drain does not wait for a hijacked connection) is closed too.
	if shutting || p.stopping() {
		go s.shut(closeGoingAway)
	}
	s.run()
}

// CloseSessions closes every open WebSocket session with a close frame
// (1001, going away) to both sides, and waits until they have ended or ctx
// is done; a session that opens afterwards is closed at once. Shutdown
// calls it once the drain is over.
func (p *Proxy) CloseSessions(ctx context.Context) {
	p.sessionsMu.Lock()
	p.sessionsClosed = true
	open := make([]*session, 0, len(p.sessions))
	for s := range p.sessions {
		open = append(open, s)
	}
	p.sessionsMu.Unlock()
	var wg sync.WaitGroup
	for _, s := range open {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.shut(closeGoingAway)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		for _, s := range open {
			s.closeBoth()
		}
	}
}

// Sessions is how many WebSocket sessions are open.
func (p *Proxy) Sessions() int {
	p.sessionsMu.Lock()
	defer p.sessionsMu.Unlock()
	return len(p.sessions)
}
