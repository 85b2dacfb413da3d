package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmproxy/llmproxy/state"
)

// The journal's and the joins' keeping (docs/journal.md): with a state
// file, complete answers are kept by run, request and occurrence, and
// served again; a client's retry of a call still in flight joins it.

const (
	journalHeader = "X-Llmproxy-Journal"
	// The SDKs' retry count (0 on a first try) and a client's idempotency
	// key: a request carrying either can be retried, so a call of it
	// whose client left goes on, for the retry to join.
	retryCountHeader  = "X-Stainless-Retry-Count"
	idempotencyHeader = "Idempotency-Key"
)

type journalMode uint8

const (
	journalOff journalMode = iota
	journalRecord
	journalReplay
	journalStrict
)

// journalModes are the modes by name, as LLMPROXY_JOURNAL and
// x-llmproxy-journal give them.
var journalModes = map[string]journalMode{"": journalOff, "off": journalOff, "record": journalRecord, "replay": journalReplay, "strict": journalStrict}

func parseJournalMode(s string) (journalMode, bool) {
	m, ok := journalModes[strings.ToLower(strings.TrimSpace(s))]
	return m, ok
}

// keepSay is what a client said of its request's journal and retries,
// and what names it: x-llmproxy-journal (said), X-Stainless-Retry-Count
// above 0 (retry), Idempotency-Key (idem), and its credential.
type keepSay struct {
	mode  journalMode
	said  bool
	retry bool
	// retries: it carries X-Stainless-Retry-Count, so its client retries
	// a call it gives up on.
	retries bool
	idem    string
	// maxWait is its x-llmproxy-max-wait (0: none); a kept call's
	// deadline is MaxWait less it, not the client's own timeout (see
	// keepOn).
	maxWait time.Duration
	// timeout is the client's own timeout (X-Stainless-Timeout, or the
	// Python SDK's X-Stainless-Read-Timeout), 0 when it says none: a
	// client that leaves at it will retry; one that leaves before it
	// gave up.
	timeout time.Duration
	cred    string
	post    bool
	// client is the client's context, as the request arrived.
	client context.Context
	// tape is the request's answer as it goes out, while the journal
	// records it or a retry may join it; nil otherwise.
	tape *tape
}

// bound is the end of the request's context: deadline, its own, or a
// kept call's longer one (see keepOn).
func (k *keepSay) bound(deadline time.Time) time.Time {
	if k.tape != nil && k.tape.until.After(deadline) {
		return k.tape.until
	}
	return deadline
}

// parent is the context the request's upstream call runs in: the
// client's, or, once a tape keeps the answer, one the client's leaving
// ends only before the request is sent (see tape.left).
func (k *keepSay) parent() context.Context {
	if k.tape != nil {
		return k.tape.ctx
	}
	return k.client
}

// recordedHeaders are the answer headers a recording keeps: what the
// client needs to read the body again. Rate-limit, request-id and date
// headers said something of that moment only.
var recordedHeaders = [...]string{"Content-Type", "Content-Encoding", servedTierHeader}

// callKey names a request for joins and the journal: a SHA-256 of its
// credential, method, path, query (less a credential in it) and
// canonical body. idem is the same over its credential and
// Idempotency-Key, when it sent one.
type callKey struct {
	sum    [state.KeySize]byte
	idem   [state.KeySize]byte
	model  string
	stream bool // it asks for a stream
}

// canonicalMax is the largest body read as JSON for its key; a larger
// one is keyed by its bytes.
const canonicalMax = 4 << 20

// canonicalBody is raw with its JSON object keys sorted and no spaces,
// so that two clients that write the same request differently share a
// key; a body that is not JSON is itself. model is its "model" field.
func canonicalBody(raw []byte) (canon []byte, model string) {
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if len(raw) > canonicalMax || d.Decode(&v) != nil || d.More() {
		return raw, ""
	}
	if m, ok := v.(map[string]any); ok {
		model, _ = m["model"].(string)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw, ""
	}
	return out, model
}

// keyQuery is the query less the parameters that carry a credential.
func keyQuery(raw string) string {
	if raw == "" {
		return ""
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return raw
	}
	q.Del("key")
	q.Del("api-key")
	return q.Encode()
}

