package proxy

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/tokens"
	"github.com/llmproxy/llmproxy/upstream"
)

// respond passes the upstream's answer to the client as it arrives.
// When metered, the answer's token usage is read, for the lane to settle
// its estimate with.
func (p *Proxy) respond(w http.ResponseWriter, req *request, res upstream.Result, metered bool) {
	if res.Resp == nil {
		p.giveUp(w, req, res, "no answer")
		return
	}
	resp := res.Resp
	defer resp.Body.Close()
	p.answerHeaders(w.Header(), req, resp)
	req.status = resp.StatusCode
	req.outcome = OutcomeOK
	if resp.StatusCode >= 400 {
		req.outcome = OutcomeUpstreamError
	}
	w.WriteHeader(resp.StatusCode)
	stream := flushEachWrite(resp)
	var meter usageMeter
	if metered && resp.StatusCode < 300 {
		meter = newUsageMeter(stream)
	}
	// An answer that stalls must not hold its slot forever when the
	// client has no timeout of its own: the upstream sending nothing for
	// MaxWait cuts the attempt.
	var upstreamIdle *time.Timer
	if a := req.attempt; a != nil {
		upstreamIdle = time.AfterFunc(p.cfg.MaxWait, a.cancel)
		defer upstreamIdle.Stop()
	}
	if err := copyBody(w, resp.Body, stream, meter, p.cfg.MaxWait, upstreamIdle); err != nil {
		// A failure after the status went out can only be signalled by
		// breaking the connection; the deferred releases still run, and
		// the attempt's cancellation ends the upstream call.
		req.outcome = OutcomeClientGone
		switch {
		case p.stopping():
			req.outcome, req.cutErr = OutcomeProxyError, "cut by shutdown"
		case errors.Is(err, errClientStalled):
			req.outcome, req.cutErr = OutcomeClientStalled, "the client accepted nothing for "+p.cfg.MaxWait.String()
		case !errors.Is(err, errClientGone):
			req.outcome = OutcomeUpstreamCut
			req.cutErr = redactErr(err, req.target)
		}
		panic(http.ErrAbortHandler)
	}
	if meter != nil {
		if u, ok := meter.Usage(); ok {
			req.used = u.Total()
			req.prompted = u.Input
			req.trace.Usage(u.Input, u.Output)
		}
		if m, ok := meter.(*bodyMeter); ok {
			m.release()
		}
	}
}

// answerHeaders sets h, the client's answer's headers, from resp's: the
// hop-by-hop ones and (unless passed) the rate-limit windows left out,
// the proxy's own added.
func (p *Proxy) answerHeaders(h http.Header, req *request, resp *http.Response) {
	// Under x-llmproxy-retry: off an error goes back as the upstream sent
	// it: the client retries on its own, by the upstream's words.
	asSent := req.retryOff && resp.StatusCode >= 400
	var skip func(string) bool
	if !p.cfg.PassRateLimitHeaders && !asSent {
		skip = headerparse.IsWindowHeader
	}
	upstream.CopyEndToEnd(h, resp.Header, skip)
	if !p.cfg.PassRateLimitHeaders {
		if resp.StatusCode < 300 {
			delete(h, "Retry-After")
			delete(h, "Retry-After-Ms")
		}
	}
	if resp.Uncompressed {
		delete(h, "Content-Length")
		delete(h, "Content-Encoding")
	}
	setLLMHeaders(h, req)
	if upstream.RetryableStatus(resp.StatusCode) && !asSent {
		// The proxy already retried, or knows retrying cannot help (hard
		// quota): stop SDKs from multiplying attempts. Other statuses are
		// left to the SDK's own rules.
		setNoRetry(h)
	}
}

// flushEachWrite reports whether the answer is a stream: server-sent events
// or a body of unknown length. Those are flushed after every write so each
// event reaches the client as soon as the upstream sends it.
func flushEachWrite(resp *http.Response) bool {
	if resp.ContentLength == -1 {
		return true
	}
	mt, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";") // a media type's parameters follow ';'
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// rearmEvery is how often an idle bound's timer or deadline is pushed back
// while the answer moves: once a second, more often for a short bound. A
// bound may so end up to that much early; a stream of many small events
// costs one clock reading per event, not a timer's work.
func rearmEvery(idle time.Duration) time.Duration { return min(time.Second, idle/4) }

