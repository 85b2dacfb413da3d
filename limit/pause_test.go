package limit

import (
	"testing"
	"time"
)

// TestGroupPause: every case of whether a group takes the pause a report
// asks for, and for what reason.
func TestGroupPause(t *testing.T) {
	until := t0.Add(2 * time.Second)
	ask := func(v Verdict, hint time.Duration) Report {
		return Report{Status: 429, Verdict: v, Hint: hint, PauseUntil: until}
	}
	quietLive := pauseEvidence{quiet: true, live: true}
	for _, tt := range []struct {
		name   string
		r      Report
		e      pauseEvidence
		reason string // "": no pause
	}{
		{"no pause asked", Report{Status: 429, Verdict: RateRefused}, pauseEvidence{}, ""},
		{"no pause asked of an outage", Report{Status: 503, Verdict: Overloaded}, pauseEvidence{quiet: true}, ""},
		{"not sent", Report{Verdict: NotSent, PauseUntil: until}, pauseEvidence{}, "retry"},
		{"a rate refusal with headers", ask(RateRefused, 0), pauseEvidence{}, "rate_limited"},
		{"a long hint with headers", ask(RateRefused, 30*time.Second), pauseEvidence{}, "rate_limited"},
		{"an overload with headers", ask(Overloaded, 0), pauseEvidence{}, "overloaded"},
		{"a concurrency refusal asked to pause", ask(ConcurrencyRefused, 0), pauseEvidence{}, "retry"},
		{"a failure asked to pause", ask(Failed, 0), pauseEvidence{}, "retry"},
		{"a window's closure holds the group", ask(RateRefused, 50*time.Millisecond), pauseEvidence{closure: true}, ""},
		{"a quiet refusal of an upstream that admits nothing", ask(RateRefused, 0), pauseEvidence{quiet: true}, "rate_limited"},
		{"a quiet overload of an upstream that admits nothing", ask(Overloaded, 5*time.Second), pauseEvidence{quiet: true}, "overloaded"},
		{"a quiet refusal while admitting, no hint: the pace holds", ask(RateRefused, 0), quietLive, ""},
		{"a quiet refusal while admitting, a hint that is a pace", ask(RateRefused, 50*time.Millisecond), quietLive, "rate_limited"},
		{"a hint just under a second is a pace", ask(RateRefused, time.Second-time.Millisecond), quietLive, "rate_limited"},
		{"a hint of a second is not a pace", ask(RateRefused, time.Second), quietLive, ""},
		{"a quiet overload while admitting, a short hint", ask(Overloaded, 100*time.Millisecond), quietLive, "overloaded"},
		{"bound by concurrency: the limit holds, whatever the hint", ask(RateRefused, 50*time.Millisecond),
			pauseEvidence{quiet: true, live: true, concurrencyBound: true}, ""},
		{"bound by concurrency while the upstream admits nothing", ask(RateRefused, 0),
			pauseEvidence{quiet: true, concurrencyBound: true}, "rate_limited"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := groupPause(tt.r, tt.e)
			want := pause{}
			if tt.reason != "" {
				want = pause{until: tt.r.PauseUntil, reason: tt.reason}
			}
			if p != want {
				t.Fatalf("groupPause = %+v, want %+v", p, want)
			}
		})
	}
}

// TestLearnTakesOnlyALongerPause: Memory.Learn takes the pause groupPause
// decides on when it ends later than the one under way, with its reason.
func TestLearnTakesOnlyALongerPause(t *testing.T) {
	m := NewMemory(Config{})
	var tk [3]Ticket
	for i := range tk {
		tk[i], _, _ = m.Admit(t0, 1, true)
	}
	m.Learn(&tk[0], Report{Status: 503, Verdict: Overloaded, PauseUntil: at(2 * time.Second)}, t0)
	m.Learn(&tk[1], Report{Verdict: NotSent, PauseUntil: at(time.Second)}, t0)
	if v := m.View(t0); !v.PausedUntil.Equal(at(2*time.Second)) || v.PauseReason != "overloaded" {
		t.Fatalf("paused until %v for %q, want the longer overload's, %v", v.PausedUntil, v.PauseReason, at(2*time.Second))
	}
	m.Learn(&tk[2], Report{Verdict: NotSent, PauseUntil: at(3 * time.Second)}, t0)
	if v := m.View(t0); !v.PausedUntil.Equal(at(3*time.Second)) || v.PauseReason != "retry" {
		t.Fatalf("paused until %v for %q, want %v for \"retry\"", v.PausedUntil, v.PauseReason, at(3*time.Second))
	}
}
