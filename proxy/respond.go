package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/cost"
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
	stream := flushEachWrite(resp)
	pricing := metered && resp.StatusCode < 300 && p.cfg.Prices != nil && p.cfg.Prices.Model(req.spend.model) != nil
	if pricing && !isEventStream(resp) {
		p.respondPriced(w, req, resp)
		return
	}
	var meter usageMeter
	if metered && resp.StatusCode < 300 {
		meter = newUsageMeter(stream)
	}
	var out io.Writer
	if pricing || req.spend.stripUsage && stream {
		f := priceStream(w, req, pricing)
		defer f.Close()
		out = f
	}
	w.WriteHeader(resp.StatusCode)
	// An answer that stalls must not hold its slot forever when the
	// client has no timeout of its own: the upstream sending nothing for
	// MaxWait cuts the attempt.
	var upstreamIdle *time.Timer
	if a := req.attempt; a != nil {
		upstreamIdle = time.AfterFunc(p.cfg.MaxWait, a.cancel)
		defer upstreamIdle.Stop()
	}
	if err := copyBody(w, out, resp.Body, stream, meter, p.cfg.MaxWait, upstreamIdle); err != nil {
		// A failure after the status went out can only be signalled by
		// breaking the connection; the deferred releases still run, and
		// the attempt's cancellation ends the upstream call.
		p.cut(req, err)
	}
	if meter != nil {
		if u, ok := meter.Usage(); ok {
			p.counted(req, u)
			if pricing {
				p.price(req, u, resp.Header)
				w.Header().Set(costHeader, req.spend.amount.String())
			}
		}
		if m, ok := meter.(*bodyMeter); ok {
			m.release()
		}
	}
}

// cut ends an answer whose copy failed with err after its status went
// out: that can only be signalled by breaking the connection; the
// deferred releases still run, and the attempt's cancellation ends the
// upstream call.
func (p *Proxy) cut(req *request, err error) {
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

// priceStream readies w for a stream whose price (priced) the client
// gets at its end, in a trailer (x-llmproxy-cost-usd), or whose usage
// chunk the proxy asked for, so with no length; the writer returned
// takes that chunk out (see askUsage). Close it once the stream is
// copied.
func priceStream(w http.ResponseWriter, req *request, priced bool) io.WriteCloser {
	if priced {
		w.Header().Set("Trailer", costHeader)
	}
	w.Header().Del("Content-Length")
	if req.spend.stripUsage {
		return &tokens.UsageChunkFilter{W: w}
	}
	return nopWriteCloser{w}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// counted notes the usage u of req's answer: for its lane to settle its
// estimate, and on its trace.
func (p *Proxy) counted(req *request, u tokens.Usage) {
	req.used = u.Total()
	req.prompted = u.Input
	req.trace.Usage(u.Input, u.Output)
}

// respondPriced answers with a non-streamed answer whose price the
// client gets in its headers (x-llmproxy-cost-usd): the body, up to
// maxMeteredBody, is read whole before the headers go out. A larger one
// goes on unpriced after what was read; one the upstream cut is cut.
func (p *Proxy) respondPriced(w http.ResponseWriter, req *request, resp *http.Response) {
	m := bodyMeters.Get().(*bodyMeter)
	defer m.release()
	var idle *time.Timer
	if a := req.attempt; a != nil {
		idle = time.AfterFunc(p.cfg.MaxWait, a.cancel)
		defer idle.Stop()
	}
	buf := bytes.NewBuffer(m.buf[:0])
	_, err := io.Copy(buf, io.LimitReader(resp.Body, maxMeteredBody+1))
	m.buf = buf.Bytes()
	whole := err == nil && len(m.buf) <= maxMeteredBody
	if whole {
		if u, ok := tokens.FromBody(m.buf); ok {
			p.counted(req, u)
			p.price(req, u, resp.Header)
			w.Header().Set(costHeader, req.spend.amount.String())
			if req.spend.asked != "" { // what the body says served it
				w.Header().Set(servedTierHeader, string(req.spend.served))
			}
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(m.buf)))
	}
	w.WriteHeader(resp.StatusCode)
	rest := io.Reader(bytes.NewReader(m.buf))
	switch {
	case err != nil:
		rest = io.MultiReader(rest, failingReader{err})
	case !whole:
		rest = io.MultiReader(rest, resp.Body)
	}
	if err := copyBody(w, nil, rest, false, nil, p.cfg.MaxWait, idle); err != nil {
		p.cut(req, err)
	}
}

// failingReader gives its error: an upstream's cut, after what was read
// of its answer before it.
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }

// isEventStream reports whether resp is a server-sent event stream.
func isEventStream(resp *http.Response) bool { return eventStreamHeader(resp.Header) }

// eventStreamHeader reports whether h says its body is server-sent
// events.
func eventStreamHeader(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// price prices req's answer from its usage u and headers h, at the tier
// that served it.
func (p *Proxy) price(req *request, u tokens.Usage, h http.Header) {
	s := &req.spend
	s.served = servedTier(req, u.Tier, h)
	s.amount, s.priced = p.cfg.Prices.Cost(s.model, s.served, u)
	if s.priced {
		p.metrics.spent(req.route, s.served, s.amount)
		req.trace.Cost(s.amount.Dollars(), string(s.served), s.run)
	}
}

// servedTier is the tier that served req's answer: what its body says
// (said, OpenAI's service_tier), else Gemini's x-gemini-service-tier,
// else the tier its last attempt asked for.
func servedTier(req *request, said string, h http.Header) cost.Tier {
	if t := cost.TierOf(said); t != "" {
		return t
	}
	if t := cost.TierOf(h.Get("X-Gemini-Service-Tier")); t != "" {
		return t
	}
	if req.spend.onFlex {
		return cost.Flex
	}
	return cost.Standard
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
	if req.spend.asked != "" && resp.StatusCode < 300 {
		h.Set(servedTierHeader, string(servedTier(req, "", resp.Header)))
	}
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
	return resp.ContentLength == -1 || isEventStream(resp)
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

// copyBody copies src to w (through out, when not nil), flushing after each write when flush is set,
// and shows every chunk to tap when it is not nil. A client that accepts
// nothing for idle is cut (errClientStalled): without a write deadline a
// client that stops reading would hold its slot, and the upstream call,
// for as long as it keeps the connection open. srcIdle, when not nil,
// is the source's idle timer: it is pushed back with the deadline, to
// idle.
func copyBody(w http.ResponseWriter, out io.Writer, src io.Reader, flush bool, tap io.Writer, idle time.Duration, srcIdle *time.Timer) error {
	if out == nil {
		out = w
	}
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
			if _, werr := out.Write(buf[:n]); werr != nil {
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
