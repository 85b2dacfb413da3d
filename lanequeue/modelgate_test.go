package lanequeue

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

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
