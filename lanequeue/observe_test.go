package lanequeue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// changeLog collects the changes a table reports.
type changeLog struct{ got []laneChange }

func (c *changeLog) add(ch laneChange) { c.got = append(c.got, ch) }

// takeKind takes the changes and returns those of kind k.
func (c *changeLog) takeKind(k changeKind) []laneChange {
	var out []laneChange
	for _, ch := range c.take() {
		if ch.Kind == k {
			out = append(out, ch)
		}
	}
	return out
}

func (c *changeLog) take() []laneChange {
	got := c.got
	c.got = nil
	return got
}

func observedTable(fc *clock.Fake, cfg Config) (*Table, *changeLog) {
	log := &changeLog{}
	cfg.Clock = fc
	return NewTable(TableConfig{Lane: cfg, IdleTTL: time.Minute, onChange: log.add}), log
}

// TestLimitsLearnedAreReportedOnceAndAgainWhenTheyMove: the first answer
// with headers reports the limits; the same limits again report nothing;
// a window twice as large reports again.
func TestLimitsLearnedAreReportedOnceAndAgainWhenTheyMove(t *testing.T) {
	fc := clock.NewFake(t0)
	tb, log := observedTable(fc, Config{Concurrency: 4})
	l := tb.laneFor(Key{Path: "/v1/chat/completions", Model: "m"})
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{Requests: win(600, 599, at(100*time.Millisecond))})
	got := log.take()
	if len(got) != 1 || got[0].Kind != changeLimits || got[0].Lane != l || !got[0].View.FromHeaders() ||
		got[0].View.Requests.Limit != 600 || got[0].Status != 200 {
		t.Fatalf("first answer reported %+v, want one changeLimits from headers, limit 600", got)
	}
	fc.Advance(10 * time.Millisecond)
	accept(s, headerparse.Limits{Requests: win(600, 598, at(110*time.Millisecond))})
	if got := log.take(); len(got) != 0 {
		t.Fatalf("the same limits reported again: %+v", got)
	}
	fc.Advance(10 * time.Millisecond)
	accept(s, headerparse.Limits{Requests: win(1200, 1197, at(120*time.Millisecond))})
	if got := log.take(); len(got) != 1 || got[0].Kind != changeLimits || got[0].View.Requests.Limit != 1200 {
		t.Fatalf("a doubled window reported %+v", got)
	}
	s.release()
}

// TestPauseIsReportedWhenItStartsNotWhenItGrows: a refusal that pauses the
// group reports changePaused with its reason and length and counts one pause; a
// second refusal extending the same pause adds its time, not a pause.
func TestPauseIsReportedWhenItStartsNotWhenItGrows(t *testing.T) {
	fc := clock.NewFake(t0)
	tb, log := observedTable(fc, Config{Concurrency: 4})
	l := tb.laneFor(Key{Path: "/p"})
	pastFirstAnswer(l)
	s := mustGet(t, acquireAsync(context.Background(), l))
	s2 := mustGet(t, acquireAsync(context.Background(), l))
	report(s, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: at(2 * time.Second)})
	paused := log.takeKind(changePaused)
	if len(paused) != 1 || paused[0].Verdict != limit.RateRefused || paused[0].PauseFor != 2*time.Second || paused[0].Status != 429 {
		t.Fatalf("paused changes: %+v, want one rate_limited for 2s", paused)
	}
	fc.Advance(time.Second)
	report(s2, limit.Report{Status: 503, Verdict: limit.Overloaded, PauseUntil: at(4 * time.Second)})
	s2.release()
	if again := log.takeKind(changePaused); len(again) != 0 {
		t.Fatalf("an extended pause was reported as new: %+v", again)
	}
	st := l.State()
	if st.Pauses["rate_limited"] != 1 || st.Pauses["overloaded"] != 0 {
		t.Fatalf("pauses %v, want one rate_limited", st.Pauses)
	}
	// 2s set by the 429, then 2s more (from 2s to 4s) by the 503.
	if !near(st.PausedSeconds["rate_limited"], 2) || !near(st.PausedSeconds["overloaded"], 2) {
		t.Fatalf("paused seconds %v, want 2 and 2", st.PausedSeconds)
	}
	// After it ends, a new pause counts again. (It is 7 s, not the 1 s
	// asked: the pause before paid nothing, and a refusal with no wait
	// lengthens it by twice the last pause, 3 s; see limit's lengthen.)
	fc.Set(at(5 * time.Second))
	report(s, limit.Report{Status: 503, Verdict: limit.Overloaded, PauseUntil: at(6 * time.Second)})
	if st := l.State(); st.Pauses["overloaded"] != 1 || !near(st.PausedSeconds["overloaded"], 9) {
		t.Fatalf("after a second pause: %v %v", st.Pauses, st.PausedSeconds)
	}
	s.release()
}

