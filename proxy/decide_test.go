package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/backoff"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/upstream"
)

func answered(status int, outcome upstream.Outcome, kind headerparse.ErrorKind) upstream.Result {
	return upstream.Result{Resp: &http.Response{StatusCode: status}, Outcome: outcome, Error: headerparse.ErrorInfo{Kind: kind}}
}

func withHint(r upstream.Result, d time.Duration) upstream.Result {
	r.Hint, r.HasHint = d, true
	return r
}

func TestDecide(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	pol := retryPolicy{maxRetries: 3, maxRetryAfter: time.Minute, backoff: backoff.Policy{Base: 100 * time.Millisecond, Max: 8 * time.Second}}
	rate429 := answered(429, upstream.Retryable, headerparse.KindRateLimit)
	unreachable := upstream.Result{Err: errors.New("dial tcp: connection refused"), Outcome: upstream.Retryable, Unreachable: true}
	tests := []struct {
		name      string
		res       upstream.Result
		retries   int
		budget    time.Duration
		action    action
		verdict   lanequeue.Verdict
		wait      time.Duration
		pauseLane bool
	}{
		{"200 passes", answered(200, upstream.Success, headerparse.KindNone), 0, time.Minute, pass, lanequeue.Accepted, 0, false},
		{"400 passes as it is", answered(400, upstream.Final, headerparse.KindOther), 0, time.Minute, pass, lanequeue.Accepted, 0, false},
		{"hard-quota 429 passes, teaching nothing", answered(429, upstream.Final, headerparse.KindHardQuota), 0, time.Minute, pass, lanequeue.Failed, 0, false},
		{"rate 429 with a hint pauses the lane for it", withHint(rate429, 1500*time.Millisecond), 0, time.Minute, retry, lanequeue.RateRefused, 1500 * time.Millisecond, true},
		{"rate 429 without a hint backs off", rate429, 1, time.Minute, retry, lanequeue.RateRefused, 200 * time.Millisecond, true},
		{"zero hint backs off instead of retrying at once", withHint(rate429, 0), 0, time.Minute, retry, lanequeue.RateRefused, 100 * time.Millisecond, true},
		{"negative hint backs off", withHint(rate429, -time.Second), 0, time.Minute, retry, lanequeue.RateRefused, 100 * time.Millisecond, true},
		{"concurrency 429 delays only the request", withHint(answered(429, upstream.Retryable, headerparse.KindConcurrency), time.Second), 0, time.Minute, retry, lanequeue.ConcurrencyRefused, time.Second, false},
		{"503 pauses the lane", answered(503, upstream.Retryable, headerparse.KindOverloaded), 0, time.Minute, retry, lanequeue.Overloaded, 100 * time.Millisecond, true},
		{"529 pauses the lane", answered(529, upstream.Retryable, headerparse.KindOverloaded), 0, time.Minute, retry, lanequeue.Overloaded, 100 * time.Millisecond, true},
		{"500 delays only the request", answered(500, upstream.Retryable, headerparse.KindOther), 0, time.Minute, retry, lanequeue.Failed, 100 * time.Millisecond, false},
		{"connection error is not sent", unreachable, 0, time.Minute, retry, lanequeue.NotSent, 100 * time.Millisecond, false},
		{"unreachable gives up after two retries", unreachable, 2, time.Minute, giveUp, lanequeue.NotSent, 0, false},
		{"retries exhausted", withHint(rate429, time.Second), 3, time.Minute, giveUp, lanequeue.RateRefused, 0, false},
		{"hint beyond MaxRetryAfter", withHint(rate429, 2*time.Minute), 0, time.Hour, giveUp, lanequeue.RateRefused, 0, false},
		{"wait past the budget", withHint(rate429, 30*time.Second), 0, 10 * time.Second, giveUp, lanequeue.RateRefused, 0, false},
	}
	// The reasons a client reads when the proxy gives up count what happened.
	if d := decide(unreachable, 2, pol, now, now.Add(time.Minute), 0); !strings.Contains(d.why, "after 3 attempts") {
		t.Errorf("unreachable after two retries: %q, want 3 attempts counted", d.why)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decide(tt.res, tt.retries, pol, now, now.Add(tt.budget), 0)
			if d.action != tt.action || d.verdict != tt.verdict || d.wait != tt.wait || d.pauseLane != tt.pauseLane {
				t.Fatalf("got %v %v wait %v pause %v (%s); want %v %v wait %v pause %v",
					d.action, d.verdict, d.wait, d.pauseLane, d.why, tt.action, tt.verdict, tt.wait, tt.pauseLane)
			}
			if (d.action == giveUp) != (d.why != "") {
				t.Fatalf("why = %q for %v", d.why, d.action)
			}
			rep := d.report(tt.res, now)
			if rep.Verdict != tt.verdict {
				t.Fatalf("report verdict %v", rep.Verdict)
			}
			if wantPause := tt.action == retry && tt.pauseLane; wantPause != !rep.PauseUntil.IsZero() ||
				wantPause && !rep.PauseUntil.Equal(now.Add(tt.wait)) {
				t.Fatalf("report pause until %v, want pause %v for %v", rep.PauseUntil, wantPause, tt.wait)
			}
		})
	}
}

