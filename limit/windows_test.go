package limit

import (
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// winRig drives a windows value with explicit times: each dispatch gets a
// ticket numbered in order, as Memory numbers them.
type winRig struct {
	t   *testing.T
	w   windows
	seq uint64
}

// send dispatches at now through the gate, and returns the ticket, or nil
// when the gate held the request.
func (r *winRig) send(now time.Time) *Ticket {
	at, knock, ok := r.w.gate(now, true)
	if !ok {
		_ = at
		return nil
	}
	r.seq++
	t := &Ticket{Seq: r.seq, Dispatched: now}
	if knock {
		r.w.knocked(t.Seq, now)
	} else {
		r.w.dispatched(now)
	}
	return t
}

// burst admits n requests sent from at, 1 ms apart, their answers at once.
func (r *winRig) burst(at time.Time, n int) time.Time {
	for i := range n {
		now := at.Add(time.Duration(i) * time.Millisecond)
		t := r.send(now)
		if t == nil {
			r.t.Fatalf("request %d of a burst held at %v", i, now)
		}
		r.w.accepted(t, now)
	}
	return at.Add(time.Duration(n) * time.Millisecond)
}

func (r *winRig) refuse(t *Ticket, hint time.Duration, now time.Time) bool {
	return r.w.refused(t, hint, hint > 0, 0, now)
}

// knockThrough drives a closure's knocks from now: each refused before
// boundary (with a Retry-After in whole seconds to it, when stated), the
// first at or after it admitted. It returns how many knocks went.
func (r *winRig) knockThrough(now, boundary time.Time, stated bool) int {
	knocks := 0
	for r.w.closed {
		at, _, _ := r.w.gate(now, true)
		if at.IsZero() {
			r.t.Fatalf("held at %v with no knock time", now)
		}
		now = at
		k := r.send(now)
		if k == nil {
			if r.w.closed {
				r.t.Fatalf("held at %v with no knock", now)
			}
			break
		}
		knocks++
		if knocks > 40 {
			r.t.Fatalf("%d knocks and still closed at %v", knocks, now)
		}
		if now.Before(boundary) {
			hint := time.Duration(0)
			if stated {
				hint = boundary.Sub(now).Round(time.Second) + time.Second
			}
			r.refuse(k, hint, now)
			continue
		}
		r.w.accepted(k, now)
	}
	return knocks
}

// TestStatedWindow: a refusal naming a wait of seconds after a burst
// suspects a window closing to that instant; a test 1.25 s later refused
// at the same instant confirms it, and the pool holds until it as a
// pause would; knocks step through what whole seconds leave open; the
// first admitted reopens the window, whose allowance and length are then
// known, and the next window's allowance goes from its start.
func TestStatedWindow(t *testing.T) {
	r := &winRig{t: t}
	boundary := t0.Add(10 * time.Second) // a 10 s window opened at t0
	end := r.burst(t0, 200)
	over := r.send(end)
	// Retry-After in whole seconds, rounded up: 10 s - 0.2 s -> 10.
	if !r.refuse(over, 10*time.Second, end) {
		t.Fatal("a 10 s wait after a burst was not taken as a window's closure")
	}
	if r.w.until().IsZero() || !r.w.until().Equal(end.Add(1250*time.Millisecond)) {
		t.Fatalf("a suspected closure holds until %v, want its test at %v", r.w.until(), end.Add(1250*time.Millisecond))
	}
	if r.send(end.Add(time.Second)) != nil {
		t.Fatal("a request went before the test")
	}
	test := r.send(end.Add(1250 * time.Millisecond))
	if test == nil {
		t.Fatal("no test at 1.25 s")
	}
	if r.send(end.Add(1300*time.Millisecond)) != nil {
		t.Fatal("a second request went while the test was out")
	}
	now := end.Add(1250 * time.Millisecond)
	if !r.refuse(test, 9*time.Second, now) { // 10 - 1.45 -> 9 s: the same instant, to the second
		t.Fatal("the test's refusal was not the window's")
	}
	if !r.w.confirmed || r.w.hi.After(end.Add(10*time.Second)) || !r.w.until().Equal(r.w.hi) {
		t.Fatalf("after the test: confirmed %v, boundary in (%v, %v], held until %v", r.w.confirmed, r.w.lo, r.w.hi, r.w.until())
	}
	// Knocks step through (lo, hi]; refused ones move lo.
	if knocks := r.knockThrough(now, boundary, true); r.w.closed || knocks > knockSteps+1 {
		t.Fatalf("closed %v after %d knocks", r.w.closed, knocks)
	}
	if late := r.w.cur.start.Sub(boundary); late < 0 || late > 250*time.Millisecond {
		t.Fatalf("reopened %v after the boundary, want within 250ms", late)
	}
	// The pool's first window began wherever its first request fell: the
	// length it teaches holds until the next window's reading.
	if !r.w.known || r.w.allowance != 200 || r.w.lengthHi < 9*time.Second || r.w.lengthHi > 11*time.Second || !r.w.lengthFirst {
		t.Fatalf("known %v allowance %d length (%v, %v] first %v, want 200 and about 10 s from the first window",
			r.w.known, r.w.allowance, r.w.lengthLo, r.w.lengthHi, r.w.lengthFirst)
	}
	// The next window: its allowance goes at once, then the pool closes
	// without a refusal, and knocks find the boundary that ends it.
	start := r.w.cur.start
	end = r.burst(start, 199) // the knock that reopened it was the first
	if r.send(end) != nil || !r.w.closed {
		t.Fatal("a request past the allowance went")
	}
	boundary = boundary.Add(10 * time.Second)
	r.knockThrough(end, boundary, true)
	if late := r.w.cur.start.Sub(boundary); late < 0 || late > time.Second {
		t.Fatalf("the second window reopened %v after its boundary", late)
	}
	if r.w.lengthHi < 9*time.Second || r.w.lengthHi > 11*time.Second || r.w.lengthFirst {
		t.Fatalf("length (%v, %v] (first %v) after the second window, want about 10 s", r.w.lengthLo, r.w.lengthHi, r.w.lengthFirst)
	}
	// The third: the pool closes when its allowance is spent, and knocks
	// at the boundary the length predicts.
	start = r.w.cur.start
	end = r.burst(start, 199)
	if r.send(end) != nil {
		t.Fatal("a request past the allowance went")
	}
	if !r.w.closed || r.w.stated || r.w.hi.IsZero() {
		t.Fatalf("after the allowance: closed %v stated %v predicted (%v, %v]", r.w.closed, r.w.stated, r.w.lo, r.w.hi)
	}
	if d := r.w.hi.Sub(start); d < 9*time.Second || d > 11*time.Second {
		t.Fatalf("predicted boundary %v after the window's start, want about 10 s", d)
	}
	v := r.w.view()
	if s := v.String(); !strings.HasPrefix(s, "window of 200 per 1") || !strings.HasSuffix(s, "s, learned from refusals whose waits end at one boundary") {
		t.Fatalf("view %q", s)
	}
}

// TestHintsThatMoveWithTheClock: a gateway's constant Retry-After (or a
// bucket's) points at another instant for every refusal: the test tells,
// and the refusals go back to the pace learned from them; so does a test
// that is admitted.
func TestHintsThatMoveWithTheClock(t *testing.T) {
	for _, testAdmitted := range []bool{false, true} {
		r := &winRig{t: t}
		end := r.burst(t0, 20)
		r.refuse(r.send(end), 30*time.Second, end)
		test := r.send(end.Add(1250 * time.Millisecond))
		now := end.Add(1250 * time.Millisecond)
		if testAdmitted {
			r.w.accepted(test, now)
		} else if r.refuse(test, 30*time.Second, now) {
			t.Fatal("a refusal 1.25 s later pointing 1.25 s later was taken as the same closure")
		}
		if r.w.closed || !r.w.until().IsZero() {
			t.Fatalf("admitted %v: still closed", testAdmitted)
		}
		// A minute on, long hints are not read as boundaries.
		if r.refuse(r.send(now.Add(time.Second)), 30*time.Second, now.Add(time.Second)) {
			t.Fatalf("admitted %v: a long hint was read as a boundary right after hints moved", testAdmitted)
		}
	}
}

// TestShortHintsAreBoundariesOnlyWhenFarFromARefill: a millisecond hint is
// a window's boundary only when worth maxHintAdmits requests or more at
// what the upstream admits; Retry-After: 1 is never one before the shape
// is known.
func TestShortHintsAreBoundariesOnlyWhenFarFromARefill(t *testing.T) {
	for _, c := range []struct {
		hint   time.Duration
		admits float64
		want   bool
	}{
		{50 * time.Millisecond, 20, false}, // a 20/s bucket's next token
		{400 * time.Millisecond, 20, true}, // 8 requests' worth: a 1 s window's end
		{400 * time.Millisecond, 2, false}, // under one request's worth... a slow bucket
		{time.Second, 100, false},          // Retry-After: 1, any wait up to a second
		{2 * time.Second, 0, true},         // Retry-After: 2
		{1500 * time.Millisecond, 0, true}, // precise and over a second
	} {
		if got := boundary(c.hint, c.admits); got != c.want {
			t.Errorf("boundary(%v, %v/s) = %v, want %v", c.hint, c.admits, got, c.want)
		}
	}
}

// TestSilentWindow: refusals with no hint and no admission for a second
// close the pool; knocks go a share of the closure's length apart; the
// first admitted reopens it, and the shape is known; the next window's
// first refusal closes it at once, with a knock at the predicted boundary.
func TestSilentWindow(t *testing.T) {
	r := &winRig{t: t}
	boundary := t0.Add(10 * time.Second)
	end := r.burst(t0, 200)
	// Refusals at a pace for a second: not yet a closure, then one.
	now := end
	for i := 0; ; i++ {
		took := r.refuse(r.send(now), 0, now)
		if now.Sub(end) < minClosure && took {
			t.Fatalf("closed after %v of refusals", now.Sub(end))
		}
		if took {
			break
		}
		now = now.Add(200 * time.Millisecond)
	}
	knocks := r.knockThrough(now, boundary, false)
	late := r.w.cur.start.Sub(boundary)
	if knocks > 30 || late < 0 || late > time.Second {
		t.Fatalf("%d knocks, reopened %v after the boundary", knocks, late)
	}
	if !r.w.known || r.w.lengthHi < 9*time.Second || r.w.lengthHi > 11*time.Second || !r.w.lengthFirst {
		t.Fatalf("after the pool's first window: known %v, length (%v, %v], first %v; want about 10 s from the first window",
			r.w.known, r.w.lengthLo, r.w.lengthHi, r.w.lengthFirst)
	}
	// The second window: its refusals close it at once, and the knocks
	// at the boundary the first window's length predicts find it.
	start := r.w.cur.start
	end = r.burst(start.Add(time.Millisecond), 199)
	if over := r.send(end); over != nil && !r.refuse(over, 0, end) || !r.w.closed {
		t.Fatal("a known window's allowance spent or refused did not close it at once")
	}
	boundary = start.Add(10 * time.Second)
	r.knockThrough(end, boundary, false)
	if r.w.lengthHi < 9*time.Second || r.w.lengthHi > 11*time.Second {
		t.Fatalf("length (%v, %v] after the second window, want about 10 s", r.w.lengthLo, r.w.lengthHi)
	}
	// The third: the first refusal closes it, predicting the boundary a
	// length after the window's first request.
	start = r.w.cur.start
	end = r.burst(start.Add(time.Millisecond), 199)
	over := r.send(end)
	if over == nil {
		// The allowance was spent: closed without a refusal.
		if !r.w.closed {
			t.Fatal("neither sent nor closed")
		}
	} else if !r.refuse(over, 0, end) || !r.w.closed {
		t.Fatal("a known window's refusal did not close it at once")
	}
	if r.w.hi.IsZero() || r.w.hi.Sub(start) < 9*time.Second || r.w.hi.Sub(start) > 11*time.Second {
		t.Fatalf("predicted boundary (%v, %v], want about 10 s after %v", r.w.lo, r.w.hi, start)
	}
}

// TestOutageIsNotAWindow: an upstream that never admitted anything is down
// or closed, not counting in windows: its refusals are not the windows'.
func TestOutageIsNotAWindow(t *testing.T) {
	r := &winRig{t: t}
	for i := range 10 {
		now := t0.Add(time.Duration(i) * 300 * time.Millisecond)
		if r.refuse(r.send(now), 0, now) || r.refuse(r.send(now), 9*time.Second, now) {
			t.Fatal("a refusal with nothing ever admitted was taken as a window's")
		}
	}
}

// TestProbingWindowSendsOneMore: one window in probeWindows sends one more
// than the allowance, to find an allowance that grew.
func TestProbingWindowSendsOneMore(t *testing.T) {
	w := windows{shape: shape{known: true, allowance: 10, lengthHi: time.Second}}
	for full := range probeWindows {
		w.full = full
		want := 10
		if full == probeWindows-1 {
			want = 11
		}
		w.cur.used, w.closed = 0, false
		sent := 0
		for {
			if _, _, ok := w.gate(t0, true); !ok {
				break
			}
			w.dispatched(t0)
			sent++
		}
		if sent != want {
			t.Errorf("window %d: sent %d, want %d", full, sent, want)
		}
	}
}

// TestAWindowNotSpentRollsOver: a load lighter than the allowance spends
// no window; once a window's length has passed the count starts again,
// so the pool is never closed for what earlier windows sent.
func TestAWindowNotSpentRollsOver(t *testing.T) {
	w := windows{shape: shape{known: true, allowance: 10, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}
	for i := range 30 {
		now := t0.Add(time.Duration(i) * 2 * time.Second) // 5 a window
		if _, _, ok := w.gate(now, true); !ok {
			t.Fatalf("request %d held at %v: %d used", i, now, w.cur.used)
		}
		w.dispatched(now)
	}
}

// TestAKnockPastAnUnconfirmedBoundaryWaitsForItsAnswer: while a test knock
// is out and the boundary the hints named has passed unconfirmed, the gate
// holds the pool until the knock's answer (a zero time), never "until"
// the instant already gone, which would have the dispatcher ask again at
// once, without end.
func TestAKnockPastAnUnconfirmedBoundaryWaitsForItsAnswer(t *testing.T) {
	r := &winRig{t: t}
	end := r.burst(t0, 20)
	over := r.send(end)
	// A wait named to the millisecond, far longer than a pace at what was
	// admitted: a suspected closure, its test 250 ms on.
	if !r.w.refused(over, 400*time.Millisecond, true, 100, end) {
		t.Fatal("a long wait after a burst was not taken as a suspected closure")
	}
	// The test goes half the hint on, under the 250 ms of longer ones.
	if want := end.Add(200 * time.Millisecond); !r.w.knockAt.Equal(want) {
		t.Fatalf("the test of a 400 ms hint goes at %v; want %v", r.w.knockAt.Sub(end), want.Sub(end))
	}
	test := r.send(r.w.knockAt)
	if test == nil || r.w.knock != test.Seq {
		t.Fatal("no test knock at its time")
	}
	past := r.w.hi.Add(50 * time.Millisecond)
	at, _, ok := r.w.gate(past, true)
	if ok || !at.IsZero() {
		t.Fatalf("with the knock out past the named boundary the gate says ok=%v until %v; want held until the knock's answer", ok, at)
	}
	if at, _, _ := r.w.gate(r.w.hi.Add(-time.Millisecond), true); !at.Equal(r.w.hi) {
		t.Fatalf("before the named boundary the gate holds until %v; want %v", at, r.w.hi)
	}
}

// TestAKnockThatEndsUnansweredLetsTheNextGo: a knock whose permit comes
// back with no word on the window (a failure, the client gone) does not
// hold the closure for ever: the next knock goes.
func TestAKnockThatEndsUnansweredLetsTheNextGo(t *testing.T) {
	s := NewMemory(Config{})
	now := t0
	// A window learned: 5 admitted, then silent refusals until knocks
	// find it open again.
	admit := func() *Ticket {
		tk, _, ok := s.Admit(now, 1, false)
		if !ok {
			return nil
		}
		return &tk
	}
	for range 5 {
		tk := admit()
		s.Learn(tk, Report{Status: 200, Verdict: Accepted}, now)
		s.Return(tk, now)
		now = now.Add(10 * time.Millisecond)
	}
	for !s.win.closed {
		tk := admit()
		if tk == nil {
			t.Fatal("held before a closure was read")
		}
		s.Learn(tk, Report{Status: 429, Verdict: RateRefused}, now)
		if s.win.closed && s.refusedHolding != 1 {
			t.Fatalf("the refusal that closed the window, its permit still held, counts %d refused holding; want 1", s.refusedHolding)
		}
		s.Return(tk, now)
		now = now.Add(400 * time.Millisecond)
	}
	// The refused requests that closed it hold their permits until they
	// give them back: they are not counted at the level of what goes next.
	if s.refusedHolding != 0 {
		t.Fatalf("%d refused requests hold permits after all were returned", s.refusedHolding)
	}
	now = clock.Later(now, s.win.knockAt)
	knock := admit()
	if knock == nil || s.win.knock != knock.Seq {
		t.Fatal("no knock at its time")
	}
	if admit() != nil {
		t.Fatal("a second request went while the knock was out")
	}
	if s.refusedHolding != 0 {
		t.Fatal("a knock holds a refused permit before its answer")
	}
	s.Learn(knock, Report{Verdict: NotSent}, now) // the connection failed
	s.Return(knock, now)
	if admit() == nil {
		t.Fatal("the knock ended unanswered and no next knock may go")
	}
}

// TestRefusalsBetweenAdmissionsThenASilentRunTeachNoWindow: an upstream
// that admitted requests sent after it refused one is a pace over-sent,
// not a window (a window refuses everything from its allowance's end to
// its boundary). When the pool then over-sends it for a second and
// more, the closure's knock ends it, and no window is learned from it;
// the same silent run after a window with no such refusal teaches one.
func TestRefusalsBetweenAdmissionsThenASilentRunTeachNoWindow(t *testing.T) {
	for _, stray := range []bool{true, false} {
		r := &winRig{t: t}
		now := r.burst(t0, 20)
		if stray {
			r.refuse(r.send(now), 0, now) // refused, then admitted after it
			now = r.burst(now.Add(100*time.Millisecond), 20)
		}
		for took := false; !took; now = now.Add(200 * time.Millisecond) {
			took = r.refuse(r.send(now), 0, now)
		}
		if !r.w.closed {
			t.Fatal("a second of silent refusals did not close the pool")
		}
		r.knockThrough(now, now, false) // the next knock is admitted
		if r.w.closed || r.w.known == stray || (r.w.view() == nil) == !stray {
			t.Fatalf("refused between admissions %v: closed %v, window known %v, view %+v", stray, r.w.closed, r.w.known, r.w.view())
		}
	}
}

// TestARefundedDispatchLeavesTheWindowsAllowance (issue 49): dispatches
// the upstream never counted (refused for their credential) give back
// their place in the running window's allowance, so a flood of them does
// not close it; a dispatch of an earlier window takes nothing off the
// running one.
func TestARefundedDispatchLeavesTheWindowsAllowance(t *testing.T) {
	w := windows{shape: shape{known: true, allowance: 10, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}
	for i := range 30 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		if _, _, ok := w.gate(now, true); !ok {
			t.Fatalf("refunded dispatch %d held: %d used", i, w.cur.used)
		}
		w.dispatched(now)
		w.undispatched(now)
	}
	for i := range 10 {
		now := t0.Add(time.Duration(30+i) * time.Millisecond)
		if _, _, ok := w.gate(now, true); !ok {
			t.Fatalf("genuine dispatch %d held after the refunded ones: %d used", i, w.cur.used)
		}
		w.dispatched(now)
	}
	if _, _, ok := w.gate(t0.Add(40*time.Millisecond), true); ok || !w.closed {
		t.Fatal("the allowance spent, the window did not close")
	}

	w = windows{shape: shape{known: true, allowance: 10, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}
	w.gate(t0, true)
	w.dispatched(t0)
	next := t0.Add(10 * time.Second)
	w.gate(next, true) // the window rolls over
	w.undispatched(t0)
	if w.cur.used != 0 {
		t.Fatalf("a refund of the window before left %d used in a new one, want 0", w.cur.used)
	}
	w.dispatched(next)
	w.undispatched(t0)
	if w.cur.used != 1 {
		t.Fatalf("a refund of the window before left %d used, want the new one's 1", w.cur.used)
	}
	w.undispatched(next)
	if w.cur.used != 0 {
		t.Fatalf("a refund of the window's own dispatch left %d used, want 0", w.cur.used)
	}
}

// TestARefundGivesBackAWindowsPlace: Memory.Refund gives a refunded
// dispatch's place in a known window back, as it gives back its budgets.
func TestARefundGivesBackAWindowsPlace(t *testing.T) {
	m := NewMemory(Config{})
	m.win = windows{shape: shape{known: true, allowance: 2, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}
	for i := range 5 {
		tk, _, ok := m.Admit(t0, 1, true)
		if !ok {
			t.Fatalf("refunded dispatch %d held", i)
		}
		m.Learn(&tk, Report{Status: 401, Verdict: NotSent}, t0)
		m.Refund(&tk)
		m.Return(&tk, t0)
	}
	for i := range 2 {
		tk, _, ok := m.Admit(t0, 1, true)
		if !ok {
			t.Fatalf("genuine dispatch %d held after the refunded ones", i)
		}
		m.Learn(&tk, Report{Status: 200, Verdict: Accepted}, t0)
		m.Return(&tk, t0)
	}
	if _, _, ok := m.Admit(t0, 1, true); ok {
		t.Fatal("a third went in a window of two")
	}
}

// TestASilentClosureAfterOneAdmissionTeachesOnlyTheKnocksGap: a silent
// closure after a window that admitted one request alone is a debt paid a
// request at a time, not a window's allowance: it teaches no window, and
// the admitted knock tells how far apart the knocks got through (from the
// last refused one, else from the closure's start). After two admitted,
// the closure is a window's.
func TestASilentClosureAfterOneAdmissionTeachesOnlyTheKnocksGap(t *testing.T) {
	for _, tc := range []struct {
		admitted, refusedKnocks int
	}{{1, 3}, {1, 0}, {2, 3}} {
		r := &winRig{t: t}
		now := r.burst(t0, tc.admitted)
		for took := false; !took; now = now.Add(200 * time.Millisecond) {
			took = r.refuse(r.send(now), 0, now)
		}
		since, last := r.w.since, time.Time{}
		var gap time.Duration
		for knocks := 0; r.w.closed; knocks++ {
			at, _, _ := r.w.gate(now, true)
			now = at
			k := r.send(now)
			if knocks < tc.refusedKnocks {
				r.refuse(k, 0, now)
				last = now
				continue
			}
			gap = r.w.accepted(k, now)
		}
		want := time.Duration(0)
		if tc.admitted == 1 {
			want = now.Sub(since)
			if !last.IsZero() {
				want = now.Sub(last)
			}
		}
		if r.w.known != (tc.admitted > 1) || gap != want || want < 0 {
			t.Errorf("%d admitted, %d knocks refused: window known %v, gap %v; want known %v, gap %v",
				tc.admitted, tc.refusedKnocks, r.w.known, gap, tc.admitted > 1, want)
		}
	}
}

// TestAWindowAfterAnOutageCountsFromItsFirstAdmission: refusals before
// anything was ever admitted are an outage, not the window's: the pool's
// first window opens at its first admitted request, so its closure reads
// the window's length from there, not from the outage's start.
func TestAWindowAfterAnOutageCountsFromItsFirstAdmission(t *testing.T) {
	r := &winRig{t: t}
	for i := range 3 {
		now := t0.Add(time.Duration(i) * 300 * time.Millisecond)
		r.refuse(r.send(now), 0, now)
	}
	start := t0.Add(time.Minute)
	now := r.burst(start, 20)
	for took := false; !took; now = now.Add(200 * time.Millisecond) {
		took = r.refuse(r.send(now), 0, now)
	}
	r.knockThrough(now, start.Add(10*time.Second), false)
	if !r.w.known || r.w.lengthHi < 9*time.Second || r.w.lengthHi > 11*time.Second {
		t.Fatalf("known %v, length (%v, %v]; want about 10 s from the first admission", r.w.known, r.w.lengthLo, r.w.lengthHi)
	}
}
