package lanequeue

import (
	"context"
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
