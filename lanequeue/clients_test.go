package lanequeue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// turnsLane is a lane of concurrency 1 whose grants a test follows one by
// one: each waiter is queued under a label, and each release lets exactly
// one of them go.
type turnsLane struct {
	t      *testing.T
	l      *Lane
	fc     *clock.Fake
	queued int
	got    chan labelled
}

type labelled struct {
	label string
	s     *Slot
	err   error
}

func newTurnsLane(t *testing.T) *turnsLane {
	l, fc := testLane(1, 100)
	return &turnsLane{t: t, l: l, fc: fc, got: make(chan labelled, 100)}
}

// queue starts an acquire as client at priority p and waits until the lane
// counts it, so that the waiters arrive in the order they are queued.
func (q *turnsLane) queue(ctx context.Context, client string, p Priority, label string) {
	q.t.Helper()
	go func() {
		s, err := q.l.acquireAs(ctx, 1, p, client, 0)
		q.got <- labelled{label, s, err}
	}()
	q.queued++
	waitQueued(q.t, q.l, q.queued)
}

// next is the next waiter to return from its acquire.
func (q *turnsLane) next() labelled {
	q.t.Helper()
	select {
	case g := <-q.got:
		q.queued--
		return g
	case <-time.After(5 * time.Second):
		q.t.Fatal("no waiter was granted")
	}
	return labelled{}
}

// drain releases held, then each waiter granted after it, n times over, and
// returns their labels in the order they were granted.
func (q *turnsLane) drain(held *Slot, n int) []string {
	q.t.Helper()
	var order []string
	for range n {
		held.release()
		g := q.next()
		if g.err != nil {
			q.t.Fatalf("%s: %v", g.label, g.err)
		}
		order = append(order, g.label)
		held = g.s
	}
	held.release()
	return order
}

func wantOrder(t *testing.T, got []string, want string) {
	t.Helper()
	if g := strings.Join(got, " "); g != want {
		t.Fatalf("granted in the order %s, want %s", g, want)
	}
}

// TestClientsTakeTurnsByRequest: the clients with waiters take turns, one
// dispatch each, in the order they came to wait; each client's requests
// go in the order they arrived; the requests that name no client are one
// client of their own; a client that comes later waits one round at most.
func TestClientsTakeTurnsByRequest(t *testing.T) {
	q := newTurnsLane(t)
	held := mustGet(t, acquireAsync(context.Background(), q.l))
	ctx := context.Background()
	for _, w := range []struct{ client, label string }{
		{"a", "a1"}, {"a", "a2"}, {"a", "a3"}, {"a", "a4"},
		{"", "n1"}, {"", "n2"},
		{"b", "b1"}, {"b", "b2"},
		{"c", "c1"},
	} {
		q.queue(ctx, w.client, High, w.label)
	}
	wantOrder(t, q.drain(held, 9), "a1 n1 b1 c1 a2 n2 b2 a3 a4")
}

// TestALaneNoRequestNamesAClientOfIsOneFIFO: without names every request
// goes in the order it arrived, and the lane shows no clients.
func TestALaneNoRequestNamesAClientOfIsOneFIFO(t *testing.T) {
	q := newTurnsLane(t)
	held := mustGet(t, acquireAsync(context.Background(), q.l))
	for i := range 5 {
		q.queue(context.Background(), "", High, fmt.Sprint(i))
	}
	if cs := q.l.State().Clients; cs != nil {
		t.Fatalf("clients %+v on a lane no request named one on", cs)
	}
	wantOrder(t, q.drain(held, 5), "0 1 2 3 4")
}

// TestClientsTakeTurnsWithinThePriorityClasses: high-priority requests go
// ahead, the low ones keep one dispatch in lowShare, and within each class
// the clients take turns of their own.
func TestClientsTakeTurnsWithinThePriorityClasses(t *testing.T) {
	q := newTurnsLane(t)
	held := mustGet(t, acquireAsync(context.Background(), q.l))
	ctx := context.Background()
	for _, w := range []struct {
		client string
		p      Priority
		label  string
	}{
		{"c", Low, "c1"}, {"c", Low, "c2"},
		{"a", High, "a1"}, {"a", High, "a2"}, {"a", High, "a3"},
		{"b", High, "b1"}, {"b", High, "b2"}, {"b", High, "b3"},
		{"d", Low, "d1"},
	} {
		q.queue(ctx, w.client, w.p, w.label)
	}
	wantOrder(t, q.drain(held, 9), "a1 b1 a2 c1 b2 a3 b3 d1 c2")
}

