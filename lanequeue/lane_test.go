package lanequeue

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/internal/setting"
	"github.com/llmproxy/llmproxy/limit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is where fake clocks start: the wall clock's present when the tests
// run, so a deadline set relative to it on the wall clock (contexts know no
// other) means the same on every day the tests run.
var t0 = time.Now().UTC().Truncate(time.Second)

func testLane(conc, maxQueue int) (*Lane, *clock.Fake) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Route: "r", CredentialHash: HashCredential("sk-test"), Path: "/v1/x", Model: "m"},
		Config{Concurrency: conc, MinConcurrency: 1, MaxConcurrency: conc, MaxQueue: maxQueue, Clock: fc})
	pastFirstAnswer(l) // past the first-answer window; TestANewLaneSendsOneUntilItsFirstAnswer covers it
	return l, fc
}

// acquireAsync starts an Acquire and returns a channel that yields its result.
type result struct {
	s   *Slot
	err error
}

func acquireAsync(ctx context.Context, l *Lane) <-chan result {
	ch := make(chan result, 1)
	go func() {
		s, err := l.acquire(ctx, 1, High)
		ch <- result{s, err}
	}()
	return ch
}

// waitQueued blocks until the lane has n waiters.
func waitQueued(t *testing.T, l *Lane, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.State().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", l.State().Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustGet(t *testing.T, ch <-chan result) *Slot {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("acquire: %v", r.err)
		}
		return r.s
	case <-time.After(5 * time.Second):
		t.Fatal("acquire did not return")
	}
	return nil
}

func mustBlock(t *testing.T, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("acquire returned early: %+v", r)
	case <-time.After(20 * time.Millisecond):
	}
}

func TestAcquireGrantsInArrivalOrder(t *testing.T) {
	l, _ := testLane(1, 100)
	first := mustGet(t, acquireAsync(context.Background(), l))
	var chans []<-chan result
	for i := 0; i < 5; i++ {
		chans = append(chans, acquireAsync(context.Background(), l))
		waitQueued(t, l, i+1) // fixes the arrival order
	}
	prev := first
	for i, ch := range chans {
		mustBlock(t, ch)
		prev.release()
		prev = mustGet(t, ch)
		if got := l.State().InFlight; got != 1 {
			t.Fatalf("step %d: in flight = %d, want 1", i, got)
		}
	}
	prev.release()
	if st := l.State(); st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("after all releases: %+v", st)
	}
}

func TestCancelledWaiterLeavesQueueAtOnce(t *testing.T) {
	l, _ := testLane(1, 100)
	held := mustGet(t, acquireAsync(context.Background(), l))
	ctx, cancel := context.WithCancel(context.Background())
	gone := acquireAsync(ctx, l)
	waitQueued(t, l, 1)
	next := acquireAsync(context.Background(), l)
	waitQueued(t, l, 2)

	cancel()
	r := <-gone
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled acquire: err = %v, want context.Canceled", r.err)
	}
	if q := l.State().Queued; q != 1 {
		t.Fatalf("queued after cancel = %d, want 1", q)
	}
	held.release()
	mustGet(t, next).release()
	if st := l.State(); st.InFlight != 0 || st.Cancelled != 1 {
		t.Fatalf("state: %+v", st)
	}
}

func TestQueueFull(t *testing.T) {
	l, _ := testLane(1, 2)
	held := mustGet(t, acquireAsync(context.Background(), l))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := acquireAsync(ctx, l), acquireAsync(ctx, l)
	waitQueued(t, l, 2)
	// A full queue refuses at once (bounded, so a mutant that queues fails fast).
	if err := mustFail(t, acquireAsync(context.Background(), l)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err = %v, want ErrQueueFull", err)
	}
	cancel()
	<-a
	<-b
	held.release()
}

func TestPauseHoldsQueueUntilItEnds(t *testing.T) {
	l, fc := testLane(4, 100)
	pause(l, t0.Add(3*time.Second))
	pause(l, t0.Add(1*time.Second)) // never shortens
	ch := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	fc.Advance(2 * time.Second)
	mustBlock(t, ch)
	fc.Advance(time.Second)
	s := mustGet(t, ch)
	if w := s.queueWait(); w != 3*time.Second {
		t.Fatalf("queue wait = %v, want 3s", w)
	}
	s.release()
}

