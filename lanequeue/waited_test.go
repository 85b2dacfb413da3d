package lanequeue

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// wantWaited fails the test unless s's latest wait had ahead waiters
// before it and met exactly reasons.
func wantWaited(t *testing.T, name string, s *Slot, ahead int, reasons ...string) {
	t.Helper()
	gotAhead, gotReasons := s.Waited()
	if gotAhead != ahead || !slices.Equal(gotReasons, reasons) {
		t.Errorf("%s waited with %d ahead for %q, want %d ahead and reasons %q", name, gotAhead, gotReasons, ahead, reasons)
	}
}

// TestWaitedIsNothingForARequestThatWentAtOnce: a request with a permit
// free and nothing ahead met no reason, and none from a wait before it
// lingers: a pass that held the lane before it joined is not its wait.
func TestWaitedIsNothingForARequestThatWentAtOnce(t *testing.T) {
	l, _ := testLane(1, 10)
	first := mustGet(t, acquireAsync(context.Background(), l))
	wantWaited(t, "the first", first, 0)
	second := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1) // held for concurrency
	first.release()
	s := mustGet(t, second)
	wantWaited(t, "the second", s, 0, "concurrency")
	s.release()
	third := mustGet(t, acquireAsync(context.Background(), l))
	wantWaited(t, "a request after the wait", third, 0)
	third.release()
}

// TestWaitedCountsTheWaitersAheadAndTheConcurrency: behind a request
// holding the only permit, each waiter names concurrency and the waiters
// that were ahead of it when it joined.
func TestWaitedCountsTheWaitersAheadAndTheConcurrency(t *testing.T) {
	l, _ := testLane(1, 10)
	first := mustGet(t, acquireAsync(context.Background(), l))
	chans := make([]<-chan result, 3)
	for i := range chans {
		chans[i] = acquireAsync(context.Background(), l)
		waitQueued(t, l, i+1)
	}
	first.release()
	for i, ch := range chans {
		s := mustGet(t, ch)
		wantWaited(t, "waiter", s, i, "concurrency")
		s.release()
	}
}

// TestWaitedNamesThePauseAndARetrysPlace: requests refused for the rate
// wait out the pause, a retry keeps its place (the retry that came
// second has the first ahead of it, not the waiter that came after it),
// and a request that came during the pause names it too.
func TestWaitedNamesThePauseAndARetrysPlace(t *testing.T) {
	l, fc := testLane(2, 10)
	a := mustGet(t, acquireAsync(context.Background(), l))
	b := mustGet(t, acquireAsync(context.Background(), l))
	later := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	until := fc.Now().Add(5 * time.Second)
	a.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: until})
	b.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: until})
	retried := make(chan error, 2)
	go func() { retried <- a.WaitRetry(context.Background(), 0) }()
	waitQueued(t, l, 2)
	go func() { retried <- b.WaitRetry(context.Background(), 0) }()
	waitQueued(t, l, 3)
	fc.Advance(5 * time.Second)
	for range 2 {
		if err := within(t, retried, "a retry still waits after the pause"); err != nil {
			t.Fatal(err)
		}
	}
	wantWaited(t, "the first retry", a, 0, "pause")
	wantWaited(t, "the second retry", b, 1, "pause")
	a.release()
	s := mustGet(t, later)
	wantWaited(t, "the request that came during the pause", s, 0, "pause", "concurrency")
	b.release()
	s.release()
}

// TestWaitedNamesTheLearnedPace: with one request left in the window
// the upstream stated, the next waits for the pace, not for a permit.
func TestWaitedNamesTheLearnedPace(t *testing.T) {
	l, fc := observedLane(t, 64, 1, headerparse.Limits{Requests: win(10, 1, at(time.Second))})
	first := mustGet(t, acquireAsync(context.Background(), l))
	wantWaited(t, "the request the window had room for", first, 0)
	next := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	fc.Advance(time.Second)
	s := mustGet(t, next)
	wantWaited(t, "the next", s, 0, "pace")
	first.release()
	s.release()
}

// TestWaitedNamesTheConfiguredPace: a route's configured 60 RPM, starts
// a second apart, holds the second request for the pace.
func TestWaitedNamesTheConfiguredPace(t *testing.T) {
	fc := clock.NewFake(t0)
	tbl := NewTable(TableConfig{Lane: Config{Concurrency: 8, Clock: fc},
		RouteLimits: map[string]limit.Limits{"": {RPM: 60}}})
	r := Request{Credential: "sk-gap", Path: "/v1/chat/completions", Model: "m"}
	first, err := tbl.Acquire(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan result, 1)
	go func() {
		s, err := tbl.Acquire(context.Background(), r)
		next <- result{s, err}
	}()
	waitFor(t, func() bool { return tbl.laneFor(NewKey("", "sk-gap", r.Path, "m")).State().Queued == 1 })
	fc.Advance(time.Second)
	s := mustGet(t, next)
	wantWaited(t, "the request a gap behind", s, 0, "pace")
	first.Done(200, "ok", -1)
	s.Done(200, "ok", -1)
}

