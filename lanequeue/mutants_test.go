package lanequeue

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// grownConc is a concurrency past slow start (a refusal was seen far above
// limit), bounded by 1 and 64.
func grownConc(limit int) concurrency {
	return concurrency{min: 1, max: 64, limit: limit, refusedAt: 65, probeAcks: minProbeAcks, lastRefusal: t0}
}

// TestAnswerThatWentAtTheLimitIsBindingAfterOthersLeft: an answer whose
// request went as the last permit the limit allowed says the limit held
// requests back, even when the others have come back by the time it
// arrives; one that went with room to spare does not.
func TestAnswerThatWentAtTheLimitIsBindingAfterOthersLeft(t *testing.T) {
	c := newConcurrency(Config{Concurrency: 4, MinConcurrency: 1, MaxConcurrency: 64})
	last := Ticket{InFlight: 3, Limit: 4} // went with 3 others at limit 4
	c.accepted(&last, t0, 1, 0)
	c.accepted(&last, t0, 1, 0)
	if c.limit != 5 {
		t.Fatalf("limit = %d after two answers that went at the limit, want 5 (slow start)", c.limit)
	}
	roomy := Ticket{InFlight: 2, Limit: 5} // went with a permit to spare
	for range 4 {
		c.accepted(&roomy, at(time.Second), 1, 0)
	}
	if c.limit != 5 {
		t.Fatalf("limit = %d after answers that went with room, want still 5", c.limit)
	}
}

// TestRefusedLevelIsRememberedForAFullRefusedMemory: growth back to a level
// the upstream refused stays slow up to and including refusedMemory after
// the latest concurrency refusal, and is forgotten just after it.
func TestRefusedLevelIsRememberedForAFullRefusedMemory(t *testing.T) {
	full := Ticket{InFlight: 3, Limit: 4}
	c := grownConc(4)
	c.refusedAt = 5 // growing to 5 is a probe: it takes 4 × probeAcks answers
	for range 4 {
		c.accepted(&full, t0.Add(refusedMemory), 4, 0)
	}
	if c.limit != 4 || c.refusedAt != 5 {
		t.Fatalf("at exactly refusedMemory: limit %d, refusedAt %d; want 4 and 5 (still a probe)", c.limit, c.refusedAt)
	}
	c = grownConc(4)
	c.refusedAt, c.probeAcks = 5, 4*minProbeAcks
	for range 4 {
		c.accepted(&full, t0.Add(refusedMemory+time.Nanosecond), 4, 0)
	}
	if c.limit != 5 || c.refusedAt != 0 || c.probeAcks != minProbeAcks {
		t.Fatalf("just after refusedMemory: limit %d, refusedAt %d, probeAcks %d; want 5, 0, %d",
			c.limit, c.refusedAt, c.probeAcks, minProbeAcks)
	}
}

// TestLittleFloorRaisesTheLimitOnlyWhileBelowIt: below the concurrency the
// learned rate needs, each binding answer raises the limit at once; at that
// floor, growth takes a limit's worth of answers again.
func TestLittleFloorRaisesTheLimitOnlyWhileBelowIt(t *testing.T) {
	full := Ticket{InFlight: 3, Limit: 4}
	c := grownConc(3)
	c.accepted(&full, t0, 4, 4)
	if c.limit != 4 {
		t.Fatalf("below the floor: limit %d, want 4 at once", c.limit)
	}
	for i := range 3 {
		c.accepted(&full, t0, 4, 4)
		if c.limit != 4 {
			t.Fatalf("at the floor, answer %d: limit %d, want still 4", i+1, c.limit)
		}
	}
	c.accepted(&full, t0, 4, 4)
	if c.limit != 5 {
		t.Fatalf("at the floor after a limit's worth of answers: limit %d, want 5", c.limit)
	}
}

// TestAnswerTimeIsAMovingMeanWeightingTheNewestByAFifth: the mean answer
// time starts at the first answer's time and then moves a fifth of the way
// to each new one.
func TestAnswerTimeIsAMovingMeanWeightingTheNewestByAFifth(t *testing.T) {
	l, fc := aimdLane(4, 1, 4)
	for i, tt := range []struct {
		took time.Duration
		want float64
	}{{time.Second, 1}, {3 * time.Second, 1.4}, {900 * time.Millisecond, 1.3}} {
		s := acquireN(t, l, 1)[0]
		accept(s, headerparse.Limits{})
		fc.Advance(tt.took)
		s.Release()
		if got := l.State().AnswerSeconds; !near(got, tt.want) {
			t.Fatalf("answer %d: mean answer seconds = %v, want %v", i+1, got, tt.want)
		}
	}
}

