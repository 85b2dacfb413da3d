package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/llmproxy/llmproxy/internal/bucket"
	"github.com/llmproxy/llmproxy/limit"
)

// What a pool learned, kept so that a restarted proxy starts from it
// rather than from nothing (docs/journal.md, "Learned limits"). Each
// pool's Shared state is wrapped (Book.Wrap): as what it learned
// changes, a snapshot is written, with absolute times, at most every
// flushEvery; a pool made again after a restart starts paced by its
// snapshot until it learns afresh from the upstream.

var limitsBucket = []byte("limits")

// flushEvery is how often changed snapshots are written: what a kill -9
// can lose.
const flushEvery = 250 * time.Millisecond

// restoredFor bounds how long a restored limit paces a pool that learns
// nothing new (a silent upstream the restored pace keeps from refusing):
// after it, the pool learns as a new one would.
const restoredFor = time.Hour

// obeyPause is the longest restored pause obeyed as it is; a longer one
// is probed by one request.
const obeyPause = time.Minute

// confirmFor is how long restored budgets still cap a pool once it has
// learned from the upstream itself: a new state's first figures overshoot
// (its first remaining counts, its slow start), the restored ones do not.
const confirmFor = 10 * time.Second

// saved is one pool's snapshot, as the file keeps it.
type saved struct {
	At time.Time `json:"at"`
	// Requests and Tokens are the learned budgets: a bucket of Limit
	// refilled at PerSecond, holding Available at At; zero when not
	// learned.
	Requests budget `json:"requests,omitzero"`
	Tokens   budget `json:"tokens,omitzero"`
	// WindowAllowance requests per WindowLength: a fixed window learned
	// from its closures.
	WindowAllowance int           `json:"window_allowance,omitempty"`
	WindowLength    time.Duration `json:"window_length,omitempty"`
	// WindowStart is when the running window began, as the answers
	// showed it (the first admitted after a closure), and WindowCount
	// what was sent in it by At; zero when not seen.
	WindowStart time.Time `json:"window_start,omitzero"`
	WindowCount int       `json:"window_count,omitempty"`
	// WindowAhead is how many requests of that window were counted before
	// they went (see aheadLocked): what a kill -9 may have sent in it.
	WindowAhead int `json:"window_ahead,omitempty"`
	// Concurrency is the concurrency limit: learned from refusals, named
	// by the upstream, or the start grown by answers.
	Concurrency int `json:"concurrency,omitempty"`
	// PausedUntil is a pause in force at At, and its reason.
	PausedUntil time.Time `json:"paused_until,omitzero"`
	PauseReason string    `json:"pause_reason,omitempty"`
	// QuotaUntil is when a quota the upstream said spent renews; Quota
	// says one is (QuotaUntil may be zero: not known).
	Quota      bool      `json:"quota,omitempty"`
	QuotaUntil time.Time `json:"quota_until,omitzero"`
	// Joined names (hashed, as the file's keys are) the pool this one was
	// found to share one upstream limit with: the pool that took its lanes.
	Joined string `json:"joined,omitempty"`
	// Clean: written as its process stopped, after its last answer; not
	// clean, the process may have sent more after At (a kill -9).
	Clean bool `json:"clean,omitempty"`
}

type budget struct {
	Limit     float64 `json:"limit"`
	PerSecond float64 `json:"per_second"`
	Available float64 `json:"available"`
}

func (s saved) learned() bool {
	return s.Requests.PerSecond > 0 || s.Tokens.PerSecond > 0 || s.WindowAllowance > 0 ||
		!s.PausedUntil.IsZero() || s.Quota || s.Joined != ""
}

// Book keeps the pools' snapshots in the store.
type Book struct {
	s     *Store
	mu    sync.Mutex
	dirty map[string]*remembered // by file key, to write at the next flush
	soon  chan struct{}          // a window's count to write ahead: flush now
	stop  chan struct{}
	done  chan struct{}
	now   func() time.Time
	began time.Time // when the book opened: its own snapshots are after
}