// tapeMax is the most of an answer a tape holds; a larger answer is
// neither recorded nor joined.
const tapeMax = 32 << 20

// joinWindow is how long a call whose client left goes on without a
// retry joining it, when the journal does not record it.
const joinWindow = 10 * time.Second

// joinKeep is how long a complete answer whose client left waits for
// the retry that joins it.
const joinKeep = time.Minute

var hashNul = []byte{0}

func keySum(parts ...[]byte) (s [state.KeySize]byte) {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
		h.Write(hashNul)
	}
	h.Sum(s[:0])
	return s
}

// keeping is the proxy's side of the journal and of joins: the calls
// under way that a request may join, and each run's pass (which
// occurrence of its body a request is).
type keeping struct {
	mode    journalMode
	journal *state.Journal
	// passGap is how long a run rests, with none of its requests at the
	// proxy, before its next request starts a new pass (counts its
	// occurrences from 1 again).
	passGap time.Duration

	mu      sync.Mutex
	runs    map[string]*runPass
	recs    map[slotKey]*tape             // calls whose answer the journal will keep
	byIdem  map[[state.KeySize]byte]*tape // by credential and Idempotency-Key
	orphans map[[state.KeySize]byte][]*tape
	kept    int64 // bytes of answers kept for joins whose client left
	// buffered is the bytes all tapes hold (tapeBudget bounds it): every
	// SDK request carries X-Stainless-Retry-Count, so each has a tape.
	buffered atomic.Int64
}

// tapeBudget bounds the answer bytes all tapes hold together; a tape
// that would pass it lets its answer go unkept (neither recorded nor
// joined). The answers waiting for the journal's writer are in it.
const tapeBudget = 256 << 20

// orphanMax bounds the bytes of complete answers kept for retries to
// join (joinKeep).
const orphanMax = 64 << 20

// maxPasses bounds the runs whose pass is kept; past it the one idle
// longest goes.
const maxPasses = 1000

type slotKey struct {
	run string
	sum [state.KeySize]byte
	occ uint32
}

// runPass is one run's pass: the occurrences its requests took, and
// its requests at the proxy whose client is still there.
type runPass struct {
	live      int
	abandoned bool // live fell to 0 as clients left (a run killed)
	last      time.Time
	occs      map[[16]byte]*occurrences
	gen       uint64      // counts the passes: an occurrence goes back only to its own
	rest      *time.Timer // drops the pass once it rested its gap
}

// maxOccurrences bounds the distinct requests a pass counts (about 80
// bytes each); past it, a new request is its run's first of its kind
// and the identical ones after it are not told apart.
const maxOccurrences = 200_000

type occurrences struct {
	next uint32   // the highest taken
	free []uint32 // taken, then given back: taken again first
}

// journaled is one request's place in its run's pass.
type journaled struct {
	run   string
	occ   uint32
	pass  *runPass
	gen   uint64 // the pass's, when it was taken
	short [16]byte
	ended bool // its end was counted to the pass
}

// callOf is the key of a request with say, target and body raw (see
// keyBody): see callKey. Only the journal needs the body canonical (two
// clients that write one request differently); a retry of a call sends
// the same bytes, so a join alone keys the body as it is, which costs a
// request with the journal off no JSON decoding.
func callOf(say *keepSay, target *url.URL, raw []byte, canonical bool) callKey {
	canon, model := raw, ""
	if canonical {
		canon, model = canonicalBody(raw)
	}
	cred := []byte(say.cred)
	c := callKey{model: model, stream: bytes.Contains(canon, []byte(`"stream":true`)) || bytes.Contains(canon, []byte(`"stream": true`))}
	c.sum = keySum(cred, []byte(http.MethodPost), []byte(target.Path), []byte(keyQuery(target.RawQuery)), canon)
	if say.idem != "" {
		c.idem = keySum(cred, []byte(say.idem))
	}
	return c
}

// joinable is the call a retry or a request with the same
// Idempotency-Key joins: one with that key, or the oldest call of the
// same request whose client left. nil when none.
func (k *keeping) joinable(c callKey, say *keepSay) (t *tape, claimed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if say.idem != "" {
		if t := k.byIdem[c.idem]; t != nil {
			return t, false
		}
	}
	if !say.retry {
		return nil, false
	}
	for _, t := range k.orphans[c.sum] {
		if t.claim() {
			return t, true
		}
	}
	return nil, false
}

