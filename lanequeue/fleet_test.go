package lanequeue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// TestAGroupAnsweredElsewhereDoesNotWaitForItsOwnFirstAnswer: while its
// first request is out, a new group's next request goes at once when
// another replica of the group has had an answer, instead of waiting for
// the first-answer window.
func TestAGroupAnsweredElsewhereDoesNotWaitForItsOwnFirstAnswer(t *testing.T) {
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	cfg := Config{Concurrency: 4, MaxConcurrency: 4, Clock: fc}
	var answered atomic.Bool
	tb := NewTable(TableConfig{Lane: cfg, Shared: func(_ string, c limit.Config) limit.Shared { return elsewhere{limit.NewMemory(c), &answered} }})
	l := tb.laneFor(Key{Path: "/p"})
	first, err := l.acquire(context.Background(), 1, High)
	if err != nil {
		t.Fatal(err)
	}
	defer first.release()
	answered.Store(true) // another replica's first answer came meanwhile
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	second, err := l.acquire(ctx, 1, High)
	if err != nil {
		t.Fatalf("the second request waited for the first answer though the group was answered elsewhere: %v", err)
	}
	second.release()
}
