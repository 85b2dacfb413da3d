package lanequeue

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// opBy is who makes the operators' changes of these tests.
const opBy = "token:ab12cd34"

// keyOf is the key of a lane of the default route for credential and
// model.
func keyOf(credential, model string) Key {
	return Key{CredentialHash: HashCredential(credential), Path: "/v1/chat/completions", Model: model}
}

// grantOrder acquires one slot of each lane in lanes, in that order, each
// after the one before it is queued, and returns the channel each
// request's index arrives on as it is granted, its slot released at once.
func grantOrder(t *testing.T, lanes ...*Lane) <-chan int {
	t.Helper()
	order := make(chan int, len(lanes))
	for i, l := range lanes {
		go func() {
			s, err := l.acquire(context.Background(), 1, High)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			s.release()
		}()
		synctest.Wait()
	}
	return order
}

// TestLimitsSetAtRunTimePaceTheRoutesLanes: 600 RPM set on a route while
// it runs spaces the starts of its lanes 100 ms apart, those of groups
// made later too; /lanes shows the figures, who set them and when; the
// route's models still share one limit as it started; set back to the
// route's own (none), requests go at once again.
func TestLimitsSetAtRunTimePaceTheRoutesLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable(TableConfig{Lane: Config{Concurrency: 8}, RouteLimits: map[string]limit.Limits{"": {PerCredential: true}}})
		l := tab.laneFor(keyOf("sk-a", "m"))
		pastFirstAnswer(l)
		set := time.Now()
		tab.SetRouteLimits("", &limit.Limits{RPM: 600}, opBy, time.Now())
		starts, _ := runStarts(t, l, 10, 10*time.Millisecond, nil)
		if g := minGap(starts); g != 100*time.Millisecond {
			t.Errorf("closest starts %v apart, want 100ms (600 a minute)", g)
		}
		st := l.State()
		if c := st.Configured; c == nil || c.RPM != 600 || c.Mode != "ceiling" {
			t.Errorf("configured = %+v, want 600 rpm as a ceiling", c)
		}
		if r := st.RuntimeLimits; r == nil || r.RPM != 600 || r.Mode != "ceiling" || r.By != "token:ab12cd34" || !r.SetAt.Equal(set) {
			t.Errorf("runtime limits = %+v, want 600 rpm set at %v by token:ab12cd34", r, set)
		}
		if !l.g.cfg.Limits.PerCredential {
			t.Errorf("the route's models no longer share one limit (%+v)", l.g.cfg.Limits)
		}
		later := tab.laneFor(keyOf("sk-b", "m"))
		pastFirstAnswer(later)
		if starts, _ := runStarts(t, later, 3, 10*time.Millisecond, nil); minGap(starts) != 100*time.Millisecond {
			t.Errorf("a group made after the change: starts %v apart, want 100ms", minGap(starts))
		}
		if r := later.State().RuntimeLimits; r == nil || r.RPM != 600 {
			t.Errorf("a group made after the change shows runtime limits %+v", r)
		}
		tab.SetRouteLimits("", nil, opBy, time.Now())
		st = l.State()
		if st.Configured != nil || st.RuntimeLimits != nil {
			t.Errorf("back to the route's own: configured %+v, runtime %+v; want neither", st.Configured, st.RuntimeLimits)
		}
		begin := time.Now()
		if starts, _ := runStarts(t, l, 5, 10*time.Millisecond, nil); starts[4].Sub(begin) >= 100*time.Millisecond {
			t.Errorf("back to the route's own: the fifth request started after %v, want under 100ms", starts[4].Sub(begin))
		}
	})
}

// TestAConcurrencySetAtRunTimeBoundsTheGroupAtOnce: concurrency 2 set on
// a route holds its group to 2 in flight from then on; another route is
// untouched.
func TestAConcurrencySetAtRunTimeBoundsTheGroupAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable(TableConfig{Lane: Config{Concurrency: 8, MaxConcurrency: 8}})
		l := tab.laneFor(keyOf("sk-a", "m"))
		other := tab.laneFor(Key{Route: "other", CredentialHash: HashCredential("sk-a"), Path: "/x", Model: "m"})
		pastFirstAnswer(l)
		tab.SetRouteLimits("", &limit.Limits{Concurrency: 2}, opBy, time.Now())
		if c := l.State().Concurrency; c != 2 {
			t.Fatalf("concurrency limit %d after 2 was set, want 2", c)
		}
		if _, most := runStarts(t, l, 10, 50*time.Millisecond, nil); most != 2 {
			t.Errorf("at most %d in flight, want 2", most)
		}
		if c := other.State(); c.Concurrency != 8 || c.RuntimeLimits != nil {
			t.Errorf("another route: limit %d, runtime limits %+v; want 8, none", c.Concurrency, c.RuntimeLimits)
		}
	})
}

