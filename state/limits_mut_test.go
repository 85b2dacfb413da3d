package state

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// verdictsSeen is a fakeShared that notes the verdicts it is taught,
// and the pauses asked with them.
type verdictsSeen struct {
	fakeShared
	got    []limit.Verdict
	pauses []time.Time
}

func (v *verdictsSeen) Learn(_ *limit.Ticket, r limit.Report, _ time.Time) {
	v.got, v.pauses = append(v.got, r.Verdict), append(v.pauses, r.PauseUntil)
}

func restoredAt(s saved, now time.Time, inner limit.Shared) *remembered {
	r := &remembered{Shared: inner, book: &Book{dirty: map[string]*remembered{}}}
	r.restore(s, now)
	return r
}

// withWindow is v showing a fixed window (View.Window's type is limit's own).
func withWindow(v limit.View, allowance int, length time.Duration) limit.View {
	w := reflect.New(reflect.TypeOf(v.Window).Elem())
	w.Elem().FieldByName("Allowance").SetInt(int64(allowance))
	w.Elem().FieldByName("Length").SetInt(int64(length))
	reflect.ValueOf(&v).Elem().FieldByName("Window").Set(w)
	return v
}

var accepted = limit.Report{Status: 200, Verdict: limit.Accepted}

func TestAnUncleanRestoreTakesOffWhatMayHaveGoneUnseen(t *testing.T) {
	// 2 a second for 1 s, less flushEvery's 0.5: 1.5 requests.
	r := restoredAt(saved{At: t0, Requests: budget{Limit: 4, PerSecond: 2}}, t0.Add(time.Second), &fakeShared{})
	if _, _, ok := r.Admit(t0.Add(time.Second), 1, false); !ok {
		t.Fatal("the one request refilled was held")
	}
	if _, _, ok := r.Admit(t0.Add(time.Second), 1, false); ok {
		t.Fatal("a second went: what the killed process may have sent after its snapshot was not taken off")
	}
}

func TestARestoredWindowAloneGatesThePoolAndItsFirstRequestGoes(t *testing.T) {
	now := t0.Add(time.Second)
	r := restoredAt(saved{At: t0, Requests: budget{Limit: 1, PerSecond: 0.01}, WindowAllowance: 3, WindowLength: 10 * time.Second,
		WindowStart: t0.Add(-2 * time.Second), Clean: true}, now, &fakeShared{})
	for i := range 3 {
		if _, _, ok := r.Admit(now, 1, false); !ok {
			t.Fatalf("request %d of the window held by the request budget the window replaces", i+1)
		}
	}
	r = restoredAt(saved{At: t0, WindowAllowance: 2, WindowLength: 10 * time.Second, Clean: true}, now, &fakeShared{})
	if _, _, ok := r.Admit(now, 1, false); !ok {
		t.Fatal("the first request of a window with no boundary seen was held")
	}
	if _, at, ok := r.Admit(now, 1, false); ok || !at.Equal(now.Add(5*time.Second)) {
		t.Fatalf("the second: %v at %v, want held 5 s (2 evenly in 10 s)", ok, at)
	}
}

func TestARestoredTokenBudgetHoldsWhatItCannotPay(t *testing.T) {
	r := restoredAt(saved{At: t0, Tokens: budget{Limit: 1000, PerSecond: 10, Available: 1000}, Clean: true}, t0, &fakeShared{})
	if _, _, ok := r.Admit(t0, 600, false); !ok {
		t.Fatal("600 of 1000 tokens held")
	}
	if _, at, ok := r.Admit(t0, 600, false); ok || !at.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("600 more: %v at %v, want held 20 s", ok, at)
	}
}

func TestTheRestoreEndsExactlyConfirmForAfterThePoolKnows(t *testing.T) {
	now := t0.Add(time.Second)
	sh, inner, _ := restart(t, learnedThen(t, limit.View{Requests: limit.BudgetView{Known: true, Limit: 1, PerSecond: 1}}), now)
	inner.knows = true
	sh.View(now)
	if v := sh.View(now.Add(confirmFor - time.Nanosecond)); strings.HasSuffix(v.Shared, "learned since") {
		t.Fatalf("before confirmFor: %q", v.Shared)
	}
	if v := sh.View(now.Add(confirmFor)); !strings.HasSuffix(v.Shared, "learned since") {
		t.Fatalf("confirmFor after the pool knew: %q, want learned since", v.Shared)
	}
}

