package proxy

import (
	"bytes"
	"errors"
	"hash/maphash"
	"io"
	"math/bits"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
	// from is the client the bytes are counted to (see bodyClient).
	from bodyClient
	// in reads the client's body within its time bounds (see paced).
	in paced
	// first is the body's first byte, waited for before anything is
	// held or made for the body (see firstByte).
	first firstByte
}

// firstByte reads a body's first byte on its own, and then gives it
// back ahead of the rest: until a client sends a byte of its body, the
// proxy holds nothing for it, neither memory nor a spool file nor a copy
// buffer, whatever length it announced.
type firstByte struct {
	b    [1]byte
	have bool  // b is still to be given
	err  error // what the read of b returned, given after b
	r    io.Reader
}

// wait reads the first byte of r.
func (f *firstByte) wait(r io.Reader) {
	f.r = r
	for {
		n, err := r.Read(f.b[:])
		if n == 1 || err != nil {
			f.have, f.err = n == 1, err
			return
		}
	}
}

func (f *firstByte) Read(b []byte) (int, error) {
	if f.have {
		if len(b) == 0 {
			return 0, nil
		}
		f.have = false
		b[0] = f.b[0]
		return 1, nil
	}
	if err := f.err; err != nil {
		return 0, err
	}
	return f.r.Read(b)
}

func (f *firstByte) Close() error { return nil }

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

// firstChunk is the most memory a body of known length takes before its
// bytes arrive; past it, its buffer doubles as they do, up to its length.
const firstChunk = 16 << 10

