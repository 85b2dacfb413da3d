package proxy

import (
	"context"
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
	"github.com/llmproxy/llmproxy/limit"
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
		name       string
		res        upstream.Result
		tries      attemptCounts
		deadline   time.Duration // after now
		action     action
		verdict    limit.Verdict
		wait       time.Duration
		pauseGroup bool
	}{
		{"200 passes", answered(200, upstream.Success, headerparse.KindNone), attemptCounts{}, time.Minute, actPass, limit.Accepted, 0, false},
		{"400 passes as it is", answered(400, upstream.Final, headerparse.KindOther), attemptCounts{}, time.Minute, actPass, limit.Accepted, 0, false},
		{"hard-quota 429 passes, teaching nothing", answered(429, upstream.Final, headerparse.KindHardQuota), attemptCounts{}, time.Minute, actPass, limit.Failed, 0, false},
		{"rate 429 with a hint pauses the lane for it, a grain late", withHint(rate429, 1500*time.Millisecond), attemptCounts{}, time.Minute, actRetry, limit.RateRefused, 1501 * time.Millisecond, true},
		{"a hint in whole seconds is read as it is", withHint(rate429, 2*time.Second), attemptCounts{}, time.Minute, actRetry, limit.RateRefused, 2 * time.Second, true},
		{"rate 429 without a hint backs off", rate429, attemptCounts{refusals: 1}, time.Minute, actRetry, limit.RateRefused, 200 * time.Millisecond, true},
		{"zero hint backs off instead of retrying at once", withHint(rate429, 0), attemptCounts{}, time.Minute, actRetry, limit.RateRefused, 100 * time.Millisecond, true},
		{"negative hint backs off", withHint(rate429, -time.Second), attemptCounts{}, time.Minute, actRetry, limit.RateRefused, 100 * time.Millisecond, true},
		{"concurrency 429 delays only the request", withHint(answered(429, upstream.Retryable, headerparse.KindConcurrency), time.Second), attemptCounts{}, time.Minute, actRetry, limit.ConcurrencyRefused, time.Second, false},
		{"503 pauses the lane", answered(503, upstream.Retryable, headerparse.KindOverloaded), attemptCounts{}, time.Minute, actRetry, limit.Overloaded, 100 * time.Millisecond, true},
		{"529 pauses the lane", answered(529, upstream.Retryable, headerparse.KindOverloaded), attemptCounts{}, time.Minute, actRetry, limit.Overloaded, 100 * time.Millisecond, true},
		{"500 delays only the request", answered(500, upstream.Retryable, headerparse.KindOther), attemptCounts{}, time.Minute, actRetry, limit.Failed, 100 * time.Millisecond, false},
		{"connection error is not sent", unreachable, attemptCounts{}, time.Minute, actRetry, limit.NotSent, 100 * time.Millisecond, false},
		{"unreachable gives up after two retries", unreachable, attemptCounts{failures: 2, unreachable: 2}, time.Minute, actGiveUp, limit.NotSent, 0, false},
		{"retries exhausted", withHint(answered(500, upstream.Retryable, headerparse.KindOther), time.Second), attemptCounts{failures: 3}, time.Minute, actGiveUp, limit.Failed, 0, false},
		{"a refusal after maxRetries failures is still absorbed", withHint(rate429, time.Second), attemptCounts{failures: 3}, time.Minute, actRetry, limit.RateRefused, time.Second, true},
		{"a failure backs off by the failures, not the refusals", answered(500, upstream.Retryable, headerparse.KindOther), attemptCounts{failures: 1, refusals: 7}, time.Minute, actRetry, limit.Failed, 200 * time.Millisecond, false},
		{"refusals without a hint back off at most 2^3 steps", rate429, attemptCounts{refusals: 40}, time.Minute, actRetry, limit.RateRefused, 800 * time.Millisecond, true},
		{"unreachable after refusals is retried", unreachable, attemptCounts{refusals: 5}, time.Minute, actRetry, limit.NotSent, 100 * time.Millisecond, false},
		{"hint beyond MaxRetryAfter", withHint(rate429, 2*time.Minute), attemptCounts{}, time.Hour, actGiveUp, limit.RateRefused, 0, false},
		{"hint of exactly MaxRetryAfter is waited for", withHint(rate429, time.Minute), attemptCounts{}, time.Hour, actRetry, limit.RateRefused, time.Minute, true},
		{"wait past the deadline", withHint(rate429, 30*time.Second), attemptCounts{}, 10 * time.Second, actGiveUp, limit.RateRefused, 0, false},
	}
	// The reasons a client reads when the proxy gives up count what happened.
	if d := decide(unreachable, attemptCounts{failures: 2, unreachable: 2}, pol, now, now.Add(time.Minute), 0); !strings.Contains(d.why, "after 3 attempts") {
		t.Errorf("unreachable after two retries: %q, want 3 attempts counted", d.why)
	}
	// A refusal retried counts one more in a row for the next answer.
	if d := decide(rate429, attemptCounts{refusals: 2}, pol, now, now.Add(time.Minute), 0); d.next.refusals != 3 {
		t.Errorf("a third refusal in a row counts %d for the next answer, want 3", d.next.refusals)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decide(tt.res, tt.tries, pol, now, now.Add(tt.deadline), 0)
			if d.action != tt.action || d.report.Verdict != tt.verdict || d.wait != tt.wait || d.pauseGroup != tt.pauseGroup {
				t.Fatalf("got %v %v wait %v pause %v (%s); want %v %v wait %v pause %v",
					d.action, d.report.Verdict, d.wait, d.pauseGroup, d.why, tt.action, tt.verdict, tt.wait, tt.pauseGroup)
			}
			if (d.action == actGiveUp) != (d.why != "") {
				t.Fatalf("why = %q for %v", d.why, d.action)
			}
			rep := d.report
			if wantPause := tt.action == actRetry && tt.pauseGroup; wantPause != !rep.PauseUntil.IsZero() ||
				wantPause && !rep.PauseUntil.Equal(now.Add(tt.wait)) {
				t.Fatalf("report pause until %v, want pause %v for %v", rep.PauseUntil, wantPause, tt.wait)
			}
			// The lane reads the hint the request waits for: a fine one
			// a grain late (its window's closure ends where the pause does).
			if tt.res.HasHint && tt.res.Hint > 0 && tt.action == actRetry && rep.Hint != tt.wait {
				t.Fatalf("report hint %v, want the %v waited", rep.Hint, tt.wait)
			}
		})
	}
}

