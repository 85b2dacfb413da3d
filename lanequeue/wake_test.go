package lanequeue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// nowShared refuses its first admissions "until now", an instant already
// come, and counts them.
type nowShared struct {
	*limit.Memory
	asked atomic.Int32
}

func (s *nowShared) Admit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	if s.asked.Add(1) <= 50 {
		return limit.Ticket{}, now, false
	}
	return s.Memory.Admit(now, cost, alone)
}

// TestADispatchThatLetsNobodyGoRunsAgainAMillisecondLater: a limit that
// holds its waiters until an instant already come is asked again minWake
// later, not at the same instant over and over (the dispatcher would spin
// and, on a simulated clock, time would never move).
func TestADispatchThatLetsNobodyGoRunsAgainAMillisecondLater(t *testing.T) {
	fc := clock.NewFake(t0)
	var made atomic.Pointer[nowShared]
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, Shared: func(_ string, cfg limit.Config) limit.Shared {
		sh := &nowShared{Memory: limit.NewMemory(cfg)}
		made.Store(sh)
		return sh
	}})
	got := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		s, err := tb.Acquire(ctx, Request{Path: "/v1/chat/completions", Model: "m"})
		if err == nil {
			s.Done(200, "ok", -1)
		}
		got <- err
	}()
	waitFor(t, func() bool { return made.Load() != nil && made.Load().asked.Load() == 1 })
	sh := made.Load()
	fc.Advance(0) // whatever is due now fires
	if n := sh.asked.Load(); n != 1 {
		t.Fatalf("the limit was asked %d times at the instant it named; want once", n)
	}
	fc.Advance(minWake - time.Microsecond)
	if n := sh.asked.Load(); n != 1 {
		t.Fatalf("asked again %d times before minWake", n-1)
	}
	fc.Advance(time.Microsecond)
	if n := sh.asked.Load(); n != 2 {
		t.Fatalf("asked %d times once minWake passed; want 2", n)
	}
	for range 50 {
		fc.Advance(minWake)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// laterShared admits nothing before an hour from the time it is asked.
type laterShared struct{ *limit.Memory }

func (s laterShared) Admit(now time.Time, _ int64, _ bool) (limit.Ticket, time.Time, bool) {
	return limit.Ticket{}, now.Add(time.Hour), false
}

// TestAWaiterGivenUpAsLateLeavesNoTimer: a request whose deadline falls
// before its limit lets it go is given up at once (nobody behind it goes
// sooner); with nobody left waiting, the group arms no timer for that
// time, which would only keep it alive.
func TestAWaiterGivenUpAsLateLeavesNoTimer(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, Shared: func(_ string, cfg limit.Config) limit.Shared {
		return laterShared{limit.NewMemory(cfg)}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // well before the hour
	defer cancel()
	s, err := tb.Acquire(ctx, Request{Path: "/v1/x", Model: "m"})
	var we *WaitError
	if !errors.As(err, &we) || we.Paused || s != nil {
		t.Fatalf("acquire: %v, %v; want no slot and a WaitError for the pacing", s, err)
	}
	g := tb.laneFor(NewKey("", "", "/v1/x", "m")).g
	g.mu.Lock()
	armed, queued := g.timer != nil, g.queued()
	g.mu.Unlock()
	if queued != 0 || armed {
		t.Fatalf("after the late waiter was given up: %d queued, timer armed %v; want none and none", queued, armed)
	}
}