// readBody keeps the body so it can be sent again: a body larger than
// MaxBodyBytes is refused before it is read; one up to MemoryBodyBytes is
// held in memory within MaxBufferedBytes, a larger one is spooled within
// MaxSpoolBytes. Both are counted as the bytes arrive, not as announced,
// and within the client's fair share (see bodyBudget); nothing is held or
// made for a body before its first byte arrives (see firstByte). The body must
// arrive within BodyTimeout and, past BodyRateGrace, at MinBodyRate at
// least (see paced). What it holds is given back when the request ends
// (see releaseBody).
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request, req *request) error {
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
	req.body.from = p.clientOf(r)
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

// bodyClient is who a body's bytes are counted to, for the fair shares:
// its address (the peer's IP, without the port) and, when the request
// carries one, its credential. Both are kept as hashes of a seed of the
// proxy's own, never as written.
type bodyClient struct {
	addr, cred uint64
	hasCred    bool
}

// clientOf is r's bodyClient. An IPv6 address counts by its /64, which
// one host is commonly given whole: its addresses are one client.
func (p *Proxy) clientOf(r *http.Request) bodyClient {
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
	if cred := credential(r.Header, r.URL.RawQuery); cred != "" {
		c.cred, c.hasCred = maphash.String(p.bodySeed, cred), true
	}
	return c
}

// bodyBudget is one of the bounds on what request bodies hold: memory
// (MaxBufferedBytes) or spool files (MaxSpoolBytes). Besides the total,
// it bounds each client to its fair share: while n clients hold bytes of
// it (the one asking included), one client may hold a 1/(n+1) of it, and
// never less than its floor, so that a client alone may use half of it, a
// newcomer always finds room, and a crowd still leaves each the largest
// body and a sixteenth. Clients are
// told apart by address and by credential, each bounded so: many
// addresses with one key, or many keys from one address, are one client
// for their share.
type bodyBudget struct {
	total atomic.Int64 // what all requests hold; read without mu
	// max is the bound; floor the least share; setting the variable
	// that sets max and what the bodies it bounds, for the refusals.
	max, floor    int64
	setting, what string
	mu            sync.Mutex
	// byAddr and byCred are what each client holds, by address and by
	// credential; a client holding nothing is not in them.
	byAddr, byCred map[uint64]int64
}

// init makes b a budget of limit bytes, where the largest body is
// largest bytes, set by the variable setting, of the bodies what
// ("held in memory").
func (b *bodyBudget) init(limit, largest int64, setting, what string) {
	b.max, b.floor, b.setting, b.what = limit, min(limit, max(limit/16, largest)), setting, what
	b.byAddr, b.byCred = map[uint64]int64{}, map[uint64]int64{}
}

// Load is what all requests hold.
func (b *bodyBudget) Load() int64 { return b.total.Load() }

// share is the most one client may hold while holders hold bytes (it
// among them): a part of the budget kept for one more.
func (b *bodyBudget) share(holders int) int64 {
	return max(b.floor, b.max/int64(holders+1))
}

// holders is how many clients of m hold bytes, id counted.
func holders(m map[uint64]int64, id uint64) int {
	n := len(m)
	if _, ok := m[id]; !ok {
		n++
	}
	return n
}

// take counts n more bytes as held by a request of client c, and adds
// them to mine; it refuses them (429 queue_full) when that would take the
// total past max or c past its share.
func (b *bodyBudget) take(c *bodyClient, mine *int64, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total.Load()+n > b.max {
		return fail(failQueueFull, "the request bodies "+b.what+" by the proxy reached "+b.setting+"; retry later")
	}
	if h := holders(b.byAddr, c.addr); b.byAddr[c.addr]+n > b.share(h) {
		return b.overShare("address", h)
	}
	if c.hasCred {
		if h := holders(b.byCred, c.cred); b.byCred[c.cred]+n > b.share(h) {
			return b.overShare("credential", h)
		}
		b.byCred[c.cred] += n
	}
	b.byAddr[c.addr] += n
	b.total.Add(n)
	*mine += n
	return nil
}

// overShare is the refusal of a client over its share, told apart by by.
func (b *bodyBudget) overShare(by string, holders int) error {
	return fail(failQueueFull, "the request bodies "+b.what+" for this client (by its "+by+") reached its fair share of "+b.setting+
		", "+strconv.FormatInt(b.share(holders), 10)+" bytes while "+strconv.Itoa(holders)+" clients hold bodies; retry later")
}

// give gives back mine, what a request of client c holds.
func (b *bodyBudget) give(c *bodyClient, mine *int64) {
	n := *mine
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	drop(b.byAddr, c.addr, n)
	if c.hasCred {
		drop(b.byCred, c.cred, n)
	}
	b.total.Add(-n)
	*mine = 0
}

// drop takes n from what id holds in m, and id out of m when that is
// all it held.
func drop(m map[uint64]int64, id uint64, n int64) {
	if left := m[id] - n; left > 0 {
		m[id] = left
		return
	}
	delete(m, id)
}

// paced reads a request's body within its time bounds: the whole of it
// within BodyTimeout, and, past BodyRateGrace, at MinBodyRate on average
// since its headers. A body that falls behind is refused as it does (408
// body_too_slow; past BodyTimeout, 400 body_read_error), rather than hold
// its connection and its share of the budgets for as long as it likes.
//
// The bounds are a read deadline on the connection, moved on as the bytes
// arrive, and gone once the body has been read: after that the server
// reads the connection in the background to notice a client that leaves,
// and a deadline passing there would cancel the request and cut the
// answer. (net/http clears the deadline itself when it starts that read,
// golang/go#18447; end clears it too rather than rely on it.) Where the
// response writer cannot set a read deadline, each read is still checked
// against them when it returns.
type paced struct {
	r     io.ReadCloser
	rd    readDeadliner // nil: the writer cannot set one
	began time.Time
	// rate is the least bytes per second past grace; 0: no rate bound.
	rate    int64
	grace   time.Duration
	timeout time.Duration
	got     int64
	eof     bool // the body was read to its end
	done    bool // the deadline is cleared (see end)
}

// readDeadliner is a response writer that can set its connection's read
// deadline, as net/http's own do.
type readDeadliner interface{ SetReadDeadline(time.Time) error }

// start makes in read src within p's bounds, from now.
func (in *paced) start(p *Proxy, w http.ResponseWriter, src io.ReadCloser) {
	*in = paced{r: src, began: time.Now(), grace: p.cfg.BodyRateGrace, timeout: p.cfg.BodyTimeout,
		rate: max(p.cfg.MinBodyRate, 0), rd: deadliner(w)}
	in.setDeadline()
}

// deadliner is w, or the writer it wraps, that can set a read deadline;
// nil when none can.
func deadliner(w http.ResponseWriter) readDeadliner {
	for {
		switch v := w.(type) {
		case readDeadliner:
			return v
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return nil
		}
	}
}

// due is when the body falls behind: its timeout, or sooner where the
// bytes so far fall under the rate.
func (in *paced) due() (time.Time, bool) {
	limit := in.timeout
	if in.rate > 0 {
		// Whole seconds first: a body large for its rate is due past
		// what a Duration holds, after its timeout.
		if secs := in.got / in.rate; secs <= int64((limit-in.grace)/time.Second) {
			hi, lo := bits.Mul64(uint64(in.got%in.rate), uint64(time.Second))
			frac, _ := bits.Div64(hi, lo, uint64(in.rate))
			if byRate := in.grace + time.Duration(secs)*time.Second + time.Duration(frac); byRate < limit {
				return in.began.Add(byRate), true
			}
		}
	}
	return in.began.Add(limit), false
}

func (in *paced) setDeadline() {
	if in.rd != nil {
		at, _ := in.due()
		_ = in.rd.SetReadDeadline(at)
	}
}

func (in *paced) Read(b []byte) (int, error) {
	n, err := in.r.Read(b)
	in.got += int64(n)
	if err == io.EOF {
		in.eof = true
		in.end()
		return n, err
	}
	at, byRate := in.due()
	if err == nil && time.Now().After(at) || errors.Is(err, os.ErrDeadlineExceeded) {
		return n, in.late(byRate)
	}
	if n > 0 {
		in.setDeadline()
	}
	return n, err
}

func (in *paced) Close() error { return in.r.Close() }

// late is the refusal of a body that fell behind its rate (byRate) or
// its timeout.
func (in *paced) late(byRate bool) error {
	if byRate {
		return &failure{kind: failBodyTooSlow,
			msg: "the request body arrived at less than " + strconv.FormatInt(in.rate, 10) + " bytes per second (LLMPROXY_MIN_BODY_RATE), " +
				strconv.FormatInt(in.got, 10) + " bytes in " + time.Since(in.began).Round(time.Millisecond).String()}
	}
	return fail(failBodyRead, "could not read the request body: it did not arrive within "+in.timeout.String()+" (LLMPROXY_BODY_TIMEOUT)")
}

// end clears the read deadline once the body is read, or given up on.
func (in *paced) end() {
	if in.done {
		return
	}
	in.done = true
	if in.rd != nil {
		_ = in.rd.SetReadDeadline(time.Time{})
	}
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
