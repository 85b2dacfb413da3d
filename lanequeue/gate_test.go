package lanequeue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// TestHighPriorityWaitsOneDispatchBehindADeepLowQueue: 1,000 batch
// requests queue in a lane that sends one at a time, 100 ms each; an
// interactive request arriving behind them goes after the one in flight,
// not after the queue.
func TestHighPriorityWaitsOneDispatchBehindADeepLowQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{Concurrency: 1}).laneFor(ckey)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		serve := func(p Priority, done func()) {
			defer wg.Done()
			s, err := l.acquire(ctx, 1, p)
			if err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
			done()
		}
		var lowDone atomic.Int64
		for range 1000 {
			wg.Add(1)
			go serve(Low, func() { lowDone.Add(1) })
			synctest.Wait()
		}
		time.Sleep(250 * time.Millisecond) // mid-way through the third
		arrived := time.Now()
		var waited time.Duration
		finished := make(chan struct{})
		go func() {
			s, err := l.acquire(ctx, 1, High)
			if err != nil {
				t.Error(err)
				return
			}
			waited = time.Since(arrived)
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
			close(finished)
		}()
		<-finished
		if waited > 100*time.Millisecond {
			t.Errorf("the high-priority request waited %v behind %d low ones, want at most one dispatch (100ms)", waited, 1000-lowDone.Load())
		}
		if st := l.State(); st.QueuedLow < 990 || st.GroupQueued != st.QueuedLow {
			t.Errorf("group_queued %d, group_queued_low %d: want the low queue in both", st.GroupQueued, st.QueuedLow)
		}
		cancel()
	})
}

// TestLowPriorityKeepsItsShare: with both classes queued deep, one
// dispatch in lowShare goes to a low-priority request.
func TestLowPriorityKeepsItsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{Concurrency: 1}).laneFor(ckey)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		var mu sync.Mutex
		var order []Priority
		for i := range 200 {
			p := High
			if i%2 == 1 {
				p = Low
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := l.acquire(ctx, 1, p)
				if err != nil {
					return
				}
				mu.Lock()
				order = append(order, p)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
				s.release()
			}()
			synctest.Wait()
		}
		time.Sleep(800 * time.Millisecond) // 80 dispatches
		mu.Lock()
		got := append([]Priority(nil), order[:80]...)
		mu.Unlock()
		cancel()
		lows := 0
		for _, p := range got[1:] { // the first went before anything queued
			if p == Low {
				lows++
			}
		}
		if lows < 19 || lows > 20 {
			t.Errorf("%d of 79 dispatches went to low-priority requests, want one in %d (19-20)", lows, lowShare)
		}
	})
}

// capTable is a table of lanes of concurrency 8 under a global cap of n.
func capTable(n int) *Table {
	return NewTable(TableConfig{Lane: Config{Concurrency: 8}, GlobalConcurrency: n})
}

func capKey(i int) Key {
	return Key{CredentialHash: HashCredential(fmt.Sprintf("sk-%d", i)), Path: "/v1/chat/completions", Model: "m"}
}

// TestCapIsNeverExceededAndServesGroupsInOrder: 50 lanes of 4 requests
// each under a cap of 3: never more than 3 dispatched at once, the cap
// used in full, and the groups served in the order they came.
func TestCapIsNeverExceededAndServesGroupsInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tbl := capTable(3)
		c := tbl.cap
		var in, most atomic.Int64
		first := make([]time.Time, 50)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for k := range 50 {
			l := tbl.laneFor(capKey(k))
			pastFirstAnswer(l)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := l.acquire(context.Background(), 1, High)
					if err != nil {
						t.Error(err)
						return
					}
					n := in.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					mu.Lock()
					if first[k].IsZero() {
						first[k] = time.Now()
					}
					mu.Unlock()
					time.Sleep(10 * time.Millisecond)
					in.Add(-1)
					s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
					s.release()
				}()
			}
			synctest.Wait()
		}
		begin := time.Now()
		wg.Wait()
		if most.Load() != 3 || c.Stats().Most != 3 {
			t.Errorf("most in flight %d (stats %d), want 3", most.Load(), c.Stats().Most)
		}
		// 200 requests, 3 at a time, 10 ms each: 67 rounds.
		if took := time.Since(begin); took > 670*time.Millisecond {
			t.Errorf("took %v, want 670ms: the cap was not used in full", took)
		}
		for k := 1; k < 50; k++ {
			if first[k].Before(first[k-1]) {
				t.Fatalf("lane %d was served before lane %d, which came first", k, k-1)
			}
		}
		if st := c.Stats(); st.InUse != 0 || st.Waiting != 0 {
			t.Errorf("after all: %+v", st)
		}
	})
}