// TestAHeldLaneWaitsAndIsReleasedInOrder: a held lane dispatches nothing
// and refuses nothing: its requests wait while the other lanes of its
// group go; /lanes says who holds it since when; released, its waiters go
// in the order they came (one at a time, so the order shows).
func TestAHeldLaneWaitsAndIsReleasedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable(TableConfig{Lane: Config{Concurrency: 1, MaxConcurrency: 1}})
		held, free := tab.laneFor(keyOf("sk-a", "m1")), tab.laneFor(keyOf("sk-a", "m2"))
		pastFirstAnswer(held)
		pastFirstAnswer(free)
		heldAt := time.Now()
		if err := tab.HoldLane(held.ID(), true, opBy, heldAt, false); err != nil {
			t.Fatal(err)
		}
		order := grantOrder(t, held, held, held, free)
		if got := <-order; got != 3 {
			t.Fatalf("request %d went first, want the other lane's (3)", got)
		}
		st := held.State()
		if st.Queued != 3 || st.Rejected != 0 || st.Held != "lane" || !st.HeldSince.Equal(heldAt) || st.HeldBy != opBy {
			t.Fatalf("held lane: %d queued, %d rejected, held %q since %v by %q", st.Queued, st.Rejected, st.Held, st.HeldSince, st.HeldBy)
		}
		if err := tab.HoldLane(held.ID(), false, opBy, time.Now(), false); err != nil {
			t.Fatal(err)
		}
		for want := range 3 {
			if got := <-order; got != want {
				t.Fatalf("after the release request %d went, want %d", got, want)
			}
		}
		if st := held.State(); st.Held != "" || !st.HeldSince.IsZero() || st.HeldBy != "" {
			t.Errorf("released lane still shows a hold: %+v", st)
		}
	})
}

// TestARouteHoldHoldsItsLanesAndThoseMadeLater: a route's hold holds the
// lanes it has and those it makes after, of any credential; other routes
// go; a lane's own hold outlasts the route's release.
func TestARouteHoldHoldsItsLanesAndThoseMadeLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable(TableConfig{Lane: Config{Concurrency: 8}})
		before := tab.laneFor(keyOf("sk-a", "m"))
		tab.HoldRoute("", true, opBy, time.Now())
		after := tab.laneFor(keyOf("sk-b", "m"))
		other := tab.laneFor(Key{Route: "other", CredentialHash: HashCredential("sk-a"), Path: "/x", Model: "m"})
		for _, l := range []*Lane{before, after, other} {
			pastFirstAnswer(l)
		}
		order := grantOrder(t, before, after, other)
		if got := <-order; got != 2 {
			t.Fatalf("request %d went first, want the other route's (2)", got)
		}
		for _, l := range []*Lane{before, after} {
			if st := l.State(); st.Held != "route" || st.Queued != 1 {
				t.Fatalf("lane %s: held %q, %d queued; want route, 1", l.ID(), st.Held, st.Queued)
			}
		}
		if st := other.State(); st.Held != "" {
			t.Fatalf("another route's lane held %q", st.Held)
		}
		if err := tab.HoldLane(after.ID(), true, opBy, time.Now(), false); err != nil {
			t.Fatal(err)
		}
		if st := after.State(); st.Held != "lane" {
			t.Fatalf("a lane held on its own and by its route shows %q, want lane", st.Held)
		}
		tab.HoldRoute("", false, opBy, time.Now())
		if got := <-order; got != 0 {
			t.Fatalf("request %d went after the route's release, want 0", got)
		}
		synctest.Wait()
		if st := after.State(); st.Queued != 1 || st.Held != "lane" {
			t.Fatalf("a lane held on its own: %d queued, held %q after its route's release; want 1, lane", st.Queued, st.Held)
		}
		if err := tab.HoldLane(after.ID(), false, opBy, time.Now(), false); err != nil {
			t.Fatal(err)
		}
		if got := <-order; got != 1 {
			t.Fatalf("request %d went, want 1", got)
		}
	})
}

// TestAHoldPastTheDeadlineAnswersAsAPause: a waiter whose deadline passes
// while its lane is held gets, at its deadline, the WaitError of a wait
// that outlasts it (which is ErrDeadlineExceeded), counted as rejected; a
// client that goes away is only cancelled.
func TestAHoldPastTheDeadlineAnswersAsAPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable(TableConfig{Lane: Config{Concurrency: 8}})
		l := tab.laneFor(keyOf("sk-a", "m"))
		pastFirstAnswer(l)
		tab.HoldRoute("", true, opBy, time.Now())
		begin := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := l.acquire(ctx, 1, High)
		var we *WaitError
		if !errors.As(err, &we) || !we.Held || !errors.Is(err, ErrDeadlineExceeded) || time.Since(begin) != 3*time.Second {
			t.Fatalf("after %v: %v; want a held WaitError at the deadline (3s)", time.Since(begin), err)
		}
		if !strings.Contains(err.Error(), "an operator's hold held the lane") {
			t.Errorf("error %q does not say a hold held it", err)
		}
		gone, leave := context.WithCancel(context.Background())
		ch := acquireAsync(gone, l)
		synctest.Wait()
		leave()
		if r := <-ch; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("a client gone from a held lane: %v, want context.Canceled", r.err)
		}
		if st := l.State(); st.Rejected != 1 || st.Cancelled != 1 {
			t.Fatalf("%d rejected, %d cancelled; want 1 and 1", st.Rejected, st.Cancelled)
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		tab.HoldRoute("", false, opBy, time.Now())
		s, err := l.acquire(ctx, 1, High)
		if err != nil {
			t.Fatalf("after the release: %v", err)
		}
		s.release()
	})
}

