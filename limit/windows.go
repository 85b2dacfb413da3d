package limit

import (
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// windows reads from refusals and admissions whether a pool's upstream
// counts in fixed windows, N requests per window with the count starting
// again at each boundary (Azure OpenAI, Kong, Gemini's per-minute quotas,
// a company gateway's Redis INCR + EXPIRE), and holds the pool by them:
// once a window's allowance is spent the upstream refuses everything until
// the boundary (a closure), so the pool waits for it as a whole, and sends
// the next window's allowance from its start instead of pacing it out
// evenly. Its methods require the group's mutex held.
type windows struct {
	closure   // the closure under way, and its knocks
	suspicion // the refusals that suspect a silent closure
	// cur is the running window; prev the one that ended, whose figures go
	// on counting answers that come late.
	cur, prev windowCount
	shape     // what closures taught: the allowance, the length, the probe
}

// closure is a span in which the upstream refuses whatever the pool sends,
// and which holds the pool while it lasts. It is read two ways:
//
//   - Stated: a refusal names a wait longer than a pace (see boundary), or,
//     once the shape is known, any wait at all. A window's refusals all
//     point at its boundary, while a bucket's (or a gateway's constant
//     Retry-After) move with the clock. One test request a gap later tells
//     them apart: refused at the same instant, the closure is real and the
//     boundary lies within every refusal's hint, to the hint's grain (whole
//     seconds or milliseconds); admitted, or refused at another instant,
//     the hints are not boundaries and the pool is paced as before. Within
//     the interval the boundary may lie in, single knocks halve it.
//   - Silent: refusals with no hint and no admission between them for
//     minClosure (see suspicion). The pool then sends one knock at a time,
//     further apart the longer the closure lasts, until one is admitted.
type closure struct {
	closed bool
	// confirmed: the closure is known, not only suspected from one hint.
	confirmed bool
	// stated: the upstream named the boundary in its hints; it lies in
	// (lo, hi], to the hints' grain.
	stated bool
	lo, hi time.Time
	since  time.Time // the closure's first refused dispatch
	// knockAt is when the next knock may go, knock the Seq of the one in
	// flight (0: none) and lastKnock the dispatch of the latest refused
	// one: a silent closure's boundary is after it.
	knockAt, knockSent, lastKnock time.Time
	knock                         uint64
	// moving: until then a long hint is not read as a boundary; a test
	// showed the hints moving with the clock.
	moving time.Time
}

// until is how long a closure holds the pool, as a pause would: to its
// stated boundary once confirmed, else to its next knock or test (zero:
// no closure). With replicas, that is how the others learn of it, and
// what keeps a replica from sending into it (a replica's own knocks do
// not reach the shared state).
func (c *closure) until() time.Time {
	switch {
	case !c.closed:
		return time.Time{}
	case c.stated && c.confirmed:
		return c.hi
	}
	return c.knockAt
}

// knocked records the knock gate allowed, numbered seq, sent at now.
func (c *closure) knocked(seq uint64, now time.Time) { c.knock, c.knockSent = seq, now }

// ended learns that the dispatch numbered seq gave its permit back: a
// knock whose answer said nothing of the window (a failure, a client gone,
// nothing sent) lets the next knock go, instead of holding the pool for
// an answer that will not come.
func (c *closure) ended(seq uint64) {
	if c.knock == seq {
		c.knock = 0
	}
}

// state narrows the stated boundary with a hint naming r, to grain.
func (c *closure) state(r time.Time, grain time.Duration) {
	if c.hi.IsZero() || r.Before(c.hi) {
		c.hi = r
	}
	c.lo = clock.Later(r.Add(-grain), c.lo)
	if !c.lo.Before(c.hi) {
		c.lo = c.hi.Add(-time.Millisecond) // hints that disagree: the latest word
	}
}

// agrees reports whether a hint naming r, to grain, points at the boundary
// the closure's hints named.
func (c *closure) agrees(r time.Time, grain time.Duration) bool {
	return r.After(c.lo.Add(-grain)) && !r.After(c.hi.Add(grain))
}

// distrust ends a stated closure whose hints a test showed moving with the
// clock, and reads no long hint as a boundary until hintTrust from now.
func (c *closure) distrust(now time.Time) { c.knock, c.moving, c.closed = 0, now.Add(hintTrust), false }

// suspicion is a run of refusals outside a closure: run refusals from
// runFrom, the first answered at runSeen; minRun of them over minClosure
// read as a silent closure. Requests reach the upstream in another order
// than they went, so only an admission sent after runSeen ends the run.
type suspicion struct {
	runFrom, runSeen, lastAdmit time.Time // lastAdmit: the latest admitted dispatch
	run                         int
}

// admit learns of an admitted dispatch at d. It reports whether d ended a
// run: the running window is stray.
func (u *suspicion) admit(d time.Time) bool {
	if d.After(u.lastAdmit) {
		u.lastAdmit = d
	}
	if u.runFrom.IsZero() || d.Before(u.runSeen) {
		return false
	}
	u.runFrom, u.run = time.Time{}, 0
	return true
}

// silent counts a refusal with no hint of a dispatch at d, answered at
// now, and reports whether the run now reads as a silent closure.
func (u *suspicion) silent(d, now time.Time) bool {
	if u.runFrom.IsZero() {
		u.runFrom, u.runSeen, u.run = d, now, 0
	}
	if d.Before(u.runFrom) {
		u.runFrom = d
	}
	u.run++
	return u.run >= minRun && d.Sub(u.runFrom) >= minClosure
}

// windowCount is what the pool sent in one window: it began at start (a
// reopen), its first dispatch went at opened (a window counted from its
// first request starts there), it has sent used and admitted admitted.
// guessed: it opened on a knock admitted where no hint named a boundary
// (an allowance learned short lets a knock through before the boundary:
// see reopen). named: it began at a boundary the hints named, not at a
// roll. stray: a refusal in it was followed by an admission of a later
// dispatch; a fixed window refuses everything from its allowance's end to
// its boundary, so an upstream that admits between refusals is a pace,
// over-sent (by several replicas, or turns of models sharing it), and a
// silent closure after it teaches no window.
type windowCount struct {
	start, opened         time.Time
	used, admitted        int
	guessed, named, stray bool
}

// shape is what a closure that ended with the window open again (a knock
// admitted, or the stated boundary reached) taught: the allowance is what
// the last window admitted and the length what lay between its opening and
// the boundary. From then on a window's allowance goes from its start (one
// more, now and then, to find an allowance that grew), the pool closes as
// soon as it is spent, and the next knock goes at the boundary the length
// predicts.
type shape struct {
	// known: the shape is known. allowance is set at each reopen; the
	// length lies in (lengthLo, lengthHi] (lengthHi 0: not known). full
	// counts the windows that ended in a closure, for the probe.
	known              bool
	allowance          int
	lengthLo, lengthHi time.Duration
	full               int
	// oddLo, oddHi: a reading of the length at odds with the known one,
	// held until the next reading agrees with it (oddHi 0: none). One
	// window whose first request went late (a loaded machine, a window
	// aligned to the clock) reads short; it teaches neither the length
	// nor the allowance.
	oddLo, oddHi time.Duration
	// lengthFirst: the known length is the reading of the pool's first
	// window alone (see readLength).
	lengthFirst bool
	// climb counts the probing windows in a row that admitted all they
	// sent; lastExtra is what the window that ended last sent past the
	// allowance (see extra).
	climb, lastExtra int
	// counted: the allowance is what the window that ended admitted, so
	// its answers that come late still add to it (see reopen).
	counted bool
	// hinted: the shape was learned from a closure the upstream's hints
	// stated (else from knocks).
	hinted bool
}

// extra is how many more than the allowance a probing window sends: one,
// every probeWindows windows; after probes that admitted all they sent,
// every window, twice as many as the last, so an allowance learned low
// (from a window the pool did not fill) is found in a few windows.
// Mirrored by windows.extra in redisstate/lua/window.lua.
func (h *shape) extra() int {
	if h.climb > 0 || h.full%probeWindows == probeWindows-1 {
		return 1 << min(h.climb, maxClimb)
	}
	return 0
}

// pacing reports whether the shape holds the pool's pace: a known window's
// allowance goes from its start, not at a pace learned from refusals.
func (h *shape) pacing() bool { return h.known }

// readLength learns from one reading of the window's length, (low, hi],
// and reports whether it counts: a reading that overlaps the known length
// narrows it to where both agree; the first reading, one of a window that
// admitted a request (admitted) and follows only the first (first: the
// reading of the pool's first window, which began wherever its first
// request fell, anywhere in a window aligned to the clock), one shorter
// of a window that admitted and began at a named boundary (from one to a
// later one lie whole windows the pool may not have filled), one off the
// known length by less than a lengthSlack-th of it (dispatches go a few
// milliseconds late), and the second of two in a row off it that agree
// with each other (the upstream's window changed) replace it. A single
// reading further off is held: a window refused before it admitted
// anything may be a closure read as over a moment early.
func (h *shape) readLength(low, hi time.Duration, first, admitted, named bool) bool {
	near := func(lo2, hi2 time.Duration) bool {
		slack := hi2 / lengthSlack
		return hi2 > 0 && hi > lo2-slack && low < hi2+slack
	}
	overlaps := h.lengthHi > 0 && hi > h.lengthLo && low < h.lengthHi
	if overlaps {
		h.lengthLo, h.lengthHi = max(h.lengthLo, low), min(h.lengthHi, hi)
	} else if h.lengthHi <= 0 || h.lengthFirst && admitted || admitted && named && hi < h.lengthLo-h.lengthLo/lengthSlack || near(h.lengthLo, h.lengthHi) || near(h.oddLo, h.oddHi) {
		h.lengthLo, h.lengthHi = low, hi
	} else {
		h.oddLo, h.oddHi = low, hi
		return false
	}
	h.lengthFirst = first
	h.oddLo, h.oddHi = 0, 0
	return true
}

const (
	// longHint: a hint longer than this (and than one grain, for whole
	// seconds: Retry-After: 1 is any wait up to a second) points at a
	// boundary, not a pace, before the shape is known (see refused).
	longHint = time.Second
	// testGap is how long after a suspected closure's first refusal its
	// test goes, by the grain of its hints: far enough apart that hints
	// moving with the clock cannot agree at one instant.
	testGapFine  = 250 * time.Millisecond
	testGapWhole = 1250 * time.Millisecond
	// minClosure is the shortest span of refusals, minRun of them, with no
	// admission between them, that is read as a silent closure: a bucket
	// at any pace worth pacing admits sooner.
	minClosure = time.Second
	minRun     = 3
	// Silent knocks go knockShare of the closure's length so far apart,
	// within [minKnock, maxKnock]: late by at most that share of it (and
	// where refusals count, each knock a debt's refill pays back).
	knockShare = 0.1
	minKnock   = 250 * time.Millisecond
	maxKnock   = 30 * time.Second
	// Knocks step through the interval a boundary is known to lie in,
	// each at 1/knockSteps of what is left, at least minSplit apart.
	knockSteps = 2
	minSplit   = 20 * time.Millisecond
	// lateShare: once the interval left is within this share of the
	// window's length, the knock goes at its end. Every refused knock is
	// a refusal the upstream sees (and, where refusals count, spends the
	// allowance); at its end the window is open, late by at most that
	// share.
	lateShare = 0.03
	// probeWindows: one window in probeWindows sends one more than the
	// allowance, to find an allowance that grew; after one that admitted
	// it, the next window sends twice as many more, up to 1<<maxClimb.
	probeWindows = 4
	maxClimb     = 2
	// hintTrust is how long hints shown to move with the clock are not
	// read as boundaries.
	hintTrust = time.Minute
	// lengthSlack: a reading of a window's length off the known one by
	// less than a lengthSlack-th of it agrees with it; one further off is
	// held until the next agrees with it (see readLength).
	lengthSlack = 8
)

// gate decides whether the pool may dispatch at now: ok with knock set
// when the dispatch is a closure's single knock (the caller reports it to
// knocked), or not ok until at (zero: until the knock's answer). With
// spend, a window whose allowance is spent closes at once; without (one
// replica of several counts only its own dispatches), its first refusal
// closes it.
func (w *windows) gate(now time.Time, spend bool) (at time.Time, knock, ok bool) {
	if !w.closed {
		w.roll(now)
		if !spend || !w.known || w.cur.used < w.allowance+w.extra() { // known: an allowance of 1 or more
			return time.Time{}, false, true
		}
		// The window's allowance is spent: close until the boundary its
		// length predicts, without waiting to be refused.
		w.close(now, now, false)
		w.predict(now)
		w.next(now)
	}
	if w.stated && w.confirmed && !now.Before(w.hi) {
		if w.knock != 0 {
			// The knock in flight went in the window that opens: it is
			// its first request.
			w.reopen(w.knockSent, 1)
		} else {
			w.reopen(w.hi, 0)
		}
		return time.Time{}, false, true
	}
	if w.knock != 0 {
		if w.stated && now.Before(w.hi) {
			return w.hi, false, false
		}
		// Past a boundary not yet confirmed, the knock's answer decides.
		return time.Time{}, false, false
	}
	if now.Before(w.knockAt) {
		return w.knockAt, false, false
	}
	return time.Time{}, true, true
}

// roll starts a new window, counted from its first request, once the
// running one has outlasted the known length with nothing closing it: a
// load lighter than the allowance never spends one.
func (w *windows) roll(now time.Time) {
	if w.known && w.lengthHi > 0 && !w.cur.opened.IsZero() && !now.Before(w.cur.opened.Add(w.lengthHi)) {
		w.prev, w.cur = w.cur, windowCount{start: now}
		w.counted = false // no closure ended the window: what it admitted is no allowance
	}
}

// dispatched counts a dispatch at now of the running window (not a
// knock).
func (w *windows) dispatched(now time.Time) {
	if !w.closed {
		w.cur.used++
		if w.cur.opened.IsZero() {
			w.cur.opened = now
		}
	}
}

// undispatched takes back a dispatch at `at` the upstream never counted
// (Memory.Refund), when the running window counted it: one opened after
// it did not. (A closed window's count starts again when it opens.)
func (w *windows) undispatched(at time.Time) {
	if w.cur.used > 0 && !at.Before(w.cur.opened) {
		w.cur.used--
	}
}

// accepted learns from an admitted answer to t. It returns how far apart
// the knocks went that ended a closure teaching no window (0: none).
func (w *windows) accepted(t *Ticket, now time.Time) time.Duration {
	d := t.Dispatched
	if w.admit(d) {
		w.cur.stray = true
	}
	if w.closed && w.stated && !w.confirmed && !d.Before(w.knockAt) && d.Before(w.lo) {
		// The test (or, with replicas, another request sent as late) went
		// through before the earliest the hint's instant can be: the hint
		// named no boundary.
		w.distrust(now)
		return 0
	}
	var paid time.Duration
	if w.closed && t.Seq == w.knock && w.knock != 0 {
		w.knock = 0
		paid = w.reopen(d, 1)
	}
	switch {
	case !d.Before(w.cur.start):
		w.cur.admitted++
	case !d.Before(w.prev.start):
		w.prev.admitted++ // an answer to the window that ended, come late
		if w.counted && w.prev.admitted > w.allowance {
			// The reopen took what that window admitted as the
			// allowance before this answer came: it is one more.
			w.allowance = w.prev.admitted
		}
	}
	return paid
}

// refused learns from a rate refusal of t at now, whose hint (when
// hasHint) is the upstream's wait, while the upstream took admits
// requests a second lately (see Memory.taken). It reports whether the
// refusal is the windows' to answer: a closure began or goes on, so the
// pool waits as a whole and nothing else learns a pace from it.
func (w *windows) refused(t *Ticket, hint time.Duration, hasHint bool, admits float64, now time.Time) bool {
	d := t.Dispatched
	long := hasHint && boundary(hint, admits) && !now.Before(w.moving)
	if w.closed {
		return w.refusedClosed(t, hint, hasHint, long, now)
	}
	if d.Before(w.cur.start) {
		return true // sent in a window that ended: nothing new
	}
	if w.lastAdmit.IsZero() {
		w.cur.opened = time.Time{} // an outage or a closed door, not a window: the one that admits opens later
		return false
	}
	switch {
	case long || hasHint && w.known && !now.Before(w.moving):
		// A wait longer than a pace points at a boundary; in a window
		// whose shape is known, any wait does (Retry-After: 1 to
		// within its second): a refusal says its allowance is spent
		// (an allowance read from a first window that spanned a
		// boundary is too large).
		w.close(d, now, true)
		w.state(now.Add(hint), grainOf(hint))
		w.confirmed = w.known
		if !w.confirmed {
			w.knockAt = d.Add(testGap(grainOf(hint), hint))
			if w.hi.Before(w.knockAt) {
				w.knockAt = w.hi
			}
			return true
		}
		w.next(now)
		return true
	case hasHint:
		return false // a pace
	case w.known:
		w.close(d, now, false)
		w.predict(now)
		w.next(now)
		return true
	}
	if !w.silent(d, now) {
		return false
	}
	w.close(w.runFrom, w.runSeen, false)
	w.next(now)
	return true
}

// refusedClosed learns from a rate refusal of t at now while a closure
// holds the pool (see refused; long: its hint is the time to a window's
// boundary). It reports whether the refusal is still the windows' to
// answer: not when the hints of a closure stated by the upstream turn
// out to move with the clock.
func (w *windows) refusedClosed(t *Ticket, hint time.Duration, hasHint, long bool, now time.Time) bool {
	d := t.Dispatched
	knocked := t.Seq == w.knock && w.knock != 0
	if knocked {
		w.knock = 0
		w.lastKnock = d
		if !w.stated && !w.hi.IsZero() && !d.Before(w.hi) {
			w.lo, w.hi = time.Time{}, time.Time{} // refused past the predicted boundary
		}
	}
	if w.stated && !w.confirmed && !d.Before(w.knockAt) {
		// The test, or with replicas another request sent as late:
		// any wait it names (Retry-After: 1 near the boundary) must
		// point at the same instant.
		if !hasHint || !w.agrees(now.Add(hint), grainOf(hint)) {
			// Refused at another instant: the hints move with the
			// clock.
			w.distrust(now)
			return false
		}
		w.confirmed = true
	}
	if hasHint && (long || w.confirmed) {
		// In a closure, any wait a refusal names points at its
		// boundary, however short: one a knock met a moment early
		// says how early.
		if !w.stated {
			w.stated, w.lo, w.hi = true, time.Time{}, time.Time{}
		}
		w.state(now.Add(hint), grainOf(hint))
	}
	if !w.hi.IsZero() && d.After(w.lo) && d.Before(w.hi) {
		w.lo = d // refused there: the boundary is later
	}
	if knocked || w.stated && w.confirmed {
		w.next(now)
	}
	return true
}

// boundary reports whether a hint names a window's boundary rather than a
// pace, while the upstream admits admits requests a second: it is longer
// than a pace (and than its grain: Retry-After: 1 is any wait up to a
// second), or, precise to the millisecond, maxHintAdmits requests' worth
// or more at what the upstream admits (a bucket's hint is at most one
// request's refill).
func boundary(hint time.Duration, admits float64) bool {
	grain := grainOf(hint)
	if hint > longHint && hint > grain {
		return true
	}
	return grain < time.Second && hint >= minSplit && admits*hint.Seconds() >= maxHintAdmits
}

// grainOf is the precision of a hint: whole seconds when it is one.
func grainOf(hint time.Duration) time.Duration {
	if hint%time.Second == 0 {
		return time.Second
	}
	return time.Millisecond
}

// testGap is how long after a suspected closure's first refusal, whose
// hint was hint, its test goes.
func testGap(grain, hint time.Duration) time.Duration {
	if grain >= time.Second {
		return testGapWhole
	}
	return min(testGapFine, hint/2)
}

// close begins a closure whose first refused dispatch went at since, its
// refusal back at seen; stated says whether a hint names its boundary.
func (w *windows) close(since, seen time.Time, stated bool) {
	w.closed, w.stated, w.confirmed = true, stated, true
	w.since, w.knock, w.lastKnock = since, 0, time.Time{}
	w.lo, w.hi = time.Time{}, time.Time{}
	w.runFrom, w.run = time.Time{}, 0
	w.lastExtra, w.counted = w.extra(), false
	w.full++
	// The running window ended: its figures go on counting late answers
	// until it opens again (see reopen), and whatever was sent before the
	// refusal came back belongs to it (may have been counted first).
	w.prev, w.cur = w.cur, windowCount{start: clock.Later(since.Add(1), seen)}
}

// predict sets where a silent closure's boundary should lie: its window's
// length after the window's first request, when the length is known.
func (w *windows) predict(now time.Time) {
	if w.lengthHi <= 0 || w.prev.opened.IsZero() {
		return
	}
	w.lo, w.hi = w.prev.opened.Add(w.lengthLo), w.prev.opened.Add(w.lengthHi)
	if !w.hi.After(now) {
		w.lo, w.hi = time.Time{}, time.Time{} // it should be open already
	}
}

// next sets when the closure's next knock goes. Where the boundary is
// known to lie in an interval (stated by hints, or predicted by the
// window's length), knocks step through it from its start (knockSteps,
// lateShare); elsewhere a knock goes a share of the closure's length so
// far after the last; from half a second on, 50 ms past the next whole second
// (of the window's first request) after max(gap−1 s, gap/2): about a gap apart.
func (w *windows) next(now time.Time) {
	if !w.hi.IsZero() {
		span := w.hi.Sub(w.lo)
		step := min(max(minSplit, span/knockSteps), span)
		if span <= time.Duration(lateShare*float64(w.length())) {
			step = span // late by a little rather than refused again
		}
		w.knockAt = clock.Later(w.lo.Add(step), now)
		return
	}
	gap := min(max(time.Duration(knockShare*float64(now.Sub(w.since))), minKnock), maxKnock)
	w.knockAt = now.Add(gap)
	if o := w.prev.opened; gap >= time.Second/2 && !o.IsZero() {
		w.knockAt = o.Add((now.Add(max(gap-time.Second, gap/2)).Sub(o)/time.Second+1)*time.Second + time.Second/20)
	}
}

// length is the least the window's length can be: the known length, else
// how long the window that ended had lasted from its first request to
// the earliest its boundary can be (zero: not known).
func (w *windows) length() time.Duration {
	if w.known && w.lengthHi > 0 {
		return w.lengthLo
	}
	if w.prev.opened.IsZero() || w.lo.IsZero() {
		return 0
	}
	return max(0, w.lo.Sub(w.prev.opened))
}

// reopen ends the closure: the window is open again from at, with used
// sent in it already (the knock that found it open), and the closure's span
// teaches the window's length.
func (w *windows) reopen(at time.Time, used int) time.Duration {
	if !w.known && !w.stated && (w.prev.stray || w.prev.admitted <= 1) {
		// Silent refusals after a window that admitted between its
		// refusals (a pace over-sent) or one request alone (a debt paid a
		// request at a time): no allowance spent. The closure ends, and
		// teaches only how far apart the knocks got through.
		gap := at.Sub(clock.Later(w.since, w.lastKnock))
		w.open(at, used)
		w.known = false
		return gap
	}
	if w.prev.guessed && w.prev.admitted*2 < w.allowance {
		// The window that ended opened on a knock and was refused before
		// it admitted half its allowance: the knock went before the
		// boundary, on what an allowance learned short had left. What
		// that window admitted belonged to the one before.
		w.allowance += w.prev.admitted
		w.lastExtra, w.counted = 0, false
		w.open(at, used)
		return 0
	}
	odd := false
	if !w.prev.opened.IsZero() {
		// The boundary lies after the last refused knock (or the known
		// lo) and at or before at; the window that ended began at the
		// boundary before (a reopen), whose first request may have gone
		// later (a loaded machine; a window aligned to the clock began
		// at the boundary all the same), or at its first request (the
		// pool's first window, or a roll).
		from := w.prev.opened
		if !w.prev.start.IsZero() {
			from = w.prev.start
		}
		lo := clock.Later(w.lo, w.lastKnock)
		odd = !w.readLength(max(lo.Sub(from), 0), at.Sub(from), w.prev.start.IsZero(), w.prev.admitted > 0, w.prev.named)
	}
	if !w.known {
		w.hinted = w.stated // how the shape was learned, for the view
	}
	w.open(at, used)
	w.counted = !odd
	if odd {
		w.lastExtra = 0
		return 0
	}
	// What the window that ended admitted, its late answers counted, is
	// the allowance.
	if w.lastExtra > 0 {
		w.climb++
		if w.prev.admitted < w.allowance+w.lastExtra {
			w.climb = 0 // the probe met the allowance's end
		}
		w.lastExtra = 0
	}
	w.allowance = max(w.prev.admitted, 1)
	return 0
}

// open starts the window at at, with used sent in it already (the knock
// that found it open, which a hint may have named the boundary for).
func (w *windows) open(at time.Time, used int) {
	w.cur = windowCount{start: at, used: used, named: w.stated && w.confirmed}
	w.cur.guessed = used > 0 && !(w.stated && w.confirmed)
	if used > 0 {
		w.cur.opened = at // the knock that found it open
	}
	w.closed, w.known, w.knock = false, true, 0
}

// view is what the windows show; nil while nothing was learned.
func (w *windows) view() *windowView {
	if !w.known && !w.closed {
		return nil
	}
	v := &windowView{Allowance: w.allowance, Length: w.lengthHi, Stated: w.hinted, Closed: w.closed}
	if !w.known {
		v.Allowance, v.Length, v.Stated = 0, 0, w.stated
	}
	if w.closed && w.stated && w.confirmed {
		v.ClosedUntil = w.hi
	}
	return v
}
