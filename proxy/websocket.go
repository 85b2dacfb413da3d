package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
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

// sessionCloseWait bounds how long a session closed by the proxy waits for
// each side to take its close frame, and for the upstream's answer.
const sessionCloseWait = 2 * time.Second

// session is one joined WebSocket connection.
type session struct {
	client   net.Conn
	clientR  *bufio.Reader // the hijacked reader: may hold the first frames
	upstream io.ReadWriteCloser
	upR      *bufio.Reader
	// toClient and toUpstream are each side's write lock, held for a
	// whole frame, so that a close frame of the proxy's own goes between
	// frames. A nil-valued send takes it.
	toClient, toUpstream chan struct{}
	// clientShut and upShut: the proxy sent that side its close frame,
	// and passes it nothing more.
	clientShut, upShut bool
	done               chan struct{} // both pumps ended
	closeOnce          sync.Once
}

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

// run relays both ways until either side ends, then closes both.
func (s *session) run() {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		pump(s.clientR, s.upstream, s.toUpstream, &s.upShut)
		s.closeBoth()
	}()
	go func() {
		defer wg.Done()
		pump(s.upR, s.client, s.toClient, &s.clientShut)
		s.closeBoth()
	}()
	wg.Wait()
	close(s.done)
}

func (s *session) closeBoth() {
	s.closeOnce.Do(func() {
		s.client.Close()
		s.upstream.Close()
	})
}

// pump copies frames from src to dst, each whole under dst's write lock,
// until src ends; once shut says dst had the proxy's close frame, frames
// for it are read and dropped.
func pump(src *bufio.Reader, dst io.Writer, lock chan struct{}, shut *bool) {
	var head [14]byte
	for {
		h, n, err := readFrameHead(src, head[:])
		if err != nil {
			return
		}
		lock <- struct{}{}
		if *shut {
			_, err = io.CopyN(io.Discard, src, n)
		} else if _, err = dst.Write(h); err == nil {
			_, err = io.CopyN(dst, src, n)
		}
		<-lock
		if err != nil {
			return
		}
	}
}

// readFrameHead reads a frame's header into buf and returns it with the
// payload's length.
func readFrameHead(r *bufio.Reader, buf []byte) ([]byte, int64, error) {
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return nil, 0, err
	}
	k := 2
	n := int64(buf[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(r, buf[2:4]); err != nil {
			return nil, 0, err
		}
		n, k = int64(binary.BigEndian.Uint16(buf[2:4])), 4
	case 127:
		if _, err := io.ReadFull(r, buf[2:10]); err != nil {
			return nil, 0, err
		}
		u := binary.BigEndian.Uint64(buf[2:10])
		if u > 1<<62 {
			return nil, 0, errors.New("websocket: frame too long")
		}
		n, k = int64(u), 10
	}
	if buf[1]&0x80 != 0 { // masked: the mask key follows
		if _, err := io.ReadFull(r, buf[k:k+4]); err != nil {
			return nil, 0, err
		}
		k += 4
	}
	return buf[:k], n, nil
}

// closeFrame is a close frame with code, masked (as a client sends it) or
// not (as a server does).
func closeFrame(code uint16, masked bool) []byte {
	payload := [2]byte{byte(code >> 8), byte(code)}
	if !masked {
		return []byte{0x88, 2, payload[0], payload[1]}
	}
	// Any mask key will do: the payload goes XORed with it.
	key := [4]byte{0x6c, 0x6c, 0x6d, 0x70}
	return []byte{0x88, 0x80 | 2, key[0], key[1], key[2], key[3], payload[0] ^ key[0], payload[1] ^ key[1]}
}

// shut closes the session from the proxy's side: each side gets a close
// frame with code between two of its frames, and nothing more; the
// session ends when the upstream closes its connection (as it does after
// answering a close frame), or after sessionCloseWait whatever happened.
func (s *session) shut(code uint16) {
	send := func(lock chan struct{}, shut *bool, w io.Writer, f []byte) {
		select {
		case lock <- struct{}{}:
		case <-time.After(sessionCloseWait):
			return // a frame is stuck half way: the close below cuts it
		}
		if !*shut {
			*shut = true
			if c, ok := w.(net.Conn); ok {
				c.SetWriteDeadline(time.Now().Add(sessionCloseWait))
			}
			w.Write(f)
		}
		<-lock
	}
	send(s.toUpstream, &s.upShut, s.upstream, closeFrame(code, true))
	send(s.toClient, &s.clientShut, s.client, closeFrame(code, false))
	select {
	case <-s.done:
	case <-time.After(sessionCloseWait):
		s.closeBoth()
	}
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
