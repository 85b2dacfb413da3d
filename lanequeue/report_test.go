package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// TestRefusalIsLearnedBeforeTheQueueMoves: the first answer of a new lane
// ends its first-answer window. When that answer is a refusal with a
// pause, the waiters must see the pause, not the window's end alone (they used to be let
// into the refusal, up to the whole concurrency limit).
func TestRefusalIsLearnedBeforeTheQueueMoves(t *testing.T) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Path: "/v1/x"}, Config{Concurrency: 64, Clock: fc})
	first := mustGet(t, acquireAsync(context.Background(), l)) // the first answer's
	var chans []<-chan result
	for i := 0; i < 5; i++ {
		chans = append(chans, acquireAsync(context.Background(), l))
	}
	waitQueued(t, l, 5)
	first.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: at(time.Second)})
	if st := l.State(); st.InFlight != 1 || st.Queued != 5 || st.PauseReason != "rate_limited" {
		t.Fatalf("after the refusal: %+v, want the 5 still queued behind the pause", st)
	}
	fc.Set(at(time.Second))
	for _, ch := range chans {
		mustGet(t, ch).release()
	}
	first.release()
}

// TestRefusalWithRoomCorrectsAnOverstatedWindow: headers state a
// per-minute limit (1200) that the upstream enforces per second (20, never
// more than 19 left after a request). A refusal while the budget had room
// proves the headers wrong: the window shrinks to what the upstream ever
// showed, and the rate follows.
func TestRefusalWithRoomCorrectsAnOverstatedWindow(t *testing.T) {
	l, fc := testLane(64, 1000)
	s := mustGet(t, acquireAsync(context.Background(), l))
	// 19 left, full again in 50ms: the headers' arithmetic says
	// (1200-19)/0.05s, about 23,620 requests a second.
	accept(s, headerparse.Limits{Requests: win(1200, 19, at(50*time.Millisecond))})
	if st := l.State(); st.RequestsPerSecond < 20000 {
		t.Fatalf("before: %v req/s", st.RequestsPerSecond)
	}
	fc.Advance(10 * time.Millisecond)
	report(s, limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: 50 * time.Millisecond,
		Limits: headerparse.Limits{Requests: win(1200, 0, at(time.Second+10*time.Millisecond))}})
	st := l.State()
	if st.RequestsLimit != 20 || !near(st.RequestsPerSecond, 20) || !st.Corrected {
		t.Fatalf("after the refusal: limit %v, %v req/s, corrected %v; want 20, 20, true", st.RequestsLimit, st.RequestsPerSecond, st.Corrected)
	}
	// The next honest answer keeps the correction: the upstream still shows
	// no more than 19 left.
	fc.Advance(time.Second)
	accept(s, headerparse.Limits{Requests: win(1200, 19, at(fc.Now().Sub(t0)+50*time.Millisecond))})
	if st := l.State(); st.RequestsLimit != 20 || st.RequestsPerSecond > 21 {
		t.Fatalf("a later answer undid the correction: %+v", st)
	}
	s.release()
}

// TestRefusalWellUnderTheLearnedRateLowersConcurrency: headers promise 100
// requests a second and report room; the lane sends a few a second and is
// refused anyway. The rate is not what binds: concurrency is lowered, the
// pace left alone.
func TestRefusalWellUnderTheLearnedRateLowersConcurrency(t *testing.T) {
	l, fc := settled(64, 1, 64)
	// 99 left, full again in 10ms: 100 a second, and the upstream has
	// shown the whole window, so there is nothing to correct.
	lim := headerparse.Limits{Requests: win(100, 99, at(10*time.Millisecond))}
	slots := acquireN(t, l, 2)
	for _, s := range slots {
		accept(s, lim)
	}
	fc.Advance(time.Second)
	slots = append(slots, acquireN(t, l, 1)...) // the budget has room
	refuse(slots[2], time.Second)               // it went with 2 others in flight
	st := l.State()
	if st.Concurrency != 63 || st.RequestsLimit != 100 || st.Corrected {
		t.Fatalf("state %+v: want concurrency one step down (63), the window left at 100", st)
	}
	releaseAll(slots)
}

// TestRateRefusalAtTheLearnedRateSlowsOnlyThePace: a refusal while the
// lane sends at its learned rate is about the rate: concurrency stays.
func TestRateRefusalAtTheLearnedRateSlowsOnlyThePace(t *testing.T) {
	l, fc := settled(16, 1, 16)
	// 10 a second, 10 left: the budget lets 10 go at once.
	lim := headerparse.Limits{Requests: win(10, 10, at(time.Second))}
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, lim)
	s.release()
	slots := acquireN(t, l, 9)
	fc.Advance(100 * time.Millisecond)
	refuse(slots[8], 100*time.Millisecond)
	if st := l.State(); st.Concurrency != 16 {
		t.Fatalf("concurrency %d after a rate refusal, want 16", st.Concurrency)
	}
	releaseAll(slots)
}

// TestCancelledWaitersOfAnEvictedLaneFreeItsGroup: a lane pushed out of the
// table while only queued requests hold it frees its group once they give
// up, so a later lane of the same key starts fresh instead of with the dead
// lane's learned limits.
func TestCancelledWaitersOfAnEvictedLaneFreeItsGroup(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{MaxLanes: 1, Lane: Config{Clock: fc}})
	k := Key{CredentialHash: HashCredential("sk-a"), Path: "/v1/chat/completions", Model: "m"}
	l := tb.laneFor(k)
	pastFirstAnswer(l)
	pause(l, at(time.Hour)) // nothing goes: the requests only wait
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, l)
	waitQueued(t, l, 1)
	tb.laneFor(Key{CredentialHash: HashCredential("sk-b"), Path: "/x"}) // evicts l
	if n := tb.groupCount(); n != 2 {
		t.Fatalf("%d groups while l's waiter is queued, want 2", n)
	}
	cancel()
	<-ch
	if n := tb.groupCount(); n != 1 {
		t.Fatalf("%d groups after the waiter left, want 1", n)
	}
	if again := tb.laneFor(k); again.g == l.g || !again.State().PausedUntil.IsZero() {
		t.Fatal("a new lane for the key inherited the dead lane's group")
	}
}

