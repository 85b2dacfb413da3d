package lanequeue

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// firstAnswers sends one request on each lane, in order, and answers each
// with the remaining count remaining(i) of a window of 20 full in a second;
// it returns the slots, released.
func firstAnswers(t *testing.T, lanes []*Lane, remaining func(i int) int64) {
	t.Helper()
	var slots []*Slot
	for _, l := range lanes {
		slots = append(slots, mustGet(t, acquireAsync(context.Background(), l)))
	}
	for i, s := range slots {
		accept(s, headerparse.Limits{Requests: win(20, remaining(i), t0.Add(time.Second))})
		s.release()
	}
}

// TestModelsWhoseCountsMoveTogetherShareALimit: four models of one key
// each see the one window fall by what all four sent: the first answers
// already show it, and the lanes draw on one limit from then on, saying so.
func TestModelsWhoseCountsMoveTogetherShareALimit(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
	cred := HashCredential("sk-gateway")
	var lanes []*Lane
	for _, m := range []string{"gpt-a", "gpt-b", "gpt-c", "gpt-d"} {
		lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
	}
	// One window of 20: the i-th request to reach it leaves 19-i.
	firstAnswers(t, lanes, func(i int) int64 { return int64(19 - i) })
	one := limitOf(lanes[0])
	for i, l := range lanes {
		if limitOf(l) != one {
			t.Fatalf("lane %d draws on a limit of its own", i)
		}
	}
	st := lanes[1].State()
	if !slices.Equal(st.SharesLimitWith, []string{"gpt-a", "gpt-c", "gpt-d"}) || st.SharedBecause != "headers move together" {
		t.Fatalf("state says it shares with %v (%q)", st.SharesLimitWith, st.SharedBecause)
	}
	// Paced as one: the window the last answer showed (16 left) is the
	// group's, not each model's. (Each model's own budget would let 16
	// of its own go: 40 in all.)
	ctx, cancel := context.WithCancel(context.Background())
	var chs []<-chan result
	for i := range 40 {
		chs = append(chs, acquireAsync(ctx, lanes[i%4]))
	}
	deadline := time.Now().Add(5 * time.Second)
	for queuedIn(lanes)+grantedIn(lanes) < 40 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := grantedIn(lanes); n > 16 {
		t.Fatalf("%d sent against one window with 16 left", n)
	}
	cancel()
	for _, ch := range chs {
		if r := <-ch; r.err == nil {
			r.s.release()
		}
	}
}

// queuedIn and grantedIn count the lanes' waiters and permits held.
func queuedIn(lanes []*Lane) (n int) {
	for _, l := range lanes {
		l.g.mu.Lock()
		n += l.queued
		l.g.mu.Unlock()
	}
	return n
}

func grantedIn(lanes []*Lane) (n int) {
	for _, l := range lanes {
		l.g.mu.Lock()
		n += l.inFlight
		l.g.mu.Unlock()
	}
	return n
}

// TestModelsWithLimitsOfTheirOwnStayApart: each model's window falls by
// what that model sent alone: the limits stay apart.
func TestModelsWithLimitsOfTheirOwnStayApart(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
	cred := HashCredential("sk-own")
	var lanes []*Lane
	for _, m := range []string{"gpt-a", "gpt-b", "gpt-c"} {
		lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
	}
	for range 3 {
		firstAnswers(t, lanes, func(int) int64 { return 19 })
	}
	if limitOf(lanes[0]) == limitOf(lanes[1]) || limitOf(lanes[1]) == limitOf(lanes[2]) {
		t.Fatal("models with counts of their own were made to share a limit")
	}
	if st := lanes[0].State(); len(st.SharesLimitWith) > 0 {
		t.Fatalf("state says it shares with %v", st.SharesLimitWith)
	}
}

// TestAnotherClientOnTheKeyIsNotAnotherModel: a window that falls by more
// than this model sent while no other model of the key sent anything is
// another client's doing: nothing to share.
func TestAnotherClientOnTheKeyIsNotAnotherModel(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
	cred := HashCredential("sk-busy")
	a := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-a"})
	b := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-b"})
	firstAnswers(t, []*Lane{a}, func(int) int64 { return 10 })
	firstAnswers(t, []*Lane{b}, func(int) int64 { return 19 })
	firstAnswers(t, []*Lane{a}, func(int) int64 { return 2 })
	if limitOf(a) == limitOf(b) {
		t.Fatal("another client's use of the key made two models share a limit")
	}
}

// TestPerCredentialLimitIsOneFromTheStart: a route that says its models
// share one limit gives every model's lanes one limit at once.
func TestPerCredentialLimitIsOneFromTheStart(t *testing.T) {
	tb := NewTable(TableConfig{RouteLimits: map[string]Limits{"gw": {PerCredential: true}}})
	cred := HashCredential("sk-gw")
	a := tb.laneFor(Key{Route: "gw", CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-a"})
	b := tb.laneFor(Key{Route: "gw", CredentialHash: cred, Path: "/v1/embeddings", Model: "text-embed"})
	other := tb.laneFor(Key{Route: "gw", CredentialHash: HashCredential("sk-else"), Path: "/v1/chat/completions", Model: "gpt-a"})
	if limitOf(a) != limitOf(b) || limitOf(a) == limitOf(other) {
		t.Fatal("want one limit for the credential's models, another for another credential")
	}
	if st := a.State(); !slices.Equal(st.SharesLimitWith, []string{"text-embed"}) || st.SharedBecause != "configured" {
		t.Fatalf("state says it shares with %v (%q)", st.SharesLimitWith, st.SharedBecause)
	}
}

// TestLanesSharingALimitTakeTurns: a lane with two requests queued behind
// another's ten is not behind all ten: the lanes take turns.
func TestLanesSharingALimitTakeTurns(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{RouteLimits: map[string]Limits{"": {PerCredential: true, Concurrency: 1}},
		Lane: Config{Clock: fc}})
	cred := HashCredential("sk-turns")
	big := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "big"})
	small := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "small"})
	held := mustGet(t, acquireAsync(context.Background(), big))
	type grant struct {
		lane string
		s    *Slot
	}
	order := make(chan grant, 12)
	wait := func(l *Lane, name string) {
		go func() {
			s, err := l.acquire(context.Background(), 1, High)
			if err != nil {
				t.Error(err)
				return
			}
			order <- grant{name, s}
		}()
	}
	for range 10 {
		wait(big, "big")
	}
	waitQueued(t, big, 10)
	for range 2 {
		wait(small, "small")
	}
	waitQueued(t, small, 2)
	held.release()
	var got []string
	for range 12 {
		g := <-order
		got = append(got, g.lane)
		g.s.release()
	}
	// big's head went first (it was first in line); then turns.
	if pos := slices.Index(got, "small"); pos > 1 || slices.Index(got[pos+1:], "small") > 1 {
		t.Fatalf("order %v: small waited behind big's queue", got)
	}
}
