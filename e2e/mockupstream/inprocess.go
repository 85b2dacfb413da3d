package mockupstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"sync"
)

// InProcessURL is the base URL of an in-process server. Nothing listens
// there: only the server's Transport reaches it.
const InProcessURL = "http://mock.invalid"

// flushAt is how many unflushed bytes a handler may write before they are
// sent anyway, as net/http's response buffer does.
const flushAt = 4096

var (
	// errClosed is what a request to a closed server fails with.
	errClosed = errors.New("mockupstream: server closed")
	// errAborted ends a response whose handler aborted it (a panic, such as
	// http.ErrAbortHandler when the server closes), as a cut connection
	// would.
	errAborted = fmt.Errorf("mockupstream: response aborted: %w", io.ErrUnexpectedEOF)
)

// NewInProcess returns a Server that listens nowhere and opens no socket.
// Only its Transport reaches it, and its URL is InProcessURL. It starts no
// goroutine of its own: each request runs on goroutines that the
// RoundTrip call starts, so that a server built inside a testing/synctest
// bubble runs entirely in it, on the bubble's fake clock (Config.Now
// defaults to time.Now, which the bubble fakes, and Latency, ChunkDelay and
// the other waits are timers). Close it when done.
func NewInProcess(cfg Config) *Server {
	return newServer(cfg)
}

// NewInProcessHandler returns an in-process Server that answers with h
// instead of the mock's own handler: the same Transport (a handler's
// flushes arrive as they are written, on the caller's clock) in front of
// an upstream written elsewhere. Config, Stats and the mock's limits do
// not apply to it.
func NewInProcessHandler(h http.Handler) *Server {
	s := newServer(Config{})
	s.handler = h
	return s
}

// Transport returns a RoundTripper that calls the server's handler in
// process, for an in-process server or a listening one alike. Its requests
// are counted and limited like those that arrive over the network.
//
// RoundTrip runs the handler in a new goroutine and returns as soon as the
// handler sends its header (WriteHeader, its first Write or a Flush). The
// response's Body is fed through an io.Pipe as the handler flushes, so that
// a stream arrives chunk by chunk when it is written; writes not flushed are
// sent when 4 KiB have gathered or the handler returns, as net/http sends
// them. The handler never waits for the reader. The Body ends (io.EOF) once
// the handler has returned, so a client that has read a whole answer finds
// its in-flight slot free again. The handler's request context ends when
// the caller's request context does, or when the caller closes the Body;
// either ends the handler's waits. If the caller's context ends, RoundTrip
// or the Body's next Read returns its error; if the handler panics (the
// server closing aborts waits with http.ErrAbortHandler), RoundTrip or the
// Body's reads fail with an error that wraps io.ErrUnexpectedEOF.
func (s *Server) Transport() http.RoundTripper { return inProcess{s} }

// inProcess is the RoundTripper of Server.Transport.
type inProcess struct{ s *Server }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.s.roundTrip(req)
}

// exchange is one request served in process: the handler's ResponseWriter
// on one side, the feed of the response body on the other.
type exchange struct {
	header http.Header // what the handler sees and sets

	mu       sync.Mutex
	status   int         // 0 until the header is sent
	sent     http.Header // the header as sent
	buf      []byte      // written, not flushed
	pending  []byte      // flushed, not yet fed to the pipe
	ended    bool        // the handler has returned
	endErr   error       // nil = a whole response
	readyNow bool        // ready is closed

	ready  chan struct{} // closed when the header is sent or the handler ended
	notify chan struct{} // capacity 1: pending or ended changed
}

func (s *Server) roundTrip(req *http.Request) (*http.Response, error) {
	reqBody := req.Body
	if reqBody == nil {
		reqBody = http.NoBody
	}
	if err := req.Context().Err(); err != nil {
		reqBody.Close()
		return nil, err
	}
	target, err := url.ParseRequestURI(req.URL.RequestURI())
	if err != nil {
		reqBody.Close()
		return nil, err
	}

	// The handler's context ends with the caller's, or when the caller
	// closes the body, as a server's does when its client hangs up.
	ctx, cancel := context.WithCancel(req.Context())
	sr := req.Clone(ctx)
	sr.Body = reqBody
	sr.URL = target
	sr.RequestURI = req.URL.RequestURI()
	sr.Proto, sr.ProtoMajor, sr.ProtoMinor = "HTTP/1.1", 1, 1
	sr.RemoteAddr = "192.0.2.1:1234" // a documentation address (RFC 5737)
	if sr.Host == "" {
		sr.Host = req.URL.Host
	}

	x := &exchange{
		header: make(http.Header),
		ready:  make(chan struct{}),
		notify: make(chan struct{}, 1),
	}
	pr, pw := io.Pipe()

	s.live.Lock()
	if s.closed {
		s.live.Unlock()
		cancel()
		reqBody.Close()
		return nil, errClosed
	}
	s.handlers.Add(1)
	s.live.Unlock()

	// The caller's context ending breaks the body at once, as a real
	// transport does.
	stop := context.AfterFunc(req.Context(), func() { pw.CloseWithError(req.Context().Err()) })
	go func() {
		defer s.handlers.Done()
		defer cancel()
		s.serveExchange(x, sr, req.Context())
	}()
	go func() {
		x.feed(pw)
		stop()
	}()

	select {
	case <-x.ready:
	case <-req.Context().Done():
		pr.Close()
		return nil, req.Context().Err()
	}
	x.mu.Lock()
	status, header, endErr := x.status, x.sent, x.endErr
	x.mu.Unlock()
	if status == 0 {
		pr.Close()
		return nil, endErr
	}
	resp := &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		Body:          &pipeBody{PipeReader: pr, cancel: cancel},
		ContentLength: -1,
		Request:       req,
	}
	if n, err := strconv.ParseInt(header.Get("Content-Length"), 10, 64); err == nil && n >= 0 {
		resp.ContentLength = n
	}
	return resp, nil
}