func TestAClosedRestoredWindowIsKnockedOnByOneRequestAtATime(t *testing.T) {
	inner := &verdictsSeen{}
	now := t0.Add(time.Second)
	r := restoredAt(saved{At: t0, WindowAllowance: 3, WindowLength: 10 * time.Second, WindowStart: t0.Add(-2 * time.Second), Clean: true}, now, inner)
	tk, _, _ := r.Admit(now, 1, false)
	r.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: now.Add(4 * time.Second)}, now)
	if len(inner.got) != 1 || inner.got[0] != limit.Failed || !inner.pauses[0].IsZero() {
		t.Fatalf("the wrapped state learned %v, pause %v, from the restored window's refusal; want Failed and no pause (the window holds the pool)", inner.got, inner.pauses)
	}
	boundary := t0.Add(8 * time.Second)
	knock, _, ok := r.Admit(boundary, 1, false)
	if !ok || !knock.Knock {
		t.Fatalf("at the boundary: admitted %v, marked a knock %v; want a knock (its refused retry is held by the knocks)", ok, knock.Knock)
	}
	if _, _, ok := r.Admit(boundary, 1, false); ok {
		t.Fatal("a second knock went while the first was out")
	}
	r.Return(&knock, boundary)
	if _, _, ok := r.Admit(boundary, 1, false); !ok {
		t.Fatal("the knock came back unanswered and no other may knock")
	}
}

func TestAProbeAnsweredOrReturnedLetsTheNextGoAndANewWindowIsSure(t *testing.T) {
	now := t0.Add(time.Second)
	r := restoredAt(saved{At: t0, WindowAllowance: 5, WindowLength: 10 * time.Second, WindowStart: t0.Add(-time.Second), WindowCount: 1}, now, &fakeShared{})
	p, _, _ := r.Admit(now, 1, false)
	r.Learn(&p, accepted, now) // its permit still out
	p, _, ok := r.Admit(now, 1, false)
	if !ok {
		t.Fatal("held after the probe was answered")
	}
	r.Learn(&p, limit.Report{Verdict: limit.Failed}, now)
	r.Return(&p, now)
	if _, _, ok := r.Admit(now, 1, false); !ok {
		t.Fatal("held after an unanswered probe came back")
	}
	next := t0.Add(9 * time.Second)
	for i := range 2 {
		if _, _, ok := r.Admit(next, 1, false); !ok {
			t.Fatalf("request %d of the next window, which nothing unseen spent, was held", i+1)
		}
	}
}

func TestAQuotaSpentEndsAtAnAdmittedAnswerAndAProbeNotSentGoesAgain(t *testing.T) {
	r := &remembered{Shared: &fakeShared{}, book: &Book{dirty: map[string]*remembered{}}}
	tk, _, _ := r.Admit(t0, 1, true)
	rep := limit.Report{Status: 429, Verdict: limit.Accepted}
	rep.Quota.Spent, rep.Quota.Renews = true, t0.Add(time.Hour)
	r.Learn(&tk, rep, t0)
	r.Learn(&tk, limit.Report{Status: 400, Verdict: limit.Accepted}, t0)
	if !r.last.Quota {
		t.Fatal("a 400 ended the spent quota")
	}
	r.Learn(&tk, accepted, t0)
	if r.last.Quota {
		t.Fatal("an admitted answer did not end the spent quota")
	}

	q := restoredAt(saved{At: t0, Quota: true, QuotaUntil: t0.Add(time.Hour), Clean: true}, t0, &fakeShared{})
	p, _, _ := q.Admit(t0, 1, true)
	q.Learn(&p, limit.Report{Verdict: limit.NotSent}, t0)
	q.Return(&p, t0)
	if _, _, ok := q.Admit(t0, 1, true); !ok {
		t.Fatal("a probe that was never sent holds the pool")
	}
}

