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