// TestLimitsThatMoveByLessThanATenthAreNotReported: a window 5 % larger is
// noise, not a change of limits.
func TestLimitsThatMoveByLessThanATenthAreNotReported(t *testing.T) {
	fc := clock.NewFake(t0)
	tb, log := observedTable(fc, Config{Concurrency: 4})
	l := tb.Get(Key{Path: "/v1/chat/completions", Model: "m"})
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{Requests: win(600, 599, at(100*time.Millisecond))})
	if got := log.takeKind(LimitsChanged); len(got) != 1 {
		t.Fatalf("first limits reported %+v, want one LimitsChanged", got)
	}
	fc.Advance(10 * time.Millisecond)
	accept(s, headerparse.Limits{Requests: win(630, 628, at(110*time.Millisecond))})
	if got := log.takeKind(LimitsChanged); len(got) != 0 {
		t.Fatalf("a window 5%% larger was reported: %+v", got)
	}
	if got := l.State().RequestsLimit; got != 630 {
		t.Fatalf("requests limit = %v, want 630 learned all the same", got)
	}
	s.Release()
}

// TestConcurrencyRiseIsReportedOnceASecondHasPassed: a rise a whole second
// after the last report is reported.
func TestConcurrencyRiseIsReportedOnceASecondHasPassed(t *testing.T) {
	fc := clock.NewFake(t0)
	tb, log := observedTable(fc, Config{Concurrency: 2})
	l := tb.Get(Key{Path: "/c"})
	pastProbe(l)
	a := mustGet(t, acquireAsync(context.Background(), l))
	b := mustGet(t, acquireAsync(context.Background(), l))
	accept(a, headerparse.Limits{}) // binding, slow start: one of two answers
	if got := log.take(); len(got) != 0 {
		t.Fatalf("first answer reported %+v, want nothing", got)
	}
	fc.Advance(concReportEvery)
	accept(b, headerparse.Limits{}) // the second: 2 → 3
	got := log.take()
	if len(got) != 1 || got[0].Kind != ConcurrencyChanged || got[0].From != 2 || got[0].View.Concurrency != 3 {
		t.Fatalf("a rise exactly a second later reported %+v, want one change from 2 to 3", got)
	}
	a.Release()
	b.Release()
}

