package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The journal's recorder (tape.go) taken at its own level: the keeping,
// its passes and its tapes, with no proxy or upstream around them. Tests
// that wait on the recorder's timers (joinWindow, passGap, joinKeep) run
// in a synctest bubble, whose clock moves only when everything waits.

// newTestKeeping is a keeping without a journal file, in record mode,
// whose passes rest passGap.
func newTestKeeping(passGap time.Duration) *keeping {
	k := &keeping{}
	k.init(nil, "record", passGap)
	return k
}

// callFor is the key of a request whose body is body.
func callFor(body string) callKey { return callKey{sum: keySum([]byte(body))} }

// discardWriter is a client that takes every byte and cannot flush.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header {
	if d.h == nil {
		d.h = http.Header{}
	}
	return d.h
}
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

// leftMidCall is a tape of call c (journaled as j, or not when j is nil)
// whose request went upstream and whose client then left.
func leftMidCall(t *testing.T, k *keeping, c callKey, j *journaled, timeout time.Duration) *tape {
	t.Helper()
	client, leave := context.WithCancel(context.Background())
	tp := k.newTape(&discardWriter{}, client, c, j, false)
	if timeout > 0 {
		tp.timesOut = time.Now().Add(timeout)
	}
	(&keepSay{tape: tp}).sentNow()
	leave()
	synctest.Wait()
	return tp
}

func TestABodyOfExactlyCanonicalMaxIsKeyedAsJSON(t *testing.T) {
	head, tail := `{"z": 1, "model": "m", "pad": "`, `"}`
	raw := []byte(head + strings.Repeat("x", canonicalMax-len(head)-len(tail)) + tail)
	if len(raw) != canonicalMax {
		t.Fatalf("the body is %d bytes, not canonicalMax", len(raw))
	}
	canon, model := canonicalBody(raw)
	if model != "m" || !bytes.HasPrefix(canon, []byte(`{"model":"m","pad":"xxx`)) || !bytes.HasSuffix(canon, []byte(`","z":1}`)) {
		t.Errorf("a body of canonicalMax bytes was not made canonical: model %q, %q...", model, canon[:40])
	}
	over := append([]byte(" "), raw...)
	if canon, model := canonicalBody(over); model != "" || !bytes.Equal(canon, over) {
		t.Errorf("a body one byte past canonicalMax was read as JSON (model %q)", model)
	}
}

func TestAKeyedQueryLeavesOutItsCredentials(t *testing.T) {
	if got := keyQuery("b=2&key=secret&a=1&api-key=other"); got != "a=1&b=2" {
		t.Errorf("keyQuery kept %q, want a=1&b=2", got)
	}
	if got := keyQuery(""); got != "" {
		t.Errorf("an empty query keyed as %q", got)
	}
}

func TestAQueryThatDoesNotParseIsKeyedAsItIs(t *testing.T) {
	for _, raw := range []string{"a=%zz&key=secret", "a=1;b=2"} {
		if got := keyQuery(raw); got != raw {
			t.Errorf("keyQuery(%q) = %q, want it as it is", raw, got)
		}
	}
}

func TestACallWhoseClientLeftWaitsJoinWindowForARetryThenEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		tp := leftMidCall(t, k, callFor("a"), nil, 0)
		if !tp.orphaned() {
			t.Fatal("a call under way whose client left is not kept for its retry")
		}
		endsAt(t, 10*time.Second, func() bool { return tp.ctx.Err() != nil }, "the call ended before joinWindow (10 s) with no retry", "the call went on past joinWindow with no retry joining it")
	})
}

func TestARecordedCallWhoseClientLeftRunsPastJoinWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		c := callFor("a")
		j := k.take(c, "r", false, time.Now())
		tp := leftMidCall(t, k, c, j, 0)
		time.Sleep(joinWindow + time.Second)
		synctest.Wait()
		if tp.ctx.Err() != nil {
			t.Fatal("a call the journal records was cut at joinWindow")
		}
	})
}

func TestAnOrphanServesOneRetryAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		c := callFor("a")
		tp := leftMidCall(t, k, c, nil, 0)
		retry := &keepSay{retry: true}
		if got, claimed := k.joinable(c, retry); got != tp || !claimed {
			t.Fatal("a retry did not claim the call its client left")
		}
		if got, _ := k.joinable(c, retry); got != nil {
			t.Fatal("a second retry claimed the call the first one holds")
		}
		k.unclaim(tp, false, true)
		if got, claimed := k.joinable(c, retry); got != tp || !claimed {
			t.Fatal("after its retry left too, the call was not there for the next retry")
		}
		k.unclaim(tp, false, true)
	})
}

func TestARetryThatLeavesGivesTheCallAnotherJoinWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		c := callFor("a")
		tp := leftMidCall(t, k, c, nil, 0)
		time.Sleep(time.Second)
		if got, _ := k.joinable(c, &keepSay{retry: true}); got != tp {
			t.Fatal("the retry did not join the call")
		}
		time.Sleep(10 * time.Second) // the first joinWindow ends with the retry joined
		synctest.Wait()
		if tp.ctx.Err() != nil {
			t.Fatal("a call a retry joined was cut at the end of its joinWindow")
		}
		k.unclaim(tp, false, true) // the retry's client leaves too
		endsAt(t, 10*time.Second, func() bool { return tp.ctx.Err() != nil }, "the call was cut before another joinWindow since its retry left", "the call went on past the joinWindow after its retry left")
	})
}

func TestAnAnswerKeptForRetriesGoesAfterJoinKeepAndLeavesTheOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		c := callFor("a")
		a := leftMidCall(t, k, c, nil, 0)
		b := leftMidCall(t, k, c, nil, 0)
		b.WriteHeader(200)
		_, _ = b.Write([]byte(`{"answer":1}`))
		ok, _, _, _ := b.wrapUp(true)
		if !ok || !b.orphaned() {
			t.Fatal("b's complete answer is not an orphan's")
		}
		k.forget(b, true)
		k.mu.Lock()
		kept := k.kept
		k.mu.Unlock()
		if kept != int64(len(`{"answer":1}`)) {
			t.Fatalf("kept %d bytes for the retry, want the answer's %d", kept, len(`{"answer":1}`))
		}
		time.Sleep(joinKeep + time.Second)
		synctest.Wait()
		k.mu.Lock()
		list, kept := k.orphans[c.sum], k.kept
		k.mu.Unlock()
		if len(list) != 1 || list[0] != a {
			t.Errorf("after b went, the request's orphans are %v, want a alone", list)
		}
		if kept != 0 || k.buffered.Load() != 0 {
			t.Errorf("after b went, %d kept and %d buffered bytes are counted, want 0", kept, k.buffered.Load())
		}
		a.wrapUp(false)
		k.forget(a, false)
		k.mu.Lock()
		_, still := k.orphans[c.sum]
		k.mu.Unlock()
		if still {
			t.Error("the request holds an empty orphans entry after its last orphan went")
		}
	})
}

func TestANewRunPastMaxPassesDropsTheIdlestPass(t *testing.T) {
	k := newTestKeeping(time.Hour)
	c := callFor("a")
	base := time.Now()
	for i := range maxPasses {
		j := k.take(c, fmt.Sprintf("r%d", i), false, base)
		if i > 0 {
			k.answered(j, true)
		}
	}
	k.mu.Lock()
	if len(k.runs) != maxPasses {
		k.mu.Unlock()
		t.Fatalf("%d runs kept below maxPasses, want all %d", len(k.runs), maxPasses)
	}
	for i := range maxPasses { // r0 rested longest but has a request at the proxy; r1 is the idlest
		k.runs[fmt.Sprintf("r%d", i)].last = base.Add(time.Duration(i-maxPasses) * time.Second)
	}
	k.mu.Unlock()
	k.take(c, "new", false, base)
	k.mu.Lock()
	defer k.mu.Unlock()
	_, r0 := k.runs["r0"]
	_, r1 := k.runs["r1"]
	if len(k.runs) != maxPasses || !r0 || r1 {
		t.Errorf("after a new run past maxPasses: %d runs, r0 (busy) kept %v, r1 (idlest) kept %v; want %d, true, false", len(k.runs), r0, r1, maxPasses)
	}
	for _, p := range k.runs {
		if p.rest != nil {
			p.rest.Stop()
		}
	}
}