// TestARetryGoesBeforeEveryLaterArrival: a request waiting to retry goes
// before every waiter of its class that arrived after it, whichever
// client's turn it is, and the turn stays where it was; one that arrived
// after the first waiter of the client whose turn it is waits for its own
// client's turn.
func TestARetryGoesBeforeEveryLaterArrival(t *testing.T) {
	ctx := context.Background()
	t.Run("older than the turn's", func(t *testing.T) {
		q := newTurnsLane(t)
		a1, err := q.l.acquireAs(ctx, 1, High, "a", 0)
		if err != nil {
			t.Fatal(err)
		}
		q.queue(ctx, "b", High, "b1")
		q.queue(ctx, "a", High, "a2")
		q.queue(ctx, "b", High, "b2")
		// a1 was refused: the lane pauses, a1 waits to retry.
		pause(q.l, q.fc.Now().Add(time.Second))
		retried := make(chan error, 1)
		go func() { retried <- a1.WaitRetry(ctx, 0) }()
		waitQueued(t, q.l, 4)
		q.fc.Advance(time.Second) // b's turn, but a1 came first
		mustReturn(t, retried)
		wantOrder(t, q.drain(a1, 3), "b1 a2 b2")
	})
	t.Run("younger than the turn's", func(t *testing.T) {
		q := newTurnsLane(t)
		held := mustGet(t, acquireAsync(ctx, q.l))
		for _, w := range []struct{ client, label string }{{"b", "b1"}, {"b", "b2"}, {"a", "a1"}, {"b", "b3"}} {
			q.queue(ctx, w.client, High, w.label)
		}
		wantOrder(t, q.drain(held, 1), "b1") // b1 goes, a's turn: a1 goes
		a1 := q.next()
		if a1.label != "a1" {
			t.Fatalf("%s went, want a1", a1.label)
		}
		pause(q.l, q.fc.Now().Add(time.Second))
		retried := make(chan error, 1)
		go func() { retried <- a1.s.WaitRetry(ctx, 0) }()
		waitQueued(t, q.l, 3)
		q.fc.Advance(time.Second) // b's turn, and b2 came before a1
		b2 := q.next()
		if b2.label != "b2" {
			t.Fatalf("%s went, want b2", b2.label)
		}
		select {
		case err := <-retried:
			t.Fatalf("the retry went before b2 was done: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		b2.s.release() // a's turn
		mustReturn(t, retried)
		wantOrder(t, q.drain(a1.s, 1), "b3")
		if c := clientNamed(q.l, "a"); c.Dispatched != 2 {
			t.Fatalf("a dispatched %d, want 2 (a1 and its retry)", c.Dispatched)
		}
	})
}

// mustReturn waits for a wait's error, which must be nil.
func mustReturn(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end")
	}
}

// clientNamed is the lane's client named name as State shows it.
func clientNamed(l *Lane, name string) ClientState {
	for _, c := range l.State().Clients {
		if c.Name == name {
			return c
		}
	}
	return ClientState{Name: "(missing " + name + ")", Queued: -1, Dispatched: -1}
}

// TestAClientThatLeavesPassesItsTurnOn: a waiter whose client goes away
// leaves its client's queue at once; when it was the last of the client
// whose turn came next, the turn passes to the client after it, and the
// client, with nothing left in the lane, may be forgotten.
func TestAClientThatLeavesPassesItsTurnOn(t *testing.T) {
	q := newTurnsLane(t)
	held := mustGet(t, acquireAsync(context.Background(), q.l))
	ctx, cancel := context.WithCancel(context.Background())
	q.queue(context.Background(), "a", High, "a1")
	q.queue(ctx, "b", High, "b1")
	q.queue(context.Background(), "c", High, "c1")
	q.queue(context.Background(), "a", High, "a2")
	held.release()
	a1 := q.next() // b's turn next
	cancel()
	if g := q.next(); g.label != "b1" || !errors.Is(g.err, context.Canceled) {
		t.Fatalf("%s returned %v, want b1 cancelled", g.label, g.err)
	}
	if b := clientNamed(q.l, "b"); b.Queued != 0 {
		t.Fatalf("b still has %d queued", b.Queued)
	}
	q.l.g.mu.Lock()
	live := q.l.named["b"].live
	q.l.g.mu.Unlock()
	if live != 0 {
		t.Fatalf("b counts %d requests in the lane, want 0", live)
	}
	wantOrder(t, q.drain(a1.s, 2), "c1 a2")
}

// TestLateWaitersOfEveryClientAreRefused: a pause that outlasts waiters'
// deadlines turns away each of them at once, whichever client and class
// they wait in, and leaves the others waiting.
func TestLateWaitersOfEveryClientAreRefused(t *testing.T) {
	q := newTurnsLane(t)
	held := mustGet(t, acquireAsync(context.Background(), q.l))
	late, cancel := context.WithDeadline(context.Background(), t0.Add(30*time.Second))
	defer cancel()
	q.queue(late, "a", High, "a1")
	q.queue(late, "b", High, "b1")
	q.queue(context.Background(), "b", High, "b2")
	q.queue(late, "c", High, "c1")
	q.queue(late, "d", Low, "d1")
	q.queue(late, "e", Low, "e1")
	report(held, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: at(time.Minute)})
	var refused []string
	for range 5 {
		g := q.next()
		if !errors.Is(g.err, ErrDeadlineExceeded) {
			t.Fatalf("%s: %v, want refused", g.label, g.err)
		}
		refused = append(refused, g.label)
	}
	slices.Sort(refused)
	wantOrder(t, refused, "a1 b1 c1 d1 e1")
	if st := q.l.State(); st.Queued != 1 || clientNamed(q.l, "b").Queued != 1 {
		t.Fatalf("queued %d (b: %d), want b2 alone", st.Queued, clientNamed(q.l, "b").Queued)
	}
	held.release()
	q.fc.Advance(time.Minute)
	q.next().s.release()
}