func TestAPoolsOwnWindowIsTrackedInItsSnapshot(t *testing.T) {
	r := &remembered{Shared: &fakeShared{view: withWindow(limit.View{}, 3, 10*time.Second)}, book: &Book{dirty: map[string]*remembered{}}}
	step := func(at time.Time, rep limit.Report, start time.Time, count int) {
		t.Helper()
		tk, _, _ := r.Admit(at, 1, false)
		r.Learn(&tk, rep, at)
		if s := r.last; !s.WindowStart.Equal(start) || s.WindowCount != count {
			t.Fatalf("at +%v: window from +%v counting %d, want +%v counting %d", at.Sub(t0), s.WindowStart.Sub(t0), s.WindowCount, start.Sub(t0), count)
		}
	}
	step(t0, accepted, t0, 1)
	step(t0.Add(15*time.Second), accepted, t0.Add(10*time.Second), 1)
	tk := limit.Ticket{Dispatched: t0.Add(15 * time.Second)}
	r.Learn(&tk, limit.Report{Verdict: limit.Failed}, t0.Add(25*time.Second))
	if s := r.last; !s.WindowStart.Equal(t0.Add(20*time.Second)) || s.WindowCount != 0 {
		t.Fatalf("a window later: from +%v counting %d", s.WindowStart.Sub(t0), s.WindowCount)
	}
}

func TestAWindowsShapeIsSeenFromAClosureWhileTheStateHeldIt(t *testing.T) {
	inner := &fakeShared{}
	r := &remembered{Shared: inner, book: &Book{dirty: map[string]*remembered{}}}
	answer := func(at time.Time, rep limit.Report) {
		tk, _, _ := r.Admit(at, 1, false)
		r.Learn(&tk, rep, at)
	}
	refused := limit.Report{Status: 429, Verdict: limit.RateRefused}
	answer(t0, accepted)
	answer(t0.Add(time.Second), accepted)
	answer(t0.Add(2*time.Second), refused)
	for inner.view.PauseReason.String() != "window" {
		inner.view.PauseReason++
	}
	answer(t0.Add(3*time.Second), refused)
	inner.view = limit.View{}
	answer(t0.Add(10*time.Second), accepted)
	if s := r.last; s.WindowAllowance != 2 || s.WindowLength != 10*time.Second || s.WindowCount != 1 {
		t.Fatalf("snapshot %d per %v counting %d, want 2 per 10s counting 1", s.WindowAllowance, s.WindowLength, s.WindowCount)
	}
}

func TestAfterTheRestoreEndsThePoolsOwnWindowIsKept(t *testing.T) {
	inner := &fakeShared{}
	r := restoredAt(saved{At: t0, WindowAllowance: 3, WindowLength: 10 * time.Second, WindowStart: t0.Add(-2 * time.Second), Clean: true}, t0, inner)
	later := t0.Add(restoredFor + 2*time.Second)
	tk, _, _ := r.Admit(later, 1, false)
	r.Learn(&tk, accepted, later)
	st := r.last.WindowStart
	if r.last.WindowAllowance != 3 || st.IsZero() {
		t.Fatalf("the restored window went from the snapshot: %+v", r.last)
	}
	inner.view = withWindow(limit.View{}, 5, time.Minute)
	r.Learn(&tk, accepted, st.Add(30*time.Second))
	if !r.last.WindowStart.Equal(st) {
		t.Fatalf("the window rolled to +%v by the restored length, not the minute the pool learned", r.last.WindowStart.Sub(st))
	}
}

func TestASnapshotOfARestoredPoolIsBroughtUpToDate(t *testing.T) {
	inner := &fakeShared{}
	r := restoredAt(saved{At: t0, Requests: budget{Limit: 4, PerSecond: 2}, Clean: true}, t0.Add(time.Second), inner)
	tk, _, _ := r.Admit(t0.Add(time.Second), 1, false) // 2 refilled, 1 left
	r.Learn(&tk, accepted, t0.Add(2*time.Second))
	if s := r.last; !s.At.Equal(t0.Add(2*time.Second)) || s.Requests.Available != 3 {
		t.Fatalf("snapshot at +%v holding %v, want +2s holding 3", s.At.Sub(t0), s.Requests.Available)
	}
	inner.view = limit.View{Requests: limit.BudgetView{Known: true, Limit: 9, PerSecond: 9, Available: 9}}
	r.Learn(&tk, accepted, t0.Add(2*time.Second))
	if r.last.Requests.PerSecond != 9 {
		t.Fatalf("the snapshot kept the restored budget over the one the pool learned: %+v", r.last.Requests)
	}
}

func TestAnAnswerDispatchedAfterALateRefusalOpensTheWindow(t *testing.T) {
	var w windowTrack
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	w.answered(true, 1, at(5), at(5))
	w.answered(false, 2, at(6), at(6))
	w.answered(true, 3, at(1), at(7)) // a straggler sent before the first closure
	w.answered(false, 4, at(3), at(8))
	if w.closed {
		t.Fatal("an answer admitted after the refusal's dispatch left the window closed")
	}
}