func TestARunRestedExactlyItsPassGapStartsANewPass(t *testing.T) {
	k := newTestKeeping(time.Minute)
	c := callFor("a")
	t0 := time.Now()
	rest := func(at time.Time) { // the run's last request ended at
		k.mu.Lock()
		k.runs["r"].last = at
		k.mu.Unlock()
	}
	j := k.take(c, "r", false, t0)
	k.answered(j, true)
	rest(t0)
	j = k.take(c, "r", false, t0.Add(time.Minute-time.Nanosecond))
	if j.occ != 2 {
		t.Errorf("a request a nanosecond inside passGap is occurrence %d, want 2", j.occ)
	}
	k.answered(j, true)
	t1 := t0.Add(time.Minute - time.Nanosecond)
	rest(t1)
	j = k.take(c, "r", false, t1.Add(time.Minute))
	if j.occ != 1 {
		t.Errorf("a request exactly passGap after the last is occurrence %d, want 1 of a new pass", j.occ)
	}
	k.answered(j, true)
	k.mu.Lock()
	k.runs["r"].rest.Stop()
	k.mu.Unlock()
}

func TestARequestPastMaxOccurrencesIsAlwaysItsRunsFirst(t *testing.T) {
	k := newTestKeeping(time.Hour)
	seed := callFor("seed")
	now := time.Now()
	k.answered(k.take(seed, "r", false, now), true)
	k.mu.Lock()
	p, shared := k.runs["r"], &occurrences{}
	for i := uint64(1); len(p.occs) < maxOccurrences; i++ {
		var s [16]byte
		binary.BigEndian.PutUint64(s[:8], i)
		p.occs[s] = shared
	}
	k.mu.Unlock()
	c := callFor("new")
	for n := range 2 {
		j := k.take(c, "r", false, now)
		if j.occ != 1 {
			t.Errorf("request %d of a kind new past maxOccurrences is occurrence %d, want 1", n+1, j.occ)
		}
		k.answered(j, true)
	}
	if j := k.take(seed, "r", false, now); j.occ != 2 {
		t.Errorf("a request counted before the pass filled is occurrence %d, want 2", j.occ)
	}
	k.mu.Lock()
	if len(p.occs) != maxOccurrences {
		t.Errorf("the pass counts %d kinds of request, want maxOccurrences", len(p.occs))
	}
	p.rest.Stop()
	k.mu.Unlock()
}

func TestGivenBackOccurrencesAreTakenAgainLowestFirst(t *testing.T) {
	k := newTestKeeping(time.Hour)
	c := callFor("a")
	now := time.Now()
	var js []*journaled
	for range 4 {
		js = append(js, k.take(c, "r", false, now))
	}
	for _, i := range []int{2, 0, 1} { // occurrences 3, 1 and 2 go back; 4 is still at the proxy
		k.answered(js[i], false)
	}
	var got []uint32
	for range 4 {
		got = append(got, k.take(c, "r", false, now).occ)
	}
	if fmt.Sprint(got) != "[1 2 3 5]" {
		t.Errorf("after 3, 1 and 2 went back the next four took %v, want [1 2 3 5]", got)
	}
}

func TestAPassRestedItsGapIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(30 * time.Second)
		c := callFor("a")
		has := func() bool { return passKept(k, "r") }
		k.answered(k.take(c, "r", false, time.Now()), true)
		endsAt(t, 30*time.Second, func() bool { return !has() }, "the pass was dropped before it rested passGap", "the pass was kept after it rested passGap")
		// A pass with a request at the proxy when its timer fires stays.
		k.answered(k.take(c, "r", false, time.Now()), true)
		time.Sleep(time.Second)
		busy := k.take(c, "r", false, time.Now())
		time.Sleep(time.Minute)
		synctest.Wait()
		if !has() {
			t.Fatal("a pass with a request at the proxy was dropped")
		}
		k.answered(busy, true)
	})
}

func TestAPassWhoseLastRequestEndedAfterItsTimerWasSetRestsItsWholeGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(30 * time.Second)
		has := func() bool { return passKept(k, "r") }
		k.answered(k.take(callFor("a"), "r", false, time.Now()), true) // its timer: at 30 s
		time.Sleep(20 * time.Second)
		// A request ended at 20 s whose re-arming the timer missed (it
		// fired while the request ended): the timer finds 10 s of rest.
		k.mu.Lock()
		k.runs["r"].last = time.Now()
		k.mu.Unlock()
		endsAt(t, 30*time.Second, func() bool { return !has() }, "the pass was dropped before it rested passGap since its last request", "the pass was kept past passGap since its last request")
	})
}

func TestAClientThatLeavesWellBeforeItsTimeoutGaveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		tp := leftMidCall(t, k, callFor("a"), nil, time.Second)
		if tp.orphaned() || tp.ctx.Err() == nil {
			t.Error("a client that left a second before its timeout left a call going on")
		}
		tp = leftMidCall(t, k, callFor("b"), nil, 200*time.Millisecond)
		if !tp.orphaned() || tp.ctx.Err() != nil {
			t.Error("a client that left within a quarter second of its timeout timed out, but its call was not kept for the retry")
		}
		tp.wrapUp(false)
		k.forget(tp, false)
	})
}

func TestA300AnswerIsNeitherRecordedNorComplete(t *testing.T) {
	k := newTestKeeping(time.Hour)
	for _, tc := range []struct {
		status int
		say    string
		ok     bool
	}{{299, "recorded", true}, {300, "miss", false}} {
		c := callFor(fmt.Sprint(tc.status))
		rec := httptest.NewRecorder()
		tp := k.newTape(rec, context.Background(), c, k.take(c, "r", false, time.Now()), false)
		tp.WriteHeader(tc.status)
		_, _ = tp.Write([]byte("body"))
		ok, _, _, _ := tp.wrapUp(true)
		if got := rec.Header().Get(journalHeader); got != tc.say || ok != tc.ok {
			t.Errorf("a %d answer says %s %q and is complete: %v; want %q, %v", tc.status, journalHeader, got, ok, tc.say, tc.ok)
		}
		k.forget(tp, false)
	}
	k.mu.Lock()
	k.runs["r"].rest.Stop()
	k.mu.Unlock()
}

func TestAnAnswerOfExactlyTapeMaxIsKeptAndOneByteMoreIsNot(t *testing.T) {
	k := newTestKeeping(time.Hour)
	tp := k.newTape(&discardWriter{}, context.Background(), callFor("a"), nil, false)
	_, _ = tp.Write(make([]byte, tapeMax))
	if tp.over || len(tp.buf) != tapeMax || k.buffered.Load() != tapeMax {
		t.Fatalf("an answer of tapeMax bytes: over %v, %d held, %d buffered; want it kept", tp.over, len(tp.buf), k.buffered.Load())
	}
	_, _ = tp.Write([]byte{1})
	if !tp.over || tp.buf != nil || k.buffered.Load() != 0 {
		t.Errorf("an answer past tapeMax: over %v, %d held, %d buffered; want it let go and 0 buffered", tp.over, len(tp.buf), k.buffered.Load())
	}
}