func TestPausePastDeadlineFailsFast(t *testing.T) {
	l, _ := testLane(4, 100)
	pause(l, t0.Add(time.Hour))
	// The deadline is on the wall clock, a minute after t0: in the future,
	// and long before the pause ends.
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(time.Minute))
	defer cancel()
	_, err := l.acquire(ctx, 1, High)
	// At once: a WaitError at the pause's end, not the deadline passing.
	var we *WaitError
	if !errors.Is(err, ErrDeadlineExceeded) || !errors.As(err, &we) || !we.Paused || !we.At.Equal(t0.Add(time.Hour)) ||
		errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a WaitError for the pause ending at t0+1h", err)
	}
	if q := l.State().Queued; q != 0 {
		t.Fatalf("queued = %d, want 0", q)
	}
}

func TestADeadlineWhileQueuedIsErrDeadlineExceeded(t *testing.T) {
	l, _ := testLane(1, 100)
	held := mustGet(t, acquireAsync(context.Background(), l))
	defer held.release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := l.acquire(ctx, 1, High)
	if !errors.Is(err, ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrDeadlineExceeded wrapping DeadlineExceeded", err)
	}
	if q := l.State().Queued; q != 0 {
		t.Fatalf("queued = %d, want 0", q)
	}
}

func TestRetryGoesBeforeLaterArrivals(t *testing.T) {
	l, fc := testLane(2, 100)
	a := mustGet(t, acquireAsync(context.Background(), l))
	b := mustGet(t, acquireAsync(context.Background(), l))
	c := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)

	// a got a 429: the lane pauses and a waits to retry, keeping its slot.
	pause(l, t0.Add(time.Second))
	retried := make(chan error, 1)
	go func() { retried <- a.WaitRetry(context.Background(), 0) }()
	waitQueued(t, l, 2)
	l.g.mu.Lock()
	front := l.waiters[High].Front().Value.(*Slot)
	l.g.mu.Unlock()
	if front != a {
		t.Fatal("the retry is not at the head of the queue")
	}
	b.release() // a slot frees up, but the lane is paused
	mustBlock(t, c)
	if st := l.State(); st.InFlight != 0 || st.Queued != 2 {
		t.Fatalf("state %+v, want a and c waiting", st)
	}
	fc.Advance(time.Second)
	if err := <-retried; err != nil {
		t.Fatalf("retry: %v", err)
	}
	cs := mustGet(t, c)
	if st := l.State(); st.InFlight != 2 || st.Retries != 1 {
		t.Fatalf("state: %+v", st)
	}
	a.release()
	cs.release()
	a.release() // a second release is a no-op
	if st := l.State(); st.InFlight != 0 {
		t.Fatalf("in flight = %d after releases, want 0", st.InFlight)
	}
}

func TestCancelledRetryKeepsSlotUntilRelease(t *testing.T) {
	l, _ := testLane(1, 100)
	a := mustGet(t, acquireAsync(context.Background(), l))
	pause(l, t0.Add(time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.WaitRetry(ctx, 0) }()
	waitQueued(t, l, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if st := l.State(); st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("state: %+v", st)
	}
	a.release()
	if st := l.State(); st.InFlight != 0 {
		t.Fatalf("in flight = %d", st.InFlight)
	}
}

// TestSlotsNeverLeakUnderChurn hammers a real-clock lane with acquires that
// are cancelled at random and checks the limit holds and nothing is left.
func TestSlotsNeverLeakUnderChurn(t *testing.T) {
	l := newLane(Key{Path: "/x"}, Config{Concurrency: 3, MaxConcurrency: 3, MaxQueue: 1000})
	pastFirstAnswer(l)
	var inside, peak atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(3000))*time.Microsecond)
			defer cancel()
			s, err := l.acquire(ctx, 1, High)
			if err != nil {
				return
			}
			defer s.release()
			n := inside.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			inside.Add(-1)
			if i%7 == 0 && s.WaitRetry(ctx, 0) == nil {
				if n := inside.Add(1); n > 3 {
					peak.Store(n)
				}
				inside.Add(-1)
			}
		}(i)
	}
	wg.Wait()
	if p := peak.Load(); p > 3 {
		t.Fatalf("peak concurrency %d > limit 3", p)
	}
	if st := l.State(); st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("leftover state: %+v", st)
	}
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
	report(held, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: at(time.Minute)})
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
	held.release()
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
	held.release()
	mustGet(t, waiting).release() // the queue is empty again
	pause(l, at(time.Minute))
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(30*time.Second))
	defer cancel()
	if err := mustFail(t, acquireAsync(ctx, l)); !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("acquire past its deadline's pause: %v, want ErrDeadlineExceeded", err)
	}
	if got := l.State().Rejected; got != 3 {
		t.Fatalf("after a pause refusal: rejected = %d, want 3", got)
	}
}