// TestCapIsNotHeldByAPausedLane: a lane paused by a refusal holds no
// place of the cap while it waits; the other lane gets them all.
func TestCapIsNotHeldByAPausedLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tbl := capTable(2)
		c := tbl.cap
		paused, busy := tbl.laneFor(capKey(0)), tbl.laneFor(capKey(1))
		pastFirstAnswer(paused)
		pastFirstAnswer(busy)
		s, err := paused.acquire(context.Background(), 1, High)
		if err != nil {
			t.Fatal(err)
		}
		s.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: time.Now().Add(5 * time.Second)})
		retried := make(chan error, 1)
		go func() { retried <- s.WaitRetry(context.Background(), 0) }()
		synctest.Wait()
		if st := c.Stats(); st.InUse != 0 {
			t.Fatalf("the paused lane holds %d places", st.InUse)
		}
		begin := time.Now()
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := busy.acquire(context.Background(), 1, High)
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(100 * time.Millisecond)
				s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
				s.release()
			}()
		}
		wg.Wait()
		// 1 s, and a few ms of slow start's spreading: a place held by
		// the paused lane would make it 2 s.
		if took := time.Since(begin); took > 1100*time.Millisecond {
			t.Errorf("20 requests of 100 ms, 2 at a time, took %v beside the paused lane, want 1s", took)
		}
		if err := <-retried; err != nil {
			t.Fatal(err)
		}
		if time.Since(begin) < 5*time.Second-time.Second {
			t.Errorf("the paused request went before its pause ended")
		}
		s.release()
	})
}

// TestCapLineMovesOnWhenAGroupGivesUp: a group waiting in the cap's line
// whose request gives up leaves the line; the next group gets the place.
func TestCapLineMovesOnWhenAGroupGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tbl := capTable(1)
		c := tbl.cap
		a, b, d := tbl.laneFor(capKey(0)), tbl.laneFor(capKey(1)), tbl.laneFor(capKey(2))
		for _, l := range []*Lane{a, b, d} {
			pastFirstAnswer(l)
		}
		sa, _ := a.acquire(context.Background(), 1, High)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		gaveUp := make(chan error, 1)
		go func() {
			_, err := b.acquire(ctx, 1, High)
			gaveUp <- err
		}()
		synctest.Wait()
		got := make(chan *Slot, 1)
		go func() {
			s, err := d.acquire(context.Background(), 1, High)
			if err == nil {
				got <- s
			}
		}()
		synctest.Wait()
		if st := c.Stats(); st.Waiting != 2 {
			t.Errorf("%d groups in line, want 2", st.Waiting)
		}
		if err := <-gaveUp; !errors.Is(err, ErrDeadlineExceeded) {
			t.Errorf("err = %v, want ErrDeadlineExceeded", err)
		}
		sa.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		sa.release()
		sd := <-got
		sd.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		sd.release()
		synctest.Wait()
		if st := c.Stats(); st.InUse != 0 || st.Waiting != 0 {
			t.Errorf("after all: %+v", st)
		}
	})
}

