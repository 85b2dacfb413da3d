package lanequeue

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// quotaTable is a table on a fake clock whose lanes have n permits each.
func quotaTable(n int) (*Table, *clock.Fake) {
	fc := clock.NewFake(t0)
	return NewTable(TableConfig{Lane: Config{Clock: fc, Concurrency: n, MaxConcurrency: n}}), fc
}

func quotaRequest(model string) Request {
	return Request{Route: "r", Credential: "sk-quota", Path: "/v1/chat/completions", Model: model}
}

// spend reports the answer to s's dispatch as a quota spent until renews
// (zero: not said), with status.
func spend(s *Slot, status int, renews time.Time) {
	s.Report(limit.Report{Status: status, Verdict: limit.Failed, Quota: headerparse.Quota{Spent: true, Renews: renews}})
}

// mustAcquire is a slot of the request's lane, which must be granted at once.
func mustAcquire(t *testing.T, tb *Table, r Request) *Slot {
	t.Helper()
	got := make(chan result, 1)
	go func() {
		s, err := tb.Acquire(context.Background(), r)
		got <- result{s, err}
	}()
	select {
	case g := <-got:
		if g.err != nil {
			t.Fatalf("acquire: %v", g.err)
		}
		return g.s
	case <-time.After(5 * time.Second):
		l := tb.laneFor(NewKey(r.Route, r.Credential, r.Path, r.Model))
		l.g.mu.Lock()
		tk, at, ok := l.drawsOn().shared.Admit(l.g.clock.Now(), 0, true)
		q := l.drawsOn().quota
		fa, faok := l.drawsOn().firstAnswerLocked(l.g.clock.Now())
		l.g.mu.Unlock()
		t.Fatalf("acquire waits: admit %v %v %+v; quota %+v; first %v %v", ok, at, tk, q, fa, faok)
	}
	return nil
}

// quotaRefusal is the QuotaError an acquire of r gets at once, or fails the
// test.
func quotaRefusal(t *testing.T, tb *Table, r Request) *QuotaError {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		s, err := tb.Acquire(context.Background(), r)
		if err == nil {
			s.Done(200, "ok", -1)
		}
		done <- err
	}()
	err := within(t, done, "an acquire under a spent quota waited")
	var qe *QuotaError
	if !errors.As(err, &qe) {
		t.Fatalf("acquire under a spent quota: %v, want a QuotaError", err)
	}
	if errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("a quota refusal %v matches ErrDeadlineExceeded", err)
	}
	return qe
}

// TestASpentQuotaRefusesUntilItRenews: after an answer that spent a quota
// renewing in an hour, the limit's requests are refused at once with the
// renewal and the upstream's status, up to the renewal; from it they go.
func TestASpentQuotaRefusesUntilItRenews(t *testing.T) {
	tb, fc := quotaTable(4)
	r := quotaRequest("m")
	renews := t0.Add(time.Hour)
	s := mustAcquire(t, tb, r)
	spend(s, 429, renews)
	s.Done(429, "upstream_error", -1)
	for _, after := range []time.Duration{0, 30 * time.Minute, time.Hour - time.Nanosecond} {
		fc.Set(t0.Add(after))
		if qe := quotaRefusal(t, tb, r); !qe.Until.Equal(renews) || qe.Status != 429 {
			t.Fatalf("%v after the quota: refused until %v with %d, want %v with 429", after, qe.Until, qe.Status, renews)
		}
	}
	st := tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")).State()
	if !st.QuotaUntil.Equal(renews) || !strings.HasPrefix(st.Quota, "quota spent until ") || !strings.HasSuffix(st.Quota, " PT") {
		t.Fatalf("state shows quota %q until %v, want until %v in PT", st.Quota, st.QuotaUntil, renews)
	}
	if st.Rejected != 3 {
		t.Fatalf("%d rejected, want the 3 refused", st.Rejected)
	}
	fc.Set(renews)
	s = mustAcquire(t, tb, r)
	s.Done(200, "ok", -1)
	if st := tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")).State(); st.Quota != "" || !st.QuotaUntil.IsZero() {
		t.Fatalf("state still shows quota %q until %v after the renewal", st.Quota, st.QuotaUntil)
	}
}