// TestWaitedNamesTheFirstAnswerAsConcurrency: a new limit sends one
// request until its first answer; the others wait for it as for a
// permit.
func TestWaitedNamesTheFirstAnswerAsConcurrency(t *testing.T) {
	fc := clock.NewFake(t0)
	l := newLane(Key{Path: "/v1/x"}, Config{Concurrency: 8, MaxConcurrency: 8, Clock: fc})
	first := mustGet(t, acquireAsync(context.Background(), l))
	next := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	accept(first, headerparse.Limits{Requests: win(100, 99, at(time.Minute))})
	s := mustGet(t, next)
	wantWaited(t, "the request behind the first", s, 0, "concurrency")
	first.release()
	s.release()
}

// TestWaitedNamesTheGlobalCap: a group whose limits let its request go
// but the cap does not waits for the cap.
func TestWaitedNamesTheGlobalCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tbl := capTable(1)
		busy, capped := tbl.laneFor(capKey(0)), tbl.laneFor(capKey(1))
		pastFirstAnswer(busy)
		pastFirstAnswer(capped)
		holder, err := busy.acquire(context.Background(), 1, High)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan result, 1)
		go func() {
			s, err := capped.acquire(context.Background(), 1, High)
			got <- result{s, err}
		}()
		synctest.Wait()
		holder.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		holder.release()
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		wantWaited(t, "the capped request", r.s, 0, "cap")
		r.s.release()
	})
}

// TestWaitedNamesTheModelGate: a request for another model than the one
// a local route's server holds waits at the gate; one for the loaded
// model does not.
func TestWaitedNamesTheModelGate(t *testing.T) {
	tb := NewTable(TableConfig{LocalRoutes: map[string]time.Duration{"local": time.Hour}})
	gate := tb.gates["local"]
	a, err := tb.Acquire(context.Background(), Request{Route: "local", Path: "/v1/chat/completions", Model: "a"})
	if err != nil {
		t.Fatal(err)
	}
	wantWaited(t, "the loaded model's request", a, 0)
	got := make(chan result, 1)
	go func() {
		s, err := tb.Acquire(context.Background(), Request{Route: "local", Path: "/v1/chat/completions", Model: "b"})
		got <- result{s, err}
	}()
	waitFor(t, func() bool { return gate.Stats().Waiting == 1 })
	a.Done(200, "ok", -1)
	b := mustGet(t, got)
	wantWaited(t, "the other model's request", b, 0, "model_gate")
	b.Done(200, "ok", -1)
}

// TestWaitedCountsTheWaitersAheadInItsClientsQueue: a request naming a
// client counts the waiters ahead of it in its client's queue, not the
// other clients' it takes turns with.
func TestWaitedCountsTheWaitersAheadInItsClientsQueue(t *testing.T) {
	tb := NewTable(TableConfig{Lane: Config{Concurrency: 1, MinConcurrency: 1, MaxConcurrency: 1}})
	r := Request{Credential: "sk-clients", Path: "/v1/chat/completions", Model: "m"}
	key := NewKey("", "sk-clients", r.Path, "m")
	pastFirstAnswer(tb.laneFor(key))
	first, err := tb.Acquire(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]chan *Slot{}
	for i, name := range []string{"a", "a", "b", "a"} {
		id := fmt.Sprintf("%s%d", name, i)
		got[id] = make(chan *Slot, 1)
		go func() {
			cr := r
			cr.Client = name
			s, err := tb.Acquire(context.Background(), cr)
			if err != nil {
				t.Error(err)
			}
			got[id] <- s
		}()
		waitFor(t, func() bool { return tb.laneFor(key).State().Queued == i+1 })
	}
	first.Done(200, "ok", -1)
	for _, want := range []struct {
		id    string
		ahead int
	}{{"a0", 0}, {"b2", 0}, {"a1", 1}, {"a3", 2}} {
		var s *Slot
		select {
		case s = <-got[want.id]:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s was not granted", want.id)
		}
		wantWaited(t, want.id, s, want.ahead, "concurrency")
		s.Done(200, "ok", -1)
	}
}
