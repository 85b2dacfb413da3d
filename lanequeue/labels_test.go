package lanequeue

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// TestALimitsChangeLogsOnlyWhatIsKnown: a change of limits names the
// admitted rate, the window's shape and the models sharing the limit only
// once there is one of each, not as a zero or an empty string.
func TestALimitsChangeLogsOnlyWhatIsKnown(t *testing.T) {
	keys := func(attrs []slog.Attr) []string {
		var ks []string
		for _, a := range attrs {
			ks = append(ks, a.Key)
		}
		return ks
	}
	bare := keys(laneChange{}.limitsAttrs(nil))
	for _, k := range []string{"admitted_rate", "shape", "shares_limit_with", "shared_because"} {
		if slices.Contains(bare, k) {
			t.Errorf("a change with nothing learned logs %s: %v", k, bare)
		}
	}
	known := keys(laneChange{View: limit.View{AdmittedRate: 2.5}, SharesLimitWith: []string{"b"}, SharedBecause: "refused together"}.limitsAttrs(nil))
	for _, k := range []string{"admitted_rate", "shares_limit_with", "shared_because"} {
		if !slices.Contains(known, k) {
			t.Errorf("a change with an admitted rate and a partner does not log %s: %v", k, known)
		}
	}
}

// TestAnAttemptWithoutAnAnswerIsCountedAsError: the attempts counter
// labels an attempt that got no answer "error", and an answer by its
// status.
func TestAnAttemptWithoutAnAnswerIsCountedAsError(t *testing.T) {
	tbl := NewTable(TableConfig{})
	l := tbl.laneFor(ckey)
	pastFirstAnswer(l)
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{})
	s.release()
	s = mustGet(t, acquireAsync(context.Background(), l))
	report(s, limit.Report{Verdict: limit.Failed})
	s.release()
	reg := prometheus.NewRegistry()
	reg.MustRegister(tbl.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "llmproxy_upstream_attempts_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "status" {
					got[lp.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if len(got) != 2 || got["200"] != 1 || got["error"] != 1 {
		t.Fatalf("attempts by status %v, want one 200 and one error", got)
	}
}

// TestOfBasesShowingOneExcessTheOldestCounts: two earlier answers that
// show the same excess at a reading count it with the others sent since
// the older, the more that could explain it: the later base sees fewer
// of them, and taking it would read sharing into requests of other
// limits that had not yet reached the count.
func TestOfBasesShowingOneExcessTheOldestCounts(t *testing.T) {
	var sh shareEvidence
	sh.bases[0] = reading{remaining: 100}
	sh.bases[1] = reading{remaining: 95, limSent: 5, groupSent: 8}
	sh.n = 2
	excess, others := sh.excessOver(reading{remaining: 80, limSent: 10, groupSent: 16}, 0)
	if excess != 10 || others != 6 {
		t.Fatalf("excess %v with others %v, want 10 with the 6 sent since the older base", excess, others)
	}
}

// TestAnExcessWithNothingElseSentShowsNoSharing: a count that fell by
// more than the limit's own dispatches while nothing else of the group
// was sent is a count read at another instant (a refill late, a request
// counted twice), not another model's requests: no excess.
func TestAnExcessWithNothingElseSentShowsNoSharing(t *testing.T) {
	var sh shareEvidence
	sh.bases[0] = reading{remaining: 100}
	sh.n = 1
	if excess, others := sh.excessOver(reading{remaining: 89, limSent: 10, groupSent: 10}, 0); excess != 0 || others != 0 {
		t.Fatalf("excess %v with others %v, want none: nothing else was sent", excess, others)
	}
	if excess, others := sh.excessOver(reading{remaining: 88, limSent: 10, groupSent: 11}, 0); excess != 2 || others != 1 {
		t.Fatalf("excess %v with others %v, want 2 with the 1 other sent", excess, others)
	}
}