// gateRun sends the models in order, one request each, arriving every
// arrive apart; each is served for serve once it enters. It returns the
// gate and the most distinct models in flight at once.
func gateRun(t *testing.T, g *modelGate, models []string, arrive, serve time.Duration) int {
	t.Helper()
	var mu sync.Mutex
	in := map[string]int{}
	most := 0
	var wg sync.WaitGroup
	for _, m := range models {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leave, _, err := g.enter(context.Background(), m)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			in[m]++
			most = max(most, len(in))
			mu.Unlock()
			time.Sleep(serve)
			mu.Lock()
			if in[m]--; in[m] == 0 {
				delete(in, m)
			}
			mu.Unlock()
			leave()
			leave()
		}()
		if arrive > 0 {
			time.Sleep(arrive)
		} else {
			synctest.Wait()
		}
	}
	wg.Wait()
	return most
}

// TestModelGateServesOneModelAtATime: 300 requests interleaving three
// models, all queued at once: one model in flight at a time, two swaps,
// and arrival order's 299 model changes avoided but two.
func TestModelGateServesOneModelAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newModelGate(30*time.Second, nil)
		var models []string
		for i := range 300 {
			models = append(models, []string{"a", "b", "c"}[i%3])
		}
		if most := gateRun(t, g, models, 0, 100*time.Millisecond); most != 1 {
			t.Errorf("%d models in flight at once, want 1", most)
		}
		st := g.Stats()
		if st.Loads != 3 || st.Swaps != 2 || st.SwapsAvoided != 297 {
			t.Errorf("stats %+v, want 3 loads, 2 swaps, 297 avoided", st)
		}
		if st.InFlight != 0 || st.Waiting != 0 {
			t.Errorf("left over: %+v", st)
		}
	})
}

// TestModelGateFairnessBound: a model that keeps being asked for holds
// the server until another model's request has waited the bound; then
// it drains and the other goes: one swap per bound, not per request.
func TestModelGateFairnessBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newModelGate(5*time.Second, nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// A stream of "a" requests, a new one every 100 ms, each 300 ms.
		go func() {
			for ctx.Err() == nil {
				go func() {
					leave, _, err := g.enter(ctx, "a")
					if err == nil {
						time.Sleep(300 * time.Millisecond)
						leave()
					}
				}()
				time.Sleep(100 * time.Millisecond)
			}
		}()
		time.Sleep(time.Second)
		asked := time.Now()
		leave, _, err := g.enter(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		waited := time.Since(asked)
		st := g.Stats()
		leave()
		// The bound, then the 300 ms answers in flight.
		if waited < 5*time.Second || waited > 5300*time.Millisecond {
			t.Errorf("b waited %v, want the 5s bound and the drain", waited)
		}
		if st.Swaps != 1 || st.Loaded != "b" {
			t.Errorf("stats as b entered %+v, want b loaded by the first swap", st)
		}
		synctest.Wait()
		if st := g.Stats(); st.Swaps != 2 || st.Loaded != "a" {
			t.Errorf("stats after b %+v, want a back, 2 swaps", st)
		}
		cancel()
		time.Sleep(time.Second)
	})
}

// TestModelGateWaiterThatGivesUp: a request that gives up waiting for its
// model leaves no trace; the gate still swaps for the others.
func TestModelGateWaiterThatGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newModelGate(time.Minute, nil)
		leaveA, _, _ := g.enter(context.Background(), "a")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, _, err := g.enter(ctx, "b"); !errors.Is(err, ErrDeadlineExceeded) {
			t.Errorf("err = %v, want ErrDeadlineExceeded", err)
		}
		entered := make(chan struct{})
		go func() {
			leave, _, err := g.enter(context.Background(), "c")
			if err == nil {
				close(entered)
				leave()
			}
		}()
		synctest.Wait()
		leaveA()
		<-entered
		if st := g.Stats(); st.Loaded != "c" || st.Swaps != 1 || st.Waiting != 0 {
			t.Errorf("stats %+v, want c loaded after 1 swap", st)
		}
	})
}

