package proxy

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/llmproxy/llmproxy/upstream"
)

// setLLMHeaders adds the x-llmproxy-* headers every answer carries.
func setLLMHeaders(h http.Header, req *request) {
	if req.lane != nil {
		h.Set("X-Llmproxy-Lane", req.lane.ID())
	}
	h.Set("X-Llmproxy-Queue-Ms", strconv.FormatInt(req.queueWait.Milliseconds(), 10))
	h.Set("X-Llmproxy-Retries", strconv.Itoa(req.retries))
}

// respond passes the upstream's answer to the client as it arrives.
func (p *Proxy) respond(w http.ResponseWriter, req *request, res upstream.Result) {
	if res.Resp == nil {
		p.giveUp(w, req, res, "no answer")
		return
	}
	resp := res.Resp
	defer resp.Body.Close()
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	upstream.StripHopHeaders(h)
	if resp.Uncompressed {
		h.Del("Content-Length")
		h.Del("Content-Encoding")
	}
	setLLMHeaders(h, req)
	if upstream.RetryableStatus(resp.StatusCode) || res.Outcome == upstream.Final && resp.StatusCode >= 400 {
		// The proxy already retried, or knows retrying cannot help: stop
		// SDKs from multiplying attempts.
		h.Set("X-Should-Retry", "false")
	}
	req.status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	if err := copyBody(w, resp.Body, flushEachWrite(resp)); err != nil {
		// A failure after the status went out can only be signalled by
		// breaking the connection; the deferred releases still run.
		if !errors.Is(err, errClientGone) {
			p.log.Warn("upstream body failed mid-answer", "lane", req.lane.ID(), "err", redactErr(err, req.target))
		}
		panic(http.ErrAbortHandler)
	}
}

// flushEachWrite reports whether the answer is a stream: server-sent events
// or a body of unknown length. Those are flushed after every write so each
// event reaches the client as soon as the upstream sends it.
func flushEachWrite(resp *http.Response) bool {
	if resp.ContentLength == -1 {
		return true
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "text/event-stream"
}

var errClientGone = errors.New("client went away")

// copyBody copies src to w, flushing after each write when flush is set.
func copyBody(w http.ResponseWriter, src io.Reader, flush bool) error {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return errClientGone
			}
			if flush {
				if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
					return errClientGone
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
