package proxy

import (
	"errors"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"
)

// readBody keeps the body so it can be sent again: a body larger than
// MaxBodyBytes is refused before it is read; one up to MemoryBodyBytes is
// held in memory within MaxBufferedBytes, a larger one is spooled within
// MaxSpoolBytes. Both are counted as the bytes arrive, not as announced,
// and within the client's fair share (see bodyBound); nothing is held or
// made for a body before its first byte arrives (see firstByte). The body must
// arrive within BodyTimeout and, past BodyRateGrace, at MinBodyRate at
// least (see paced). What it holds is given back when the request ends
// (see releaseBody). cred is r's credential, which its bytes count to
// with its address (see clientOf).
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request, req *request, cred string) error {
	tooLarge := func() error {
		return fail(failTooLarge, "request body larger than "+strconv.FormatInt(p.cfg.MaxBodyBytes, 10)+" bytes (LLMPROXY_MAX_BODY_BYTES)")
	}
	if r.ContentLength > p.cfg.MaxBodyBytes {
		unread(w, r)
		return tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	req.body.from = p.clientOf(r, cred)
	in := &req.body.in
	in.start(p, w, r.Body)
	first := &req.body.first
	first.wait(in)
	var err error
	switch n := r.ContentLength; {
	case n > p.cfg.MemoryBodyBytes:
		err = p.spool(req, first, nil, n)
	case n > 0:
		// Known length: read into a buffer that grows as the bytes
		// arrive, to that length at most, which the server holds the
		// body to.
		err = p.readKnown(req, first, n)
	default:
		src := io.Reader(http.MaxBytesReader(w, first, p.cfg.MaxBodyBytes))
		// Unknown length: in memory up to MemoryBodyBytes, spooled past it.
		var mem []byte
		mem, err = io.ReadAll(io.LimitReader(&heldReader{r: src, p: p, req: req}, p.cfg.MemoryBodyBytes+1))
		if err == nil && int64(len(mem)) > p.cfg.MemoryBodyBytes {
			err = p.spool(req, src, mem, -1)
			p.unhold(req) // the part read is in the spool now
			break
		}
		req.body.mem, req.body.size = mem, int64(len(mem))
	}
	in.end()
	if err != nil {
		if !in.eof {
			// Not the whole body: the server must not read the rest,
			// before it answers or after (a stalled client would hold
			// the refusal back, or the connection), nor read the next
			// request from it.
			unread(w, r)
		}
		var mbe *http.MaxBytesError
		var f *failure
		switch {
		case errors.As(err, &mbe):
			return tooLarge()
		case errors.As(err, &f):
			return err
		}
		return fail(failBodyRead, "could not read the request body: "+err.Error())
	}
	return nil
}

// unread marks the answer to r, a request whose body the proxy answers
// without reading it whole, as the connection's last, and ends the
// connection's reads: else the server, once the handler returns, would
// read what is left of the body (up to 256 KiB) for as long as the client
// takes to send it, answer sent or not. (Over HTTP/2 an unread body holds
// only its stream, which the answer ends.)
func unread(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 || r.ProtoMajor != 1 {
		return
	}
	w.Header().Set("Connection", "close")
	if rd := deadliner(w); rd != nil {
		_ = rd.SetReadDeadline(time.Now())
	}
}

// clientOf is the bodyClient of r, whose credential is cred ("" for
// none). An IPv6 address counts by its /64, which one host is commonly
// given whole: its addresses are one client.
func (p *Proxy) clientOf(r *http.Request, cred string) bodyClient {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	var c bodyClient
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		if a.Is4() {
			b := a.As4()
			c.addr = maphash.Bytes(p.bodySeed, b[:])
		} else {
			b := a.As16()
			c.addr = maphash.Bytes(p.bodySeed, b[:8])
		}
	} else {
		c.addr = maphash.String(p.bodySeed, host)
	}
	if cred != "" {
		c.cred, c.hasCred = maphash.String(p.bodySeed, cred), true
	}
	return c
}