// TestConcurrencyFallsAreReportedAtOnceRisesOncePerSecond: slow start
// raises the limit several times within a second and none is reported;
// after a second one change covers them all, from the last level reported;
// a refusal's fall is reported at once.
func TestConcurrencyFallsAreReportedAtOnceRisesOncePerSecond(t *testing.T) {
	fc := clock.NewFake(t0)
	tb, log := observedTable(fc, Config{Concurrency: 2})
	l := tb.laneFor(Key{Path: "/c"})
	pastFirstAnswer(l)
	a := mustGet(t, acquireAsync(context.Background(), l))
	b := mustGet(t, acquireAsync(context.Background(), l))
	// Both permits out: each accepted answer is binding; slow start raises
	// the limit every second answer.
	for range 4 {
		fc.Advance(10 * time.Millisecond)
		accept(a, headerparse.Limits{})
		fc.Advance(10 * time.Millisecond) // past slow start's spread
		accept(b, headerparse.Limits{})
	}
	if st := l.State(); st.Concurrency <= 2 {
		t.Fatalf("limit did not grow: %d", st.Concurrency)
	}
	if rises := log.takeKind(changeConcurrency); len(rises) != 0 {
		t.Fatalf("rises within a second were reported one by one: %+v", rises)
	}
	fc.Advance(time.Second)
	accept(a, headerparse.Limits{})
	fc.Advance(200 * time.Millisecond) // past slow start's spread
	accept(b, headerparse.Limits{})
	now := l.State().Concurrency
	got := log.take()
	if len(got) != 1 || got[0].Kind != changeConcurrency || got[0].From != 2 || got[0].View.Concurrency != now {
		t.Fatalf("after a second: %+v, want one change from 2 to %d", got, now)
	}
	fc.Advance(200 * time.Millisecond)
	report(a, limit.Report{Status: 429, Verdict: limit.ConcurrencyRefused})
	got = log.take()
	if len(got) != 1 || got[0].Kind != changeConcurrency || got[0].From != now || got[0].View.Concurrency >= now || got[0].Verdict != limit.ConcurrencyRefused {
		t.Fatalf("a refusal reported %+v, want a fall from %d at once", got, now)
	}
	a.release()
	b.release()
}

// TestEvictionIsReportedWithWhy: a sweep drops an idle lane ("idle"), a
// full table its least recently used one ("table_full").
func TestEvictionIsReportedWithWhy(t *testing.T) {
	fc := clock.NewFake(t0)
	log := &changeLog{}
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, MaxLanes: 2, IdleTTL: time.Minute, onChange: log.add})
	a := tb.laneFor(Key{Path: "/a"})
	tb.laneFor(Key{Path: "/b"})
	tb.laneFor(Key{Path: "/c"}) // /a goes: the table holds two
	got := log.take()
	if len(got) != 1 || got[0].Kind != changeEvicted || got[0].Lane != a || got[0].Reason != "table_full" {
		t.Fatalf("full table: %+v", got)
	}
	fc.Advance(2 * time.Minute)
	tb.sweep()
	got = log.take()
	if len(got) != 2 || got[0].Reason != "idle" || got[1].Reason != "idle" {
		t.Fatalf("sweep: %+v", got)
	}
}

