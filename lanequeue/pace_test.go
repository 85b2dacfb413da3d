package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// acquireCostAsync is acquireAsync for a request of the given token cost.
func acquireCostAsync(ctx context.Context, l *Lane, cost int64) <-chan result {
	ch := make(chan result, 1)
	go func() {
		s, err := l.acquire(ctx, cost, High)
		ch <- result{s, err}
	}()
	return ch
}

// observedLane returns a lane whose pacing learned lim from the answer to a
// first request (cost cost) dispatched at t0, which is released.
func observedLane(t *testing.T, conc int, cost int64, lim headerparse.Limits) (*Lane, *clock.Fake) {
	t.Helper()
	l, fc := testLane(conc, 1000)
	s := mustGet(t, acquireCostAsync(context.Background(), l, cost))
	accept(s, lim)
	s.release()
	return l, fc
}

func TestLanePacesQueuedRequestsAtLearnedRate(t *testing.T) {
	// 10 a second, 1 left, full again in 1s: 9/s after the first.
	l, fc := observedLane(t, 64, 1, headerparse.Limits{Requests: win(10, 1, at(time.Second))})
	const n = 50
	chans := make([]<-chan result, n)
	for i := range chans {
		chans[i] = acquireAsync(context.Background(), l)
	}
	waitQueued(t, l, n-1)
	granted := func() int64 { return l.State().Admitted - 1 } // less observedLane's request
	if g := granted(); g != 1 {
		t.Fatalf("granted at once = %d, want 1", g)
	}
	// Grants fall at k/9 s; checking at +0.5s and then every second stays
	// clear of those instants.
	steps := []struct {
		advance time.Duration
		want    int64 // granted in this step
	}{
		{500 * time.Millisecond, 4},
		{time.Second, 9}, {time.Second, 9}, {time.Second, 9}, {time.Second, 9}, {time.Second, 9},
	}
	total := granted()
	for i, st := range steps {
		fc.Advance(st.advance)
		g := granted()
		if g-total != st.want {
			t.Fatalf("step %d (to +%v): granted %d, want %d", i, fc.Now().Sub(t0), g-total, st.want)
		}
		if st := l.State(); st.InFlight != int(g) || st.Queued != n-int(g) {
			t.Fatalf("step %d: state %+v after %d grants", i, st, g)
		}
		total = g
	}
	if total != n {
		t.Fatalf("granted %d, want all %d", total, n)
	}
	for _, ch := range chans {
		mustGet(t, ch).release()
	}
}

func TestLaneRequestAndTokenWindowsHaveSeparateClocks(t *testing.T) {
	tests := []struct {
		name string
		lim  headerparse.Limits
		cost int64
		// the other window's reset, which must not release the lane
		otherReset time.Duration
		// when the exhausted window allows the next request
		goAt time.Duration
	}{
		{
			name: "tokens exhausted, requests plentiful",
			lim: headerparse.Limits{
				Requests: win(100, 50, at(time.Second)),
				Tokens:   win(1000, 0, at(5*time.Second)),
			},
			cost:       1000,
			otherReset: time.Second,
			goAt:       5 * time.Second,
		},
		{
			name: "requests exhausted, tokens plentiful",
			lim: headerparse.Limits{
				Requests: win(1, 0, at(5*time.Second)),
				Tokens:   win(1000, 500, at(time.Second)),
			},
			cost:       1,
			otherReset: time.Second,
			goAt:       5 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, fc := observedLane(t, 8, tt.cost, tt.lim)
			ch := acquireCostAsync(context.Background(), l, tt.cost)
			waitQueued(t, l, 1)
			for _, d := range []time.Duration{tt.otherReset, tt.goAt - time.Millisecond} {
				fc.Set(at(d))
				if q := l.State().Queued; q != 1 {
					t.Fatalf("at +%v: queued = %d, want the request still waiting", d, q)
				}
			}
			mustBlock(t, ch)
			fc.Set(at(tt.goAt))
			s := mustGet(t, ch)
			if w := s.queueWait(); w != tt.goAt {
				t.Fatalf("queue wait = %v, want %v", w, tt.goAt)
			}
			s.release()
		})
	}
}

func TestLaneExhaustedWithoutResetWaitsForAnswer(t *testing.T) {
	// No reset and no rate: only an answer can tell more. A request whose
	// answer already came (still streaming) tells nothing new, so one more
	// goes to find out; the next waits for that one's answer.
	l, fc := testLane(8, 100)
	a := mustGet(t, acquireAsync(context.Background(), l))
	accept(a, headerparse.Limits{Requests: win(100, 0, time.Time{})})
	next := mustGet(t, acquireAsync(context.Background(), l))
	ch := acquireAsync(context.Background(), l)
	waitQueued(t, l, 1)
	fc.Advance(time.Hour)
	if q := l.State().Queued; q != 1 {
		t.Fatalf("queued = %d an hour on with an answer outstanding, want 1", q)
	}
	accept(next, headerparse.Limits{Requests: win(100, 50, time.Time{})})
	b := mustGet(t, ch)
	a.release()
	next.release()
	b.release()
}

// TestLaneNotHeldByAnswersAlreadyIn: requests still streaming after their
// answer's headers came do not hold the queue (a regression: the lane used
// to wait for any request in flight).
func TestLaneNotHeldByAnswersAlreadyIn(t *testing.T) {
	l, _ := testLane(8, 100)
	var streaming []*Slot
	for i := 0; i < 2; i++ {
		s := mustGet(t, acquireAsync(context.Background(), l))
		accept(s, headerparse.Limits{Requests: win(100, 0, time.Time{})})
		streaming = append(streaming, s)
	}
	// Both answered, both still in flight: the next request may go.
	mustGet(t, acquireAsync(context.Background(), l)).release()
	for _, s := range streaming {
		s.release()
	}
}

func TestPacingTimerStoppedWhenNobodyWaits(t *testing.T) {
	l, fc := observedLane(t, 8, 1, headerparse.Limits{Requests: win(10, 0, at(time.Hour))})
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, l)
	waitQueued(t, l, 1)
	if fc.Pending() == 0 {
		t.Fatal("no pacing timer armed for the waiter")
	}
	cancel()
	<-ch
	if n := fc.Pending(); n != 0 {
		t.Fatalf("%d timers still pending with an empty queue", n)
	}
}