// readKnown reads a body of known length n into memory: a first buffer of
// up to firstChunk, doubled as the bytes fill it, each size held before
// it is made.
func (p *Proxy) readKnown(req *request, src io.Reader, n int64) error {
	size := min(n, firstChunk)
	if err := p.hold(req, size); err != nil {
		return err
	}
	buf := make([]byte, size)
	var got int64
	for {
		k, err := io.ReadFull(src, buf[got:])
		got += int64(k)
		if got == n {
			break
		}
		switch err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return io.ErrUnexpectedEOF
		default:
			return err
		}
		grown := min(2*size, n)
		if err := p.hold(req, grown-size); err != nil {
			return err
		}
		next := make([]byte, grown)
		copy(next, buf)
		buf, size = next, grown
	}
	req.body.mem, req.body.size = buf, n
	return nil
}

// spool writes the body to a spool file: head, read already, then the
// rest of src; n is the body's length when known, else -1. Its bytes are
// held against MaxSpoolBytes as they are written.
func (p *Proxy) spool(req *request, src io.Reader, head []byte, n int64) error {
	f, err := os.CreateTemp(p.cfg.SpoolDir, spoolPrefix+"*")
	if err != nil {
		p.log.Error("cannot spool a request body", "dir", p.cfg.SpoolDir, "err", err)
		return fail(failInternal, "the proxy could not spool the request body to disk (LLMPROXY_SPOOL_DIR)")
	}
	req.body.file = f
	if os.Remove(f.Name()) != nil {
		req.body.path = f.Name() // removed when the request ends
	}
	dst := &spoolWriter{f: f, p: p, req: req}
	bp := spoolBuffers.Get().(*[]byte)
	defer spoolBuffers.Put(bp)
	if _, err := dst.Write(head); err != nil {
		return err
	}
	var copied int64
	if n > 0 {
		copied, err = io.CopyBuffer(dst, io.LimitReader(src, n), *bp)
		if err == nil && copied < n {
			err = io.ErrUnexpectedEOF
		}
	} else {
		copied, err = io.CopyBuffer(dst, src, *bp)
	}
	req.body.size = int64(len(head)) + copied
	return err
}

// spoolWriter holds the bytes of a body against MaxSpoolBytes as they are
// written.
type spoolWriter struct {
	f   *os.File
	p   *Proxy
	req *request
}

func (s *spoolWriter) Write(b []byte) (int, error) {
	if err := s.p.holdSpool(s.req, int64(len(b))); err != nil {
		return 0, err
	}
	return s.f.Write(b)
}

// hold counts n more bytes as held in memory by req, unless that takes
// the total past MaxBufferedBytes or its client past its share.
func (p *Proxy) hold(req *request, n int64) error {
	return p.buffered.take(&req.body.from, &req.body.held, n)
}

// unhold gives back what req holds in memory.
func (p *Proxy) unhold(req *request) {
	p.buffered.give(&req.body.from, &req.body.held)
}

// holdSpool counts n more bytes as spooled by req, unless that takes the
// total past MaxSpoolBytes or its client past its share.
func (p *Proxy) holdSpool(req *request, n int64) error {
	return p.spooled.take(&req.body.from, &req.body.spooled, n)
}

// releaseBody gives back what req held, and closes (and removes) its
// spool.
func (p *Proxy) releaseBody(req *request) {
	p.unhold(req)
	p.spooled.give(&req.body.from, &req.body.spooled)
	if f := req.body.file; f != nil {
		f.Close()
		if req.body.path != "" {
			os.Remove(req.body.path)
		}
		req.body.file, req.body.path = nil, ""
	}
}

// heldReader counts a body of unknown length as it arrives.
type heldReader struct {
	r   io.Reader
	p   *Proxy
	req *request
}

func (h *heldReader) Read(b []byte) (int, error) {
	n, err := h.r.Read(b)
	if n > 0 {
		if herr := h.p.hold(h.req, int64(n)); herr != nil {
			return n, herr
		}
	}
	return n, err
}

// spoolBuffers are the copy buffers of spooling.
var spoolBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}
