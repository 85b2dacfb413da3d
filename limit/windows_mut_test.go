package limit

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAWindowOfUnknownLengthIsNotRolledOver: with the window's length not
// known, nothing says when the running window ended, so its allowance
// once spent holds the pool however long ago it was sent, instead of a
// new window being counted at once.
func TestAWindowOfUnknownLengthIsNotRolledOver(t *testing.T) {
	w := windows{shape: shape{known: true, allowance: 2}}
	for i := range 2 {
		now := t0.Add(time.Duration(i) * time.Second)
		if _, _, ok := w.gate(now, true); !ok {
			t.Fatalf("request %d of the allowance held", i)
		}
		w.dispatched(now)
	}
	if _, _, ok := w.gate(t0.Add(time.Hour), true); ok || !w.closed {
		t.Fatalf("a spent window of unknown length let a request go an hour on: ok %v, closed %v, used %d", ok, w.closed, w.cur.used)
	}
}

// silentRig is a rig whose upstream admitted a burst, so that refusals
// with no hint may be read as a silent closure; it returns the rig and
// the end of the burst.
func silentRig(t *testing.T) (*winRig, time.Time) {
	r := &winRig{t: t}
	return r, r.burst(t0, 5)
}

// TestTheMinRunthSilentRefusalCloses: refusals with no hint and no
// admission between them close the pool once there are minRun of them
// over minClosure; the one that makes minRun is enough, not the one
// after.
func TestTheMinRunthSilentRefusalCloses(t *testing.T) {
	r, end := silentRig(t)
	for i := range minRun {
		now := end.Add(time.Duration(i) * minClosure)
		took := r.refuse(r.send(now), 0, now)
		if last := i == minRun-1; took != last || r.w.closed != last {
			t.Fatalf("silent refusal %d of %d over %v: taken %v, closed %v", i+1, minRun, now.Sub(end), took, r.w.closed)
		}
	}
}

// TestSilentRefusalsSpanningExactlyMinClosureClose: a run of silent
// refusals closes the pool as soon as it spans minClosure, at that span
// exactly, not only past it.
func TestSilentRefusalsSpanningExactlyMinClosureClose(t *testing.T) {
	r, end := silentRig(t)
	for i := range minRun {
		now := end.Add(time.Duration(i) * time.Millisecond)
		if r.refuse(r.send(now), 0, now) || r.w.closed {
			t.Fatalf("refusal %d, %v into the run, closed the pool", i+1, now.Sub(end))
		}
	}
	now := end.Add(minClosure)
	if !r.refuse(r.send(now), 0, now) || !r.w.closed {
		t.Fatalf("a run of %d silent refusals spanning %v did not close the pool", minRun+1, minClosure)
	}
}

// TestAMillisecondHintOfMinSplitCanBeABoundary: a hint precise to the
// millisecond is a window's boundary from minSplit on, when far longer
// than a refill at what the upstream admits; below minSplit it never is.
func TestAMillisecondHintOfMinSplitCanBeABoundary(t *testing.T) {
	admits := 100 * maxHintAdmits / minSplit.Seconds() // 100 requests' worth a hint
	if !boundary(minSplit, admits) {
		t.Errorf("boundary(%v, %v/s) = false, want true", minSplit, admits)
	}
	if below := minSplit - time.Millisecond; boundary(below, admits) {
		t.Errorf("boundary(%v, %v/s) = true, want false", below, admits)
	}
}

// TestAHintWorthMaxHintAdmitsIsABoundary: a millisecond hint is a pace
// while the upstream admitted fewer than maxHintAdmits requests a hint
// lately, and a boundary from maxHintAdmits on: 100 ms while a 1 s window
// of 20 admits 20 a second is its end, not a 10/s bucket's refill.
func TestAHintWorthMaxHintAdmitsIsABoundary(t *testing.T) {
	hint := 500 * time.Millisecond
	under := (maxHintAdmits - 0.1) / hint.Seconds()
	if boundary(hint, under) {
		t.Errorf("boundary(%v, %v/s) = true: under %d requests a hint is a pace", hint, under, maxHintAdmits)
	}
	at := maxHintAdmits / hint.Seconds() // exactly maxHintAdmits a hint
	if !boundary(hint, at) {
		t.Errorf("boundary(%v, %v/s) = false: %d requests a hint is a boundary", hint, at, maxHintAdmits)
	}
	if !boundary(100*time.Millisecond, 20) {
		t.Error("a 100 ms hint while 20 a second are admitted is a pace")
	}
}

// TestEveryClosureCountsTowardTheAllowanceProbe: each window that ends in
// a closure counts toward the probe, so that of probeWindows windows in a
// row exactly one sends one more than the allowance, to find an allowance
// that grew.
func TestEveryClosureCountsTowardTheAllowanceProbe(t *testing.T) {
	r := &winRig{t: t, w: windows{shape: shape{known: true, allowance: 10, lengthLo: 900 * time.Millisecond, lengthHi: time.Second}}}
	now := t0
	probes := 0
	for i := range probeWindows {
		allowance := r.w.allowance
		var sent int
		sent, now = r.spend(now, 1<<30)
		switch sent {
		case allowance + 1:
			probes++
		case allowance:
		default:
			t.Fatalf("window %d sent %d with an allowance of %d", i, sent, allowance)
		}
	}
	if probes != 1 {
		t.Fatalf("%d of %d windows sent one more than the allowance, want 1", probes, probeWindows)
	}
}

// statedClosure is a rig with a confirmed stated closure: a burst, a
// refusal whose whole-second wait names end+10 s, and a test 1.25 s later
// refused with a wait naming the same instant (9 s, rounded up). It
// returns the rig, the instant the hints named and the test's answer
// time.
func statedClosure(t *testing.T) (*winRig, time.Time, time.Time) {
	r := &winRig{t: t}
	end := r.burst(t0, 20)
	named := end.Add(10 * time.Second)
	if !r.refuse(r.send(end), 10*time.Second, end) {
		t.Fatal("a 10 s wait after a burst was not taken as a window's closure")
	}
	now := end.Add(testGapWhole)
	test := r.send(now)
	if test == nil {
		t.Fatal("no test")
	}
	if !r.refuse(test, named.Sub(now).Round(time.Second), now) || !r.w.confirmed {
		t.Fatal("a test refused at the same instant did not confirm the closure")
	}
	return r, named, now
}

