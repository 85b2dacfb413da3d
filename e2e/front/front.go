// Package front is the load balancer in front of the replicas in the
// rolling-restart test and benchmark row: what a Kubernetes Service with a
// readiness probe gives clients, plus the retry an L7 proxy in front of it
// makes. Each request goes to the next backend, round robin, among those
// whose /readyz (on their admin listener) answered 200 at the last probe.
// When a backend refuses the connection, or closes or resets it before a
// byte of the answer came back, the request goes to the next ready one: a
// replica that stopped listening, or closed an idle connection as its
// drain began, had not started on it. An answer that has begun is passed
// on as it comes, never retried.
//
// It listens on 127.0.0.1 only, and is meant for tests and benchmarks.
package front

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Backend is one replica: its proxy listener and its admin listener,
// host:port each.
type Backend struct {
	Addr, Admin string
}

// Config is the front's backends and how often it probes them.
type Config struct {
	Backends []Backend
	// Probe is the interval between two /readyz of a backend; 0 = 100ms.
	Probe time.Duration
	// MaxBody bounds a request's body, which is kept to be sent again;
	// 0 = 4 MiB.
	MaxBody int64
}

// Stats counts what the front did.
type Stats struct {
	// Answered is, by backend, the requests whose answer it passed on.
	Answered []int64
	// Failovers counts the tries that failed before any byte of an answer
	// and went to another backend.
	Failovers int64
	// Failed counts the requests it answered 502 itself: no backend took
	// them before the client gave up.
	Failed int64
}

// Server is a running front.
type Server struct {
	cfg      Config
	srv      *http.Server
	ln       net.Listener
	tr       *http.Transport
	probe    *http.Client
	ready    []atomic.Bool
	answered []atomic.Int64
	next     atomic.Uint64
	fails    atomic.Int64
	failed   atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

// Start listens on a free loopback port, probes every backend once and
// serves; Close stops it.
func Start(cfg Config) (*Server, error) {
	if len(cfg.Backends) == 0 {
		return nil, errors.New("front: no backends")
	}
	if cfg.Probe <= 0 {
		cfg.Probe = 100 * time.Millisecond
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 4 << 20
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, ln: ln,
		// No Proxy: loopback, never through one. Compression is the
		// client's business: the body goes through as it came.
		tr:       &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true},
		probe:    &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		ready:    make([]atomic.Bool, len(cfg.Backends)),
		answered: make([]atomic.Int64, len(cfg.Backends)),
		stop:     make(chan struct{}),
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	for i := range cfg.Backends {
		s.ready[i].Store(s.probeOnce(i))
		s.wg.Go(func() { s.probeLoop(i) })
	}
	s.wg.Go(func() { _ = s.srv.Serve(ln) })
	return s, nil
}

// Addr is the front's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving and probing and closes every connection.
func (s *Server) Close() {
	close(s.stop)
	s.srv.Close()
	s.wg.Wait()
	s.tr.CloseIdleConnections()
	s.probe.CloseIdleConnections()
}

// Stats is a copy of the counts so far.
func (s *Server) Stats() Stats {
	st := Stats{Answered: make([]int64, len(s.answered)), Failovers: s.fails.Load(), Failed: s.failed.Load()}
	for i := range s.answered {
		st.Answered[i] = s.answered[i].Load()
	}
	return st
}

// Ready reports whether backend i answered its last probe with 200.
func (s *Server) Ready(i int) bool { return s.ready[i].Load() }

func (s *Server) probeLoop(i int) {
	tick := time.NewTicker(s.cfg.Probe)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.ready[i].Store(s.probeOnce(i))
		}
	}
}

func (s *Server) probeOnce(i int) bool {
	resp, err := s.probe.Get("http://" + s.cfg.Backends[i].Admin + "/readyz")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// pick is the next ready backend after the last pick, skipping those in
// tried; -1 when there is none.
func (s *Server) pick(tried []bool) int {
	n := len(s.cfg.Backends)
	start := int(s.next.Add(1) % uint64(n))
	for k := range n {
		i := (start + k) % n
		if !tried[i] && s.ready[i].Load() {
			return i
		}
	}
	return -1
}

// hopHeaders are not forwarded, either way.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err != nil {
		http.Error(w, "front: reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	tried := make([]bool, len(s.cfg.Backends))
	for {
		i := s.pick(tried)
		if i < 0 {
			// Every ready backend failed this request, or none is
			// ready: wait a little for the probes, then all may be
			// tried again.
			clear(tried)
			select {
			case <-ctx.Done():
				s.failed.Add(1)
				http.Error(w, "front: no backend took the request", http.StatusBadGateway)
				return
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		tried[i] = true
		resp, err := s.send(ctx, r, body, s.cfg.Backends[i].Addr)
		if err != nil {
			if ctx.Err() != nil {
				s.failed.Add(1)
				http.Error(w, "front: "+err.Error(), http.StatusBadGateway)
				return
			}
			s.fails.Add(1)
			continue
		}
		s.answered[i].Add(1)
		pass(w, resp)
		return
	}
}

// send is one try of r, with body, at addr.
func (s *Server) send(ctx context.Context, r *http.Request, body []byte, addr string) (*http.Response, error) {
	out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+addr+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	return s.tr.RoundTrip(out)
}

// pass writes resp to w as it comes, flushing each piece (streams).
func pass(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	for _, h := range hopHeaders {
		w.Header().Del(h)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			// A body cut short ends the client's answer short too: the
			// handler returns and the server closes the connection
			// without the final chunk.
			if !errors.Is(err, io.EOF) {
				panic(http.ErrAbortHandler)
			}
			return
		}
	}
}
