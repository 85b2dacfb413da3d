package lanequeue

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/prometheus/client_golang/prometheus"
)

// configuredTable is a table whose default route has lim, on the bubble's
// wall clock.
func configuredTable(lim limit.Limits) *Table {
	return NewTable(TableConfig{Lane: Config{Concurrency: 8}, RouteLimits: map[string]limit.Limits{"": lim}})
}

var ckey = Key{CredentialHash: HashCredential("sk-c"), Path: "/v1/chat/completions", Model: "m"}

// runStarts sends n requests at once through l, each answered after
// answer (Accepted, with limits), and returns their start times in order
// and the most in flight at once.
func runStarts(t *testing.T, l *Lane, n int, answer time.Duration, limits func() headerparse.Limits) ([]time.Time, int) {
	t.Helper()
	var mu sync.Mutex
	var starts []time.Time
	inFlight, most := 0, 0
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := l.acquire(context.Background(), 10, High)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			starts = append(starts, time.Now())
			inFlight++
			most = max(most, inFlight)
			mu.Unlock()
			time.Sleep(answer)
			var lim headerparse.Limits
			if limits != nil {
				lim = limits()
			}
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted, Limits: lim})
			mu.Lock()
			inFlight--
			mu.Unlock()
			s.release()
		}()
	}
	wg.Wait()
	return starts, most
}

func minGap(starts []time.Time) time.Duration {
	gap := time.Duration(1 << 62)
	for i := 1; i < len(starts); i++ {
		gap = min(gap, starts[i].Sub(starts[i-1]))
	}
	return gap
}

// TestConfiguredRPMPacesEvenlyWithoutHeaders: 600 RPM on an upstream that
// says nothing: starts are 100 ms apart from the first request on (no
// waiting for the first answer, no burst), 60 requests take 5.9 s.
func TestConfiguredRPMPacesEvenlyWithoutHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{RPM: 600}).laneFor(ckey)
		begin := time.Now()
		starts, _ := runStarts(t, l, 60, 300*time.Millisecond, nil)
		if g := minGap(starts); g < 100*time.Millisecond {
			t.Errorf("closest starts %v apart, want ≥ 100ms", g)
		}
		if took := starts[len(starts)-1].Sub(begin); took != 5900*time.Millisecond {
			t.Errorf("60 starts took %v, want 5.9s (600 a minute)", took)
		}
		if c := l.State().Configured; c == nil || c.RPM != 600 || c.Mode != "ceiling" {
			t.Errorf("configured view = %+v", c)
		}
	})
}

// TestConfiguredRPMHoldsUnderHeadersThatClaimMore: headers saying ten
// thousand are left do not take the pace past the ceiling.
func TestConfiguredRPMHoldsUnderHeadersThatClaimMore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{RPM: 1200}).laneFor(ckey)
		generous := func() headerparse.Limits {
			return headerparse.Limits{Requests: headerparse.Window{Limit: 10000, Remaining: 9999, HasRemaining: true,
				Reset: time.Now().Add(6 * time.Millisecond)}}
		}
		begin := time.Now()
		starts, _ := runStarts(t, l, 40, 100*time.Millisecond, generous)
		if g := minGap(starts); g < 50*time.Millisecond {
			t.Errorf("closest starts %v apart, want ≥ 50ms (1200 a minute)", g)
		}
		if took := starts[len(starts)-1].Sub(begin); took < 1950*time.Millisecond {
			t.Errorf("40 starts took %v, want 1.95s", took)
		}
	})
}

// TestConfiguredStartIsReplacedByHeaders: with LIMITS=start, the first
// answer's headers replace the configured 60 RPM: the rest go at once.
func TestConfiguredStartIsReplacedByHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{RPM: 60, Start: true}).laneFor(ckey)
		generous := func() headerparse.Limits {
			return headerparse.Limits{Requests: headerparse.Window{Limit: 10000, Remaining: 9999, HasRemaining: true,
				Reset: time.Now().Add(6 * time.Millisecond)}}
		}
		begin := time.Now()
		starts, _ := runStarts(t, l, 10, 100*time.Millisecond, generous)
		// The first goes at 0; the second waits its 1 s (60 a minute)
		// only until the first answer (at 0.1 s) replaces the start.
		if took := starts[len(starts)-1].Sub(begin); took > 300*time.Millisecond {
			t.Errorf("10 starts took %v: the start was not replaced", took)
		}
		if c := l.State().Configured; c == nil || c.Mode != "replaced" {
			t.Errorf("configured view = %+v, want mode replaced", c)
		}
	})
}