// TestASpentQuotaRefusesTheWaitersBehindIt: requests queued behind the one
// whose answer spent the quota are refused when it comes, not sent.
func TestASpentQuotaRefusesTheWaitersBehindIt(t *testing.T) {
	tb, _ := quotaTable(1)
	r := quotaRequest("m")
	s := mustAcquire(t, tb, r)
	defer s.Done(403, "upstream_error", -1) // a waiter still queued when the test fails goes then
	waiters := make(chan error, 2)
	for range 2 {
		go func() {
			w, err := tb.Acquire(context.Background(), r)
			if err == nil {
				w.Done(200, "ok", -1)
			}
			waiters <- err
		}()
	}
	waitFor(t, func() bool { return tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")).State().Queued == 2 })
	spend(s, 403, t0.Add(time.Minute))
	for range 2 {
		var qe *QuotaError
		if err := within(t, waiters, "a waiter still waits after the quota was spent"); !errors.As(err, &qe) || qe.Status != 403 {
			t.Fatalf("a waiter got %v, want the 403 quota", err)
		}
	}
}

// TestAQuotaWithoutRenewalSendsOneRequestAMinute: while the renewal is not
// known, the first request a minute after the quota answer goes upstream,
// the others are refused; the probe's quota answer starts the minute
// again, and its success ends the hold.
func TestAQuotaWithoutRenewalSendsOneRequestAMinute(t *testing.T) {
	tb, fc := quotaTable(4)
	r := quotaRequest("m")
	s := mustAcquire(t, tb, r)
	spend(s, 429, time.Time{})
	s.Done(429, "upstream_error", -1)
	if qe := quotaRefusal(t, tb, r); !qe.Until.IsZero() {
		t.Fatalf("refused until %v, want a renewal not known", qe.Until)
	}
	if st := tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")).State(); st.Quota != "quota spent, reset not known" || !st.QuotaUntil.IsZero() {
		t.Fatalf("state shows %q until %v", st.Quota, st.QuotaUntil)
	}
	fc.Set(t0.Add(quotaProbeEvery - time.Nanosecond))
	quotaRefusal(t, tb, r)
	fc.Set(t0.Add(quotaProbeEvery))
	probe := mustAcquire(t, tb, r)
	quotaRefusal(t, tb, r) // one probe a minute
	fc.Set(t0.Add(quotaProbeEvery + time.Second))
	spend(probe, 429, time.Time{}) // still spent: a minute from this answer
	probe.Done(429, "upstream_error", -1)
	fc.Set(t0.Add(2*quotaProbeEvery + time.Second - time.Nanosecond))
	quotaRefusal(t, tb, r)
	fc.Set(t0.Add(2*quotaProbeEvery + time.Second))
	probe = mustAcquire(t, tb, r)
	fc.Set(t0.Add(2*quotaProbeEvery + 2*time.Second))
	accept(probe, headerparse.Limits{})
	probe.Done(200, "ok", -1)
	for range 3 { // the quota came back: the lane sends as before
		fc.Set(fc.Now().Add(time.Second)) // past any pace learned
		mustAcquire(t, tb, r).Done(200, "ok", -1)
	}
}

// TestOnlyAnAnswerSentAfterTheQuotaEndsIt: an answer to a request sent
// before the quota answer came does not end the hold, nor does a 5xx or
// no answer at all to one sent after it; a success to one sent after it
// does.
func TestOnlyAnAnswerSentAfterTheQuotaEndsIt(t *testing.T) {
	tb, fc := quotaTable(4)
	r := quotaRequest("m")
	first := mustAcquire(t, tb, r)
	fc.Set(t0.Add(time.Millisecond)) // past the first-answer window's one request
	pastFirstAnswer(tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")))
	earlier := mustAcquire(t, tb, r)
	fc.Set(t0.Add(time.Second))
	spend(first, 429, time.Time{})
	first.Done(429, "upstream_error", -1)
	accept(earlier, headerparse.Limits{})
	earlier.Done(200, "ok", -1)
	quotaRefusal(t, tb, r)
	for i, status := range []int{500, 0} {
		fc.Set(t0.Add(time.Second + time.Duration(i+1)*quotaProbeEvery))
		probe := mustAcquire(t, tb, r)
		verdict := limit.Failed
		if status == 0 {
			verdict = limit.NotSent
		}
		probe.Report(limit.Report{Status: status, Verdict: verdict})
		probe.Done(status, "upstream_error", -1)
		quotaRefusal(t, tb, r)
	}
	fc.Set(t0.Add(time.Second + 3*quotaProbeEvery))
	probe := mustAcquire(t, tb, r)
	probe.Report(limit.Report{Status: 404, Verdict: limit.Accepted})
	probe.Done(404, "upstream_error", -1)
	fc.Set(fc.Now().Add(time.Second)) // past any pace learned
	mustAcquire(t, tb, r).Done(200, "ok", -1)
}

// TestAQuotaHoldsItsModelsLimitOnly: another model of the same key has a
// limit of its own, which the quota does not hold.
func TestAQuotaHoldsItsModelsLimitOnly(t *testing.T) {
	tb, _ := quotaTable(4)
	s := mustAcquire(t, tb, quotaRequest("day-spent"))
	spend(s, 429, t0.Add(time.Hour))
	s.Done(429, "upstream_error", -1)
	quotaRefusal(t, tb, quotaRequest("day-spent"))
	mustAcquire(t, tb, quotaRequest("other")).Done(200, "ok", -1)
}

// TestAQuotaRenewingNowHoldsNothing: an answer that spends a quota that
// renews now or earlier holds nothing.
func TestAQuotaRenewingNowHoldsNothing(t *testing.T) {
	tb, _ := quotaTable(4)
	r := quotaRequest("m")
	s := mustAcquire(t, tb, r)
	spend(s, 429, t0)
	s.Done(429, "upstream_error", -1)
	mustAcquire(t, tb, r).Done(200, "ok", -1)
}

// TestASpentQuotaIsLoggedOnce: the answer that spends a quota logs one
// line with its status and renewal, or that it is not known; answers that
// spend it again log none.
func TestASpentQuotaIsLoggedOnce(t *testing.T) {
	for _, c := range []struct {
		renews time.Time
		want   []string
	}{
		{time.Date(2036, 11, 28, 8, 0, 0, 0, time.UTC), []string{"msg=\"lane quota spent\"", "status=429", "until=2036-11-28T08:00:00.000Z", "pt=\"00:00 PT\""}},
		{time.Time{}, []string{"msg=\"lane quota spent\"", "status=429", "until=\"not known\"", "probe_every=1m0s"}},
	} {
		var logs bytes.Buffer
		fc := clock.NewFake(time.Date(2036, 11, 27, 16, 0, 0, 0, time.UTC))
		tb := NewTable(TableConfig{Lane: Config{Clock: fc, Concurrency: 4, MaxConcurrency: 4},
			Log: slog.New(slog.NewTextHandler(&logs, nil))})
		r := quotaRequest("m")
		a := mustAcquire(t, tb, r)
		pastFirstAnswer(tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")))
		b := mustAcquire(t, tb, r)
		spend(a, 429, c.renews)
		spend(b, 429, c.renews)
		a.Done(429, "upstream_error", -1)
		b.Done(429, "upstream_error", -1)
		if n := strings.Count(logs.String(), "lane quota spent"); n != 1 {
			t.Fatalf("%d quota lines, want 1:\n%s", n, logs.String())
		}
		for _, w := range c.want {
			if !strings.Contains(logs.String(), w) {
				t.Errorf("log %q lacks %s", logs.String(), w)
			}
		}
	}
}

// TestQuotaErrorSays: the error names the renewal, or that it is not known.
func TestQuotaErrorSays(t *testing.T) {
	if got := (&QuotaError{Until: time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)}).Error(); got != "lanequeue: quota spent until 2026-11-28T08:00:00Z" {
		t.Errorf("Error() = %q", got)
	}
	if got := (&QuotaError{}).Error(); got != "lanequeue: quota spent, reset not known" {
		t.Errorf("Error() = %q", got)
	}
}

// spendOnWords reports the answer to s's dispatch as a quota spent on the
// message's words alone, renewing at renews (zero: not said).
func spendOnWords(s *Slot, status int, renews time.Time) {
	s.Report(limit.Report{Status: status, Verdict: limit.Failed, Quota: headerparse.Quota{Spent: true, Renews: renews, Worded: true}})
}

// TestAHoldOnWordsIsProbedAndCapped (issue 49): a quota said in words
// alone holds at most quotaWordsCap, however long the words say, and one
// request a minute goes upstream even though a renewal was named; the
// probe's success ends the hold.
func TestAHoldOnWordsIsProbedAndCapped(t *testing.T) {
	for _, c := range []struct {
		name         string
		renews, want time.Time
	}{
		{"a month said", t0.Add(744 * time.Hour), t0.Add(quotaWordsCap)},
		{"a day and a second said", t0.Add(quotaWordsCap + time.Second), t0.Add(quotaWordsCap)},
		{"a day said", t0.Add(quotaWordsCap), t0.Add(quotaWordsCap)},
		{"two hours said", t0.Add(2 * time.Hour), t0.Add(2 * time.Hour)},
		{"nothing said", time.Time{}, t0.Add(quotaWordsCap)},
	} {
		t.Run(c.name, func(t *testing.T) {
			tb, fc := quotaTable(4)
			r := quotaRequest("m")
			s := mustAcquire(t, tb, r)
			spendOnWords(s, 429, c.renews)
			s.Done(429, "upstream_error", -1)
			if qe := quotaRefusal(t, tb, r); !qe.Until.Equal(c.want) {
				t.Fatalf("refused until %v, want %v", qe.Until, c.want)
			}
			if st := tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")).State(); !st.QuotaUntil.Equal(c.want) {
				t.Fatalf("state shows the quota until %v, want %v", st.QuotaUntil, c.want)
			}
			fc.Set(t0.Add(quotaProbeEvery - time.Nanosecond))
			quotaRefusal(t, tb, r)
			fc.Set(t0.Add(quotaProbeEvery))
			probe := mustAcquire(t, tb, r)
			quotaRefusal(t, tb, r) // one probe a minute
			accept(probe, headerparse.Limits{})
			probe.Done(200, "ok", -1)
			fc.Set(fc.Now().Add(time.Second))
			mustAcquire(t, tb, r).Done(200, "ok", -1)
		})
	}
}

// TestAHoldOnWordsEndsAtItsCap: with no request to probe it, a hold on
// words ends at its cap.
func TestAHoldOnWordsEndsAtItsCap(t *testing.T) {
	tb, fc := quotaTable(4)
	r := quotaRequest("m")
	s := mustAcquire(t, tb, r)
	spendOnWords(s, 429, t0.Add(744*time.Hour))
	s.Done(429, "upstream_error", -1)
	fc.Set(t0.Add(quotaWordsCap))
	if st := tb.laneFor(NewKey("r", "sk-quota", r.Path, "m")).State(); st.Quota != "" {
		t.Fatalf("state shows %q at the cap, want no quota", st.Quota)
	}
	mustAcquire(t, tb, r).Done(200, "ok", -1)
}

// TestAClearLiftsAQuota (issue 49): an operator's clear of the lane, or of
// its route, ends a quota hold at once, a renewal named or not.
func TestAClearLiftsAQuota(t *testing.T) {
	for _, route := range []bool{false, true} {
		for _, renews := range []time.Time{{}, t0.Add(time.Hour)} {
			tb, _ := quotaTable(4)
			r := quotaRequest("m")
			s := mustAcquire(t, tb, r)
			spend(s, 429, renews)
			s.Done(429, "upstream_error", -1)
			quotaRefusal(t, tb, r)
			l := tb.laneFor(NewKey("r", "sk-quota", r.Path, "m"))
			if route {
				tb.ClearRoute("r", opBy, time.Now())
			} else if err := tb.ClearLane(l.ID(), opBy, time.Now(), false); err != nil {
				t.Fatal(err)
			}
			if st := l.State(); st.Quota != "" || !st.QuotaUntil.IsZero() {
				t.Fatalf("route %v, renewal %v: a clear left %q until %v", route, renews, st.Quota, st.QuotaUntil)
			}
			mustAcquire(t, tb, r).Done(200, "ok", -1)
		}
	}
}

// TestAProbeRefusedItsCredentialLeavesTheHold (issue 49): a probe the
// upstream answers 401 or 403 (a forged credential on the key's lane)
// does not end a quota hold, and gives its turn back: the next request
// probes at once, not a minute later, and its success ends the hold.
func TestAProbeRefusedItsCredentialLeavesTheHold(t *testing.T) {
	for _, status := range []int{401, 403} {
		tb, fc := quotaTable(4)
		r := quotaRequest("m")
		s := mustAcquire(t, tb, r)
		spendOnWords(s, 429, time.Time{})
		s.Done(429, "upstream_error", -1)
		fc.Set(t0.Add(quotaProbeEvery))
		probe := mustAcquire(t, tb, r)
		probe.Report(limit.Report{Status: status, Verdict: limit.VerdictOf(status, false, false)})
		probe.Done(status, "upstream_error", -1)
		fc.Set(fc.Now().Add(time.Second))
		probe = mustAcquire(t, tb, r) // the forged probe's turn given back
		quotaRefusal(t, tb, r)
		accept(probe, headerparse.Limits{})
		probe.Done(200, "ok", -1)
		mustAcquire(t, tb, r).Done(200, "ok", -1)
	}
}
