package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
)

// body is a request's body, kept so that it can be sent again: in memory
// when it is small, in a spool file when it is larger than
// Config.MemoryBodyBytes.
type body struct {
	mem  []byte
	file *os.File // the spool; nil when the body is in memory
	// path is the spool's name while it is still in the directory: where
	// a file open for reading cannot be removed (Windows). On Unix the
	// spool is removed as soon as it is made, so that nothing is left
	// behind even by a crash.
	path string
	size int64
	held int64 // bytes counted against MaxBufferedBytes
	// spooled is bytes counted against MaxSpoolBytes.
	spooled int64
}

// reader reads the whole body from its start; each attempt takes its own,
// as a transport may still be sending an attempt's body when its answer
// arrives. A body in memory is an io.NopCloser around a *bytes.Reader,
// which net/http knows for an in-memory body: it sends the body with the
// headers in one write, not after them in a second.
func (b *body) reader() io.ReadCloser {
	if b.file != nil {
		return io.NopCloser(io.NewSectionReader(b.file, 0, b.size))
	}
	return io.NopCloser(bytes.NewReader(b.mem))
}

// spoolPrefix starts every spool file's name.
const spoolPrefix = "llmproxy-spool-"

// spoolBuffers are the copy buffers of spooling.
var spoolBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// readBody keeps the body so it can be sent again: a body larger than
// MaxBodyBytes is refused before it is read; one up to MemoryBodyBytes is
// held in memory within MaxBufferedBytes, a larger one is spooled within
// MaxSpoolBytes. What it holds is given back when the request ends (see
// releaseBody).
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request, req *request) error {
	tooLarge := func() error {
		return fail(failTooLarge, "request body larger than "+strconv.FormatInt(p.cfg.MaxBodyBytes, 10)+" bytes (LLMPROXY_MAX_BODY_BYTES)")
	}
	if r.ContentLength > p.cfg.MaxBodyBytes {
		return tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	var err error
	switch n := r.ContentLength; {
	case n > p.cfg.MemoryBodyBytes:
		err = p.spool(req, r.Body, nil, n)
	case n > 0:
		// Known length: hold it before reading, and read it into one
		// buffer of that size. The server holds the body to its length,
		// which is within MaxBodyBytes.
		if !p.hold(req, n) {
			return errBuffersFull
		}
		req.body.mem = make([]byte, n)
		req.body.size = n
		_, err = io.ReadFull(r.Body, req.body.mem)
	default:
		src := io.Reader(http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes))
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
	if err != nil {
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

// spool writes the body to a spool file: head, read already, then the
// rest of src. n is the body's length when known (held against
// MaxSpoolBytes at once), else -1 (held as it arrives).
func (p *Proxy) spool(req *request, src io.Reader, head []byte, n int64) error {
	if n > 0 && !p.holdSpool(req, n) {
		return errSpoolFull
	}
	f, err := os.CreateTemp(p.cfg.SpoolDir, spoolPrefix+"*")
	if err != nil {
		p.log.Error("cannot spool a request body", "dir", p.cfg.SpoolDir, "err", err)
		return fail(failInternal, "the proxy could not spool the request body to disk (LLMPROXY_SPOOL_DIR)")
	}
	req.body.file = f
	if os.Remove(f.Name()) != nil {
		req.body.path = f.Name() // removed when the request ends
	}
	var dst io.Writer = f
	if n < 0 {
		dst = &spoolWriter{f: f, p: p, req: req}
	}
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

// spoolWriter holds the bytes of a body of unknown length against
// MaxSpoolBytes as they are written.
type spoolWriter struct {
	f   *os.File
	p   *Proxy
	req *request
}

func (s *spoolWriter) Write(b []byte) (int, error) {
	if !s.p.holdSpool(s.req, int64(len(b))) {
		return 0, errSpoolFull
	}
	return s.f.Write(b)
}

// errBuffersFull refuses a body that would take what all requests hold
// past MaxBufferedBytes.
var errBuffersFull = fail(failQueueFull, "the request bodies held by the proxy reached LLMPROXY_MAX_BUFFERED_BYTES; retry later")

// errSpoolFull refuses a body that would take what all requests spooled
// past MaxSpoolBytes.
var errSpoolFull = fail(failQueueFull, "the request bodies spooled to disk by the proxy reached LLMPROXY_MAX_SPOOL_BYTES; retry later")

// hold counts n more bytes as held in memory by req, unless that takes
// the total past MaxBufferedBytes.
func (p *Proxy) hold(req *request, n int64) bool {
	return reserve(&p.buffered, &req.body.held, n, p.cfg.MaxBufferedBytes)
}

// unhold gives back what req holds in memory.
func (p *Proxy) unhold(req *request) {
	p.buffered.Add(-req.body.held)
	req.body.held = 0
}

// holdSpool counts n more bytes as spooled by req, unless that takes the
// total past MaxSpoolBytes.
func (p *Proxy) holdSpool(req *request, n int64) bool {
	return reserve(&p.spooled, &req.body.spooled, n, p.cfg.MaxSpoolBytes)
}

// reserve adds n to total and to mine, unless that takes total past max.
func reserve(total *atomic.Int64, mine *int64, n, max int64) bool {
	if total.Add(n) > max {
		total.Add(-n)
		return false
	}
	*mine += n
	return true
}

// releaseBody gives back what req held, and closes (and removes) its
// spool.
func (p *Proxy) releaseBody(req *request) {
	p.unhold(req)
	p.spooled.Add(-req.body.spooled)
	req.body.spooled = 0
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
	if n > 0 && !h.p.hold(h.req, int64(n)) {
		return n, errBuffersFull
	}
	return n, err
}

// removeSpools removes the spool files left in dir: on Unix only a crash
// between making a spool and removing it leaves one; elsewhere any crash
// does. A spool still in use where files cannot be removed while open is
// not removed. It returns how many it removed.
func removeSpools(dir string) int {
	names, _ := filepath.Glob(filepath.Join(dir, spoolPrefix+"*"))
	n := 0
	for _, name := range names {
		if os.Remove(name) == nil {
			n++
		}
	}
	return n
}