// TestConfiguredCeilingIsNeverExceededWhenStartIsNot: the same headers
// under LIMITS=ceiling leave the pace at 60 a minute.
func TestConfiguredCeilingIsNeverExceededWhenStartIsNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{RPM: 60}).laneFor(ckey)
		generous := func() headerparse.Limits {
			return headerparse.Limits{Requests: headerparse.Window{Limit: 10000, Remaining: 9999, HasRemaining: true}}
		}
		begin := time.Now()
		starts, _ := runStarts(t, l, 4, 100*time.Millisecond, generous)
		if took := starts[len(starts)-1].Sub(begin); took != 3*time.Second {
			t.Errorf("4 starts took %v, want 3s", took)
		}
		if c := l.State().Configured; c.Mode != "ceiling" {
			t.Errorf("mode %q, want ceiling", c.Mode)
		}
	})
}

// TestMinGapHoldsNoSlot: a minimum gap spaces every two starts, retries
// included, and is pacing: while the next request waits out the gap, no
// permit is held.
func TestMinGapHoldsNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{MinGap: time.Second, Concurrency: 1}).laneFor(ckey)
		var mu sync.Mutex
		var starts []time.Time
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := l.acquire(context.Background(), 1, High)
				if err != nil {
					t.Error(err)
					return
				}
				defer s.release()
				mu.Lock()
				starts = append(starts, time.Now())
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
				if i == 0 {
					// Refused once: the retry is a start too.
					s.Report(limit.Report{Status: 500, Verdict: limit.Failed})
					if err := s.WaitRetry(context.Background(), 0); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					starts = append(starts, time.Now())
					mu.Unlock()
					time.Sleep(100 * time.Millisecond)
				}
				s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			}()
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		// The first answer is in at 100 ms (a retry is queued again when
		// it was the one refused): the rest wait out the gap in the queue.
		if st := l.State(); st.InFlight != 0 || st.Queued < 2 {
			t.Errorf("inside the gap: %d in flight, %d queued; want none in flight (the gap holds no permit)", st.InFlight, st.Queued)
		}
		wg.Wait()
		if len(starts) != 4 {
			t.Fatalf("%d starts, want 4", len(starts))
		}
		if g := minGap(starts); g != time.Second {
			t.Errorf("closest starts %v apart, want 1s", g)
		}
	})
}

// TestConfiguredTPMPacesTokens: 6,000 tokens a minute is 100 a second;
// requests of 50 tokens go two a second after the first second's worth.
func TestConfiguredTPMPacesTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{TPM: 6000}).laneFor(ckey)
		var starts []time.Time
		begin := time.Now()
		for range 10 {
			s, err := l.acquire(context.Background(), 50, High)
			if err != nil {
				t.Fatal(err)
			}
			starts = append(starts, time.Now())
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		}
		// 2 from the full bucket at 0, then one each 0.5 s: the 10th at 4 s.
		if took := starts[9].Sub(begin); took != 4*time.Second {
			t.Errorf("10 requests of 50 tokens took %v, want 4s", took)
		}
	})
}

// TestConfiguredConcurrencyIsACeiling: a configured concurrency is where
// the group starts, and a ceiling it never grows past; with LIMITS=start
// it grows.
func TestConfiguredConcurrencyIsACeiling(t *testing.T) {
	for _, tc := range []struct {
		start    bool
		wantMost int
	}{{false, 3}, {true, 4}} {
		synctest.Test(t, func(t *testing.T) {
			l := configuredTable(limit.Limits{Concurrency: 3, Start: tc.start}).laneFor(ckey)
			if c := l.State().Concurrency; c != 3 {
				t.Errorf("start %v: starts at %d, want 3", tc.start, c)
			}
			_, most := runStarts(t, l, 200, 100*time.Millisecond, nil)
			if tc.start && most <= 3 || !tc.start && most != 3 {
				t.Errorf("start %v: most in flight %d, want %s", tc.start, most, map[bool]string{false: "3", true: "more than 3"}[tc.start])
			}
		})
	}
}

