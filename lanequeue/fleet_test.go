package lanequeue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// TestAFreshGroupHasNotLoweredItsConcurrency: the view says the
// concurrency limit was lowered only once refusals lowered it (a shared
// store publishes only such limits); a fresh group's was not.
func TestAFreshGroupHasNotLoweredItsConcurrency(t *testing.T) {
	l := NewLocal(Config{Concurrency: 8, MinConcurrency: 1, MaxConcurrency: 8})
	now := time.Unix(1_000_000, 0)
	if l.View(now).ConcurrencyLowered {
		t.Fatal("a fresh group says its concurrency was lowered")
	}
	tk, _, ok := l.Admit(now, 1, false)
	if !ok {
		t.Fatal("admit")
	}
	l.Learn(&tk, Report{Status: 429, Verdict: ConcurrencyRefused}, now)
	if !l.View(now).ConcurrencyLowered {
		t.Fatal("a named concurrency refusal did not count as lowering")
	}
}

// TestFleetDispatchesCountOnceEach: the dispatches of other replicas
// between two of this one's count toward the group's sending rate once;
// a count that did not move counts this dispatch alone.
func TestFleetDispatchesCountOnceEach(t *testing.T) {
	l := NewLocal(Config{})
	now := time.Unix(1_000_000, 0)
	l.NoteDispatch(now, 0, 5) // the first count only sets the mark
	l.NoteDispatch(now, 0, 9) // four dispatches, all replicas
	l.NoteDispatch(now, 0, 9) // the count had not moved: this one
	if n, _ := l.pace.recent.recent(now); n != 6 {
		t.Fatalf("the sending meter counts %d dispatches, want 1 + 4 + 1", n)
	}
}

// elsewhere is a Local whose peers have had an answer once answered is
// set.
type elsewhere struct {
	*Local
	answered *atomic.Bool
}

func (e elsewhere) AnsweredElsewhere() bool { return e.answered.Load() }

// TestAGroupAnsweredElsewhereDoesNotWaitForItsOwnFirstAnswer: while its
// first request is out, a new group's next request goes at once when
// another replica of the group has had an answer, instead of waiting for
// the probe window.
func TestAGroupAnsweredElsewhereDoesNotWaitForItsOwnFirstAnswer(t *testing.T) {
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	cfg := Config{Concurrency: 4, MaxConcurrency: 4, Clock: fc}
	var answered atomic.Bool
	tb := NewTable(TableConfig{Lane: cfg, Shared: func(_ string, c Config) Shared { return elsewhere{NewLocal(c), &answered} }})
	l := tb.Get(Key{Path: "/p"})
	first, err := l.Acquire(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	answered.Store(true) // another replica's first answer came meanwhile
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	second, err := l.Acquire(ctx, 1)
	if err != nil {
		t.Fatalf("the second request waited for the first answer though the group was answered elsewhere: %v", err)
	}
	second.Release()
}