// TestHistoryCountsAnswersAnd429sPerBucket: answers and upstream 429s land
// in the bucket of their time; the newest bucket is last; buckets older
// than the ring are gone.
func TestHistoryCountsAnswersAnd429sPerBucket(t *testing.T) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Path: "/h"}, Config{Concurrency: 4, Clock: fc})
	s := mustGet(t, acquireAsync(context.Background(), l))
	refuse(s, 0)
	accept(s, headerparse.Limits{})
	l.countAnswer(200, "ok")
	fc.Advance(historyBucket)
	l.countAnswer(200, "ok")
	l.countAnswer(502, "proxy_error")
	h := l.StateWithHistory().History
	n := len(h.Answers)
	if n != historyBuckets || len(h.Upstream429) != n || h.BucketSeconds != 5 {
		t.Fatalf("history shape: %+v", h)
	}
	if h.Answers[n-1] != 2 || h.Answers[n-2] != 1 || h.Upstream429[n-2] != 1 || h.Upstream429[n-1] != 0 {
		t.Fatalf("last buckets: answers %v, 429s %v", h.Answers[n-3:], h.Upstream429[n-3:])
	}
	if !h.End.After(fc.Now()) || h.End.Sub(fc.Now()) > historyBucket {
		t.Fatalf("end %v, now %v", h.End, fc.Now())
	}
	fc.Advance(3 * historyBucket)
	h = l.StateWithHistory().History
	if h.Answers[n-4] != 2 || h.Answers[n-1] != 0 {
		t.Fatalf("after 3 buckets: %v", h.Answers[n-6:])
	}
	fc.Advance(historyBuckets * historyBucket)
	for i, v := range l.StateWithHistory().History.Answers {
		if v != 0 {
			t.Fatalf("bucket %d still holds %d after the ring's span", i, v)
		}
	}
	if l.State().History != nil {
		t.Fatal("State carries the history")
	}
	s.release()
}

// TestOutcomesAreCountedWithTheirStatus: State shows answers by status and
// by outcome, and answerCounts by both.
func TestOutcomesAreCountedWithTheirStatus(t *testing.T) {
	l := newLane(Key{Path: "/o"}, Config{})
	l.countAnswer(200, "ok")
	l.countAnswer(200, "upstream_cut")
	l.countAnswer(0, "client_gone")
	st := l.State()
	if st.Answers[200] != 2 || st.Answers[0] != 1 || st.Outcomes["ok"] != 1 || st.Outcomes["upstream_cut"] != 1 ||
		st.answerCounts[answerKey{200, "upstream_cut"}] != 1 || len(st.answerCounts) != 3 {
		t.Fatalf("%+v", st)
	}
}