// TestWholeSecondHintsKnockWithinTheSecondBeforeTheNamedInstant: a wait in
// whole seconds leaves the boundary anywhere in the second before the
// instant it names, so the first knock goes within that second, before
// the instant, rather than waiting for the latest it could be.
func TestWholeSecondHintsKnockWithinTheSecondBeforeTheNamedInstant(t *testing.T) {
	r, named, now := statedClosure(t)
	if !r.w.hi.Equal(named) {
		t.Fatalf("stated boundary at %v, want the named %v", r.w.hi, named)
	}
	at, knock, ok := r.w.gate(now, true)
	if ok || knock {
		t.Fatal("the pool went before its first knock")
	}
	if !at.Before(named) || !at.After(named.Add(-time.Second)) {
		t.Fatalf("first knock at %v, want within the second before %v", at, named)
	}
}

// TestKnocksStepThroughTheIntervalBeforeItsEnd: where the boundary is known
// to lie in (lo, hi], the next knock goes inside it, a step of at most
// 1/knockSteps of it from lo, not at hi where the window is sure to be
// open.
func TestKnocksStepThroughTheIntervalBeforeItsEnd(t *testing.T) {
	lo, hi := t0, t0.Add(time.Second)
	w := windows{closure: closure{closed: true, stated: true, confirmed: true, lo: lo, hi: hi}}
	w.next(t0)
	if !w.knockAt.After(lo) || w.knockAt.After(lo.Add(hi.Sub(lo)/knockSteps)) {
		t.Fatalf("knock at %v, want in (%v, %v]", w.knockAt, lo, lo.Add(hi.Sub(lo)/knockSteps))
	}
}

// TestATestNamingAnInstantInsideTheIntervalAgrees: a test refused with a
// wait naming an instant inside the interval the first hints left open
// points at the same boundary: the closure is confirmed, not taken for
// hints that move with the clock.
func TestATestNamingAnInstantInsideTheIntervalAgrees(t *testing.T) {
	r := &winRig{t: t}
	end := r.burst(t0, 20)
	r.refuse(r.send(end), 10*time.Second, end) // the boundary is in (end+9 s, end+10 s]
	now := end.Add(testGapWhole)
	test := r.send(now)
	if test == nil {
		t.Fatal("no test")
	}
	hint := 8 * time.Second // names end+9.25 s: inside the interval
	if named := now.Add(hint); !named.After(r.w.lo) || named.After(r.w.hi) {
		t.Fatalf("rig: %v is not in (%v, %v]", named, r.w.lo, r.w.hi)
	}
	if !r.refuse(test, hint, now) || !r.w.closed || !r.w.confirmed {
		t.Fatalf("a test naming an instant inside the boundary's interval did not confirm the closure: closed %v, confirmed %v", r.w.closed, r.w.confirmed)
	}
}

// reading is a known window of length (lengthLo, lengthHi] reopened by a
// knock that found a new reading (low, hi]: the last refused knock went
// low after the window's first request, the admitted one hi after it.
func reading(lengthLo, lengthHi, low, hi time.Duration) windows {
	w := windows{closure: closure{closed: true, lastKnock: t0.Add(low)}, prev: windowCount{start: t0, opened: t0, admitted: 5}, shape: shape{known: true, allowance: 5, lengthLo: lengthLo, lengthHi: lengthHi}}
	w.reopen(t0.Add(hi), 1)
	return w
}

// TestOverlappingLengthReadingsNarrowTheLength: a reading of the window's
// length that overlaps the known one narrows it to where both agree,
// rather than replacing it.
func TestOverlappingLengthReadingsNarrowTheLength(t *testing.T) {
	w := reading(9*time.Second, 11*time.Second, 9500*time.Millisecond, 12*time.Second)
	if w.lengthLo != 9500*time.Millisecond || w.lengthHi != 11*time.Second {
		t.Fatalf("length (%v, %v], want (9.5s, 11s]", w.lengthLo, w.lengthHi)
	}
}

// again reopens w, reopened a moment ago at t0+past, once more by a knock
// that finds a new reading (low, hi] of a window that admitted admitted.
func again(w windows, past, low, hi time.Duration, admitted int) windows {
	w.closed, w.prev.start, w.prev.opened, w.prev.admitted = true, t0.Add(past), t0.Add(past), admitted
	w.lastKnock = w.prev.opened.Add(low)
	w.reopen(w.prev.opened.Add(hi), 1)
	return w
}