func TestATapeThatWouldPassTheBudgetLetsItsAnswerGo(t *testing.T) {
	k := newTestKeeping(time.Hour)
	const others = tapeBudget - 100 // what the other tapes hold
	k.buffered.Store(others)
	tp := k.newTape(&discardWriter{}, context.Background(), callFor("a"), nil, false)
	_, _ = tp.Write(make([]byte, 60))
	_, _ = tp.Write(make([]byte, 40))
	if tp.over || len(tp.buf) != 100 || k.buffered.Load() != tapeBudget {
		t.Fatalf("a tape that brings the total to tapeBudget: over %v, %d held, %d buffered; want it kept", tp.over, len(tp.buf), k.buffered.Load())
	}
	_, _ = tp.Write([]byte{1})
	if !tp.over || k.buffered.Load() != others {
		t.Errorf("a tape past tapeBudget: over %v, %d buffered; want it let go and the others' %d", tp.over, k.buffered.Load(), int64(others))
	}
}

func TestATapeMaxAnswerOverTheBudgetGivesItsBytesBack(t *testing.T) {
	k := newTestKeeping(time.Hour)
	const others = tapeBudget - tapeMax + 1
	k.buffered.Store(others)
	tp := k.newTape(&discardWriter{}, context.Background(), callFor("a"), nil, false)
	_, _ = tp.Write(make([]byte, tapeMax))
	if !tp.over || k.buffered.Load() != others {
		t.Errorf("a tapeMax answer past tapeBudget: over %v, %d buffered; want it let go and the others' %d", tp.over, k.buffered.Load(), int64(others))
	}
}

func TestAFlushThatWorksLeavesTheClientThere(t *testing.T) {
	k := newTestKeeping(time.Hour)
	rec := httptest.NewRecorder()
	tp := k.newTape(rec, context.Background(), callFor("a"), nil, false)
	_, _ = tp.Write([]byte("data: 1\n\n"))
	if err := http.NewResponseController(tp).Flush(); err != nil {
		t.Fatal(err)
	}
	_, _ = tp.Write([]byte("data: 2\n\n"))
	if tp.isGone() || !rec.Flushed || rec.Body.String() != "data: 1\n\ndata: 2\n\n" {
		t.Errorf("after a flush that worked: gone %v, flushed %v, client got %q", tp.isGone(), rec.Flushed, rec.Body.String())
	}
}

func TestAFlushThatFailsIsTheClientLeaving(t *testing.T) {
	k := newTestKeeping(time.Hour)
	tp := k.newTape(&discardWriter{}, context.Background(), callFor("a"), nil, false)
	_ = http.NewResponseController(tp).Flush()
	if !tp.isGone() {
		t.Error("a client the answer could not be flushed to is still counted there")
	}
}

func TestACallThatFailsAfterItsClientLeftGivesItsOccurrenceBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		c := callFor("a")
		tp := leftMidCall(t, k, c, k.take(c, "r", false, time.Now()), 0)
		tp.WriteHeader(500)
		tp.wrapUp(false)
		k.forget(tp, false)
		if j := k.take(c, "r", true, time.Now()); j.occ != 1 {
			t.Errorf("the retry took occurrence %d, want 1, which its failed call gave back", j.occ)
		}
	})
}

func TestAFinishedRecordingNoLongerTakesJoiners(t *testing.T) {
	k := newTestKeeping(time.Hour)
	c := callFor("a")
	j := k.take(c, "r", false, time.Now())
	old := k.newTape(&discardWriter{}, context.Background(), c, j, false)
	cur := k.newTape(&discardWriter{}, context.Background(), c, j, false) // the slot's call now
	old.wrapUp(false)
	k.forget(old, false)
	if got := k.recording(c, j); got != cur {
		t.Fatal("forgetting a call dropped the slot's newer call")
	}
	cur.WriteHeader(200)
	cur.wrapUp(true)
	k.forget(cur, false)
	if got := k.recording(c, j); got != nil {
		t.Error("a forgotten recording is still there to join")
	}
	k.mu.Lock()
	k.runs["r"].rest.Stop()
	k.mu.Unlock()
}

