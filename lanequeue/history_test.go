package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// TestHistoryCountsInTheRingsFirstSlot: answers and 429s whose bucket is
// the ring's slot 0 are counted like any other.
func TestHistoryCountsInTheRingsFirstSlot(t *testing.T) {
	l, fc := testLane(1, 10)
	fc.Set(firstSlotZero())
	l.countAnswer(200, "ok")
	s := mustGet(t, acquireAsync(context.Background(), l))
	refuse(s, 0)
	s.release()
	h := l.StateWithHistory().History
	last := len(h.Answers) - 1
	if h.Answers[last] != 1 || h.Upstream429[last] != 1 {
		t.Fatalf("newest bucket: %d answers, %d 429s; want 1 and 1", h.Answers[last], h.Upstream429[last])
	}
}

// TestHistoryDropsAnEventOlderThanTheRing: an event a whole ring older
// than the newest bucket (a wall clock stepped back) is dropped, not
// counted in the newest bucket, which shares its slot.
func TestHistoryDropsAnEventOlderThanTheRing(t *testing.T) {
	var h history
	now := at(time.Hour)
	h.answer(now)
	h.answer(now.Add(-historyBuckets * historyBucket))
	h.refusal(now.Add(-historyBuckets * historyBucket))
	v := h.view(now)
	if got := v.Answers[historyBuckets-1]; got != 1 {
		t.Fatalf("newest bucket has %d answers, want 1 (the old one dropped)", got)
	}
	var answers, refusals uint32
	for i := range v.Answers {
		answers, refusals = answers+v.Answers[i], refusals+v.Upstream429[i]
	}
	if answers != 1 || refusals != 0 {
		t.Fatalf("the ring holds %d answers and %d 429s, want 1 and 0 (the old ones dropped, not counted elsewhere)", answers, refusals)
	}
	h.answer(now.Add(-(historyBuckets - 1) * historyBucket)) // the oldest bucket still shown
	if got := h.view(now).Answers[0]; got != 1 {
		t.Fatalf("oldest bucket has %d answers, want 1", got)
	}
}

// TestHistoryCountsOnlyUpstream429s: a 200 and a 503 are answers, not 429s.
func TestHistoryCountsOnlyUpstream429s(t *testing.T) {
	l, fc := testLane(4, 10)
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{})
	report(s, limit.Report{Status: 503, Verdict: limit.Overloaded})
	resend(t, s, fc.Advance) // past the pace the 503 taught
	s.Report(limit.Report{Status: 429, Verdict: limit.RateRefused})
	s.release()
	h := l.StateWithHistory().History
	if got := h.Upstream429[len(h.Upstream429)-1]; got != 1 {
		t.Fatalf("429s in the newest bucket = %d, want 1", got)
	}
	if st := l.State(); st.Attempts[200] != 1 || st.Attempts[503] != 1 || st.Attempts[429] != 1 {
		t.Fatalf("attempts %v, want one each of 200, 503 and 429", st.Attempts)
	}
}

// TestHistoryClearsABucketTheRingReuses: a bucket a whole ring after an
// earlier one shares its slot and starts from zero.
func TestHistoryClearsABucketTheRingReuses(t *testing.T) {
	var h history
	h.answer(t0)
	h.answer(t0.Add((historyBuckets - 1) * historyBucket))
	v := h.view(t0.Add(historyBuckets * historyBucket))
	if got := v.Answers[historyBuckets-1]; got != 0 {
		t.Fatalf("newest bucket has %d answers, want 0 (the one a ring ago cleared)", got)
	}
	if got := v.Answers[historyBuckets-2]; got != 1 {
		t.Fatalf("the bucket before has %d answers, want 1", got)
	}
}