// TestAReadingAtOddsWithTheKnownLengthIsHeld: (6 s, 7 s] and (12 s, 13 s]
// are further than an eighth of 10 s from (9 s, 10 s]: one such reading (a
// window whose first request went late) changes neither the length nor
// the allowance, whose window it was.
func TestAReadingAtOddsWithTheKnownLengthIsHeld(t *testing.T) {
	for _, r := range [][2]time.Duration{{6 * time.Second, 7 * time.Second}, {12 * time.Second, 13 * time.Second}} {
		w := windows{closure: closure{closed: true, lastKnock: t0.Add(r[0])}, prev: windowCount{start: t0, opened: t0, admitted: 2}, shape: shape{known: true, allowance: 5, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}
		w.reopen(t0.Add(r[1]), 1)
		if w.lengthLo != 9*time.Second || w.lengthHi != 10*time.Second || w.allowance != 5 {
			t.Fatalf("after the reading %v: length (%v, %v], allowance %d; want (9s, 10s] and 5 held", r, w.lengthLo, w.lengthHi, w.allowance)
		}
		if w.closed || w.cur.used != 1 || !w.cur.opened.Equal(t0.Add(r[1])) {
			t.Fatalf("after the reading %v the window is not open from the knock: closed %v, used %d, opened %v", r, w.closed, w.cur.used, w.cur.opened)
		}
	}
}

// TestAReadingALittleOffTheKnownLengthReplacesIt: (8 s, 9 s] and (10 s,
// 11 s] share no length with (9 s, 10 s], but are within an eighth of it:
// dispatches that went a little late, not another window. The latest
// reading replaces the known one, rather than narrowing it to nothing,
// and the allowance is what the window admitted.
func TestAReadingALittleOffTheKnownLengthReplacesIt(t *testing.T) {
	for _, r := range [][2]time.Duration{{8 * time.Second, 9 * time.Second}, {10 * time.Second, 11 * time.Second}} {
		w := windows{closure: closure{closed: true, lastKnock: t0.Add(r[0])}, prev: windowCount{start: t0, opened: t0, admitted: 6}, shape: shape{known: true, allowance: 5, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}
		w.reopen(t0.Add(r[1]), 1)
		if w.lengthLo != r[0] || w.lengthHi != r[1] || w.allowance != 6 {
			t.Fatalf("after the reading %v: length (%v, %v], allowance %d; want the reading and 6", r, w.lengthLo, w.lengthHi, w.allowance)
		}
	}
}

// TestTwoReadingsAtOddsThatAgreeReplaceTheLength: the upstream's window
// changed: a second reading in a row at odds with the known length, that
// agrees with the first, replaces it, and the allowance with what the
// window admitted.
func TestTwoReadingsAtOddsThatAgreeReplaceTheLength(t *testing.T) {
	w := reading(9*time.Second, 10*time.Second, 5*time.Second, 6*time.Second)
	w = again(w, 20*time.Second, 5500*time.Millisecond, 6500*time.Millisecond, 3)
	if w.lengthLo != 5500*time.Millisecond || w.lengthHi != 6500*time.Millisecond || w.allowance != 3 {
		t.Fatalf("length (%v, %v], allowance %d; want the latest reading (5.5s, 6.5s] and 3", w.lengthLo, w.lengthHi, w.allowance)
	}
}

// TestAReadingThatAgreesWithTheKnownLengthDropsTheOneHeld: a reading at
// odds, then one that agrees with the known length: the first is dropped,
// so a later reading at odds is held again rather than taken as the
// second of two.
func TestAReadingThatAgreesWithTheKnownLengthDropsTheOneHeld(t *testing.T) {
	w := reading(9*time.Second, 10*time.Second, 5*time.Second, 6*time.Second)
	w = again(w, 20*time.Second, 9500*time.Millisecond, 10500*time.Millisecond, 4)
	if w.lengthLo != 9500*time.Millisecond || w.lengthHi != 10*time.Second || w.allowance != 4 {
		t.Fatalf("length (%v, %v], allowance %d; want (9.5s, 10s] and 4", w.lengthLo, w.lengthHi, w.allowance)
	}
	w = again(w, 40*time.Second, 5500*time.Millisecond, 6500*time.Millisecond, 3)
	if w.lengthLo != 9500*time.Millisecond || w.lengthHi != 10*time.Second || w.allowance != 4 {
		t.Fatalf("a reading at odds after one that agreed: length (%v, %v], allowance %d; want (9.5s, 10s] and 4 held", w.lengthLo, w.lengthHi, w.allowance)
	}
}

// TestAWindowReopenedByAKnockCountsFromTheKnock: the knock that found the
// window open is its first request, so the window's length runs from the
// knock: once it has passed, a new window's allowance goes, however late
// the rest of the allowance was sent.
func TestAWindowReopenedByAKnockCountsFromTheKnock(t *testing.T) {
	knockAt := t0.Add(10 * time.Second)
	r := &winRig{t: t, w: windows{closure: closure{closed: true, lastKnock: t0.Add(9500 * time.Millisecond), since: t0.Add(9 * time.Second), knockAt: knockAt}, prev: windowCount{admitted: 2, opened: t0}, shape: shape{known: true, allowance: 2, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}}
	k := r.send(knockAt)
	if k == nil {
		t.Fatal("no knock")
	}
	r.w.accepted(k, knockAt)
	if r.w.closed || r.w.allowance != 2 {
		t.Fatalf("the admitted knock did not reopen the window: closed %v, allowance %d", r.w.closed, r.w.allowance)
	}
	late := knockAt.Add(3 * time.Second)
	if r.send(late) == nil { // the allowance's second request, spending it
		t.Fatal("the allowance's second request held")
	}
	next := knockAt.Add(r.w.lengthHi)
	if _, knock, ok := r.w.gate(next, true); !ok || knock {
		t.Fatalf("held at %v, a window's length after the knock that opened it", next)
	}
}

// TestAWindowReopenedAtAStatedBoundaryCountsFromItsFirstRequest: a window
// reopened at its stated boundary with nothing sent yet starts at its
// first request, as a window counted from its first request does: its
// allowance spent holds the pool until a length after that request, not
// after the boundary.
func TestAWindowReopenedAtAStatedBoundaryCountsFromItsFirstRequest(t *testing.T) {
	b := t0.Add(10 * time.Second)
	r := &winRig{t: t, w: windows{closure: closure{closed: true, stated: true, confirmed: true, lo: b.Add(-time.Second), hi: b, since: t0.Add(9 * time.Second)}, prev: windowCount{admitted: 2, opened: t0}, shape: shape{known: true, allowance: 2, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}}
	if _, _, ok := r.w.gate(b, true); !ok || r.w.closed {
		t.Fatal("the stated boundary did not reopen the window")
	}
	first := b.Add(3 * time.Second)
	for range r.w.allowance {
		if r.send(first) == nil {
			t.Fatal("a request of the allowance held")
		}
	}
	length := r.w.lengthHi
	rolled := r.w // the same window, asked a length after its first request
	if _, knock, ok := rolled.gate(first.Add(length), true); !ok || knock {
		t.Fatalf("held at %v, a window's length after its first request", first.Add(length))
	}
	if _, _, ok := r.w.gate(b.Add(length), true); ok {
		t.Fatalf("a request went %v after the boundary, with the window opened at %v spent", length, first)
	}
}

// TestAShortWindowsLengthShowsTenthsOfASecond: a window shorter than ten
// seconds shows its length to a tenth of a second, whole seconds being
// too coarse for it.
func TestAShortWindowsLengthShowsTenthsOfASecond(t *testing.T) {
	v := &windowView{Allowance: 5, Length: 2340 * time.Millisecond, Stated: true}
	if s := v.String(); !strings.Contains(s, "5 per 2.3s,") {
		t.Fatalf("view %q, want the length as 2.3s", s)
	}
}

// TestALongWindowsLengthShowsWholeSeconds: a window of ten seconds and
// more shows its length in whole seconds.
func TestALongWindowsLengthShowsWholeSeconds(t *testing.T) {
	v := &windowView{Allowance: 500, Length: 61400 * time.Millisecond, Stated: false}
	if s := v.String(); !strings.Contains(s, "500 per 1m1s,") {
		t.Fatalf("view %q, want the length as 1m1s", s)
	}
}

// TestHintsThatDisagreeLeaveTheLatestInstant: a hint whose instant lies
// after the interval the earlier ones left (its second begins at or after
// their latest instant) cannot narrow it; the interval becomes the last
// millisecond before that instant, still one the boundary can lie in.
func TestHintsThatDisagreeLeaveTheLatestInstant(t *testing.T) {
	var w windows
	at := t0.Add(10 * time.Second)
	w.state(at, time.Second)
	w.state(at.Add(2*time.Second), time.Second) // its second begins after at
	if !w.hi.Equal(at) || !w.lo.Equal(at.Add(-time.Millisecond)) {
		t.Fatalf("interval (%v, %v], want the millisecond before %v", w.lo.Sub(t0), w.hi.Sub(t0), at.Sub(t0))
	}
}

// TestAStatedBoundaryReachedReopensFromTheKnockInFlightOrTheBoundary: when
// the clock reaches the boundary hints stated, the window that opens
// counts from the knock still in flight, its first request, or with none
// in flight from the boundary itself, empty.
func TestAStatedBoundaryReachedReopensFromTheKnockInFlightOrTheBoundary(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		r := &winRig{t: t}
		end := r.burst(t0, 20)
		boundary := t0.Add(10 * time.Second)
		r.w.close(end, end, true)
		r.w.state(boundary, time.Millisecond)
		knockAt := boundary.Add(-5 * time.Millisecond)
		if inFlight {
			r.w.knocked(99, knockAt)
		}
		if _, _, ok := r.w.gate(boundary, false); !ok || r.w.closed {
			t.Fatalf("in flight %v: the pool is held at the stated boundary", inFlight)
		}
		wantStart, wantUsed := boundary, 0
		if inFlight {
			wantStart, wantUsed = knockAt, 1
		}
		if !r.w.cur.start.Equal(wantStart) || r.w.cur.used != wantUsed {
			t.Fatalf("in flight %v: the window opened at %v with %d sent, want %v with %d",
				inFlight, r.w.cur.start.Sub(t0), r.w.cur.used, wantStart.Sub(t0), wantUsed)
		}
	}
}

// TestRequestsStillOutCountAsTakenWhenAHintIsJudged: right after a burst
// the upstream admitted, the admitted requests are still out (an answer
// takes its time; a refusal comes back at once). A 300 ms wait then is
// six requests' worth of what the upstream took: a window's boundary, not
// a bucket's refill, and no pace is learned from it. With nothing out and
// nothing admitted it is a pace, one request per hint.
func TestRequestsStillOutCountAsTakenWhenAHintIsJudged(t *testing.T) {
	hint := 300 * time.Millisecond
	refusedAt := at(201 * time.Millisecond)
	burst := func(out int) *Memory {
		s := NewMemory(Config{Concurrency: 32, MaxConcurrency: 64})
		s.learn.lastAccepted = t0
		s.conc.inFlight = out + 1 // the burst, and the refused request
		return s
	}
	tk := Ticket{Seq: 21, Dispatched: at(200 * time.Millisecond), Level: 21}
	if got := burst(20).hintPace(hint, &tk, refusedAt); got != 0 {
		t.Fatalf("a %v hint with 20 admitted requests still out gave a pace of %v/s", hint, got)
	}
	if got, want := burst(0).hintPace(hint, &tk, refusedAt), 1/hint.Seconds(); !near(got, want) {
		t.Fatalf("a %v hint with nothing out gave a pace of %v/s, want %v", hint, got, want)
	}
	// Nor is the refused request itself: 20 taken make 97 ms under two
	// requests' worth, a pace (21 would make it a boundary).
	short := 97 * time.Millisecond
	if got, want := burst(20).hintPace(short, &tk, refusedAt), 1/short.Seconds(); !near(got, want) {
		t.Fatalf("a %v hint with 20 out gave a pace of %v/s, want %v: the refused one counted as taken", short, got, want)
	}
	// Refused permits held for their retries are not taken requests.
	held := burst(20)
	held.refusedHolding = 20
	if got := held.hintPace(hint, &tk, refusedAt); got == 0 {
		t.Fatal("refused requests holding permits were counted as taken")
	}
	// And learned from: the refusal closes the window, and no pace is
	// taken from the hint.
	s := burst(20)
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused, Hint: hint, PauseUntil: refusedAt.Add(hint)}, refusedAt)
	if s.learn.from == rateHint {
		t.Fatalf("learned %v/s from a window's boundary as a hint pace", s.learn.estimate)
	}
}

// TestAnAllowanceLearnedLowIsFoundInAFewWindows: a window learned at 10
// from one the pool did not fill, against an upstream that admits 20 a
// window. After the first probe admitted all it sent, every window
// probes, each twice as far as the last (up to 1<<maxClimb): 11, 13, 17,
// 21 sent, the last refused past 20. Then the probe is one more, one
// window in probeWindows, as before (here the fifth).
func TestAnAllowanceLearnedLowIsFoundInAFewWindows(t *testing.T) {
	const real = 20
	r := &winRig{t: t, w: windows{shape: shape{known: true, allowance: 10, lengthLo: 900 * time.Millisecond, lengthHi: time.Second, full: probeWindows - 1}}}
	now := t0
	var sentBy []int
	for range 8 {
		var sent int
		sent, now = r.spend(now, real)
		sentBy = append(sentBy, sent)
	}
	want := []int{11, 13, 17, 21, 21, 20, 20, 20}
	if !slices.Equal(sentBy, want) {
		t.Fatalf("windows sent %v, want %v", sentBy, want)
	}
}

// spend sends from now, 1 ms apart, until the gate closes the window,
// the upstream admitting the first admits of the window (the knock that
// reopened it among them) and refusing the rest; then the knock at the
// boundary, admitted. It returns what the window sent and the knock's
// time.
func (r *winRig) spend(now time.Time, admits int) (int, time.Time) {
	r.t.Helper()
	sent := r.w.cur.used // the knock that reopened it went in it
	for tk := r.send(now); tk != nil; tk = r.send(now) {
		sent++
		if sent <= admits {
			r.w.accepted(tk, now)
		} else {
			r.refuse(tk, 0, now)
		}
		now = now.Add(time.Millisecond)
	}
	if !r.w.closed {
		r.t.Fatalf("a window that sent %d not closed once spent", sent)
	}
	at, _, _ := r.w.gate(now, true)
	k := r.send(at)
	if k == nil {
		r.t.Fatalf("no knock at %v after a window that sent %d", at, sent)
	}
	r.w.accepted(k, at)
	return sent, at
}

// TestLateAnswersCountTowardTheWindowThatEnded: a window of a known
// allowance of 3 spends it and closes before any answer is in; the three
// answers come late, during the closure, and count toward the window
// they went in, whose allowance the knock that reopens the window takes:
// 3 again, so two more go after the knock, not none.
func TestLateAnswersCountTowardTheWindowThatEnded(t *testing.T) {
	r := &winRig{t: t, w: windows{shape: shape{known: true, allowance: 3, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}}
	var out []*Ticket
	for range 3 {
		out = append(out, r.send(t0))
	}
	if slices.Contains(out, nil) || r.send(at(10*time.Millisecond)) != nil || !r.w.closed {
		t.Fatal("a window of 3 did not close once 3 went")
	}
	for _, tk := range out {
		r.w.accepted(tk, at(time.Second))
	}
	now, _, _ := r.w.gate(at(time.Second), true)
	k := r.send(now)
	if k == nil {
		t.Fatalf("no knock at %v", now.Sub(t0))
	}
	r.w.accepted(k, now)
	if r.w.closed || r.w.allowance != 3 {
		t.Fatalf("after the knock: closed %v, allowance %d; want open, 3", r.w.closed, r.w.allowance)
	}
	sent := 0
	for r.send(now) != nil {
		sent++
	}
	if sent != 2 {
		t.Fatalf("%d went after the knock, want 2 (3 a window, the knock among them)", sent)
	}
}

// TestALateFirstRequestDoesNotShortenTheLength: a window that opened at a
// boundary (a reopen) whose first request went 600 ms late (a loaded
// machine) reads its length from the boundary, 1 s, not from the request.
func TestALateFirstRequestDoesNotShortenTheLength(t *testing.T) {
	w := windows{closure: closure{closed: true, lastKnock: t0.Add(990 * time.Millisecond)}, prev: windowCount{start: t0, opened: t0.Add(600 * time.Millisecond), admitted: 5}, shape: shape{known: true, allowance: 5}}
	w.reopen(t0.Add(time.Second), 1)
	if w.lengthLo != 990*time.Millisecond || w.lengthHi != time.Second {
		t.Fatalf("length (%v, %v], want (990ms, 1s] from the boundary that opened the window", w.lengthLo, w.lengthHi)
	}
}

// TestTheFirstWindowsLengthGivesWayToTheNext: the pool's first window
// began wherever its first request fell (784 ms before the boundary of a
// 1 s window aligned to the clock): the next window's reading, far off
// it, replaces it rather than being held.
func TestTheFirstWindowsLengthGivesWayToTheNext(t *testing.T) {
	w := windows{closure: closure{closed: true, lastKnock: t0.Add(780 * time.Millisecond)}, prev: windowCount{opened: t0, admitted: 19}, shape: shape{allowance: 5}}
	w.reopen(t0.Add(784*time.Millisecond), 1)
	if w.lengthHi != 784*time.Millisecond || !w.lengthFirst {
		t.Fatalf("rig: length (%v, %v], first %v", w.lengthLo, w.lengthHi, w.lengthFirst)
	}
	w = again(w, 784*time.Millisecond, 990*time.Millisecond, time.Second, 20)
	if w.lengthLo != 990*time.Millisecond || w.lengthHi != time.Second || w.lengthFirst || w.allowance != 20 {
		t.Fatalf("length (%v, %v], first %v, allowance %d; want (990ms, 1s] and 20 from the second window",
			w.lengthLo, w.lengthHi, w.lengthFirst, w.allowance)
	}
}

// TestARefusedEmptyWindowDoesNotReplaceTheFirstLength: the pool's first
// window, from its first request to a boundary 10 s on, admitted 180. The
// window its boundary reopened is refused a millisecond later, before it
// admitted anything (the boundary was read a moment early): its reading,
// (0, 1 ms], is held, and the allowance stays 180. A window that admitted
// 20 in (999 ms, 1 s] (the first window had spanned boundaries) replaces
// it.
func TestARefusedEmptyWindowDoesNotReplaceTheFirstLength(t *testing.T) {
	w := windows{closure: closure{closed: true, lastKnock: t0.Add(9998 * time.Millisecond)}, prev: windowCount{opened: t0, admitted: 180}}
	w.reopen(t0.Add(9999*time.Millisecond), 0)
	if w.lengthLo != 9998*time.Millisecond || !w.lengthFirst || w.allowance != 180 {
		t.Fatalf("rig: length (%v, %v], first %v, allowance %d", w.lengthLo, w.lengthHi, w.lengthFirst, w.allowance)
	}
	empty := again(w, 9999*time.Millisecond, 0, time.Millisecond, 0)
	if empty.lengthLo != 9998*time.Millisecond || empty.lengthHi != 9999*time.Millisecond || empty.allowance != 180 {
		t.Fatalf("after (0, 1ms] with none admitted: length (%v, %v], allowance %d; want (9.998s, 9.999s] and 180 held",
			empty.lengthLo, empty.lengthHi, empty.allowance)
	}
	full := again(w, 9999*time.Millisecond, 999*time.Millisecond, time.Second, 20)
	if full.lengthLo != 999*time.Millisecond || full.lengthHi != time.Second || full.lengthFirst || full.allowance != 20 {
		t.Fatalf("after (999ms, 1s] with 20 admitted: length (%v, %v], first %v, allowance %d; want (999ms, 1s] and 20",
			full.lengthLo, full.lengthHi, full.lengthFirst, full.allowance)
	}
}

// TestAKnockLetThroughByAShortAllowanceIsNoBoundary: a window learned as
// 19 of an upstream's 20 closes after 19, and its knock at the boundary a
// wrong length predicts is admitted, as the 20th. The window it seemed to
// open is refused at once, having admitted the knock alone: when the
// boundary the hints name reopens the pool, the allowance is 20 and the
// length is not read from the false start.
func TestAKnockLetThroughByAShortAllowanceIsNoBoundary(t *testing.T) {
	r := &winRig{t: t, w: windows{cur: windowCount{start: t0}, prev: windowCount{start: t0.Add(-time.Second), opened: t0.Add(-time.Second)}, shape: shape{known: true, allowance: 19, lengthLo: 783 * time.Millisecond, lengthHi: 784 * time.Millisecond}}}
	end := r.burst(t0, 19)
	if r.send(end) != nil || !r.w.closed {
		t.Fatal("rig: the pool did not close on its allowance")
	}
	at, _, _ := r.w.gate(end, true)
	k := r.send(at)
	if k == nil || !at.Before(t0.Add(time.Second)) {
		t.Fatalf("rig: no knock before the real boundary (at %v)", at.Sub(t0))
	}
	r.w.accepted(k, at)
	if r.w.closed || !r.w.cur.guessed {
		t.Fatalf("rig: the admitted knock did not open a window (closed %v, guessed %v)", r.w.closed, r.w.cur.guessed)
	}
	// The next request is refused, naming the real boundary.
	over := r.send(at.Add(time.Millisecond))
	boundary := t0.Add(time.Second)
	now := at.Add(2 * time.Millisecond)
	if over == nil || !r.w.refused(over, boundary.Sub(now), true, 20, now) { // the upstream took 20 a second
		t.Fatal("rig: the refusal after the false start was not the windows'")
	}
	r.knockThrough(now, boundary, true)
	if r.w.closed || r.w.allowance != 20 {
		t.Fatalf("closed %v, allowance %d; want open with 20", r.w.closed, r.w.allowance)
	}
	if r.w.lengthLo != 783*time.Millisecond || r.w.lengthHi != 784*time.Millisecond {
		t.Fatalf("length (%v, %v], want (783ms, 784ms] untouched by the false start", r.w.lengthLo, r.w.lengthHi)
	}
}

// TestAReadingAnEighthOffIsHeld: the slack is strict: with a known length
// of (9 s, 10 s], a reading ending exactly an eighth of 10 s below its
// start (7.75 s), or starting exactly an eighth above its end (11.25 s),
// is held, while one a millisecond inside replaces it.
func TestAReadingAnEighthOffIsHeld(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		low, hi time.Duration
		held    bool
	}{
		{7 * time.Second, 7750 * ms, true},
		{7 * time.Second, 7751 * ms, false},
		{11250 * ms, 12 * time.Second, true},
		{11249 * ms, 12 * time.Second, false},
	} {
		w := shape{lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}
		counted := w.readLength(c.low, c.hi, false, true, false)
		if counted == c.held || c.held != (w.lengthHi == 10*time.Second) {
			t.Errorf("reading (%v, %v]: counted %v, length now (%v, %v]; want held %v", c.low, c.hi, counted, w.lengthLo, w.lengthHi, c.held)
		}
	}
}

// TestAKnockWindowThatAdmittedHalfItsAllowanceWasAWindow: a window opened
// by a knock that admitted exactly half its allowance before a refusal is
// read as a window (its allowance and length), not as a knock let through
// early.
func TestAKnockWindowThatAdmittedHalfItsAllowanceWasAWindow(t *testing.T) {
	w := windows{closure: closure{closed: true, lastKnock: t0.Add(995 * time.Millisecond)}, prev: windowCount{start: t0, opened: t0, admitted: 10, guessed: true}, shape: shape{known: true, allowance: 20, lengthLo: 990 * time.Millisecond, lengthHi: time.Second}}
	w.reopen(t0.Add(time.Second), 1)
	if w.allowance != 10 || w.lengthLo != 995*time.Millisecond {
		t.Fatalf("allowance %d, length (%v, %v]; want 10 and (995ms, 1s] read from the window", w.allowance, w.lengthLo, w.lengthHi)
	}
}

// TestAnswersAfterTheReopenStillAddToTheAllowance: a window of 20 whose
// last three answers come after the boundary reopened it (they went in
// its last 200 ms, one answer time before it) takes 17 as the allowance
// at the reopen, then 20 as those answers come in; the window that opens
// sends 20, so the knock at the boundary after it is not the 20th of a
// window still open.
func TestAnswersAfterTheReopenStillAddToTheAllowance(t *testing.T) {
	r := &winRig{t: t, w: windows{shape: shape{known: true, allowance: 20, lengthLo: 999 * time.Millisecond, lengthHi: time.Second}}}
	var late []*Ticket
	for i := range 20 {
		tk := r.send(at(time.Duration(i) * 40 * time.Millisecond))
		if i < 17 {
			r.w.accepted(tk, tk.Dispatched)
		} else {
			late = append(late, tk)
		}
	}
	if r.send(at(800*time.Millisecond)) != nil || !r.w.closed {
		t.Fatal("a window of 20 did not close once 20 went")
	}
	k := r.send(at(time.Second))
	if k == nil {
		t.Fatal("no knock at the boundary")
	}
	r.w.accepted(k, at(time.Second))
	if r.w.closed || r.w.allowance != 17 {
		t.Fatalf("after the knock: closed %v, allowance %d; want open, 17 (the answers in so far)", r.w.closed, r.w.allowance)
	}
	for _, tk := range late {
		r.w.accepted(tk, at(time.Second+100*time.Millisecond))
	}
	if r.w.allowance != 20 {
		t.Fatalf("allowance %d after the window's last answers came, want 20", r.w.allowance)
	}
	sent := 1 // the knock
	for r.send(at(time.Second+150*time.Millisecond)) != nil {
		sent++
	}
	if sent != 20 {
		t.Fatalf("the window after sent %d, want 20", sent)
	}
}

// TestAShortHintInAKnownWindowClosesItAtTheHint: once the shape is known,
// a refusal in a window whose allowance was read too large (a first window
// that spanned a boundary) closes it at once, stated and confirmed, until
// the instant its hint names, however short the hint (800 ms, or
// Retry-After: 1 to within its second): the rest of the allowance is not
// sent into refusals. Before the shape is known a 40 ms hint is a pace,
// and so is any hint while hints are known to move with the clock.
func TestAShortHintInAKnownWindowClosesItAtTheHint(t *testing.T) {
	known := func() *winRig {
		return &winRig{t: t, w: windows{suspicion: suspicion{lastAdmit: t0}, shape: shape{known: true, allowance: 34, lengthLo: 1449 * time.Millisecond, lengthHi: 1450 * time.Millisecond}}}
	}
	for _, hint := range []time.Duration{800 * time.Millisecond, time.Second} {
		r := known()
		now := r.burst(t0, 20)
		if !r.refuse(r.send(now), hint, now) || !r.w.closed || !r.w.stated || !r.w.confirmed {
			t.Fatalf("a %v hint in a known window: closed %v, stated %v, confirmed %v; want all",
				hint, r.w.closed, r.w.stated, r.w.confirmed)
		}
		if until := r.w.until(); !until.Equal(now.Add(hint)) {
			t.Fatalf("a %v hint holds the pool until %v, want its instant %v", hint, until.Sub(t0), now.Add(hint).Sub(t0))
		}
		if r.send(now.Add(time.Millisecond)) != nil {
			t.Fatalf("a %v hint: sent on in a window refused", hint)
		}
	}
	u := &winRig{t: t, w: windows{suspicion: suspicion{lastAdmit: t0}}}
	now := u.burst(t0, 20)
	if u.refuse(u.send(now), 40*time.Millisecond, now) || u.w.closed {
		t.Fatal("a 40 ms hint closed a pool whose shape is not known")
	}
	m := known()
	m.w.moving = t0.Add(time.Minute)
	now = m.burst(t0, 20)
	if m.refuse(m.send(now), 800*time.Millisecond, now) || m.w.closed {
		t.Fatal("an 800 ms hint closed a known window while hints are known to move with the clock")
	}
}

// TestOnlyAReopenedWindowsLateAnswersAddToTheAllowance: late answers to the
// window that ended add to the allowance only while it is what a reopen
// took as the allowance: not once a new closure began (its window's
// answers are the next reopen's to count), nor after a roll (a window no
// closure ended, counted from its first request, may span a boundary).
func TestOnlyAReopenedWindowsLateAnswersAddToTheAllowance(t *testing.T) {
	late := func(w *windows, sent time.Time, n int) {
		for i := range n {
			w.accepted(&Ticket{Seq: uint64(100 + i), Dispatched: sent}, sent.Add(time.Second))
		}
	}
	w := windows{cur: windowCount{start: at(time.Second)}, prev: windowCount{start: t0}, shape: shape{known: true, allowance: 5, counted: true, lengthLo: 999 * time.Millisecond, lengthHi: time.Second}}
	late(&w, at(500*time.Millisecond), 6)
	if w.allowance != 6 {
		t.Fatalf("allowance %d after 6 answers to the reopened window, want 6", w.allowance)
	}
	w.close(at(1500*time.Millisecond), at(1500*time.Millisecond), false)
	late(&w, at(1200*time.Millisecond), 8)
	if w.allowance != 6 {
		t.Fatalf("allowance %d after answers to a window a new closure ended, want 6 until it reopens", w.allowance)
	}
	r := windows{cur: windowCount{start: t0, opened: t0}, shape: shape{known: true, allowance: 5, counted: true, lengthLo: 999 * time.Millisecond, lengthHi: time.Second}}
	r.roll(at(1100 * time.Millisecond))
	late(&r, at(500*time.Millisecond), 8)
	if r.allowance != 5 {
		t.Fatalf("allowance %d after answers to a rolled window, want 5", r.allowance)
	}
}

// TestANarrowIntervalIsKnockedAtItsEnd: once the interval the boundary
// lies in is within lateShare of the window's length, the knock goes at
// its end, where the window is open, instead of into it where the
// upstream may refuse it again; a wider one is still stepped through.
// Before the length is known, the window that ended lasted at least from
// its first request to the interval's start.
func TestANarrowIntervalIsKnockedAtItsEnd(t *testing.T) {
	opened := t0
	lo := t0.Add(9 * time.Second)
	narrow := lo.Add(time.Duration(lateShare * float64(9*time.Second)))
	w := windows{closure: closure{closed: true, stated: true, confirmed: true, lo: lo, hi: narrow}, prev: windowCount{opened: opened}}
	w.next(lo)
	if !w.knockAt.Equal(narrow) {
		t.Fatalf("interval %v wide after a window of at least 9 s: knock at %v, want its end %v", narrow.Sub(lo), w.knockAt.Sub(lo), narrow.Sub(lo))
	}
	wide := narrow.Add(10 * time.Millisecond)
	w = windows{closure: closure{closed: true, stated: true, confirmed: true, lo: lo, hi: wide}, prev: windowCount{opened: opened}}
	w.next(lo)
	if want := lo.Add(wide.Sub(lo) / knockSteps); !w.knockAt.Equal(want) {
		t.Fatalf("interval %v wide: knock at %v, want %v", wide.Sub(lo), w.knockAt.Sub(lo), want.Sub(lo))
	}
	// A known length counts, not the time since the window's first
	// request.
	w = windows{closure: closure{closed: true, stated: true, confirmed: true, lo: lo, hi: wide}, prev: windowCount{opened: opened}, shape: shape{known: true, lengthLo: 20 * time.Second, lengthHi: 21 * time.Second}}
	w.next(lo)
	if !w.knockAt.Equal(wide) {
		t.Fatalf("interval %v wide in a window known to last 20 s: knock at %v, want its end", wide.Sub(lo), w.knockAt.Sub(lo))
	}
	// Known, but with no length read yet: the window that ended counts.
	w = windows{closure: closure{closed: true, stated: true, confirmed: true, lo: lo, hi: narrow}, prev: windowCount{opened: opened}, shape: shape{known: true}}
	w.next(lo)
	if !w.knockAt.Equal(narrow) {
		t.Fatal("a shape known with no length read: the window that ended did not count")
	}
	// Nothing known of the window: step through.
	w = windows{closure: closure{closed: true, stated: true, confirmed: true, lo: lo, hi: narrow}}
	w.next(lo)
	if w.knockAt.Equal(narrow) {
		t.Fatal("a window of unknown length: knocked at the interval's end")
	}
}

// TestAnAdmissionSentBeforeARefusalCameBackLeavesTheRunGoing: requests
// reach the upstream in another order than they went, so one sent a
// moment after a refused one may have been counted before it: its
// admission, answered after the refusal, neither marks the window stray
// nor ends the run of refusals, which closes the pool as it would have.
// One sent after the refusal came back was counted after it, and does.
func TestAnAdmissionSentBeforeARefusalCameBackLeavesTheRunGoing(t *testing.T) {
	r, end := silentRig(t)
	refused := r.send(end)
	overtook := r.send(end.Add(2 * time.Millisecond))
	r.refuse(refused, 0, end.Add(50*time.Millisecond)) // the refusal comes back
	r.w.accepted(overtook, end.Add(60*time.Millisecond))
	if r.w.cur.stray || r.w.runFrom.IsZero() {
		t.Fatalf("an admission sent 2 ms after a refusal, before it came back, ended the run (stray %v)", r.w.cur.stray)
	}
	for i := 1; i < minRun; i++ {
		now := end.Add(time.Duration(i) * minClosure)
		r.refuse(r.send(now), 0, now)
	}
	if !r.w.closed {
		t.Fatal("the run of silent refusals did not close the pool")
	}

	r, end = silentRig(t)
	r.refuse(r.send(end), 0, end.Add(50*time.Millisecond))
	after := r.send(end.Add(51 * time.Millisecond))
	r.w.accepted(after, end.Add(100*time.Millisecond))
	if !r.w.cur.stray || !r.w.runFrom.IsZero() {
		t.Fatal("an admission sent after the refusal came back did not end the run")
	}
}

// TestAnAdmissionSentBeforeTheClosingRefusalCameBackCountsInTheAllowance:
// a request sent 2 ms after the one whose refusal closed the window,
// before that refusal came back, was counted by the upstream first and
// admitted: it was the window's, and the allowance learned when the
// window opens again counts it (counted in the closed window instead,
// the allowance came out one short, and the run's last requests waited a
// window).
func TestAnAdmissionSentBeforeTheClosingRefusalCameBackCountsInTheAllowance(t *testing.T) {
	r := &winRig{t: t}
	boundary := t0.Add(10 * time.Second)
	end := r.burst(t0, 20)
	refused := r.send(end)
	overtook := r.send(end.Add(2 * time.Millisecond))
	if !r.refuse(refused, 10*time.Second, end.Add(50*time.Millisecond)) || !r.w.closed {
		t.Fatal("a 10 s wait after a burst did not close the window")
	}
	r.w.accepted(overtook, end.Add(60*time.Millisecond))
	now := end.Add(1250 * time.Millisecond)
	r.refuse(r.send(now), 9*time.Second, now) // the test: the same instant
	r.knockThrough(now, boundary, true)
	if r.w.closed || r.w.allowance != 21 {
		t.Fatalf("reopened %v with an allowance of %d, want 21: the 20 of the burst and the one that overtook the refusal", !r.w.closed, r.w.allowance)
	}
}

// TestALongSilentClosureKnocksJustPastAWholeSecondOfItsWindow: once a
// silent closure's knocks go half a second or more apart, each goes 50 ms
// past the first whole second, counted from the window's first request,
// after half the gap: a window of whole seconds counted from its first
// request ends on one, so its first closure is found within 50 ms, not
// anywhere in the last gap (up to a tenth of the window's length).
// Later in the closure the knocks stay about its share apart (a second
// less at most), not half of it: each refused knock is a refusal, and one
// that counts deepens a debt. Earlier, or with no first request known,
// knocks go a share of the closure's length apart.
func TestALongSilentClosureKnocksJustPastAWholeSecondOfItsWindow(t *testing.T) {
	w := windows{closure: closure{closed: true, since: t0.Add(300 * time.Millisecond)}}
	w.prev.opened = t0
	now := t0.Add(time.Second)
	if w.next(now); !w.knockAt.Equal(now.Add(minKnock)) {
		t.Fatalf("0.7 s into the closure: knock at +%v, want +%v", w.knockAt.Sub(now), minKnock)
	}
	now = t0.Add(9370 * time.Millisecond) // a gap of 0.907 s: the next whole second after now+gap/2 is 10 s
	if w.next(now); !w.knockAt.Equal(t0.Add(10*time.Second + 50*time.Millisecond)) {
		t.Fatalf("9.07 s into the closure: knock at %v after the window's first request, want 10.05 s", w.knockAt.Sub(t0))
	}
	now = t0.Add(9900 * time.Millisecond)
	if w.next(now); !w.knockAt.Equal(t0.Add(11*time.Second + 50*time.Millisecond)) {
		t.Fatalf("a knock refused at 9.9 s: the next at %v after the window's first request, want 11.05 s", w.knockAt.Sub(t0))
	}
	now = t0.Add(40300 * time.Millisecond) // a gap of 4 s: knocks still about that far apart, not half of it
	if w.next(now); !w.knockAt.Equal(t0.Add(44*time.Second + 50*time.Millisecond)) {
		t.Fatalf("40 s into the closure: knock at %v after the window's first request, want 44.05 s", w.knockAt.Sub(t0))
	}
	now = t0.Add(9900 * time.Millisecond)
	w.prev.opened = time.Time{}
	if w.next(now); w.knockAt.Sub(now) < 959*time.Millisecond || w.knockAt.Sub(now) > 961*time.Millisecond {
		t.Fatalf("with no first request known: knock at +%v, want a tenth of the 9.6 s closure", w.knockAt.Sub(now))
	}
}