// claim takes t for one retry: an orphan serves one retry at a time, and
// is there for the next if that one's client leaves too.
func (t *tape) claim() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.joiners > 0 {
		return false
	}
	t.joiners++
	return true
}

// unclaim ends a join; complete says the joiner got the whole answer,
// and then an orphan it claimed as a retry is spent.
func (k *keeping) unclaim(t *tape, complete, retry bool) {
	t.mu.Lock()
	t.joiners--
	rearm := t.joiners == 0 && t.gone && !t.done
	t.mu.Unlock()
	if rearm && !complete {
		t.cutUnjoined() // its joiner left too: the next retry has joinWindow
	}
	if complete && retry {
		k.mu.Lock()
		k.dropOrphanLocked(t.c.sum, t)
		k.mu.Unlock()
	}
}

func (k *keeping) dropOrphanLocked(sum [state.KeySize]byte, t *tape) {
	list := k.orphans[sum]
	for i, o := range list {
		if o == t {
			list = append(list[:i:i], list[i+1:]...)
			if t.keptBytes > 0 {
				k.kept -= t.keptBytes
				t.keptBytes = 0
			}
			break
		}
	}
	if len(list) == 0 {
		delete(k.orphans, sum)
	} else {
		k.orphans[sum] = list
	}
}

// take gives a request of run with key c its occurrence in the run's
// pass. A retry continues the pass; any other request after the run
// rested for passGap, or after its clients all left, starts a new one.
func (k *keeping) take(c callKey, run string, retry bool, now time.Time) *journaled {
	if run == "" {
		run = "default"
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.runs[run]
	if p == nil {
		if len(k.runs) >= maxPasses {
			k.dropIdlestLocked()
		}
		p = &runPass{occs: map[[16]byte]*occurrences{}}
		k.runs[run] = p
	} else if !retry && p.live == 0 && (p.abandoned || now.Sub(p.last) >= k.passGap) {
		p.occs = map[[16]byte]*occurrences{}
		p.gen++
	}
	p.live++
	p.abandoned = false
	p.last = now
	j := &journaled{run: run, pass: p, gen: p.gen}
	copy(j.short[:], c.sum[:16])
	o := p.occs[j.short]
	if o == nil {
		o = &occurrences{}
		if len(p.occs) < maxOccurrences {
			p.occs[j.short] = o
		}
	}
	if n := len(o.free); n > 0 {
		low := 0
		for i, f := range o.free {
			if f < o.free[low] {
				low = i
			}
		}
		j.occ = o.free[low]
		o.free[low] = o.free[n-1]
		o.free = o.free[:n-1]
	} else {
		o.next++
		j.occ = o.next
	}
	return j
}

func (k *keeping) dropIdlestLocked() {
	var idlest string
	var at time.Time
	for name, p := range k.runs {
		if p.live == 0 && (idlest == "" || p.last.Before(at)) {
			idlest, at = name, p.last
		}
	}
	if idlest != "" {
		delete(k.runs, idlest)
	}
}

// answered ends j's request in its pass: consumed keeps its occurrence
// taken (an answer was served or recorded), otherwise it is given back.
func (k *keeping) answered(j *journaled, consumed bool) { k.passEnd(j, consumed, false) }

func (k *keeping) passEnd(j *journaled, consumed, left bool) {
	if j == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if o := j.pass.occs[j.short]; !consumed && o != nil && j.gen == j.pass.gen {
		o.free = append(o.free, j.occ) // into its own pass only
	}
	if j.ended {
		return
	}
	j.ended = true
	p := j.pass
	p.live--
	p.last = time.Now()
	if p.live == 0 {
		p.abandoned = left
		// A pass that rests its gap would start again from 1 at the run's
		// next request: it is dropped then, and its counts with it.
		if p.rest == nil {
			p.rest = time.AfterFunc(k.passGap, func() { k.dropRested(j.run, p) })
		} else {
			p.rest.Reset(k.passGap)
		}
	}
}

// dropRested drops p, run's pass, if it is still the run's and rested
// its gap.
func (k *keeping) dropRested(run string, p *runPass) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.runs[run] == p && p.live == 0 {
		if rested := time.Since(p.last); rested < k.passGap {
			p.rest.Reset(k.passGap - rested)
			return
		}
		delete(k.runs, run)
	}
}