// copyBufs recycles the 32 KiB copy buffers: one per answer would be most
// of the proxy's allocation per request.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

var (
	errClientGone    = errors.New("client went away")
	errClientStalled = errors.New("client stopped reading")
)

// copyBody copies src to w, flushing after each write when flush is set,
// and shows every chunk to tap when it is not nil. A client that accepts
// nothing for idle is cut (errClientStalled): without a write deadline a
// client that stops reading would hold its slot, and the upstream call,
// for as long as it keeps the connection open. srcIdle, when not nil,
// is the source's idle timer: it is pushed back with the deadline, to
// idle.
func copyBody(w http.ResponseWriter, src io.Reader, flush bool, tap io.Writer, idle time.Duration, srcIdle *time.Timer) error {
	rc := http.NewResponseController(w)
	set := time.Now() // when the deadline and srcIdle were last pushed back
	deadlines := rc.SetWriteDeadline(set.Add(idle)) == nil
	if deadlines {
		// The connection may serve more requests: no deadline left behind.
		defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	}
	writeErr := func(err error) error {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errClientStalled
		}
		return errClientGone
	}
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if tap != nil {
				_, _ = tap.Write(buf[:n])
			}
			if now := time.Now(); now.Sub(set) >= rearmEvery(idle) {
				if deadlines {
					_ = rc.SetWriteDeadline(now.Add(idle))
				}
				if srcIdle != nil {
					srcIdle.Reset(idle)
				}
				set = now
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return writeErr(werr)
			}
			if flush {
				if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
					return writeErr(err)
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// usageMeter watches an answer on its way to the client for its token usage.
type usageMeter interface {
	io.Writer
	Usage() (tokens.Usage, bool)
}

func newUsageMeter(stream bool) usageMeter {
	if stream {
		return &tokens.StreamScanner{}
	}
	return bodyMeters.Get().(*bodyMeter)
}

// bodyMeters recycle the body meters and their buffers: most answers are
// small, and a buffer of their size would otherwise be allocated and
// grown for each.
var bodyMeters = sync.Pool{New: func() any { return &bodyMeter{} }}

// maxPooledMeter bounds the buffer a meter keeps when it goes back to the
// pool: a rare large answer's buffer is left to the collector.
const maxPooledMeter = 64 << 10

// release gives m back to the pool, emptied.
func (m *bodyMeter) release() {
	if cap(m.buf) > maxPooledMeter {
		m.buf = nil
	}
	m.buf, m.overflow = m.buf[:0], false
	bodyMeters.Put(m)
}

// maxMeteredBody bounds what is kept of a non-streamed answer to read its
// usage; a larger answer is passed through without settling.
const maxMeteredBody = 4 << 20

// bodyMeter keeps a bounded copy of a JSON answer to read usage from.
type bodyMeter struct {
	buf      []byte
	overflow bool
}

func (m *bodyMeter) Write(p []byte) (int, error) {
	if !m.overflow {
		if len(m.buf)+len(p) > maxMeteredBody {
			m.overflow, m.buf = true, nil
		} else {
			m.buf = append(m.buf, p...)
		}
	}
	return len(p), nil
}

func (m *bodyMeter) Usage() (tokens.Usage, bool) {
	if m.overflow {
		return tokens.Usage{}, false
	}
	return tokens.FromBody(m.buf)
}

// giveUp hands the client the upstream's own last answer, or a proxy error
// when there is none, marked so SDKs do not retry on top of the proxy.
func (p *Proxy) giveUp(w http.ResponseWriter, req *request, res upstream.Result, why string) {
	if res.Resp != nil {
		p.log.Debug("giving up on retries", "lane", req.laneID, "status", res.Resp.StatusCode, "reason", why)
		p.respond(w, req, res, false)
		return
	}
	setLLMHeaders(w.Header(), req)
	err := fail(failDeadline, why)
	if res.Err != nil {
		err = fail(failUnreachable, "upstream "+req.target.Host+" unreachable: "+redactErr(res.Err, req.target)+" ("+why+")")
	}
	p.failRequest(w, req, err)
}

// redactErr returns a transport error without the URL's query, which a
// client may have used for an api key.
func redactErr(err error, u *url.URL) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	s := err.Error()
	if u.RawQuery != "" {
		s = strings.ReplaceAll(s, u.RawQuery, "…")
	}
	return s
}