// TestNoTimerIsLeftWhenEveryWaiterIsRefused: when a pause turns away every
// waiter (their deadlines fall before it ends), nobody is left to dispatch
// and no timer is armed to keep the group alive.
func TestNoTimerIsLeftWhenEveryWaiterIsRefused(t *testing.T) {
	l, fc := testLane(1, 10)
	held := mustGet(t, acquireAsync(context.Background(), l))
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(30*time.Second))
	defer cancel()
	late := acquireAsync(ctx, l)
	waitQueued(t, l, 1)
	report(held, Report{Status: 429, Verdict: RateRefused, PauseUntil: at(time.Minute)})
	select {
	case r := <-late:
		var we *WaitError
		if !errors.As(r.err, &we) || !we.Paused || !we.At.Equal(at(time.Minute)) {
			t.Fatalf("late waiter got %v, want a pause WaitError until +1m", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("late waiter was not refused at once")
	}
	if n := fc.Pending(); n != 0 {
		t.Fatalf("%d timers pending with nobody waiting, want 0", n)
	}
	held.Release()
}

// firstSlotZero is the first time at or after t0 whose history bucket is
// ring slot 0.
func firstSlotZero() time.Time {
	t := t0
	for ring(bucketOf(t)) != 0 {
		t = t.Add(historyBucket)
	}
	return t
}

// TestHistoryCountsInTheRingsFirstSlot: answers and 429s whose bucket is
// the ring's slot 0 are counted like any other.
func TestHistoryCountsInTheRingsFirstSlot(t *testing.T) {
	l, fc := testLane(1, 10)
	fc.Set(firstSlotZero())
	l.CountAnswer(200, "ok")
	s := mustGet(t, acquireAsync(context.Background(), l))
	refuse(s, 0)
	s.Release()
	h := l.StateWithHistory().History
	last := len(h.Answers) - 1
	if h.Answers[last] != 1 || h.Upstream429[last] != 1 {
		t.Fatalf("newest bucket: %d answers, %d 429s; want 1 and 1", h.Answers[last], h.Upstream429[last])
	}
}

// TestHistoryDropsAnEventOlderThanTheRing: an event a whole ring older
// than the newest bucket (a wall clock stepped back) is dropped, not
// counted in the newest bucket, which shares its slot.
func TestHistoryDropsAnEventOlderThanTheRing(t *testing.T) {
	var h history
	now := at(time.Hour)
	h.answer(now)
	h.answer(now.Add(-historyBuckets * historyBucket))
	h.refusal(now.Add(-historyBuckets * historyBucket))
	v := h.view(now)
	if got := v.Answers[historyBuckets-1]; got != 1 {
		t.Fatalf("newest bucket has %d answers, want 1 (the old one dropped)", got)
	}
	var answers, refusals uint32
	for i := range v.Answers {
		answers, refusals = answers+v.Answers[i], refusals+v.Upstream429[i]
	}
	if answers != 1 || refusals != 0 {
		t.Fatalf("the ring holds %d answers and %d 429s, want 1 and 0 (the old ones dropped, not counted elsewhere)", answers, refusals)
	}
	h.answer(now.Add(-(historyBuckets - 1) * historyBucket)) // the oldest bucket still shown
	if got := h.view(now).Answers[0]; got != 1 {
		t.Fatalf("oldest bucket has %d answers, want 1", got)
	}
}

// TestBoundedKeepsAValueOfExactly128Bytes: 128 bytes is within bounds.
func TestBoundedKeepsAValueOfExactly128Bytes(t *testing.T) {
	s := strings.Repeat("m", maxField)
	if got := Bounded(s); got != s {
		t.Fatalf("Bounded(128 bytes) = %q, want it unchanged", got)
	}
	if got := Bounded(s + "x"); len(got) >= len(s) || !strings.HasPrefix(got, strings.Repeat("m", 64)+"…") {
		t.Fatalf("Bounded(129 bytes) = %q, want its first 64 bytes, … and a hash", got)
	}
}

// TestBoundedCutsLongValuesAtAWholeRune: the kept prefix never ends inside
// a multi-byte rune, and bytes that start no rune at all are not kept.
func TestBoundedCutsLongValuesAtAWholeRune(t *testing.T) {
	s := strings.Repeat("a", 63) + "é" + strings.Repeat("b", 100) // é is bytes 63 and 64
	got := Bounded(s)
	if want := strings.Repeat("a", 63) + "…"; !strings.HasPrefix(got, want) || !utf8.ValidString(got) {
		t.Fatalf("Bounded = %q, want it to start %q and be valid UTF-8", got, want)
	}
	junk := strings.Repeat("\x80", 200) // no byte starts a rune
	got = Bounded(junk)
	if !strings.HasPrefix(got, "…") || len(got) != len("…")+16 {
		t.Fatalf("Bounded(no runes) = %q, want … and 16 hex digits", got)
	}
}

// TestZeroConfigTakesTheDocumentedDefaults: concurrency 8, bounds 1 and
// 1024, a queue of 10000.
func TestZeroConfigTakesTheDocumentedDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.Concurrency != DefaultConcurrency || c.MinConcurrency != 1 || c.MaxConcurrency != 1024 || c.MaxQueue != 10000 || c.Clock == nil {
		t.Fatalf("defaults %+v, want concurrency 8, min 1, max 1024, queue 10000, a clock", c)
	}
	if c := (Config{Concurrency: 16}).withDefaults(); c.Concurrency != 16 || c.MaxConcurrency != 1024 {
		t.Fatalf("concurrency 16 with zero bounds became %+v, want 16 under a max of 1024", c)
	}
	// The limit never falls below the default minimum of 1.
	fc := clock.NewFake(t0)
	l := New(Key{Path: "/d"}, Config{Concurrency: 1, MaxConcurrency: 4, Clock: fc})
	pastProbe(l)
	s := acquireN(t, l, 1)[0]
	refuseConc(s)
	wantLimit(t, l, 1)
	s.Release()
}

