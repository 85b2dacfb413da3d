package lanequeue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// TestWhatAnAnswerSaysOfACredential: a 2xx, a 429 or a spent quota
// vouches for a lane's credential, any other 401 or 403 refuses it, and
// every other status (or no answer) says nothing either way.
func TestWhatAnAnswerSaysOfACredential(t *testing.T) {
	for _, tc := range []struct {
		status           int
		quota            bool
		vouched, refused bool
	}{
		{0, false, false, false}, {100, false, false, false}, {199, false, false, false}, {200, false, true, false}, {204, false, true, false},
		{299, false, true, false}, {300, false, false, false}, {400, false, false, false}, {401, false, false, true}, {402, false, false, false},
		{403, false, false, true}, {404, false, false, false}, {428, false, false, false}, {429, false, true, false}, {430, false, false, false},
		{500, false, false, false}, {503, false, false, false}, {403, true, true, false}, {400, true, true, false},
	} {
		l := &Lane{}
		l.noteAnswer(limit.Report{Status: tc.status, Quota: headerparse.Quota{Spent: tc.quota}})
		if l.vouched() != tc.vouched || l.refusedOnly() != tc.refused {
			t.Errorf("status %d, quota %v: vouched %v, refused only %v; want %v, %v", tc.status, tc.quota, l.vouched(), l.refusedOnly(), tc.vouched, tc.refused)
		}
	}
	l := &Lane{}
	l.noteAnswer(limit.Report{Status: 401})
	l.noteAnswer(limit.Report{Status: 200})
	if !l.vouched() || l.refusedOnly() {
		t.Errorf("a 401 then a 200: vouched %v, refused only %v; want true, false", l.vouched(), l.refusedOnly())
	}
}