// recording is the call under way whose answer the journal will keep
// as j's occurrence.
func (k *keeping) recording(c callKey, j *journaled) *tape {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.recs[slotKey{j.run, c.sum, j.occ}]
}

// tape is a request's answer as it goes to its client, kept for the
// journal and for the calls that join it. Once the client has left, the
// answer still runs to its end (writes to the client are dropped), when
// it was sent before the client left.
type tape struct {
	w       http.ResponseWriter
	k       *keeping
	c       callKey
	j       *journaled // nil: not recorded
	ctx     context.Context
	cancel  context.CancelFunc
	unwatch func() bool

	mu       sync.Mutex
	changed  *sync.Cond
	status   int
	header   http.Header
	buf      []byte
	over     bool // past tapeMax: neither recorded nor joined
	gone     bool // the client left
	sent     bool // the request went upstream
	done, ok bool
	joiners  int
	orphan   bool
	// timesOut is when its client's own timeout ends its wait (zero: it
	// states none); until is when the kept call's context ends.
	timesOut  time.Time
	until     time.Time
	keptBytes int64
	released  bool // its bytes went back to keeping.buffered
}

func (k *keeping) newTape(w http.ResponseWriter, client context.Context, c callKey, j *journaled, idem bool) *tape {
	t := &tape{w: w, k: k, c: c, j: j}
	t.changed = sync.NewCond(&t.mu)
	t.ctx, t.cancel = context.WithCancel(context.WithoutCancel(client))
	k.mu.Lock()
	if j != nil {
		k.recs[slotKey{j.run, c.sum, j.occ}] = t
	}
	if idem {
		k.byIdem[c.idem] = t
	}
	k.mu.Unlock()
	t.unwatch = context.AfterFunc(client, t.left)
	return t
}

// sentNow notes that the request went upstream: from now its client's
// leaving does not end the call.
func (k *keepSay) sentNow() {
	if t := k.tape; t != nil {
		t.mu.Lock()
		t.sent = true
		t.mu.Unlock()
	}
}

// left is the client leaving: a request not yet sent is dropped; a call
// under way goes on for a retry to join, and for the journal.
func (t *tape) left() {
	t.mu.Lock()
	if t.gone || t.done {
		t.gone = true
		t.mu.Unlock()
		return
	}
	t.gone = true
	// A client that left well before its own timeout gave up rather than
	// timed out: no retry follows, and unless the journal keeps its answer
	// the call ends now.
	// Stating no timeout, a stream's client that leaves stopped reading;
	// one waiting for a whole answer may have timed out.
	gaveUp := t.j == nil && (t.timesOut.IsZero() && t.c.stream || !t.timesOut.IsZero() && time.Now().Before(t.timesOut.Add(-time.Second/4)))
	sent := t.sent && !gaveUp
	t.orphan = sent
	t.mu.Unlock()
	t.k.passEnd(t.j, true, true)
	if !sent {
		t.cancel()
		return
	}
	t.k.mu.Lock()
	t.mu.Lock()
	if !t.done { // not forgotten already
		t.k.orphans[t.c.sum] = append(t.k.orphans[t.c.sum], t)
	}
	t.mu.Unlock()
	t.k.mu.Unlock()
	t.cutUnjoined()
}

// cutUnjoined ends, joinWindow from now, a call whose client left that
// the journal does not record, unless a retry joined it by then.
func (t *tape) cutUnjoined() {
	if t.j != nil {
		return
	}
	time.AfterFunc(joinWindow, func() {
		t.mu.Lock()
		idle := t.joiners == 0 && !t.done
		t.mu.Unlock()
		if idle {
			t.cancel()
		}
	})
}

func (t *tape) Header() http.Header { return t.w.Header() }

func (t *tape) Unwrap() http.ResponseWriter { return t.w }