// TestRefusalsAtArrivalAreCountedAsRejected: a request turned away because
// the lane's queue is full, or because the pause outlasts its deadline,
// counts one rejection each, and neither waits.
func TestRefusalsAtArrivalAreCountedAsRejected(t *testing.T) {
	l, _ := testLane(1, 1)
	held := mustGet(t, acquireAsync(context.Background(), l))
	waiting := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	for i := 1; i <= 2; i++ {
		if err := mustFail(t, acquireAsync(context.Background(), l)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("acquire on a full queue: %v, want ErrQueueFull", err)
		}
		if got := l.State().Rejected; got != int64(i) {
			t.Fatalf("after %d full-queue refusals: rejected = %d", i, got)
		}
	}
	held.Release()
	mustGet(t, waiting).Release() // the queue is empty again
	pause(l, at(time.Minute))
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(30*time.Second))
	defer cancel()
	if err := mustFail(t, acquireAsync(ctx, l)); !errors.Is(err, ErrBudgetExceeded) {
		t.Fatalf("acquire past its deadline's pause: %v, want ErrBudgetExceeded", err)
	}
	if got := l.State().Rejected; got != 3 {
		t.Fatalf("after a pause refusal: rejected = %d, want 3", got)
	}
}

// mustFail returns the error of an acquire that must fail at once.
func mustFail(t *testing.T, ch <-chan result) error {
	t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			r.s.Release()
			t.Fatal("acquire succeeded, want an error")
		}
		return r.err
	case <-time.After(time.Second):
		t.Fatal("acquire did not return")
	}
	return nil
}

// TestAnswerWithoutALimitKeepsTheLearnedLimit: a remaining count without a
// limit header does not shrink the window to what is left.
func TestAnswerWithoutALimitKeepsTheLearnedLimit(t *testing.T) {
	b := learnedBudget(win(100, 99, at(time.Second)))
	b.observe(headerparse.Window{Remaining: 50, HasRemaining: true, Reset: at(2 * time.Second)}, 0, at(time.Second), at(time.Second))
	if v := b.view(); v.Limit != 100 || v.Available != 50 {
		t.Fatalf("after a count without a limit: %+v, want limit 100 with 50 left", v)
	}
}

// TestCorrectedWindowGrowsWhenTheUpstreamShowsAsMuchLeftAsItsSize: a window
// corrected to 20 that then shows 20 left held at least 21.
func TestCorrectedWindowGrowsWhenTheUpstreamShowsAsMuchLeftAsItsSize(t *testing.T) {
	var b budget
	b.observe(win(1200, 19, at(time.Second)), 0, t0, t0)
	if !b.correct() || b.size() != 20 {
		t.Fatalf("correct: size %v, want 20", b.size())
	}
	b.observe(win(1200, 20, at(2*time.Second)), 0, at(time.Second), at(time.Second))
	if b.size() != 21 {
		t.Fatalf("size %v after 20 shown left of a window corrected to 20, want 21", b.size())
	}
}

// TestHeadersAreNotOverstatedWhenTheShownRefillIsWithinATwentiethOfTheirRate:
// the headers say 10/s (500 missing of 600, reset in 50 s); the upstream's
// counts show a 4/s refill while others share the key and keep it low. That
// is not 20 times slower: the window stands as stated.
func TestHeadersAreNotOverstatedWhenTheShownRefillIsWithinATwentiethOfTheirRate(t *testing.T) {
	var b budget
	b.observe(win(600, 100, at(50*time.Second)), 1, t0, t0)
	for range 2 {
		b.take(1)
	}
	d := at(500 * time.Millisecond)
	b.observe(win(600, 100, d.Add(50*time.Second)), 3, d, d)
	if b.size() != 600 || b.capped != 0 || !near(b.rate, 10) {
		t.Fatalf("size %v, capped %v, rate %v; want 600 uncorrected at 10/s", b.size(), b.capped, b.rate)
	}
}

// quantizedBudget is a window stated as 1200 whose upstream never shows
// more than 19 left and refills 20/s by its own counts: corrected to 20
// at 20/s. It returns the budget and the second answer's dispatch time.
func quantizedBudget(t *testing.T) (*budget, time.Time) {
	t.Helper()
	var b budget
	b.observe(win(1200, 19, at(50*time.Millisecond)), 1, t0, t0)
	for range 8 {
		b.take(1)
	}
	d := at(200 * time.Millisecond)
	b.observe(win(1200, 15, d.Add(250*time.Millisecond)), 9, d, d)
	if b.size() != 20 || !near(b.shown, 20) || !near(b.rate, 20) {
		t.Fatalf("quantized: size %v, shown %v, rate %v; want 20, 20, 20", b.size(), b.shown, b.rate)
	}
	return &b, d
}

