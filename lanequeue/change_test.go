package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// TestLimitsThatMoveByLessThanATenthAreNotReported: a window 5 % larger is
// noise, not a change of limits.
func TestLimitsThatMoveByLessThanATenthAreNotReported(t *testing.T) {
	fc := clock.NewFake(t0)
	tb, log := observedTable(fc, Config{Concurrency: 4})
	l := tb.laneFor(Key{Path: "/v1/chat/completions", Model: "m"})
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{Requests: win(600, 599, at(100*time.Millisecond))})
	if got := log.takeKind(changeLimits); len(got) != 1 {
		t.Fatalf("first limits reported %+v, want one changeLimits", got)
	}
	fc.Advance(10 * time.Millisecond)
	accept(s, headerparse.Limits{Requests: win(630, 628, at(110*time.Millisecond))})
	if got := log.takeKind(changeLimits); len(got) != 0 {
		t.Fatalf("a window 5%% larger was reported: %+v", got)
	}
	if got := l.State().RequestsLimit; got != 630 {
		t.Fatalf("requests limit = %v, want 630 learned all the same", got)
	}
	s.release()
}

// TestConcurrencyRiseIsReportedOnceASecondHasPassed: a rise a whole second
// after the last report is reported.
func TestConcurrencyRiseIsReportedOnceASecondHasPassed(t *testing.T) {
	fc := clock.NewFake(t0)
	tb, log := observedTable(fc, Config{Concurrency: 2})
	l := tb.laneFor(Key{Path: "/c"})
	pastFirstAnswer(l)
	a := mustGet(t, acquireAsync(context.Background(), l))
	b := mustGet(t, acquireAsync(context.Background(), l))
	accept(a, headerparse.Limits{}) // binding, slow start: one of two answers
	if got := log.take(); len(got) != 0 {
		t.Fatalf("first answer reported %+v, want nothing", got)
	}
	fc.Advance(concReportEvery)
	accept(b, headerparse.Limits{}) // the second: 2 → 3
	got := log.take()
	if len(got) != 1 || got[0].Kind != changeConcurrency || got[0].From != 2 || got[0].View.Concurrency != 3 {
		t.Fatalf("a rise exactly a second later reported %+v, want one change from 2 to 3", got)
	}
	a.release()
	b.release()
}