func TestAnAnswerIsKeptForRetriesUpToOrphanMax(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKeeping(time.Hour)
		k.kept = orphanMax - 10
		fits := leftMidCall(t, k, callFor("a"), nil, 0)
		fits.WriteHeader(200)
		_, _ = fits.Write(make([]byte, 10))
		fits.wrapUp(true)
		k.forget(fits, true)
		if fits.keptBytes != 10 || k.kept != orphanMax {
			t.Fatalf("an answer that brings the kept bytes to orphanMax: %d kept of it, %d in all; want 10, orphanMax", fits.keptBytes, k.kept)
		}
		past := leftMidCall(t, k, callFor("b"), nil, 0)
		past.WriteHeader(200)
		_, _ = past.Write([]byte{1})
		past.wrapUp(true)
		k.forget(past, true)
		k.mu.Lock()
		_, waits := k.orphans[callFor("b").sum]
		k.mu.Unlock()
		if past.keptBytes != 0 || k.kept != orphanMax || waits {
			t.Errorf("an answer past orphanMax: %d kept of it, %d in all, waiting for a retry %v; want 0, orphanMax, false", past.keptBytes, k.kept, waits)
		}
	})
}

func TestAForgottenCallIsNoLongerJoinedByItsIdempotencyKey(t *testing.T) {
	k := newTestKeeping(time.Hour)
	c := callFor("a")
	c.idem = keySum([]byte("key"))
	say := &keepSay{idem: "key"}
	old := k.newTape(&discardWriter{}, context.Background(), c, nil, true)
	cur := k.newTape(&discardWriter{}, context.Background(), c, nil, true)
	old.wrapUp(false)
	k.forget(old, false)
	if got, _ := k.joinable(c, say); got != cur {
		t.Fatal("forgetting a call dropped the newer call with its Idempotency-Key")
	}
	cur.WriteHeader(200)
	_, _ = cur.Write([]byte("answer"))
	cur.wrapUp(true)
	k.forget(cur, false)
	if got, _ := k.joinable(c, say); got != nil {
		t.Error("a forgotten call is still joined by its Idempotency-Key")
	}
}

func TestAForgottenTapeGivesItsBytesBackToTheBudget(t *testing.T) {
	k := newTestKeeping(time.Hour)
	tp := k.newTape(&discardWriter{}, context.Background(), callFor("a"), nil, false)
	tp.WriteHeader(200)
	_, _ = tp.Write(make([]byte, 10))
	if k.buffered.Load() != 10 {
		t.Fatalf("a tape of 10 bytes: %d buffered", k.buffered.Load())
	}
	tp.wrapUp(true)
	k.forget(tp, false)
	if k.buffered.Load() != 0 {
		t.Errorf("a forgotten tape left %d bytes buffered, want 0", k.buffered.Load())
	}
}

func TestAPassGapOfZeroOrLessIsThirtySeconds(t *testing.T) {
	for gap, want := range map[time.Duration]time.Duration{0: 30 * time.Second, -time.Second: 30 * time.Second, time.Nanosecond: time.Nanosecond} {
		if got := newTestKeeping(gap).passGap; got != want {
			t.Errorf("a pass gap of %v is %v, want %v", gap, got, want)
		}
	}
}

// endsAt sleeps (in a synctest bubble) to a millisecond before d and then
// past it: ended must be false at the first (before, the message), true
// at the second (after).
func endsAt(t *testing.T, d time.Duration, ended func() bool, before, after string) {
	t.Helper()
	time.Sleep(d - time.Millisecond)
	synctest.Wait()
	if ended() {
		t.Fatal(before)
	}
	time.Sleep(2 * time.Millisecond)
	synctest.Wait()
	if !ended() {
		t.Fatal(after)
	}
}

// passKept reports whether k holds a pass of run.
func passKept(k *keeping, run string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.runs[run] != nil
}