func (t *tape) WriteHeader(code int) {
	h := t.w.Header()
	if t.j != nil {
		v := "miss"
		if code >= 200 && code < 300 {
			v = "recorded"
		}
		h.Set(journalHeader, v)
	}
	kept := http.Header{}
	for _, name := range recordedHeaders {
		if v, ok := h[name]; ok {
			kept[name] = v
		}
	}
	t.mu.Lock()
	t.status, t.header = code, kept
	gone := t.gone
	t.mu.Unlock()
	t.changed.Broadcast()
	if !gone {
		t.w.WriteHeader(code)
	}
}

func (t *tape) Write(b []byte) (int, error) {
	t.mu.Lock()
	if !t.over {
		if len(t.buf)+len(b) > tapeMax || t.k.buffered.Add(int64(len(b))) > tapeBudget {
			if len(t.buf)+len(b) <= tapeMax {
				t.k.buffered.Add(-int64(len(b)))
			}
			t.k.buffered.Add(-int64(len(t.buf)))
			t.over, t.buf = true, nil
		} else {
			t.buf = append(t.buf, b...)
		}
	}
	gone := t.gone
	t.mu.Unlock()
	t.changed.Broadcast()
	if gone {
		return len(b), nil
	}
	if _, err := t.w.Write(b); err != nil {
		t.left()
	}
	return len(b), nil
}

// FlushError and SetWriteDeadline are http.ResponseController's: a client
// gone takes neither.
func (t *tape) FlushError() error {
	if t.isGone() {
		return nil
	}
	if err := http.NewResponseController(t.w).Flush(); err != nil {
		t.left()
	}
	return nil
}

func (t *tape) SetWriteDeadline(d time.Time) error {
	if t.isGone() {
		return nil
	}
	return http.NewResponseController(t.w).SetWriteDeadline(d)
}

// orphaned reports whether the client left while the call was under way.
func (t *tape) orphaned() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.orphan
}

func (t *tape) isGone() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gone
}

// wrapUp ends the tape: its answer is complete when outcomeOK and its
// status is a success; the calls waiting on it are told. It gives back
// the occurrence of an answer that will not be recorded, and returns
// the answer.
func (t *tape) wrapUp(outcomeOK bool) (ok bool, status int, header http.Header, answer []byte) {
	t.unwatch()
	t.mu.Lock()
	t.done = true
	t.ok = outcomeOK && t.status >= 200 && t.status < 300 && !t.over
	ok, status, header, answer = t.ok, t.status, t.header, t.buf
	gone := t.gone
	t.mu.Unlock()
	t.changed.Broadcast()
	t.cancel()
	if !gone {
		t.k.passEnd(t.j, ok, false)
	} else if !ok && t.j != nil {
		t.k.passEnd(t.j, false, true) // gives its occurrence back
	}
	return ok, status, header, answer
}

// forget drops t from the calls a request may join, at once or, for an
// answer whose client left, joinKeep later.
func (k *keeping) forget(t *tape, keep bool) {
	k.mu.Lock()
	if t.j != nil && k.recs[slotKey{t.j.run, t.c.sum, t.j.occ}] == t {
		delete(k.recs, slotKey{t.j.run, t.c.sum, t.j.occ})
	}
	if keep && k.kept+int64(len(t.buf)) <= orphanMax {
		t.keptBytes = int64(len(t.buf))
		k.kept += t.keptBytes
		k.mu.Unlock()
		time.AfterFunc(joinKeep, func() { k.forget(t, false) })
		return
	}
	if k.byIdem[t.c.idem] == t {
		delete(k.byIdem, t.c.idem)
	}
	if !t.released {
		t.released = true
		k.buffered.Add(-int64(len(t.buf)))
	}
	k.dropOrphanLocked(t.c.sum, t)
	k.mu.Unlock()
}

// init readies k for journal, in mode (as LLMPROXY_JOURNAL says it),
// with passes that end after passGap of rest.
func (k *keeping) init(journal *state.Journal, mode string, passGap time.Duration) {
	k.mode, _ = parseJournalMode(mode)
	k.journal, k.passGap = journal, passGap
	if k.passGap <= 0 {
		k.passGap = 30 * time.Second
	}
	k.runs, k.recs = map[string]*runPass{}, map[slotKey]*tape{}
	k.byIdem, k.orphans = map[[state.KeySize]byte]*tape{}, map[[state.KeySize]byte][]*tape{}
}