// TestCapLetsEveryWaitingGroupInWhenSeveralPlacesFree: three places free
// at one instant go to the three groups in line, not only the first.
func TestCapLetsEveryWaitingGroupInWhenSeveralPlacesFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tbl := capTable(3)
		c := tbl.cap
		var held []*Slot
		for k := range 3 {
			l := tbl.laneFor(capKey(k))
			pastFirstAnswer(l)
			s, err := l.acquire(context.Background(), 1, High)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, s)
		}
		got := make(chan *Slot, 3)
		for k := 3; k < 6; k++ {
			l := tbl.laneFor(capKey(k))
			pastFirstAnswer(l)
			go func() {
				if s, err := l.acquire(context.Background(), 1, High); err == nil {
					got <- s
				}
			}()
			synctest.Wait()
		}
		if st := c.Stats(); st.Waiting != 3 || st.InUse != 3 {
			t.Fatalf("before: %+v, want 3 in use and 3 groups in line", st)
		}
		for _, s := range held {
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		}
		synctest.Wait()
		if st := c.Stats(); st.InUse != 3 || st.Waiting != 0 || len(got) != 3 {
			t.Fatalf("after three places freed: %+v, %d granted; want all three groups in", st, len(got))
		}
		for range 3 {
			s := <-got
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		}
	})
}

// TestModelGateDefaultsAndAStaleFairnessTimer: a zero fairness bound is
// the default; a bound that passes after the waiter it was set for gave
// up, with nothing in flight, changes nothing.
func TestModelGateDefaultsAndAStaleFairnessTimer(t *testing.T) {
	if f := newModelGate(0, nil).Stats().FairnessSeconds; f != DefaultFairness.Seconds() {
		t.Errorf("fairness %vs, want the default %v", f, DefaultFairness)
	}
	synctest.Test(t, func(t *testing.T) {
		g := newModelGate(time.Second, nil)
		leaveA, _, _ := g.enter(context.Background(), "a")
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if _, _, err := g.enter(ctx, "b"); err == nil {
			t.Fatal("b entered while a was in flight")
		}
		time.Sleep(200 * time.Millisecond)
		leaveA()
		time.Sleep(time.Second) // the bound passes: nothing waits, nothing is in flight
		leave, _, err := g.enter(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		leave()
		if st := g.Stats(); st.Swaps != 0 || st.Loaded != "a" {
			t.Errorf("stats %+v, want a still loaded, no swap", st)
		}
	})
}

// TestCapLineMovesOnWhenTheFirstGroupCannotGo: the first group in line is
// given a freed place but has been paused meanwhile (a 429 to one of its
// requests); it leaves the line and the place goes to the next group.
func TestCapLineMovesOnWhenTheFirstGroupCannotGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tbl := capTable(2)
		c := tbl.cap
		b, d := tbl.laneFor(capKey(0)), tbl.laneFor(capKey(1))
		pastFirstAnswer(b)
		pastFirstAnswer(d)
		b1, _ := b.acquire(context.Background(), 1, High)
		b2, _ := b.acquire(context.Background(), 1, High)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go b.acquire(ctx, 1, High) // b's third waits in line, first
		synctest.Wait()
		dGot := make(chan *Slot, 1)
		go func() {
			if s, err := d.acquire(context.Background(), 1, High); err == nil {
				dGot <- s
			}
		}()
		synctest.Wait()
		// b1 is refused with a 5 s pause and waits to retry: its place
		// frees, b is first in line but paused.
		b1.Report(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: time.Now().Add(5 * time.Second)})
		retried := make(chan error, 1)
		go func() { retried <- b1.WaitRetry(ctx, 0) }()
		synctest.Wait()
		select {
		case s := <-dGot:
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		default:
			t.Fatalf("the freed place did not go to the next group in line: %+v", c.Stats())
		}
		cancel()
		<-retried // a slot is used by one goroutine at a time
		b2.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		b2.release()
		b1.release()
		synctest.Wait()
	})
}