// TestCorrectedWindowPacesAtTheRefillItShowed: in a corrected window whose
// next answer's arithmetic says far less (others hold remaining low and the
// reset far), the refill shown at the correction stays the pace.
func TestCorrectedWindowPacesAtTheRefillItShowed(t *testing.T) {
	b, d := quantizedBudget(t)
	b.take(1)
	next := d.Add(50 * time.Millisecond)
	b.observe(win(1200, 0, next.Add(10*time.Second)), 10, next, next) // arithmetic: 20 in 10 s
	if !near(b.rate, 20) {
		t.Fatalf("rate = %v, want the 20/s shown at the correction, not 2/s", b.rate)
	}
}

// TestCorrectedWindowKeepsTheRefillOfItsCorrection: later answers of a
// corrected window that show a slower refill (others drain the key) do not
// replace the refill shown at the correction; only a new correction does.
// Before, the second of two such answers dropped the pace from 20/s to 2/s.
func TestCorrectedWindowKeepsTheRefillOfItsCorrection(t *testing.T) {
	b, d := quantizedBudget(t)
	for i := range 2 {
		next := d.Add(time.Duration(i+1) * 300 * time.Millisecond)
		b.observe(win(1200, 0, next.Add(10*time.Second)), 9, next, next) // nothing refilled, reset 10 s away
		if !near(b.rate, 20) || !near(b.shown, 20) {
			t.Fatalf("answer %d: rate %v, shown %v; want the 20/s of the correction", i+1, b.rate, b.shown)
		}
	}
}

// TestLiftedCorrectionPacesByTheHeadersAgain: once an answer shows the
// whole stated window left (less one), the correction no longer holds and
// the headers' own arithmetic is the pace.
func TestLiftedCorrectionPacesByTheHeadersAgain(t *testing.T) {
	b, d := quantizedBudget(t)
	b.take(1)
	next := d.Add(50 * time.Millisecond)
	b.observe(win(1200, 1199, next.Add(time.Minute)), 10, next, next)
	if b.size() != 1200 || !near(b.rate, 1.0/60) {
		t.Fatalf("size %v, rate %v; want 1200 at 1/60 per second", b.size(), b.rate)
	}
}

// TestRefillIsMeasuredOverExactlyRefillSpan: two answers refillSpan apart
// are far enough apart to show the refill, and so to correct overstated
// headers.
func TestRefillIsMeasuredOverExactlyRefillSpan(t *testing.T) {
	var b budget
	b.observe(win(1200, 19, at(50*time.Millisecond)), 1, t0, t0)
	for range 8 {
		b.take(1)
	}
	d := t0.Add(refillSpan)
	b.observe(win(1200, 15, d.Add(250*time.Millisecond)), 9, d, d)
	if b.size() != 20 {
		t.Fatalf("size %v after answers refillSpan apart, want corrected to 20", b.size())
	}
}

// TestShownRefillIsPerSecond: over 2 s the upstream's counts show one
// request refilled, half a request a second, while the headers claim 22/s
// and never show more than 100 of 1200 left: overstated, corrected.
func TestShownRefillIsPerSecond(t *testing.T) {
	var b budget
	b.observe(win(1200, 100, at(50*time.Second)), 1, t0, t0)
	b.take(1)
	d := at(2 * time.Second)
	b.observe(win(1200, 100, d.Add(50*time.Second)), 2, d, d)
	if b.size() != 101 || !near(b.shown, 0.5) {
		t.Fatalf("size %v, shown %v; want corrected to 101 with 0.5/s shown", b.size(), b.shown)
	}
}

// TestWindowThatShowedHalfItsSizeIsNotOverstated: headers whose rate is far
// above the refill shown are still honest once the window has shown half
// its stated size left.
func TestWindowThatShowedHalfItsSizeIsNotOverstated(t *testing.T) {
	var b budget
	b.observe(win(600, 300, at(300*time.Millisecond)), 1, t0, t0) // 1000/s
	b.take(1)
	d := at(500 * time.Millisecond)
	b.observe(win(600, 300, d.Add(300*time.Millisecond)), 2, d, d) // 2/s shown
	if b.size() != 600 || b.capped != 0 {
		t.Fatalf("size %v, capped %v; want 600 uncorrected", b.size(), b.capped)
	}
}