// TestALaneKeepsAtMostMaxClientsApart: past maxClients names with
// something in the lane, further names share one turn, shown as
// othersClient; a new name takes the place of the least recent client with
// nothing left in the lane.
func TestALaneKeepsAtMostMaxClientsApart(t *testing.T) {
	q := newTurnsLane(t)
	l := q.l
	name := func(i int) string { return fmt.Sprintf("n%02d", i) }
	l.g.mu.Lock()
	for i := range maxClients {
		l.clientOf(name(i), uint64(i+1)) // each with a request in flight
	}
	x, y := l.clientOf("x", 100), l.clientOf("y", 101)
	l.g.mu.Unlock()
	if x != l.others || y != x || x.name != othersClient {
		t.Fatalf("names past the bound: %q and %q, want both %q", x.name, y.name, othersClient)
	}
	if cs := l.State().Clients; len(cs) != maxClients+2 || !slices.ContainsFunc(cs, func(c ClientState) bool { return c.Name == othersClient }) {
		t.Fatalf("%d clients shown, want the unnamed, %d named and %q", len(cs), maxClients, othersClient)
	}

	held := mustGet(t, acquireAsync(context.Background(), l))
	q.queue(context.Background(), "x", High, "x1")
	q.queue(context.Background(), name(0), High, "n00")
	q.queue(context.Background(), "x", High, "x2")
	q.queue(context.Background(), "y", High, "y1")
	wantOrder(t, q.drain(held, 4), "x1 n00 x2 y1") // x and y in one turn

	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	l.named[name(5)].live, l.named[name(3)].live = 0, 0 // their requests are done
	for _, c := range []struct{ name, gone string }{{"z", name(3)}, {"w", name(5)}} {
		if got := l.clientOf(c.name, 200); got == l.others || l.named[c.gone] != nil || len(l.named) != maxClients {
			t.Fatalf("%s: shares the others' turn %v, %s still known %v, %d known", c.name, got == l.others, c.gone, l.named[c.gone] != nil, len(l.named))
		}
	}
	if l.clientOf("v", 300) != l.others {
		t.Fatal("a name past the bound got a turn of its own with every client busy")
	}
}

// TestStateShowsEachClient: once a request names a client, the lane's
// state shows every client by name, with its waiters, its dispatches and
// how long its oldest waiter, of either class, has waited.
func TestStateShowsEachClient(t *testing.T) {
	q := newTurnsLane(t)
	held := mustGet(t, acquireAsync(context.Background(), q.l))
	q.queue(context.Background(), "a", Low, "a1")
	q.fc.Advance(2 * time.Second)
	q.queue(context.Background(), "a", High, "a2")
	q.queue(context.Background(), "b", High, "b1")
	q.fc.Advance(time.Second)
	want := []ClientState{
		{Name: "", Dispatched: 1},
		{Name: "a", Queued: 2, OldestWaitSeconds: 3},
		{Name: "b", Queued: 1, OldestWaitSeconds: 1},
	}
	if got := q.l.State().Clients; !slices.Equal(got, want) {
		t.Fatalf("clients %+v, want %+v", got, want)
	}
	held.release()
	a2 := q.next()
	want[1] = ClientState{Name: "a", Queued: 1, Dispatched: 1, OldestWaitSeconds: 3}
	if got := q.l.State().Clients; a2.label != "a2" || !slices.Equal(got, want) {
		t.Fatalf("after %s went: clients %+v, want %+v", a2.label, got, want)
	}
	wantOrder(t, q.drain(a2.s, 2), "b1 a1")
}