// laneDeadline is the error a lane gives a request whose deadline passed
// while it waited.
var laneDeadline = fmt.Errorf("lane ab12: %w: %w", lanequeue.ErrDeadlineExceeded, context.DeadlineExceeded)

// TestRetryWaitIsNoneWhenTheGroupHoldsIt: a retry that asked its group
// to pause waits nothing more of its own when the group is paused at
// least as long as asked, or when a refusal meets a group bound by the
// number in flight; otherwise, and always when it asked no pause, it
// waits its decided wait.
func TestRetryWaitIsNoneWhenTheGroupHoldsIt(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	asked := now.Add(time.Second)
	for _, c := range []struct {
		name       string
		verdict    limit.Verdict
		pauseGroup bool
		paused     time.Time
		bound      bool
		want       time.Duration
	}{
		{"paused as long as asked", limit.RateRefused, true, asked, false, 0},
		{"paused longer than asked", limit.RateRefused, true, asked.Add(time.Second), false, 0},
		{"the pause declined, a rate binds", limit.RateRefused, true, time.Time{}, false, time.Second},
		{"the pause shorter than asked", limit.RateRefused, true, asked.Add(-time.Millisecond), false, time.Second},
		{"the pause declined, concurrency binds", limit.RateRefused, true, time.Time{}, true, 0},
		{"an overload meets a concurrency bound", limit.Overloaded, true, time.Time{}, true, 0},
		{"an overload without one", limit.Overloaded, true, time.Time{}, false, time.Second},
		{"no pause asked: the request's own wait", limit.ConcurrencyRefused, false, asked, true, time.Second},
	} {
		d := decision{action: actRetry, wait: time.Second, pauseGroup: c.pauseGroup, report: limit.Report{Verdict: c.verdict}}
		if c.pauseGroup {
			d.report.PauseUntil = asked
		}
		if got := d.retryWait(c.paused, c.bound); got != c.want {
			t.Errorf("%s: waits %v, want %v", c.name, got, c.want)
		}
	}
}

// times is n copies of res.
func times(n int, res ...upstream.Result) []upstream.Result {
	var out []upstream.Result
	for range n {
		out = append(out, res...)
	}
	return out
}