// answer takes a slot of the table's lane for credential and model, and
// ends it with the upstream's status; it returns the lane.
func answer(t *testing.T, tb *Table, credential, model string, status int, lim headerparse.Limits) *Lane {
	t.Helper()
	s, err := tb.Acquire(context.Background(), Request{Credential: credential, Path: "/v1/chat/completions", Model: model, Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.Report(limit.Report{Status: status, Verdict: limit.Accepted, Limits: lim})
	l := s.lane
	s.Done(status, "ok", -1)
	return l
}

// learnedLane is a lane of tb that learned a window of 600 requests a
// minute from a 200.
func learnedLane(t *testing.T, tb *Table) *Lane {
	t.Helper()
	l := answer(t, tb, "sk-real", "gpt-real", 200, headerparse.Limits{Requests: win(600, 599, time.Now().Add(time.Minute))})
	if got := l.State().RequestsLimit; got != 600 {
		t.Fatalf("the real lane learned a window of %v, want 600", got)
	}
	return l
}

// stillLearned fails the test unless tb still holds l, with the window of
// 600 it learned.
func stillLearned(t *testing.T, tb *Table, l *Lane) {
	t.Helper()
	got, ok := tb.lookup(l.ID())
	if !ok || got != l {
		t.Fatal("the real lane was evicted")
	}
	if lim := got.State().RequestsLimit; lim != 600 {
		t.Fatalf("the real lane's window is %v after the flood, want the 600 it learned", lim)
	}
}

// TestLanesTheUpstreamRefusedAreNotKept: a request with a key the
// upstream answers 401 or 403 leaves no lane once it ends; a lane that
// has one in flight still stays until it ends, or until the answer to a
// request it refused is counted; a lane the upstream served once stays
// when it later refuses.
func TestLanesTheUpstreamRefusedAreNotKept(t *testing.T) {
	var reasons []string
	tb := NewTable(TableConfig{onChange: func(c laneChange) {
		if c.Kind == changeEvicted {
			reasons = append(reasons, c.Reason)
		}
	}})
	for i, status := range []int{401, 403} {
		if l := answer(t, tb, fmt.Sprint("sk-forged-", i), "m", status, headerparse.Limits{}); tb.laneCount() != 0 {
			t.Fatalf("a %d left its lane %s in the table", status, l.ID())
		}
	}
	if len(reasons) != 2 || reasons[0] != "refused" || reasons[1] != "refused" {
		t.Errorf("eviction reasons %q, want two refused", reasons)
	}

	// Two requests of one forged key: the lane goes when the second ends.
	a, err := tb.Acquire(context.Background(), Request{Credential: "sk-two", Path: "/p", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tb.Acquire(context.Background(), Request{Credential: "sk-two", Path: "/p", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	a.Report(limit.Report{Status: 401})
	a.Done(401, "ok", -1)
	if tb.laneCount() != 1 {
		t.Fatal("a refused lane with a request in flight was dropped")
	}
	b.Report(limit.Report{Status: 401})
	b.Done(401, "ok", -1)
	if tb.laneCount() != 0 {
		t.Fatal("a refused lane stays after its last request ended")
	}

	// A refused lane whose last word is a request it refused itself (a
	// full queue, a deadline) goes once that request's answer is counted.
	gone := tb.laneFor(NewKey("", "sk-gone", "/p", "m"))
	gone.standing.Store(standingRefused)
	tb.Answered(gone.ID(), 504, "proxy_error")
	if tb.laneCount() != 0 {
		t.Fatal("a refused lane stays after the answer to a request it refused")
	}

	// Served once, then refused (a key revoked): what it learned stays.
	real := learnedLane(t, tb)
	answer(t, tb, "sk-real", "gpt-real", 401, headerparse.Limits{})
	stillLearned(t, tb, real)
}

// TestAFloodOfUnprovenLanesLeavesALearnedLane: with the table full, new
// lanes push out those the upstream never vouched for, however recently
// used, before a lane that learned a limit, however long idle: 500 keys
// whose requests got no answer through a table of 50 leave the real lane
// and what it learned.
func TestAFloodOfUnprovenLanesLeavesALearnedLane(t *testing.T) {
	tb := NewTable(TableConfig{MaxLanes: 50})
	real := learnedLane(t, tb)
	for i := range 500 {
		s, err := tb.Acquire(context.Background(), Request{Credential: fmt.Sprint("sk-flood-", i), Path: "/p", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		s.Done(0, "client_gone", -1)
	}
	if n := tb.laneCount(); n != 50 {
		t.Fatalf("%d lanes, want the table's 50", n)
	}
	stillLearned(t, tb, real)

	// Once every lane is vouched for, the least recently used goes.
	full := NewTable(TableConfig{MaxLanes: 3})
	first := answer(t, full, "sk-1", "m", 200, headerparse.Limits{})
	for i := 2; i <= 4; i++ {
		answer(t, full, fmt.Sprint("sk-", i), "m", 429, headerparse.Limits{})
	}
	if _, ok := full.lookup(first.ID()); ok || full.laneCount() != 3 {
		t.Fatalf("all vouched for: the least recently used stays (%d lanes)", full.laneCount())
	}
}

// TestALaneVouchedForLaterIsKept: a lane made before its first answer
// and vouched for by it is kept over lanes made after it that were not.
func TestALaneVouchedForLaterIsKept(t *testing.T) {
	tb := NewTable(TableConfig{MaxLanes: 4})
	s, err := tb.Acquire(context.Background(), Request{Credential: "sk-real", Path: "/p", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	real := s.lane
	s.Report(limit.Report{Status: 200})
	s.Done(200, "ok", -1)
	// The table has not seen it vouched for yet: it is the oldest of
	// the lanes without a vouch when the flood comes.
	for i := range 20 {
		tb.laneFor(NewKey("", fmt.Sprint("sk-flood-", i), "/p", "m"))
	}
	if got, ok := tb.lookup(real.ID()); !ok || got != real {
		t.Fatal("a lane vouched for by its first answer was evicted by lanes without one")
	}
}

// gatherLanes is each lane label of the table's metrics with the
// number of series it has, and the values of llmproxy_lane_queue_depth,
// llmproxy_lane_in_flight and llmproxy_lane_requests_limit by lane.
func gatherLanes(t *testing.T, tb *Table) (series map[string]int, queued, flights, reqLimit map[string]float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(tb.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series, queued, flights, reqLimit = map[string]int{}, map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "lane" {
					continue
				}
				series[lp.GetValue()]++
				switch f.GetName() {
				case "llmproxy_lane_queue_depth":
					queued[lp.GetValue()] = m.GetGauge().GetValue()
				case "llmproxy_lane_in_flight":
					flights[lp.GetValue()] = m.GetGauge().GetValue()
				case "llmproxy_lane_requests_limit":
					reqLimit[lp.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return series, queued, flights, reqLimit
}

// TestMetricsHaveSeriesOfAtMost200Lanes: 300 lanes of random keys the
// upstream never vouched for, each with a request waiting, and a real
// lane idle since it learned a limit: the metrics name 200 lanes, the
// real one among them with what it learned, and sum the other 101's
// waiting requests under lane="other".
func TestMetricsHaveSeriesOfAtMost200Lanes(t *testing.T) {
	tb := NewTable(TableConfig{})
	real := learnedLane(t, tb)
	for i := range 300 {
		l := tb.laneFor(NewKey("", fmt.Sprint("sk-random-", i), "/p", "m"))
		l.g.mu.Lock()
		l.queued, l.inFlight = 1, 2 // as waiters and sent requests would count, without them
		l.g.mu.Unlock()
	}
	series, queued, flights, reqLimit := gatherLanes(t, tb)
	if len(series) != defaultMetricLanes+1 {
		t.Errorf("%d lane labels in the metrics, want %d lanes and \"other\"", len(series), defaultMetricLanes)
	}
	if reqLimit[real.ID()] != 600 {
		t.Errorf("the real lane's requests limit in the metrics is %v, want 600", reqLimit[real.ID()])
	}
	if queued["other"] != 101 {
		t.Errorf("lane=\"other\" has %v queued, want the 101 unlisted lanes' one each", queued["other"])
	}
	if flights["other"] != 202 {
		t.Errorf("lane=\"other\" has %v in flight, want the 101 unlisted lanes' two each", flights["other"])
	}
	if _, ok := reqLimit["other"]; ok {
		t.Error("lane=\"other\" has a learned limit: only queue depth and in flight are summed")
	}

	// With no more lanes than the bound, no "other".
	small := NewTable(TableConfig{})
	learnedLane(t, small)
	if series, _, _, _ := gatherLanes(t, small); len(series) != 1 || series["other"] != 0 {
		t.Errorf("lane labels %v, want only the one lane's", series)
	}
}