// TestDrainEstimate: the slowest of what the pace, the tokens and the
// concurrency at the answer time allow for what waits past the window's
// room, plus the pause.
func TestDrainEstimate(t *testing.T) {
	now := t0
	cases := []struct {
		name   string
		n      int
		tokens int64
		v      limit.View
		want   float64
	}{
		{"nothing waits", 0, 0, limit.View{Requests: limit.BudgetView{Known: true, PerSecond: 1}}, 0},
		{"nothing learned", 10, 100, limit.View{}, 0},
		{"request pace", 30, 0, limit.View{Requests: limit.BudgetView{Known: true, PerSecond: 10, Available: 10}}, 2},
		{"token pace binds", 10, 1000, limit.View{Requests: limit.BudgetView{Known: true, PerSecond: 10}, Tokens: limit.BudgetView{Known: true, PerSecond: 100}}, 10},
		{"concurrency binds", 40, 0, limit.View{Requests: limit.BudgetView{Known: true, PerSecond: 100}, Concurrency: 4, AnswerSeconds: 2}, 20},
		{"pause adds", 10, 0, limit.View{Requests: limit.BudgetView{Known: true, PerSecond: 10}, PausedUntil: now.Add(3 * time.Second)}, 4},
		{"a pause alone", 1, 0, limit.View{PausedUntil: now.Add(3 * time.Second)}, 3},
		{"a pause over", 1, 0, limit.View{PausedUntil: now.Add(-time.Second)}, 0},
		{"room for all", 5, 0, limit.View{Requests: limit.BudgetView{Known: true, PerSecond: 1, Available: 10}}, 0},
	}
	for _, c := range cases {
		if got := drainSeconds(c.n, c.tokens, c.v, now); !near(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestStateShowsTheGroupsQueueAndDrain: waiters of two lanes of one group
// are counted in each lane's GroupQueued, and the drain estimate follows
// the learned pace (the window is empty: 1 a second for 3 waiters).
func TestStateShowsTheGroupsQueueAndDrain(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Concurrency: 1, Clock: fc}})
	a := tb.laneFor(Key{Path: "/v1/chat/completions", Model: "m", CredentialHash: "k"})
	b := tb.laneFor(Key{Path: "/v1/responses", Model: "m", CredentialHash: "k"}) // same limit
	s := mustGet(t, acquireAsync(context.Background(), a))
	accept(s, headerparse.Limits{Requests: win(60, 0, at(time.Minute))}) // 1 a second, none left
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		acquireAsync(ctx, a)
	}
	acquireAsync(ctx, b)
	waitQueued(t, a, 2)
	waitQueued(t, b, 1)
	for _, st := range []State{a.State(), b.State()} {
		if st.GroupQueued != 3 || !near(st.DrainSeconds, 3) {
			t.Fatalf("lane %s: group queued %d, drain %v; want 3, and 3 s at 1 a second", st.Path, st.GroupQueued, st.DrainSeconds)
		}
	}
	s.release()
}

// TestWaitPastTheDeadlineIsRefusedAtOnce: once the group knows it cannot
// send before a waiter's deadline (the window is empty until a reset a
// minute away), that waiter gets a WaitError at the reset at once, also
// one that was queued before the answer said so; a waiter without a
// deadline keeps waiting; a pause past the deadline says Paused.
func TestWaitPastTheDeadlineIsRefusedAtOnce(t *testing.T) {
	// The deadlines are the wall clock's, as a context's are: the fake
	// clock starts now, not at the package's t0, which a long run passes.
	start := time.Now()
	at := func(d time.Duration) time.Time { return start.Add(d) }
	fc := clock.NewFake(start)
	l := newLane(Key{Path: "/w"}, Config{Concurrency: 1, Clock: fc})
	s := mustGet(t, acquireAsync(context.Background(), l))
	short, cancel := context.WithDeadline(context.Background(), at(10*time.Second))
	defer cancel()
	queued := acquireAsync(short, l) // waits for the one permit
	patient, stopPatient := context.WithCancel(context.Background())
	defer stopPatient()
	long := acquireAsync(patient, l)
	waitQueued(t, l, 2)
	// 1 request a minute, none left: the next slot is a minute away.
	accept(s, headerparse.Limits{Requests: win(1, 0, at(time.Minute))})
	s.release()
	r := <-queued
	var we *WaitError
	if !errors.As(r.err, &we) || !we.At.Equal(at(time.Minute)) || we.Paused || !errors.Is(r.err, ErrDeadlineExceeded) {
		t.Fatalf("queued waiter: %v, want a WaitError at the reset", r.err)
	}
	if st := l.State(); st.Queued != 1 || st.Rejected != 1 {
		t.Fatalf("after the refusal: %+v, want the patient waiter still queued", st)
	}
	// A new one with a short deadline is refused in Acquire.
	short2, cancel2 := context.WithDeadline(context.Background(), at(5*time.Second))
	defer cancel2()
	if _, err := l.acquire(short2, 1, High); !errors.As(err, &we) || !we.At.Equal(at(time.Minute)) {
		t.Fatalf("a new waiter: %v", err)
	}
	stopPatient()
	if r := <-long; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("patient waiter: %v", r.err)
	}
	// A pause past the deadline.
	pause(l, at(2*time.Minute))
	if _, err := l.acquire(short2, 1, High); !errors.As(err, &we) || !we.Paused || !we.At.Equal(at(2*time.Minute)) {
		t.Fatalf("paused: %v", err)
	}
}