// TestClearForgetsWhatTheLaneLearned: a clear drops the budgets a lane's
// limit learned from headers and its pause, and says who cleared it
// when; the route's configured limit stays; a clear of the route clears
// every lane of it.
func TestClearForgetsWhatTheLaneLearned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := configuredTable(limit.Limits{TPM: 60000})
		a, b := tab.laneFor(keyOf("sk-a", "m")), tab.laneFor(keyOf("sk-b", "m"))
		for _, l := range []*Lane{a, b} {
			s := mustGet(t, acquireAsync(context.Background(), l))
			s.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: time.Now().Add(time.Hour),
				Limits: headerparse.Limits{Requests: win(100, 0, time.Now().Add(time.Minute))}})
			s.release()
			if st := l.State(); st.RequestsLimit != 100 || st.PausedUntil.IsZero() {
				t.Fatalf("set-up: learned %v requests, paused until %v", st.RequestsLimit, st.PausedUntil)
			}
		}
		clearedAt := time.Now()
		if err := tab.ClearLane(a.ID(), opBy, clearedAt, false); err != nil {
			t.Fatal(err)
		}
		st := a.State()
		if st.RequestsLimit != 0 || !st.PausedUntil.IsZero() || st.Learned != "" || !st.ClearedAt.Equal(clearedAt) || st.ClearedBy != opBy {
			t.Fatalf("after a clear: %+v", st)
		}
		if c := st.Configured; c == nil || c.TPM != 60000 {
			t.Fatalf("after a clear the configured limit is %+v, want 60000 tpm", c)
		}
		if st := b.State(); st.RequestsLimit != 100 || !st.ClearedAt.IsZero() {
			t.Fatalf("another credential's lane was cleared too: %+v", st)
		}
		mustGet(t, acquireAsync(context.Background(), a)).release()
		tab.ClearRoute("", opBy, time.Now())
		if st := b.State(); st.RequestsLimit != 0 || !st.PausedUntil.IsZero() || st.ClearedBy != "token:ab12cd34" {
			t.Fatalf("after the route's clear: %+v", st)
		}
	})
}

// TestAClearStartsTheFirstAnswerWindowAgain: a cleared limit knows
// nothing, and sends one request until its first answer, as a new one.
func TestAClearStartsTheFirstAnswerWindowAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable(TableConfig{Lane: Config{Concurrency: 8}})
		l := tab.laneFor(keyOf("sk-a", "m"))
		pastFirstAnswer(l)
		if err := tab.ClearLane(l.ID(), opBy, time.Now(), false); err != nil {
			t.Fatal(err)
		}
		first := mustGet(t, acquireAsync(context.Background(), l))
		second := acquireAsync(context.Background(), l)
		synctest.Wait()
		if st := l.State(); st.InFlight != 1 || st.Queued != 1 {
			t.Fatalf("a cleared lane: %d in flight, %d queued; want one alone until its answer", st.InFlight, st.Queued)
		}
		first.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		mustGet(t, second).release()
		first.release()
	})
}

// TestALanesChangeNeedsALaneOfThatID: an ID no lane has is an error and
// changes nothing, so a lane made later with it is not held; one another
// replica held first is kept for the lane to come.
func TestALanesChangeNeedsALaneOfThatID(t *testing.T) {
	tab := NewTable(TableConfig{})
	k, k2 := keyOf("sk-a", "m"), keyOf("sk-b", "m")
	by, at := opBy, time.Now()
	if err := tab.HoldLane(k.ID(), true, by, at, false); !errors.Is(err, errUnknownLane) {
		t.Fatalf("hold of a lane nobody has: %v, want errUnknownLane", err)
	}
	if err := tab.ClearLane(k.ID(), by, at, false); !errors.Is(err, errUnknownLane) {
		t.Fatalf("clear of a lane nobody has: %v, want errUnknownLane", err)
	}
	if st := tab.laneFor(k).State(); st.Held != "" {
		t.Fatalf("a lane made after a refused hold is held (%q)", st.Held)
	}
	if err := tab.HoldLane(k2.ID(), true, by, at, true); err != nil {
		t.Fatal(err)
	}
	if st := tab.laneFor(k2).State(); st.Held != "lane" || st.HeldBy != by {
		t.Fatalf("a lane made after another replica's hold: held %q by %q", st.Held, st.HeldBy)
	}
	if err := tab.ClearLane(keyOf("sk-c", "m").ID(), by, at, true); err != nil {
		t.Fatalf("another replica's clear of a lane this one lacks: %v", err)
	}
}