// serveExchange runs the handler and ends the exchange when it returns. A
// panic aborts the response; one other than http.ErrAbortHandler is logged
// with its stack, as net/http does. If the caller's context ended, the
// response ends with its error: the handler returned because of it, and
// what it wrote last is not a whole answer.
func (s *Server) serveExchange(x *exchange, r *http.Request, caller context.Context) {
	defer func() {
		err := caller.Err()
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				log.Printf("mockupstream: panic serving %s: %v\n%s", r.URL.Path, v, debug.Stack())
			}
			err = errAborted
		}
		r.Body.Close()
		x.end(err)
	}()
	if s.handler != nil {
		s.handler.ServeHTTP(x, r)
		return
	}
	s.serveHTTP(x, r)
}

// pipeBody is a response body whose Close also hangs up on the handler.
type pipeBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (b *pipeBody) Close() error {
	b.cancel()
	return b.PipeReader.Close()
}

// feed copies what the handler flushes into pw until the handler has ended
// or the reader has gone, then closes pw with the exchange's outcome.
func (x *exchange) feed(pw *io.PipeWriter) {
	for {
		<-x.notify
		x.mu.Lock()
		data, ended, endErr := x.pending, x.ended, x.endErr
		x.pending = nil
		x.mu.Unlock()
		if len(data) > 0 {
			if _, err := pw.Write(data); err != nil {
				return // the reader closed, or the caller's context ended
			}
		}
		if ended {
			pw.CloseWithError(endErr) // nil: the reader sees io.EOF
			return
		}
	}
}

// wake tells feed that there is something to do. Requires x.mu held.
func (x *exchange) wake() {
	select {
	case x.notify <- struct{}{}:
	default: // feed has yet to take the previous wake, and will see this too
	}
}

// commit sends the header with status. Requires x.mu held.
func (x *exchange) commit(status int) {
	if x.status != 0 {
		return
	}
	x.status = status
	x.sent = x.header.Clone()
	if !x.readyNow {
		x.readyNow = true
		close(x.ready)
	}
}

// flushLocked passes what was written on to feed. Requires x.mu held.
func (x *exchange) flushLocked() {
	if len(x.buf) == 0 {
		return
	}
	x.pending = append(x.pending, x.buf...)
	x.buf = x.buf[:0]
	x.wake()
}

// end finishes the exchange after the handler returned: a whole response
// if err is nil (an implicit 200 if the handler sent nothing), else a
// broken one, whose unflushed writes are lost as on a cut connection.
func (x *exchange) end(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err == nil {
		x.commit(http.StatusOK)
		x.flushLocked()
	} else {
		x.buf = nil
	}
	x.ended, x.endErr = true, err
	if !x.readyNow {
		x.readyNow = true
		close(x.ready)
	}
	x.wake()
}

// Header, WriteHeader, Write and Flush make exchange the handler's
// http.ResponseWriter and http.Flusher.

func (x *exchange) Header() http.Header { return x.header }

// WriteHeader sends the header. Informational statuses are not imitated:
// they are ignored, as are calls after the first.
func (x *exchange) WriteHeader(status int) {
	if status < 200 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.commit(status)
}

func (x *exchange) Write(b []byte) (int, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.status == 0 {
		if x.header.Get("Content-Type") == "" {
			x.header.Set("Content-Type", http.DetectContentType(b))
		}
		x.commit(http.StatusOK)
	}
	x.buf = append(x.buf, b...)
	if len(x.buf) >= flushAt {
		x.flushLocked()
	}
	return len(b), nil
}

func (x *exchange) Flush() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.commit(http.StatusOK)
	x.flushLocked()
}