// TestConfiguredLimitsAreMetrics: the configured limits of a lane's route
// are gauges by kind, only those set; a lane of a route without any has
// none.
func TestConfiguredLimitsAreMetrics(t *testing.T) {
	tbl := NewTable(TableConfig{RouteLimits: map[string]limit.Limits{"": {RPM: 600, Concurrency: 4, MinGap: 50 * time.Millisecond}}})
	l := tbl.laneFor(ckey)
	tbl.laneFor(Key{Route: "other", Path: "/v1/x", Model: "m"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(tbl.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "llmproxy_lane_configured_limit" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["lane"] != l.ID() {
				t.Errorf("a configured limit on lane %s, which has none", labels["lane"])
			}
			got[labels["kind"]] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{"rpm": 600, "concurrency": 4, "min_gap_seconds": 0.05}
	if len(got) != len(want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// TestConfiguredStartGrowsWhileNothingIsLearned: a start of 60 RPM that
// holds requests back on an upstream that says nothing and refuses nothing
// grows by a quarter each second it holds them; a ceiling would not.
func TestConfiguredStartGrowsWhileNothingIsLearned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{RPM: 60, Start: true}).laneFor(ckey)
		starts, _ := runStarts(t, l, 8, 10*time.Millisecond, nil)
		var gaps []time.Duration
		for i := 1; i < len(starts); i++ {
			gaps = append(gaps, starts[i].Sub(starts[i-1]))
		}
		if gaps[0] != time.Second {
			t.Errorf("first gap %v, want the start's 1s", gaps[0])
		}
		// 1s, 1s, 0.8s, 0.64s, 0.64s, 0.512s, …: a quarter more for each
		// second held back.
		for i := 1; i < len(gaps); i++ {
			if gaps[i] > gaps[i-1] {
				t.Errorf("gaps %v: want none longer than the one before", gaps)
				break
			}
		}
		if last := gaps[len(gaps)-1]; last > 520*time.Millisecond {
			t.Errorf("last gap %v (gaps %v), want the start grown to about twice", last, gaps)
		}
		if c := l.State().Configured; c.Mode != "start" {
			t.Errorf("mode %q, want start: nothing was learned", c.Mode)
		}
	})
}

// TestAConfiguredLimitSkipsTheFirstAnswerWindow: a group whose route
// configures a rate, a token rate or a concurrency knows a limit and sends
// a burst at once; one with only a minimum gap still sends one request
// and waits for its answer first.
func TestAConfiguredLimitSkipsTheFirstAnswerWindow(t *testing.T) {
	for _, tc := range []struct {
		lim   limit.Limits
		waits bool
	}{
		{limit.Limits{RPM: 6e6}, false}, {limit.Limits{TPM: 6e9}, false}, {limit.Limits{Concurrency: 4}, false},
		{limit.Limits{MinGap: time.Millisecond}, true},
	} {
		synctest.Test(t, func(t *testing.T) {
			l := configuredTable(tc.lim).laneFor(ckey)
			first, err := l.acquire(context.Background(), 1, High)
			if err != nil {
				t.Fatal(err)
			}
			second := make(chan *Slot, 1)
			go func() {
				if s, err := l.acquire(context.Background(), 1, High); err == nil {
					second <- s
				}
			}()
			time.Sleep(100 * time.Millisecond) // the gap and the rate are long past
			if went := len(second) == 1; went == tc.waits {
				t.Errorf("%+v: the second request went before the first answer: %v, want %v", tc.lim, went, !tc.waits)
			}
			first.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			first.release()
			s := <-second
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		})
	}
}

// TestConfiguredRPMGivesNoBurstAfterAnIdleSpell: 600 RPM, one request,
// half a second idle, then five at once: they go 100 ms apart, not in a
// burst that makes up for the idle time; a timer a little late keeps the
// cadence.
func TestConfiguredRPMGivesNoBurstAfterAnIdleSpell(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{RPM: 600}).laneFor(ckey)
		s, _ := l.acquire(context.Background(), 1, High)
		s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
		time.Sleep(500 * time.Millisecond)
		starts, _ := runStarts(t, l, 5, 10*time.Millisecond, nil)
		if g := minGap(starts); g < 100*time.Millisecond {
			t.Errorf("after an idle spell, starts %v apart, want 100ms", g)
		}
	})
}