// Limits starts the store's book of learned limits; the store's Close
// writes what changed last and stops it.
func (s *Store) Limits() (*Book, error) {
	if err := s.db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(limitsBucket)
		return err
	}); err != nil {
		return nil, err
	}
	b := &Book{s: s, dirty: map[string]*remembered{}, soon: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), now: time.Now}
	b.began = b.now()
	go b.flushing()
	s.closers = append(s.closers, b.close)
	return b, nil
}

// fileKey is a pool's key as the file keeps it: a hash, so that nothing
// in the file names a route, credential hash or model in clear.
func fileKey(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return []byte(hex.EncodeToString(sum[:16]))
}

// load is the snapshot kept for the pool with key, if any.
func (b *Book) load(key string) (saved, bool) {
	var s saved
	var ok bool
	_ = b.s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(limitsBucket).Get(fileKey(key)); v != nil {
			ok = json.Unmarshal(v, &s) == nil
		}
		return nil
	})
	return s, ok
}

// Shared makes the Shared state of the pool with key and cfg with
// newShared, kept in the book: it starts from the pool's snapshot, when the
// file has one (a learned concurrency limit as where cfg starts, unless
// the route configures one).
func (b *Book) Shared(key string, cfg limit.Config, newShared func(limit.Config) limit.Shared) limit.Shared {
	s, ok := b.load(key)
	own := cfg
	if ok && s.Concurrency > 0 && cfg.Limits.Concurrency == 0 {
		cfg.Limits.Concurrency, cfg.Limits.Start = s.Concurrency, true
	}
	r := &remembered{Shared: newShared(cfg), book: b, key: fileKey(key), cfg: own}
	if ok {
		r.restore(s, b.now())
	}
	return r
}

func (b *Book) changed(r *remembered) {
	b.mu.Lock()
	b.dirty[string(r.key)] = r
	b.mu.Unlock()
}

// reserve has r's window count ahead written at once; true when it is
// already (a book without a file, as in tests, keeps nothing to lose).
func (b *Book) reserve(r *remembered) bool {
	if b.s == nil {
		return true
	}
	b.changed(r)
	select {
	case b.soon <- struct{}{}:
	default:
	}
	return false
}

func (b *Book) flushing() {
	defer close(b.done)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			b.flush()
			b.markClean()
			return
		case <-t.C:
			b.flush()
		case <-b.soon:
			b.flush()
		}
	}
}