// TestAWindowPerMillisecondIsTheFastestBelievableRate: a reset one
// millisecond away for a whole window is still believed.
func TestAWindowPerMillisecondIsTheFastestBelievableRate(t *testing.T) {
	b := learnedBudget(win(10, 0, at(time.Millisecond)))
	if !near(b.rate, 10*maxRateFactor) {
		t.Fatalf("rate = %v/s, want %v/s", b.rate, 10*maxRateFactor)
	}
}

// TestRefusalCorrectsEveryBudgetWhenItsHeadersShowNoneExhausted: a refusal
// with room whose headers still show a request left, or exactly the
// request's cost in tokens, does not point at one budget: both are
// corrected.
func TestRefusalCorrectsEveryBudgetWhenItsHeadersShowNoneExhausted(t *testing.T) {
	tests := []struct {
		name             string
		reqLeft, tokLeft int64
	}{
		{"one request left", 1, 5000},
		{"tokens left equal the cost", 50, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p pacer
			p.observe(headerparse.Limits{Requests: win(100, 10, at(time.Second)), Tokens: win(10000, 1000, at(time.Second))},
				&Ticket{Dispatched: t0}, t0)
			refusal := headerparse.Limits{Requests: win(100, tt.reqLeft, at(time.Second)), Tokens: win(10000, tt.tokLeft, at(time.Second))}
			if !p.contradicted(&Ticket{Dispatched: t0, Room: true, Cost: 100}, refusal, at(10*time.Millisecond)) {
				t.Fatal("a refusal with room corrected nothing")
			}
			if p.requests.capped != 11 || p.tokens.capped != 1001 {
				t.Fatalf("capped: requests %v, tokens %v; want 11 and 1001 (both)", p.requests.capped, p.tokens.capped)
			}
		})
	}
}

// TestSendingAtExactlyHalfTheLearnedRateIsNotUnderUse: under-use is less
// than half the headers' rate.
func TestSendingAtExactlyHalfTheLearnedRateIsNotUnderUse(t *testing.T) {
	var p pacer
	p.requests = budget{known: true, rate: 10, limit: 10}
	for range 5 {
		p.recent.add(t0)
	}
	if p.underUsed(t0) {
		t.Fatal("5/s against a learned 10/s counts as under-used")
	}
	p.recent = meter{}
	for range 4 {
		p.recent.add(t0)
	}
	if !p.underUsed(t0) {
		t.Fatal("4/s against a learned 10/s does not count as under-used")
	}
}

// TestMeterCountsTheCurrentSecondAndForgetsTenSecondsAgo: events in the
// current second count; events meterSeconds ago have left the window.
func TestMeterCountsTheCurrentSecondAndForgetsTenSecondsAgo(t *testing.T) {
	var m meter
	for range 5 {
		m.add(t0)
	}
	if r := m.rate(t0); r != 5 {
		t.Fatalf("rate %v with 5 events this second, want 5", r)
	}
	if n, _ := m.recent(t0.Add((meterSeconds - 1) * time.Second)); n != 5 {
		t.Fatalf("%d events seen %d s later, want 5", n, meterSeconds-1)
	}
	if n, _ := m.recent(t0.Add(meterSeconds * time.Second)); n != 0 {
		t.Fatalf("%d events seen %d s later, want 0", n, meterSeconds)
	}
}

// TestLearnedPaceBurstsAQuarterSecondOfItsRate: a pace learned from
// refusals holds burstSeconds of its rate, at least one request.
func TestLearnedPaceBurstsAQuarterSecondOfItsRate(t *testing.T) {
	var p pacer
	p.setSynthetic(20, t0)
	if p.requests.limit != 5 {
		t.Fatalf("bucket %v at 20/s, want 5", p.requests.limit)
	}
	p.setSynthetic(2, t0)
	if p.requests.limit != 1 {
		t.Fatalf("bucket %v at 2/s, want 1", p.requests.limit)
	}
}

// TestOnlyCapacityRefusalsCountAsThrottled: rate and concurrency refusals
// and overloads count as throttled; accepted, failed and unsent attempts
// do not.
func TestOnlyCapacityRefusalsCountAsThrottled(t *testing.T) {
	for _, tt := range []struct {
		v    Verdict
		want bool
	}{{Accepted, false}, {RateRefused, true}, {ConcurrencyRefused, true}, {Overloaded, true}, {Failed, false}, {NotSent, false}} {
		if got := tt.v.Refusal(); got != tt.want {
			t.Errorf("%v.Refusal() = %v, want %v", tt.v, got, tt.want)
		}
	}
	l, _ := testLane(4, 10)
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{})
	report(s, Report{Status: 500, Verdict: Failed})
	if n := l.State().Throttled; n != 0 {
		t.Fatalf("throttled = %d after an accepted and a failed attempt, want 0", n)
	}
	report(s, Report{Status: 529, Verdict: Overloaded})
	if n := l.State().Throttled; n != 1 {
		t.Fatalf("throttled = %d after an overload, want 1", n)
	}
	s.Release()
}