// TestLaneWithoutAnswersShowsNoAnswerCounts: the per-status and per-outcome
// maps exist only once the lane has answered someone.
func TestLaneWithoutAnswersShowsNoAnswerCounts(t *testing.T) {
	l, _ := testLane(4, 10)
	if st := l.State(); st.Answers != nil || st.Outcomes != nil {
		t.Fatalf("answers %v, outcomes %v before any answer, want none", st.Answers, st.Outcomes)
	}
	l.countAnswer(200, "ok")
	if st := l.State(); st.Answers[200] != 1 || st.Outcomes["ok"] != 1 {
		t.Fatalf("answers %v, outcomes %v, want one 200 ok", st.Answers, st.Outcomes)
	}
}

// TestDrainIgnoresAWindowWithoutARate: a window known without a refill
// rate (no reset reported) bounds nothing in the drain estimate.
func TestDrainIgnoresAWindowWithoutARate(t *testing.T) {
	for name, v := range map[string]limit.View{
		"requests": {Requests: limit.BudgetView{Known: true, Limit: 10}},
		"tokens":   {Tokens: limit.BudgetView{Known: true, Limit: 1000}},
	} {
		if got := drainSeconds(3, 300, v, t0); got != 0 {
			t.Errorf("%s window without a rate: drain %v, want 0", name, got)
		}
	}
}

// TestDrainCountsTokensTheWindowStillHolds: what the token window still
// holds goes at once, only the rest at the pace; and a concurrency that is
// not known bounds nothing.
func TestDrainCountsTokensTheWindowStillHolds(t *testing.T) {
	v := limit.View{Tokens: limit.BudgetView{Known: true, PerSecond: 100, Available: 500}}
	if got := drainSeconds(1, 1000, v, t0); !near(got, 5) {
		t.Fatalf("1000 tokens with 500 in the window at 100/s: drain %v, want 5", got)
	}
	if got := drainSeconds(3, 0, limit.View{AnswerSeconds: 2}, t0); got != 0 {
		t.Fatalf("no concurrency known: drain %v, want 0", got)
	}
}

// TestGrantWonInTheRaceWithCancellationIsHandedBack: a request granted
// as its client goes away (its context done after acquire's first look)
// gets context.Canceled, its permit and budget go back, and it counts as
// cancelled; the same request with its client still there is granted.
func TestGrantWonInTheRaceWithCancellationIsHandedBack(t *testing.T) {
	limits := headerparse.Limits{Requests: win(10, 5, at(time.Minute))}
	l, _ := observedLane(t, 1, 1, limits)
	before := l.State().RequestsAvailable
	_, err := l.acquire(newGoneAfterCheckCtx(), 1, High)
	st := l.State()
	if !errors.Is(err, context.Canceled) || st.InFlight != 0 || st.Cancelled != 1 || st.RequestsAvailable != before {
		t.Fatalf("cancelled with the grant: err %v, in flight %d, cancelled %d, available %v (was %v)",
			err, st.InFlight, st.Cancelled, st.RequestsAvailable, before)
	}
	l, _ = observedLane(t, 1, 1, limits)
	s, err := l.acquire(context.Background(), 1, High)
	if st := l.State(); err != nil || st.InFlight != 1 || st.Cancelled != 0 {
		t.Fatalf("granted: err %v, %+v", err, st)
	}
	s.release()
}

// TestConfigValidate: negative counts and a floor above the ceiling, once
// zero bounds take their defaults, are refused naming the field; a start
// outside the bounds is not (the group starts at the nearer bound).
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		field string // "" = valid
	}{
		{Config{}, ""},
		{Config{Concurrency: 100, MaxConcurrency: 4}, ""},
		{Config{MinConcurrency: 4, MaxConcurrency: 4}, ""},
		{Config{MinConcurrency: limit.Config{}.WithDefaults().MaxConcurrency + 1}, "MinConcurrency"},
		{Config{MinConcurrency: 10, MaxConcurrency: 5}, "MinConcurrency"},
		{Config{MaxConcurrency: -1}, "MaxConcurrency"},
		{Config{MaxQueue: -1}, "MaxQueue"},
		{Config{Concurrency: -2}, "Concurrency"},
	} {
		err := tc.cfg.Validate()
		var se *setting.Error
		if tc.field == "" && err != nil || tc.field != "" && (!errors.As(err, &se) || se.Field != tc.field) {
			t.Errorf("%+v: %v, want an error on %q", tc.cfg, err, tc.field)
		}
	}
	if got := (Config{Concurrency: 100, MaxConcurrency: 4}).WithDefaults().Concurrency; got != 4 {
		t.Errorf("a start of 100 under a ceiling of 4 became %d, want 4", got)
	}
}
