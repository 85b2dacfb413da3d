package proxy

import (
	"bytes"
	"errors"
	"io"
	"math/bits"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
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

// firstChunk is the most memory a body of known length takes before its
// bytes arrive; past it, its buffer doubles as they do, up to its length.
const firstChunk = 16 << 10

// paced reads a request's body within its time bounds: the whole of it
// within BodyTimeout, and, past BodyRateGrace, at MinBodyRate on average
// since its headers. A body that falls behind is refused as it does (408
// body_too_slow; past BodyTimeout, 400 body_read_error), rather than hold
// its connection and its share of the bounds for as long as it likes.
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
