package redisstate

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// slowStartCases are the configured limits whose slow start the Go state
// and the admit script must agree on (limit.Limits.SlowStart): spread is
// whether a group with them, its first answer in after replySecs, holds
// back the dispatch right after it.
var slowStartCases = []struct {
	name   string
	lim    limit.Limits
	spread bool
}{
	{"nothing configured", limit.Limits{}, true},
	{"an RPM ceiling", limit.Limits{RPM: 600}, true},
	{"a TPM ceiling", limit.Limits{TPM: 100_000}, true},
	{"RPM and TPM as a start", limit.Limits{RPM: 600, TPM: 100_000, Start: true}, true},
	{"a minimum gap", limit.Limits{MinGap: time.Millisecond}, true},
	{"a concurrency ceiling", limit.Limits{Concurrency: 8}, false},
	{"a concurrency start", limit.Limits{Concurrency: 8, Start: true}, false},
	{"RPM and concurrency", limit.Limits{RPM: 600, Concurrency: 8}, false},
}

// replySecs is the first answer's time to its headers in slowStartCases:
// the spread's gap is 1/(2 × 8) of it, 3.75 s.
const replySecs = 60

// spreadsGo reports whether the in-process state, with lim, holds back
// the dispatch right after its first answer came in.
func spreadsGo(lim limit.Limits) bool {
	m := limit.NewMemory(limit.Config{Concurrency: 8, Limits: lim})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	first, _, ok := m.Admit(now, 1, false)
	if !ok {
		panic("the first dispatch was held")
	}
	first.Dispatched = now.Add(-replySecs * time.Second)
	m.Learn(&first, limit.Report{Status: 200, Verdict: limit.Accepted}, now)
	_, at, ok := m.Admit(now, 1, false)
	return !ok && at.After(now)
}

// spreadsLua reports the same of the admit script, for group on st,
// whose clock and scripts' clock is fc.
func spreadsLua(t *testing.T, st *Store, fc *clock.Fake, group string, lim limit.Limits) bool {
	sh := st.Shared(group, limit.Config{Concurrency: 8, Limits: lim})
	first := admitOn(t, fc, sh, 100)
	now := fc.Now()
	first.Dispatched = now.Add(-replySecs * time.Second)
	sh.Learn(&first, limit.Report{Status: 200, Verdict: limit.Accepted}, now)
	_, at, ok := sh.Admit(now, 1, false)
	return !ok && at.After(now)
}

// TestGoAndLuaStartSlowByOneRule: the in-process state and the admit
// script spread a slow start for the same configured limits, those
// without a configured concurrency (an RPM or TPM ceiling says nothing of
// how many requests the upstream holds in flight), by the one rule
// limit.Limits.SlowStart states.
func TestGoAndLuaStartSlowByOneRule(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := newFakeStore(t, srv.url(), fc, fc)
	for i, c := range slowStartCases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.lim.SlowStart(); got != c.spread {
				t.Errorf("Limits.SlowStart() = %v, want %v", got, c.spread)
			}
			if got := spreadsGo(c.lim); got != c.spread {
				t.Errorf("Go: the dispatch after the first answer held back %v, want %v", got, c.spread)
			}
			if got := spreadsLua(t, st, fc, "slow-start-"+string(rune('a'+i)), c.lim); got != c.spread {
				t.Errorf("Lua: the dispatch after the first answer held back %v, want %v", got, c.spread)
			}
		})
	}
}
