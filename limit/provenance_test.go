package limit

import (
	"testing"
	"time"
)

// TestProvenanceShowsAsBefore: what /lanes, the logs and the dashboard
// show of where a rate comes from and what binds is the text they always
// showed; a value out of range shows as "unknown", never as another's.
func TestProvenanceShowsAsBefore(t *testing.T) {
	for f, want := range map[rateFrom]string{
		rateUnknown: "", rateHeaders: "headers", rateAdmitted: "admitted rate", rateSending: "sending rate",
		rateHint: "hint", rateProbe: "probe", rateReplicas: "replicas", rateReplicas + 1: "unknown",
	} {
		if got := f.String(); got != want {
			t.Errorf("rateFrom(%d) shows %q, want %q", f, got, want)
		}
	}
	for b, want := range map[Bound]string{
		boundUnknown: "", BoundRate: "rate", BoundConcurrency: "concurrency", BoundConcurrency + 1: "unknown",
	} {
		if got := b.String(); got != want {
			t.Errorf("Bound(%d) shows %q, want %q", b, got, want)
		}
	}
	for p, want := range map[pauseReason]string{
		notPaused: "", pauseRateLimited: "rate_limited", pauseOverloaded: "overloaded", pauseRetry: "retry",
		pauseWindow: "window", pauseShared: "shared", pauseShared + 1: "unknown",
	} {
		if got := p.String(); got != want {
			t.Errorf("pauseReason(%d) shows %q, want %q", p, got, want)
		}
	}
	for c, want := range map[concurrencyFrom]string{
		concurrencyGrown: "", concurrencyNamed: "words", 1: "refusals at 1 in flight", 12: "refusals at 12 in flight",
		concurrencyNamed + 1: "unknown", -1: "unknown",
	} {
		if got := c.String(); got != want {
			t.Errorf("concurrencyFrom(%d) shows %q, want %q", c, got, want)
		}
	}
}

// TestWhereAPaceWasLearned: learned_from is "headers" for a pace read from
// headers, "refusals" for every pace read from the behaviour of an
// upstream without them, "" before either; a View asks the same of its
// RateFrom without reading the text.
func TestWhereAPaceWasLearned(t *testing.T) {
	for f := rateUnknown; f <= rateReplicas; f++ {
		want, headers, refusals := "refusals", false, true
		switch f {
		case rateUnknown:
			want, refusals = "", false
		case rateHeaders:
			want, headers, refusals = "headers", true, false
		}
		v := View{RateFrom: f}
		if f.Learned() != want || v.FromHeaders() != headers || v.FromRefusals() != refusals {
			t.Errorf("%q: learned from %q, from headers %v, from refusals %v; want %q, %v, %v",
				f, f.Learned(), v.FromHeaders(), v.FromRefusals(), want, headers, refusals)
		}
	}
}

// TestAConcurrencyLimitIsKnownOnceTheUpstreamShowsIt: the start grown by
// answers is not known; the upstream's words or refusals at a level are.
func TestAConcurrencyLimitIsKnownOnceTheUpstreamShowsIt(t *testing.T) {
	for c, want := range map[concurrencyFrom]bool{concurrencyGrown: false, concurrencyNamed: true, 1: true, 9: true} {
		if got := c.Known(); got != want {
			t.Errorf("%q: known %v, want %v", c, got, want)
		}
	}
}

// TestAPauseFromElsewhereShowsAsShared: a pause another replica set
// replaces the view's pause and its reason, and nothing else.
func TestAPauseFromElsewhereShowsAsShared(t *testing.T) {
	v := View{PausedUntil: t0, PauseReason: pauseRateLimited, Concurrency: 4, RateFrom: rateHint}
	got := v.PausedElsewhere(at(time.Second))
	want := View{PausedUntil: at(time.Second), PauseReason: pauseShared, Concurrency: 4, RateFrom: rateHint}
	if got != want {
		t.Errorf("paused elsewhere: %+v, want %+v", got, want)
	}
}