// flush writes the snapshots of the pools that changed since the last.
func (b *Book) flush() {
	b.mu.Lock()
	dirty := b.dirty
	b.dirty = map[string]*remembered{}
	b.mu.Unlock()
	if len(dirty) == 0 {
		return
	}
	snaps := make(map[string][]byte, len(dirty))
	written := make(map[*remembered]saved, len(dirty))
	for k, r := range dirty {
		r.mu.Lock()
		s := r.last
		r.mu.Unlock()
		written[r] = s
		if s.learned() {
			snaps[k], _ = json.Marshal(s)
		} else {
			snaps[k] = nil
		}
	}
	err := b.s.db.Update(func(tx *bolt.Tx) error {
		lb := tx.Bucket(limitsBucket)
		for k, v := range snaps {
			var err error
			if v == nil {
				err = lb.Delete([]byte(k))
			} else {
				err = lb.Put([]byte(k), v)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return
	}
	for r, s := range written {
		r.mu.Lock()
		if w := &r.win; w.start.Equal(s.WindowStart) && s.WindowAhead > w.ahead {
			w.ahead = s.WindowAhead
		}
		r.mu.Unlock()
	}
}

// markClean marks the snapshots this book wrote clean: the proxy
// stopped after their last answers, so nothing went after them.
func (b *Book) markClean() {
	_ = b.s.db.Update(func(tx *bolt.Tx) error {
		lb := tx.Bucket(limitsBucket)
		var fixed [][2][]byte
		err := lb.ForEach(func(k, v []byte) error {
			var s saved
			if json.Unmarshal(v, &s) == nil && !s.Clean && !s.At.Before(b.began) {
				s.Clean = true
				nv, _ := json.Marshal(s)
				fixed = append(fixed, [2][]byte{append([]byte(nil), k...), nv})
			}
			return nil
		})
		for _, f := range fixed {
			if err == nil {
				err = lb.Put(f[0], f[1])
			}
		}
		return err
	})
}

func (b *Book) close() {
	close(b.stop)
	<-b.done
}

// remembered is a pool's Shared state, its changes written to the book,
// paced at first by what was restored. The pool calls it under its
// lock, as it calls the state it wraps; the book's flushes read only
// last, under mu.
type remembered struct {
	limit.Shared
	book *Book
	key  []byte
	cfg  limit.Config // the pool's own, before a restored concurrency

	mu sync.Mutex
	// restored: the snapshot it started from paces it (requests and
	// tokens; a fixed window by the gate) until the pool learns anew or
	// restoredFor passes; restoredAt is the snapshot's time.
	restored      bool
	restoredAt    time.Time
	restoredUntil time.Time
	knewAt        time.Time // when the wrapped state first knew a limit
	requests      *bucket.Bucket
	tokens        *bucket.Bucket
	pausedUntil   time.Time
	quota         bool // a spent quota: one request goes to see
	probing       bool
	// joined is the file key of the pool this one shares a limit with.
	joined string
	// spent is a quota the answers said spent (renews: when it renews,
	// zero when not said), until an answer admits a request.
	spent  bool
	renews time.Time
	// win follows the upstream's fixed windows from the answers; gate: it
	// holds the pool by them (a restored window), and the refusals it
	// reads are not the wrapped state's to learn from.
	win  windowTrack
	gate bool
	// last is the latest snapshot, for the book to write.
	last saved
}

// windowTrack follows a fixed window of allowance per length: where the
// running one began (the first answer admitted after a closure) and what
// was sent in it; closed from a refusal until a knock is admitted.
type windowTrack struct {
	allowance int
	length    time.Duration
	start     time.Time
	count     int
	closed    bool
	closedAt  time.Time // the refused dispatch that closed it
	knockAt   time.Time
	knockOut  bool
	// unsure is how much of the running window's allowance may have gone
	// unseen (a kill -9 after the last snapshot): that part is sent one
	// request at a time (probeOut), so a spent window costs one refusal.
	unsure   int
	probeOut bool
	probeSeq uint64 // the probe's dispatch
	// ahead is how many of the running window's requests the file counts
	// already; asked, how many a write on its way will.
	ahead, asked int
	// accepted counts the running window's admitted answers; seen* are
	// the shape the answers showed (the allowance a window admitted, the
	// time from one opening to the next), read while the wrapped state
	// held the pool for a window (windowHeld): before it knows the shape
	// itself, from one closure.
	accepted                int
	seenAllowance           int
	seenLength              time.Duration
	windowHeld, provisional bool
	// firstSeq and firstSent are the running window's first dispatch;
	// rolledFrom, when roll moved the window on by one length, is where
	// the one before began (its first dispatch: a window counted from its
	// first request begins there). early: the upstream refused the first
	// dispatch after a roll, so its window had not ended (the length was
	// read short), and the boundary is knocked for.
	firstSeq   uint64
	firstSent  time.Time
	rolledFrom time.Time
	early      bool
}

// knockEvery is how often a closed restored window is knocked on.
const knockEvery = 250 * time.Millisecond

// roll moves the window on to the one running at now.
func (w *windowTrack) roll(now time.Time) {
	if w.start.IsZero() || w.length <= 0 || now.Before(w.start.Add(w.length)) || w.early {
		return // (early: a knock admitted says where the next begins)
	}
	w.accepted, w.rolledFrom = 0, time.Time{}
	if now.Before(w.start.Add(2 * w.length)) {
		w.rolledFrom = w.start
		if w.firstSent.After(w.start) {
			w.rolledFrom = w.firstSent
		}
	}
	w.start = w.start.Add(now.Sub(w.start).Truncate(w.length))
	w.count, w.unsure, w.probeOut, w.ahead, w.asked = 0, 0, false, 0, 0
}

// answered reads an answer to a request dispatched at sent: a refusal
// closes the window; the first admitted after it opens the next.
func (w *windowTrack) answered(refused bool, seq uint64, sent, now time.Time) {
	if seq == w.probeSeq {
		w.probeOut = false
	}
	switch {
	case refused:
		if !w.closed || sent.After(w.closedAt) {
			w.closedAt = sent
		}
		w.early = w.early || seq == w.firstSeq && !w.rolledFrom.IsZero()
		w.closed, w.knockOut, w.knockAt, w.unsure = true, false, now.Add(knockEvery), 0
		if end := w.start.Add(w.length); !w.early && !w.start.IsZero() && end.After(now) {
			w.knockAt = end // the boundary is known: no knock before it
		}
	case w.closed && sent.After(w.closedAt):
		if w.windowHeld && !w.start.IsZero() && sent.After(w.start) {
			w.seenAllowance, w.seenLength = w.accepted, sent.Sub(w.start)
		}
		if w.early && sent.Sub(w.closedAt) <= 2*knockEvery {
			// The window that began at rolledFrom ended by sent, and after
			// the last refused knock: at most this long, so it does not roll
			// early again. (A knock held apart from the refusals by
			// something else, another limit's pause, bounds nothing.)
			w.length = max(w.length, sent.Sub(w.rolledFrom))
		}
		w.rolledFrom, w.early = time.Time{}, false
		w.closed, w.knockOut, w.windowHeld, w.provisional = false, false, false, false
		w.start, w.count, w.accepted, w.ahead, w.asked = sent, 1, 1, 0, 0
	case !w.closed && !w.start.IsZero() && !sent.Before(w.start):
		w.accepted++
	}
}

func (r *remembered) restore(s saved, now time.Time) {
	r.restored, r.restoredAt, r.restoredUntil = true, s.At, now.Add(restoredFor)
	r.last, r.joined = s, s.Joined
	elapsed := max(now.Sub(s.At).Seconds(), 0)
	unseen := flushEvery.Seconds() // what the old process may have sent after At
	if s.Clean {
		unseen = 0
	}
	refill := func(b budget) *bucket.Bucket {
		if b.PerSecond <= 0 {
			return nil
		}
		// What it held then and refilled since, less what the old
		// process may have sent after its last snapshot (a kill -9).
		k := &bucket.Bucket{Size: b.Limit, Rate: b.PerSecond}
		k.Set(now, math.Min(b.Limit, b.Available+b.PerSecond*(elapsed-unseen)))
		return k
	}
	r.requests, r.tokens = refill(s.Requests), refill(s.Tokens)
	if s.WindowAllowance > 0 && s.WindowLength > 0 {
		r.gate, r.requests = true, nil
		r.win = windowTrack{allowance: s.WindowAllowance, length: s.WindowLength, start: s.WindowStart, count: s.WindowCount}
		if !s.WindowStart.IsZero() {
			r.win.ahead = max(s.WindowCount, s.WindowAhead) // what the file counts
			r.win.asked = r.win.ahead
			switch {
			case s.Clean:
			case s.WindowAhead > 0:
				// Counted before they went: no more than that went.
				r.win.count = r.win.ahead
			default:
				// Not counted ahead (a file from before): a window's
				// allowance goes in a burst, so after a kill -9 any of it
				// may have gone unseen, and all of it is probed.
				r.win.unsure = s.WindowAllowance
			}
		} else {
			// No boundary seen: evenly spaced, the allowance never overruns
			// a window of its length, wherever its boundaries fall.
			r.requests = &bucket.Bucket{Size: 1, Rate: float64(s.WindowAllowance) / s.WindowLength.Seconds()}
			r.requests.Set(now, 1)
		}
	}
	r.quota = s.Quota && (s.QuotaUntil.IsZero() || now.Before(s.QuotaUntil))
	switch rest := s.PausedUntil.Sub(now); {
	case rest > obeyPause:
		// Longer than a rate's pause: re-probed rather than obeyed, as a
		// spent quota is (the file may hold what the upstream's words set,
		// or what someone wrote).
		r.quota = true
	case rest > 0:
		r.pausedUntil = s.PausedUntil
	}
}

// activeLocked reports whether the restored limits still pace the pool:
// until confirmFor after it learns from the upstream itself (a gated
// window, whose refusals it does not see, for restoredFor), or a refusal
// shows them wrong.
func (r *remembered) activeLocked(now time.Time) bool {
	if r.restored && !r.gate && r.knewAt.IsZero() && r.Shared.Knows() {
		r.knewAt = now
	}
	if r.restored && (now.After(r.restoredUntil) || !r.knewAt.IsZero() && now.Sub(r.knewAt) >= confirmFor) {
		r.restored, r.gate = false, false
	}
	return r.restored
}

// holdLocked is when the restored limits let a request costing cost go
// (zero: only an answer can say), or ok.
func (r *remembered) holdLocked(now time.Time, cost int64, alone bool) (time.Time, bool) {
	if now.Before(r.pausedUntil) {
		return r.pausedUntil, false
	}
	if r.quota && (r.probing || !alone) {
		return time.Time{}, false // the probe's answer decides
	}
	if !r.activeLocked(now) {
		return time.Time{}, true
	}
	if r.gate {
		w := &r.win
		w.roll(now)
		switch {
		case w.closed && w.knockOut:
			return time.Time{}, false
		case w.closed && now.Before(w.knockAt):
			return w.knockAt, false
		case !w.closed && !w.start.IsZero() && w.count >= w.allowance:
			return w.start.Add(w.length), false
		case !w.closed && w.count >= w.allowance-w.unsure && w.probeOut:
			return time.Time{}, false // the probe's answer says whether there is room
		}
	}
	if k := r.requests; k != nil {
		if at, ok := k.Admit(now, 1); !ok {
			return at, false
		}
	}
	if k := r.tokens; k != nil {
		if at, ok := k.Admit(now, float64(cost)); !ok {
			return at, false
		}
	}
	return time.Time{}, true
}

// aheadWait is how soon a request held for its window's count to be
// written goes again: a write takes about a millisecond.
const aheadWait = 2 * time.Millisecond

// aheadLocked holds a request in a window of known shape until the file
// counts it: the count written runs ahead of what went by up to a
// twentieth of the allowance, and is asked for again once half of that is
// used, so the pool made again after a kill -9 starts from at least what
// went (the unused part of one step is what that costs).
func (r *remembered) aheadLocked(now time.Time) (time.Time, bool) {
	w := &r.win
	if w.allowance <= 0 || w.length <= 0 || w.start.IsZero() && w.closed {
		return time.Time{}, true
	}
	if w.start.IsZero() {
		w.start, w.provisional = now, true // a window from the first request
	}
	w.roll(now)
	if step := max(2, w.allowance/20); w.asked-w.count <= step/2 {
		w.asked = w.count + step
		s := &r.last
		if s.At.IsZero() {
			s.At = now
		}
		s.WindowAllowance, s.WindowLength = w.allowance, w.length
		s.WindowStart, s.WindowCount, s.WindowAhead = w.start, w.count, w.asked
		if r.book.reserve(r) {
			w.ahead = w.asked
		}
	}
	if w.count < w.ahead {
		return time.Time{}, true
	}
	return now.Add(aheadWait), false
}

func (r *remembered) Admit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	r.mu.Lock()
	at, ok := r.holdLocked(now, cost, alone)
	if ok {
		at, ok = r.aheadLocked(now)
	}
	r.mu.Unlock()
	if !ok {
		return limit.Ticket{}, at, false
	}
	t, at, ok := r.Shared.Admit(now, cost, alone)
	if !ok {
		return t, at, ok
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.win.start.IsZero() && !r.win.closed {
		r.win.start, r.win.provisional = now, true // a window from the first request
	}
	r.win.roll(now)
	r.win.count++
	if r.win.count == 1 {
		r.win.firstSeq, r.win.firstSent = t.Seq, now
	}
	if r.win.closed {
		r.win.knockOut, t.Knock = true, true // held by the knocks if refused, as the wrapped state's
	}
	if r.win.unsure > 0 && r.win.count > r.win.allowance-r.win.unsure {
		r.win.probeOut, r.win.probeSeq = true, t.Seq
	}
	if r.restored {
		if k := r.requests; k != nil {
			k.Charge(1)
		}
		if k := r.tokens; k != nil {
			k.Charge(float64(cost))
		}
	}
	r.probing = r.probing || r.quota
	return t, at, ok
}

func refusedForRate(v limit.Verdict) bool { return v == limit.RateRefused }

func (r *remembered) Learn(t *limit.Ticket, rep limit.Report, now time.Time) {
	r.mu.Lock()
	gated := r.gate && r.activeLocked(now)
	r.mu.Unlock()
	learned := rep
	if gated && refusedForRate(rep.Verdict) {
		// The restored window read this refusal (below): the state it
		// wraps would read it as one of a pool it knows nothing of, and
		// pause the pool for the retry's backoff, where the window holds
		// it to its end or by its knocks.
		learned.Verdict, learned.PauseUntil = limit.Failed, time.Time{}
	}
	r.Shared.Learn(t, learned, now)
	v := r.Shared.View(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probing && rep.Verdict != limit.NotSent {
		r.quota, r.probing = false, false // the answer says; the lanes keep a quota it names
	}
	switch {
	case rep.Quota.Spent:
		r.spent, r.renews = true, rep.Quota.Renews
	case rep.Verdict == limit.Accepted && rep.Status < 400:
		r.spent = false
	}
	if w := v.Window; w != nil && w.Allowance > 0 && w.Length > 0 && !r.gate {
		r.win.allowance, r.win.length = w.Allowance, w.Length
	}
	if r.win.closed && v.PauseReason.String() == "window" {
		r.win.windowHeld = true
	}
	if rep.Verdict != limit.NotSent && rep.Verdict != limit.Failed {
		r.win.answered(refusedForRate(rep.Verdict), t.Seq, t.Dispatched, now)
		if !r.gate && r.win.length == 0 && r.win.seenLength > 0 {
			r.win.allowance, r.win.length = r.win.seenAllowance, r.win.seenLength
		}
	}
	if !gated && rep.Verdict != limit.Accepted && rep.Verdict != limit.NotSent && rep.Verdict != limit.Failed {
		r.restored = false // the upstream's refusals are the ground truth
	}
	r.snapshotLocked(v, now)
	r.book.changed(r)
}

func (r *remembered) Return(t *limit.Ticket, now time.Time) {
	r.Shared.Return(t, now)
	r.mu.Lock()
	if r.probing && r.quota {
		r.probing = false // the probe went nowhere: the next may go
	}
	if r.win.knockOut && !t.Dispatched.Before(r.win.closedAt) {
		r.win.knockOut = false
	}
	if t.Seq == r.win.probeSeq {
		r.win.probeOut = false // answered (Learn) or never sent: the next may go
	}
	r.mu.Unlock()
}

func (r *remembered) PausedUntil() time.Time {
	u := r.Shared.PausedUntil()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pausedUntil.After(u) {
		return r.pausedUntil
	}
	return u
}

func (r *remembered) View(now time.Time) limit.View {
	v := r.Shared.View(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.restoredAt.IsZero() || v.Shared != "" {
		return v
	}
	at := r.restoredAt.UTC().Format("15:04:05")
	if !r.activeLocked(now) {
		v.Shared = "restored from state at " + at + " UTC, learned since"
		return v
	}
	v.Shared = "restored from state at " + at + " UTC"
	if !v.Requests.Known && r.requests != nil {
		v.Requests = limit.BudgetView{Known: true, Limit: r.requests.Size, PerSecond: r.requests.Rate, Available: r.requests.Level()}
	}
	if !v.Requests.Known && r.gate {
		v.Requests = limit.BudgetView{Known: true, Limit: float64(r.win.allowance), PerSecond: float64(r.win.allowance) / r.win.length.Seconds()}
	}
	if !v.Tokens.Known && r.tokens != nil {
		v.Tokens = limit.BudgetView{Known: true, Limit: r.tokens.Size, PerSecond: r.tokens.Rate, Available: r.tokens.Level()}
	}
	if now.Before(r.pausedUntil) && r.pausedUntil.After(v.PausedUntil) {
		v.PausedUntil = r.pausedUntil
	}
	return v
}

// PutJoined notes, for the next process, that the pool shares one
// upstream limit with the pool named root, which took its lanes.
func (r *remembered) PutJoined(root string) {
	r.mu.Lock()
	r.joined = string(fileKey(root))
	r.last.Joined = r.joined
	r.mu.Unlock()
	r.book.changed(r)
}

// Joined reports whether the pool was found sharing root's limit, by this
// process or the one before it: the lanes pool with root's again at the
// pool's first answer, rather than find it again from the answers.
func (r *remembered) Joined(root string) bool {
	r.mu.Lock()
	j := r.joined
	r.mu.Unlock()
	return j != "" && j == string(fileKey(root))
}

// StartFrom passes on to the wrapped state, when it has it (see
// limit.Memory.StartFrom).
func (r *remembered) StartFrom(now time.Time, inFlight int, answerSecs, sending float64) {
	if s, ok := r.Shared.(interface {
		StartFrom(time.Time, int, float64, float64)
	}); ok {
		s.StartFrom(now, inFlight, answerSecs, sending)
	}
}

// Configure takes cfg as the pool's own from now on.
func (r *remembered) Configure(cfg limit.Config) {
	r.mu.Lock()
	r.cfg = cfg
	r.mu.Unlock()
	r.Shared.Configure(cfg)
}

func (r *remembered) Forget() {
	r.mu.Lock()
	cfg := r.cfg
	r.mu.Unlock()
	r.Shared.Configure(cfg) // a restored concurrency is not where it starts again
	r.Shared.Forget()
	r.mu.Lock()
	r.restored, r.restoredAt, r.knewAt, r.requests, r.tokens = false, time.Time{}, time.Time{}, nil, nil
	r.pausedUntil, r.quota, r.probing, r.gate, r.spent, r.renews = time.Time{}, false, false, false, false, time.Time{}
	r.win, r.last, r.joined = windowTrack{}, saved{}, ""
	r.mu.Unlock()
	r.book.changed(r)
}

// snapshotLocked takes what the pool knows at now (v, the wrapped
// state's view), for the book: what it learned itself and where its
// window stands; while the restored limits pace a pool that learned
// nothing itself, what was restored, its window brought up to date.
func (r *remembered) snapshotLocked(v limit.View, now time.Time) {
	s := saved{At: now}
	if r.activeLocked(now) && !v.Requests.Known && !v.Tokens.Known {
		s = r.last
		s.At = now
		if r.gate {
			s.WindowLength = r.win.length // as the knocks found it
		}
		if k := r.requests; k != nil {
			k.Refill(now)
			s.Requests.Available = k.Level()
		}
		if k := r.tokens; k != nil {
			k.Refill(now)
			s.Tokens.Available = k.Level()
		}
	} else {
		if b := v.Requests; b.Known {
			s.Requests = budget{Limit: b.Limit, PerSecond: b.PerSecond, Available: b.Available}
		}
		if b := v.Tokens; b.Known {
			s.Tokens = budget{Limit: b.Limit, PerSecond: b.PerSecond, Available: b.Available}
		}
		if w := v.Window; w != nil && w.Allowance > 0 && w.Length > 0 {
			s.WindowAllowance, s.WindowLength = w.Allowance, w.Length
		} else if r.win.allowance > 0 && r.win.length > 0 {
			s.WindowAllowance, s.WindowLength = r.win.allowance, r.win.length
		}
		s.Concurrency = v.Concurrency // lowered by refusals, or grown by answers: where a new pool starts
		if now.Before(v.PausedUntil) {
			s.PausedUntil, s.PauseReason = v.PausedUntil, v.PauseReason.String()
		}
	}
	if r.spent && (r.renews.IsZero() || now.Before(r.renews)) {
		s.Quota, s.QuotaUntil = true, r.renews
	}
	s.Joined = r.joined
	if s.WindowAllowance > 0 && !r.win.closed && !r.win.start.IsZero() {
		r.win.roll(now)
		s.WindowStart, s.WindowCount, s.WindowAhead = r.win.start, r.win.count, r.win.asked
	}
	r.last = s
}