// TestDecideCountsFailuresNotRefusals plays a request's answers in order,
// carrying what decide counted from one to the next and advancing the clock
// by each wait: refusals absorbed by waiting are bounded by the deadline
// alone, failures by maxRetries.
func TestDecideCountsFailuresNotRefusals(t *testing.T) {
	start := time.Unix(2_000_000, 0)
	pol := retryPolicy{maxRetries: 10, maxRetryAfter: 2 * time.Minute}
	ok := answered(200, upstream.Success, headerparse.KindNone)
	rate := withHint(answered(429, upstream.Retryable, headerparse.KindRateLimit), time.Second)
	conc := withHint(answered(429, upstream.Retryable, headerparse.KindConcurrency), time.Second)
	failed := func(code int) upstream.Result { return answered(code, upstream.Retryable, headerparse.KindOther) }
	unreachable := upstream.Result{Err: errors.New("dial tcp: connection refused"), Outcome: upstream.Retryable, Unreachable: true}
	tests := []struct {
		name     string
		answers  []upstream.Result // the last one is decided on with action and why
		deadline time.Duration     // after start
		action   action
		why      string
	}{
		{"50 absorbed 429s then a 200", append(times(50, rate), ok), 10 * time.Minute, actPass, ""},
		{"30 concurrency 429s then a 200", append(times(30, conc), ok), 10 * time.Minute, actPass, ""},
		{"429s without a hint then a 200", append(times(40, withHint(rate, 0)), ok), 10 * time.Minute, actPass, ""},
		{"11 × 500 gives up", times(11, failed(500)), 10 * time.Minute, actGiveUp, "retries exhausted (LLMPROXY_MAX_RETRIES)"},
		{"10 × 500 then a 200", append(times(10, failed(500)), ok), 10 * time.Minute, actPass, ""},
		{"11 × 503 gives up", times(11, answered(503, upstream.Retryable, headerparse.KindOverloaded)), 10 * time.Minute, actGiveUp, "retries exhausted"},
		{"11 × 408 gives up", times(11, failed(408)), 10 * time.Minute, actGiveUp, "retries exhausted"},
		{"every failure kind counts", []upstream.Result{failed(500), failed(502), unreachable, failed(503), failed(504), unreachable,
			answered(529, upstream.Retryable, headerparse.KindOverloaded), failed(408), failed(500), failed(502), failed(504)}, 10 * time.Minute, actGiveUp, "retries exhausted"},
		{"a mix counts only the failures: the 11th 500 gives up", times(11, rate, conc, failed(500)), 10 * time.Minute, actGiveUp, "retries exhausted"},
		{"a mix with 10 failures passes", append(times(10, rate, failed(500), rate), ok), 10 * time.Minute, actPass, ""},
		{"a 429 whose wait passes the deadline gives up", times(6, rate), 5500 * time.Millisecond, actGiveUp, "would pass the request's deadline"},
		{"a long hint gives up at once after absorbed refusals", append(times(5, rate), withHint(rate, 3*time.Minute)), 10 * time.Minute, actGiveUp, "longer than LLMPROXY_MAX_RETRY_AFTER"},
		{"connection errors in a row still give up after 3", append(times(4, rate), unreachable, unreachable, unreachable), 10 * time.Minute, actGiveUp, "no connection after 3 attempts"},
		{"connection errors apart are retried", append(times(3, rate, unreachable, unreachable), ok), 10 * time.Minute, actPass, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now, counted := start, attemptCounts{}
			last := len(tt.answers) - 1
			for i, res := range tt.answers[:last] {
				d := decide(res, counted, pol, now, start.Add(tt.deadline), 0.5)
				if d.action != actRetry {
					t.Fatalf("answer %d of %d: %v (%s), want retry", i+1, len(tt.answers), d.action, d.why)
				}
				counted, now = d.next, now.Add(d.wait)
			}
			d := decide(tt.answers[last], counted, pol, now, start.Add(tt.deadline), 0.5)
			if d.action != tt.action || !strings.Contains(d.why, tt.why) {
				t.Fatalf("last answer: %v (%q), want %v (%q); counted %+v", d.action, d.why, tt.action, tt.why, counted)
			}
			if counted.failures > pol.maxRetries {
				t.Fatalf("%d failures retried, more than maxRetries", counted.failures)
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
		{"deadline from the lane", laneDeadline, 504, "budget_exceeded", true, 0},
		{"deadline from the proxy", fail(failDeadline, "x"), 504, "budget_exceeded", true, 0},
		{"unreachable", fail(failUnreachable, "x"), 502, "upstream_unreachable", true, 0},
		{"too large", fail(failTooLarge, "x"), 413, "request_too_large", true, 0},
		{"body read", fail(failBodyRead, "x"), 400, "body_read_error", false, 0},
		{"CONNECT", fail(failMethod, "x"), 405, "method_not_allowed", false, 0},
		{"absolute URI", fail(failAbsoluteURI, "x"), 400, "absolute_uri", false, 0},
		{"anything else", errors.New("boom"), 500, "internal_error", false, 0},
		{"shutting down", errShutdown, 503, "shutting_down", false, time.Second},
		{"pacing past the deadline", fmt.Errorf("lane x: %w", &lanequeue.WaitError{At: replyNow.Add(42 * time.Second)}), 429, "wait_exceeds_budget", true, 42 * time.Second},
		{"pause past the deadline", &lanequeue.WaitError{At: replyNow.Add(1500 * time.Millisecond), Paused: true}, 429, "wait_exceeds_budget", true, 1500 * time.Millisecond},
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
