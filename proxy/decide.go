package proxy

import (
	"strconv"
	"time"

	"github.com/llmproxy/llmproxy/backoff"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/upstream"
)

// action is what the proxy does with an attempt's answer.
type action uint8

const (
	// actPass hands the upstream's answer to the client.
	actPass action = iota
	// actRetry sends the request again after decision.wait; the request
	// keeps its place in the lane.
	actRetry
	// actGiveUp ends the request: the client gets the upstream's answer, or a
	// proxy error when there is none.
	actGiveUp
)

func (a action) String() string {
	switch a {
	case actPass:
		return "pass"
	case actRetry:
		return "retry"
	}
	return "give_up"
}

// decision is what to do with one answer, and what it tells the lane.
type decision struct {
	action action
	// report is what the lane learns from the answer; with pauseGroup it
	// asks the group to pause until the retry.
	report limit.Report
	// wait is how long before the retry. With pauseGroup it holds every
	// lane of the group (a refusal speaks for the whole limit); without,
	// only this request.
	wait       time.Duration
	pauseGroup bool
	why        string // actGiveUp: the reason, for the client and the log
	// next is the request's counts with this answer counted: what decide
	// reads for the next attempt's answer when the action is actRetry.
	next attemptCounts
	// quiet: the lane is not told of the answer, and the retry goes as
	// the same dispatch (a flex refusal: see flexDecide).
	quiet bool
}

// retryPolicy is the part of Config that decides retries.
type retryPolicy struct {
	maxRetries    int
	maxRetryAfter time.Duration
	backoff       backoff.Policy
}

// maxUnreachableRetries bounds retries when no connection can be made at
// all: a blip is over in a second or two, a wrong host or a missing network
// is not, and the client should hear about it quickly.
const maxUnreachableRetries = 2

// maxRefusalStep caps the backoff step of a refusal without a hint: the
// step is the request's refusals in a row, so a request that absorbs many
// waits at most Base·2³ (4 s by default) for each, not the policy's
// maximum: a shared limit frees up within seconds, and the lane's pacing
// already spaces the attempts.
const maxRefusalStep = 3

// decide chooses what to do with an attempt's answer, given what the
// request's earlier attempts met, the time, its deadline and a jitter draw
// in [0, 1).
func decide(res upstream.Result, t attemptCounts, pol retryPolicy, now, deadline time.Time, rnd float64) decision {
	d := decision{report: reportOf(res)}
	if res.Outcome != upstream.Retryable {
		d.action = actPass
		return d
	}
	d.action = actGiveUp
	hint, hasHint := lateHint(res.Hint), res.HasHint
	if hasHint && hint <= 0 {
		// "Retry now" (Retry-After: 0, a past date or reset) from a server
		// that just refused would make a retry storm: back off instead.
		hasHint = false
	}
	step := t.failures
	switch {
	case d.report.Verdict.Limited():
		step = min(t.refusals, maxRefusalStep)
	case t.failures >= pol.maxRetries:
		d.why = "retries exhausted (LLMPROXY_MAX_RETRIES)"
		return d
	case res.Unreachable && t.unreachable >= maxUnreachableRetries:
		d.why = "no connection after " + strconv.Itoa(t.unreachable+1) + " attempts"
		return d
	}
	if hasHint && hint > pol.maxRetryAfter {
		d.why = "the upstream asks to wait " + hint.Round(time.Millisecond).String() + ", longer than LLMPROXY_MAX_RETRY_AFTER"
		return d
	}
	wait := pol.backoff.Choose(step, hint, hasHint, rnd)
	if now.Add(wait).After(deadline) {
		d.why = "waiting " + wait.Round(time.Millisecond).String() + " would pass the request's deadline"
		return d
	}
	d.action, d.wait = actRetry, wait
	if d.pauseGroup = d.report.Verdict.Pauses(); d.pauseGroup {
		d.report.PauseUntil = now.Add(wait)
	}
	d.next = t
	if d.report.Verdict.Limited() {
		d.next.refusals++
	} else {
		d.next.refusals = 0
		d.next.failures++
	}
	if res.Unreachable {
		d.next.unreachable++
	} else {
		d.next.unreachable = 0
	}
	return d
}

// lateHint is a wait the upstream named, read a millisecond late when it
// is finer than a second (OpenAI's reset and message, Azure's
// retry-after-ms): it may be cut, not rounded up, and a pause that ended
// on the named instant sent a window's whole queue a fraction of a
// millisecond before its boundary, all refused (the universe's seed 23:
// up to 28 % of its requests). Whole seconds are read as they are. The
// request's own wait and the lane's (its pause, a window's closure) read
// the same instant.
func lateHint(h time.Duration) time.Duration {
	if h > 0 && h%time.Second != 0 {
		return h + time.Millisecond
	}
	return h
}

// reportOf is what the lane learns from an answer: its status, hint,
// limits and quota, and what it says about the upstream's capacity (a
// quota spent says nothing of its rate or load).
func reportOf(res upstream.Result) limit.Report {
	r := limit.Report{Verdict: limit.Failed, Limits: res.Limits, Quota: res.Quota}
	if res.Resp != nil {
		r.Status = res.Resp.StatusCode
	}
	if res.HasHint {
		r.Hint = lateHint(res.Hint)
	}
	if !res.Quota.Spent {
		r.Verdict = limit.VerdictOf(r.Status, res.Outcome == upstream.Retryable, res.Error.Kind == headerparse.KindConcurrency)
	}
	return r
}

// retryWait is how long the retry d decided waits before it takes its
// place in the lane again, given what holds the lane once d.report is
// told (see lanequeue.Slot.Report): nothing more when d asked the group
// to pause and the group holds the retry itself, paused at least that
// long or, after a refusal, held (bound by the number in flight, which a
// free permit ends, or a refused knock on a closed window, which the
// window's next knock or its opening ends: its own backoff would let the
// window open and fill without it); else d's wait.
func (d decision) retryWait(pausedUntil time.Time, held bool) time.Duration {
	if d.pauseGroup && (!pausedUntil.Before(d.report.PauseUntil) || d.report.Verdict.Refusal() && held) {
		return 0
	}
	return d.wait
}
