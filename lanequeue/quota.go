package lanequeue

import (
	"time"

	"github.com/llmproxy/llmproxy/internal/pacific"
	"github.com/llmproxy/llmproxy/limit"
)

// QuotaError is the error of a request whose limit's quota is spent: an
// answer said so (limit.Report.Quota: a day's requests, a spend cap), and
// waiting for a rate cannot renew it, so the request is refused at once,
// without a call upstream. It does not match ErrDeadlineExceeded.
type QuotaError struct {
	// Until is when the quota renews, by the upstream's word; zero when it
	// did not say: then one request every quotaProbeEvery goes upstream
	// to see whether it has.
	Until time.Time
	// Status is the upstream's status on the answer that said so (429,
	// 403, 402, 400).
	Status int
	// Probed: one request every quotaProbeEvery goes upstream, the
	// renewal known or not (a quota said in words alone).
	Probed bool
}

func (e *QuotaError) Error() string {
	if e.Until.IsZero() {
		return "lanequeue: quota spent, reset not known"
	}
	return "lanequeue: quota spent until " + e.Until.UTC().Format(time.RFC3339)
}

// quotaProbeEvery is how often one request goes upstream while a quota
// whose renewal is not known, or was said in words alone, holds a limit:
// its answer tells whether the quota came back.
const quotaProbeEvery = time.Minute

// quotaWordsCap bounds a hold on words alone (headerparse.Quota.Worded):
// words may say a month, but a day is the longest quota such words name
// (requests or tokens per day), and the probes end it sooner.
const quotaWordsCap = 24 * time.Hour

// quotaHold is a limit's spent quota. The answer that spent it came at
// since (zero: no quota holds the limit); it renews at until (zero: not
// known). While that is not known, or the hold rests on words (probes),
// the next probe may go at probeAt. status is that answer's. Guarded by
// the group's mutex.
type quotaHold struct {
	since, until, probeAt time.Time
	status                int
	probes                bool
}

// quotaState is what a limit's quota lets its head waiter do.
type quotaState uint8

const (
	quotaNone  quotaState = iota // no quota holds the limit
	quotaHeld                    // every waiter is refused
	quotaProbe                   // the head may go to see whether it renewed
)

// learn folds in r, the answer to a dispatch made at dispatched: an
// answer that spends a quota (and renews later than now, when it says)
// holds the limit from now; an answer to a dispatch made after the hold
// began that went through (a status below 500) and spends none ends it,
// unless it refused the request's credential (401, 403): a forged
// credential says nothing of the key's quota, and the next probe may go
// at once rather than a minute later.
// It reports whether a hold began.
func (q *quotaHold) learn(r limit.Report, dispatched, now time.Time) (began bool) {
	if r.Quota.Spent {
		if !r.Quota.Renews.IsZero() && !r.Quota.Renews.After(now) {
			return false
		}
		began = q.since.IsZero()
		until := r.Quota.Renews
		if capped := now.Add(quotaWordsCap); r.Quota.Worded && (until.IsZero() || until.After(capped)) {
			until = capped
		}
		*q = quotaHold{since: now, until: until, probeAt: now.Add(quotaProbeEvery), status: r.Status,
			probes: r.Quota.Worded || until.IsZero()}
		return began
	}
	if q.since.IsZero() || r.Status <= 0 || r.Status >= 500 || !dispatched.After(q.since) {
		return false
	}
	if r.Status == 401 || r.Status == 403 {
		q.probeAt = now // that probe told nothing: the next may go at once
	} else {
		*q = quotaHold{}
	}
	return false
}

// check is what the hold lets the head waiter do at now; a hold whose
// renewal came ends.
func (q *quotaHold) check(now time.Time) quotaState {
	switch {
	case q.since.IsZero():
		return quotaNone
	case !q.until.IsZero() && !now.Before(q.until):
		*q = quotaHold{}
		return quotaNone
	case !q.probes || now.Before(q.probeAt):
		return quotaHeld
	}
	return quotaProbe
}

// sent notes a dispatch at now: under a hold, the probe; the next may go
// quotaProbeEvery later.
func (q *quotaHold) sent(now time.Time) {
	if !q.since.IsZero() {
		q.probeAt = now.Add(quotaProbeEvery)
	}
}

// err is the error the hold refuses requests with.
func (q *quotaHold) err() error {
	return &QuotaError{Until: q.until, Status: q.status, Probed: q.probes}
}

// describe is the hold as a lane's state shows it at now: when the quota
// renews (zero when not known) and in words, "quota spent until 00:00 PT"
// or "quota spent, reset not known"; "" when none holds.
func (q quotaHold) describe(now time.Time) (until time.Time, words string) {
	switch {
	case q.since.IsZero() || !q.until.IsZero() && !now.Before(q.until):
		return time.Time{}, ""
	case q.until.IsZero():
		return time.Time{}, "quota spent, reset not known"
	}
	return q.until, "quota spent until " + pacific.Clock(q.until, now)
}