// TestHistoryCountsOnlyUpstream429s: a 200 and a 503 are answers, not 429s.
func TestHistoryCountsOnlyUpstream429s(t *testing.T) {
	l, fc := testLane(4, 10)
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{})
	report(s, Report{Status: 503, Verdict: Overloaded})
	resend(t, s, fc.Advance) // past the pace the 503 taught
	s.Report(Report{Status: 429, Verdict: RateRefused})
	s.Release()
	h := l.StateWithHistory().History
	if got := h.Upstream429[len(h.Upstream429)-1]; got != 1 {
		t.Fatalf("429s in the newest bucket = %d, want 1", got)
	}
	if st := l.State(); st.Attempts[200] != 1 || st.Attempts[503] != 1 || st.Attempts[429] != 1 {
		t.Fatalf("attempts %v, want one each of 200, 503 and 429", st.Attempts)
	}
}

// TestLaneWithoutAnswersShowsNoAnswerCounts: the per-status and per-outcome
// maps exist only once the lane has answered someone.
func TestLaneWithoutAnswersShowsNoAnswerCounts(t *testing.T) {
	l, _ := testLane(4, 10)
	if st := l.State(); st.Answers != nil || st.Outcomes != nil {
		t.Fatalf("answers %v, outcomes %v before any answer, want none", st.Answers, st.Outcomes)
	}
	l.CountAnswer(200, "ok")
	if st := l.State(); st.Answers[200] != 1 || st.Outcomes["ok"] != 1 {
		t.Fatalf("answers %v, outcomes %v, want one 200 ok", st.Answers, st.Outcomes)
	}
}

// TestDrainIgnoresAWindowWithoutARate: a window known without a refill
// rate (no reset reported) bounds nothing in the drain estimate.
func TestDrainIgnoresAWindowWithoutARate(t *testing.T) {
	for name, v := range map[string]View{
		"requests": {Requests: BudgetView{Known: true, Limit: 10}},
		"tokens":   {Tokens: BudgetView{Known: true, Limit: 1000}},
	} {
		if got := drainSeconds(3, 300, v, t0); got != 0 {
			t.Errorf("%s window without a rate: drain %v, want 0", name, got)
		}
	}
}

// TestHistoryClearsABucketTheRingReuses: a bucket a whole ring after an
// earlier one shares its slot and starts from zero.
func TestHistoryClearsABucketTheRingReuses(t *testing.T) {
	var h history
	h.answer(t0)
	h.answer(t0.Add((historyBuckets - 1) * historyBucket))
	v := h.view(t0.Add(historyBuckets * historyBucket))
	if got := v.Answers[historyBuckets-1]; got != 0 {
		t.Fatalf("newest bucket has %d answers, want 0 (the one a ring ago cleared)", got)
	}
	if got := v.Answers[historyBuckets-2]; got != 1 {
		t.Fatalf("the bucket before has %d answers, want 1", got)
	}
}

// TestDrainCountsTokensTheWindowStillHolds: what the token window still
// holds goes at once, only the rest at the pace; and a concurrency that is
// not known bounds nothing.
func TestDrainCountsTokensTheWindowStillHolds(t *testing.T) {
	v := View{Tokens: BudgetView{Known: true, PerSecond: 100, Available: 500}}
	if got := drainSeconds(1, 1000, v, t0); !near(got, 5) {
		t.Fatalf("1000 tokens with 500 in the window at 100/s: drain %v, want 5", got)
	}
	if got := drainSeconds(3, 0, View{AnswerSeconds: 2}, t0); got != 0 {
		t.Fatalf("no concurrency known: drain %v, want 0", got)
	}
}