// TestCountersLiveInTheLane: attempts, answers and absorbed 429s are
// counted where the lane is, and shown in its state.
func TestCountersLiveInTheLane(t *testing.T) {
	l, _ := testLane(4, 100)
	s := mustGet(t, acquireAsync(context.Background(), l))
	refuse(s, 0)
	if err := s.WaitRetry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
	s.release()
	l.countAnswer(200, "ok")
	st := l.State()
	if st.Attempts[429] != 1 || st.Attempts[200] != 1 || st.Answers[200] != 1 || st.Absorbed429 != 1 || st.Retries != 1 {
		t.Fatalf("counters: %+v", st)
	}
}

// Regression tests from the review of the lane engine.

// TestHonestHeadersOfASharedKeyAreNotCorrected: limit 600 a minute, resets
// consistent with 10 a second, and other clients holding remaining near
// 100: this lane's own answers show a slower refill than 10 a second, but
// not the orders of magnitude of a quantized limit.
func TestHonestHeadersOfASharedKeyAreNotCorrected(t *testing.T) {
	l, fc := testLane(8, 100)
	honest := func(remaining int64) headerparse.Limits {
		reset := time.Duration(float64(600-remaining) / 10 * float64(time.Second))
		return headerparse.Limits{Requests: headerparse.Window{Limit: 600, Remaining: remaining, HasRemaining: true,
			Reset: fc.Now().Add(reset)}}
	}
	for range 4 {
		s := mustGet(t, acquireAsync(context.Background(), l))
		accept(s, honest(100))
		s.release()
		fc.Advance(500 * time.Millisecond)
	}
	if st := l.State(); st.Corrected || st.RequestsPerSecond < 9 {
		t.Fatalf("honest headers corrected: window %v, rate %v/s (true: 600, 10/s)", st.RequestsLimit, st.RequestsPerSecond)
	}
}

// TestOnlyCapacityRefusalsCountAsThrottled: rate and concurrency refusals
// and overloads count as throttled; accepted, failed and unsent attempts
// do not.
func TestOnlyCapacityRefusalsCountAsThrottled(t *testing.T) {
	for _, tt := range []struct {
		v    limit.Verdict
		want bool
	}{{limit.Accepted, false}, {limit.RateRefused, true}, {limit.ConcurrencyRefused, true}, {limit.Overloaded, true}, {limit.Failed, false}, {limit.NotSent, false}} {
		if got := tt.v.Refusal(); got != tt.want {
			t.Errorf("%v.Refusal() = %v, want %v", tt.v, got, tt.want)
		}
	}
	l, _ := testLane(4, 10)
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{})
	report(s, limit.Report{Status: 500, Verdict: limit.Failed})
	if n := l.State().Throttled; n != 0 {
		t.Fatalf("throttled = %d after an accepted and a failed attempt, want 0", n)
	}
	report(s, limit.Report{Status: 529, Verdict: limit.Overloaded})
	if n := l.State().Throttled; n != 1 {
		t.Fatalf("throttled = %d after an overload, want 1", n)
	}
	s.release()
}

// knocking is a pool's state whose dispatches are knocks while knock is
// set (a closed window's, as limit.Memory marks them).
type knocking struct {
	limit.Shared
	knock bool
}

func (k *knocking) Admit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	t, at, ok := k.Shared.Admit(now, cost, alone)
	t.Knock = k.knock
	return t, at, ok
}

// TestARefusedKnocksRetryIsHeldByTheLane: a knock the upstream refused,
// its retry asking the group to pause, is held by the lane (the window's
// next knock or opening sends it), so the proxy adds no backoff of its
// own; a refused request that was no knock, or a knock the upstream
// answered overloaded, is not.
func TestARefusedKnocksRetryIsHeldByTheLane(t *testing.T) {
	for _, tc := range []struct {
		name  string
		knock bool
		r     limit.Report
		held  bool
	}{
		{"refused knock", true, limit.Report{Status: 429, Verdict: limit.RateRefused}, true},
		{"refused request", false, limit.Report{Status: 429, Verdict: limit.RateRefused}, false},
		{"overloaded knock", true, limit.Report{Status: 529, Verdict: limit.Overloaded}, false},
	} {
		fc := clock.NewFake(t0)
		st := &knocking{knock: tc.knock}
		g := newGroup(Key{Path: "/v1/x"}.groupKey(), Config{Concurrency: 8, Clock: fc}.withDefaults(),
			func(_ string, c limit.Config) limit.Shared { st.Shared = limit.NewMemory(c); return st }, nil)
		g.refs.Store(1)
		l := g.newLane(Key{Path: "/v1/x"}, Key{Path: "/v1/x"}.ID())
		s := mustGet(t, acquireAsync(context.Background(), l))
		tc.r.PauseUntil = at(time.Second)
		if _, held := s.Report(tc.r); held != tc.held {
			t.Errorf("%s: held %v, want %v", tc.name, held, tc.held)
		}
		s.release()
	}
}
