package limit

import "testing"

// TestProvenanceShowsAsBefore: what /lanes, the logs and the dashboard
// show of where a rate comes from and what binds is the text they always
// showed; a value out of range shows as "unknown", never as another's.
func TestProvenanceShowsAsBefore(t *testing.T) {
	for f, want := range map[RateFrom]string{
		rateUnknown: "", rateHeaders: "headers", rateAdmitted: "admitted rate", rateSending: "sending rate",
		rateHint: "hint", rateProbe: "probe", rateReplicas: "replicas", rateReplicas + 1: "unknown",
	} {
		if got := f.String(); got != want {
			t.Errorf("RateFrom(%d) shows %q, want %q", f, got, want)
		}
	}
	for b, want := range map[Bound]string{
		boundUnknown: "", BoundRate: "rate", BoundConcurrency: "concurrency", BoundConcurrency + 1: "unknown",
	} {
		if got := b.String(); got != want {
			t.Errorf("Bound(%d) shows %q, want %q", b, got, want)
		}
	}
}