// TestConfiguredTPMWaitsForWhatIsMissing: with 20 of 100 tokens refilled,
// a 50-token request waits for the 30 missing (0.3 s at 100 a second).
func TestConfiguredTPMWaitsForWhatIsMissing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{TPM: 6000}).laneFor(ckey)
		for range 2 { // the full bucket: 100 tokens
			s, _ := l.acquire(context.Background(), 50, High)
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		}
		time.Sleep(200 * time.Millisecond) // 20 back
		begin := time.Now()
		s, _ := l.acquire(context.Background(), 50, High)
		if w := time.Since(begin); w != 300*time.Millisecond {
			t.Errorf("waited %v, want 300ms for the 30 tokens missing", w)
		}
		s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
	})
}

// TestConfiguredTPMStartGrows: a token start that holds requests back
// grows like a request start.
func TestConfiguredTPMStartGrows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{TPM: 6000, Start: true}).laneFor(ckey)
		begin := time.Now()
		for range 20 {
			s, _ := l.acquire(context.Background(), 50, High)
			s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		}
		// At 100 tokens a second, 20 × 50 tokens take 9 s past the first
		// second's 100; grown by a quarter each second held, far less.
		if took := time.Since(begin); took > 6*time.Second {
			t.Errorf("20 requests of 50 tokens took %v: the start did not grow", took)
		}
	})
}

// TestForgedCredentialsSpendNoPace (issue 49): requests the upstream
// answers 401 or 403 give back what they took from the lane's limits (the
// configured gap, RPM and TPM, and the pace its headers taught), so a
// flood of forged signatures on a key's lane (SigV4 lanes are keyed by
// the access key ID, which is not secret) leaves the key's pace to its
// genuine requests: the one after them goes at once, and the one after
// that waits for the pace.
func TestForgedCredentialsSpendNoPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := configuredTable(limit.Limits{RPM: 6, TPM: 600, MinGap: 5 * time.Second}).laneFor(ckey)
		get := func() *Slot {
			t.Helper()
			s, err := l.acquire(context.Background(), 10, High)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		begin := time.Now()
		s := get()
		// One of two requests a minute left, by the headers.
		s.Report(limit.Report{Status: 200, Verdict: limit.Accepted, Limits: headerparse.Limits{
			Requests: headerparse.Window{Limit: 2, Remaining: 1, HasRemaining: true, Reset: begin.Add(time.Minute)}}})
		s.release()
		time.Sleep(10 * time.Second) // the RPM's gap
		paced := time.Now()
		for i := range 20 {
			s := get()
			status := 401 + 2*(i%2) // 401 and 403
			s.Report(limit.Report{Status: status, Verdict: limit.VerdictOf(status, false, false)})
			s.release()
		}
		if waited := time.Since(paced); waited != 0 {
			t.Fatalf("20 forged requests took %v, want none of the pace", waited)
		}
		s = get()
		if waited := time.Since(paced); waited != 0 {
			t.Fatalf("the genuine request after them waited %v, want none", waited)
		}
		s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
		s = get()
		if waited := time.Since(paced); waited < 10*time.Second {
			t.Fatalf("the next genuine request waited %v, want the pace's 10s at least", waited)
		}
		// No answer at all (the connection failed): it may have reached
		// the upstream, and keeps the configured gap.
		s.Report(limit.Report{Verdict: limit.VerdictOf(0, true, false)})
		s.release()
		before := time.Now()
		s = get()
		if waited := time.Since(before); waited < 5*time.Second {
			t.Fatalf("the request after a failed connection waited %v, want the gap's 5s at least", waited)
		}
		s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
	})
}