// TestHeadersExactlyTwentyTimesTheShownRefillAreNotYetOverstated: the
// headers overstate a window only when their rate is more than
// overstatedRate times the refill shown (here 20/s against 1/s).
func TestHeadersExactlyTwentyTimesTheShownRefillAreNotYetOverstated(t *testing.T) {
	var b budget
	b.observe(win(1200, 100, at(55*time.Second)), 1, t0, t0) // 1100 in 55 s: 20/s
	b.take(1)
	d := at(time.Second)
	b.observe(win(1200, 100, d.Add(55*time.Second)), 2, d, d) // 1 refilled in 1 s
	if b.size() != 1200 || b.capped != 0 || !near(b.rate, 20) {
		t.Fatalf("size %v, capped %v, rate %v; want 1200 uncorrected at 20/s", b.size(), b.capped, b.rate)
	}
}

// TestWindowWhoseShownSizeReachesHalfIsNotOverstated: with 299 of 600
// shown left, the window has held at least 300, half its stated size:
// honest, however slow the refill it shows.
func TestWindowWhoseShownSizeReachesHalfIsNotOverstated(t *testing.T) {
	var b budget
	b.observe(win(600, 299, at(301*time.Millisecond)), 1, t0, t0) // about 1000/s
	b.take(1)
	d := at(500 * time.Millisecond)
	b.observe(win(600, 299, d.Add(301*time.Millisecond)), 2, d, d) // 2/s shown
	if b.size() != 600 || b.capped != 0 {
		t.Fatalf("size %v, capped %v; want 600 uncorrected", b.size(), b.capped)
	}
}

// goneAfterCheckCtx is a client that goes away right after Acquire first
// checks it: Done is closed, Err is nil only on the first call.
type goneAfterCheckCtx struct {
	context.Context
	done   chan struct{}
	checks int
	mu     sync.Mutex
}

func newGoneAfterCheckCtx() *goneAfterCheckCtx {
	c := &goneAfterCheckCtx{Context: context.Background(), done: make(chan struct{})}
	close(c.done)
	return c
}

func (c *goneAfterCheckCtx) Done() <-chan struct{} { return c.done }

func (c *goneAfterCheckCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checks++
	if c.checks == 1 {
		return nil
	}
	return context.Canceled
}

// TestGrantWonInTheRaceWithCancellationIsHandedBack: a client that goes
// away as its request is granted gets context.Canceled, its permit and
// budget go back, and it counts as cancelled (the race is decided by
// select, so it is run until both sides have been seen).
func TestGrantWonInTheRaceWithCancellationIsHandedBack(t *testing.T) {
	cancelled, granted := 0, 0
	for i := 0; i < 200 && (cancelled == 0 || granted == 0 || i < 32); i++ {
		l, _ := observedLane(t, 1, 1, headerparse.Limits{Requests: win(10, 5, at(time.Minute))})
		before := l.State().RequestsAvailable
		s, err := l.Acquire(newGoneAfterCheckCtx(), 1)
		st := l.State()
		if err == nil {
			granted++
			if st.InFlight != 1 || st.Cancelled != 0 {
				t.Fatalf("granted: %+v", st)
			}
			s.Release()
			continue
		}
		cancelled++
		if !errors.Is(err, context.Canceled) || st.InFlight != 0 || st.Cancelled != 1 || st.RequestsAvailable != before {
			t.Fatalf("cancelled with the grant: err %v, in flight %d, cancelled %d, available %v (was %v)",
				err, st.InFlight, st.Cancelled, st.RequestsAvailable, before)
		}
	}
	if cancelled == 0 || granted == 0 {
		t.Fatalf("%d cancelled, %d granted: the race was not seen both ways", cancelled, granted)
	}
}

// TestGetSweepsEveryEighthOfTheTTLAndDropsLanesUnusedThatLong: a Get an
// eighth of IdleTTL after the last sweep sweeps again, and drops an idle
// lane unused for exactly IdleTTL.
func TestGetSweepsEveryEighthOfTheTTLAndDropsLanesUnusedThatLong(t *testing.T) {
	fc := clock.NewFake(t0)
	const ttl = 80 * time.Second
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, IdleTTL: ttl})
	a := tb.Get(Key{Path: "/a"}) // sweeps at t0
	fc.Set(at(ttl - ttl/8))
	tb.Get(Key{Path: "/b"}) // sweeps; /a is not stale yet
	if _, ok := tb.Lookup(a.ID()); !ok {
		t.Fatal("/a dropped before its TTL")
	}
	fc.Set(at(ttl))
	tb.Get(Key{Path: "/b"}) // an eighth of the TTL since the last sweep
	if _, ok := tb.Lookup(a.ID()); ok || tb.Len() != 1 {
		t.Fatalf("/a unused for the whole TTL is still there (%d lanes)", tb.Len())
	}
}