// replyNow is the time the reply table is read at.
var replyNow = time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)

func TestReplyFor(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		status     int
		code       string
		noRetry    bool
		retryAfter time.Duration
	}{
		{"queue full", lanequeue.ErrQueueFull, 429, "queue_full", false, time.Second},
		{"budget from the lane", lanequeue.ErrBudgetExceeded, 504, "budget_exceeded", true, 0},
		{"budget from the proxy", fail(failBudget, "x"), 504, "budget_exceeded", true, 0},
		{"unreachable", fail(failUnreachable, "x"), 502, "upstream_unreachable", true, 0},
		{"too large", fail(failTooLarge, "x"), 413, "request_too_large", true, 0},
		{"body read", fail(failBodyRead, "x"), 400, "body_read_error", false, 0},
		{"CONNECT", fail(failMethod, "x"), 405, "method_not_allowed", false, 0},
		{"absolute URI", fail(failAbsoluteURI, "x"), 400, "absolute_uri", false, 0},
		{"anything else", errors.New("boom"), 500, "internal_error", false, 0},
		{"shutting down", errShutdown, 503, "shutting_down", false, time.Second},
		{"pacing past the budget", fmt.Errorf("lane x: %w", &lanequeue.WaitError{At: replyNow.Add(42 * time.Second)}), 429, "wait_exceeds_budget", true, 42 * time.Second},
		{"pause past the budget", &lanequeue.WaitError{At: replyNow.Add(1500 * time.Millisecond), Paused: true}, 429, "wait_exceeds_budget", true, 1500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := replyFor(tt.err, replyNow)
			if r.status != tt.status || r.code != tt.code || r.noRetry != tt.noRetry || r.retryAfter != tt.retryAfter {
				t.Fatalf("got %+v", r)
			}
			// What the client gets: Retry-After only with a wait, in whole
			// seconds rounded up; x-should-retry only when retrying is futile.
			rec := httptest.NewRecorder()
			r.write(rec)
			wantRA := ""
			if tt.retryAfter > 0 {
				wantRA = strconv.FormatInt(int64((tt.retryAfter+time.Second-1)/time.Second), 10)
			}
			if got := rec.Header().Get("Retry-After"); got != wantRA {
				t.Errorf("Retry-After %q, want %q", got, wantRA)
			}
			if got := rec.Header().Get("X-Should-Retry") == "false"; got != tt.noRetry {
				t.Errorf("x-should-retry false = %v, want %v", got, tt.noRetry)
			}
			if rec.Code != tt.status || !strings.Contains(rec.Body.String(), `"code":"`+tt.code+`"`) {
				t.Errorf("wrote %d %s", rec.Code, rec.Body.String())
			}
		})
	}
}
