package lanequeue

import (
	"math"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// budget models one upstream window (requests or tokens) as a token bucket:
// a capacity, what is left of it at a time, and a refill rate. Everything is
// learned from the upstream's headers; until then the budget is unknown and
// never holds anything back. Methods require the lane's mutex held.
type budget struct {
	known   bool
	limit   float64   // capacity
	avail   float64   // what is left at `at`; negative when the lane owes
	at      time.Time // when avail was true
	rate    float64   // refill per second; 0 while unknown
	resetAt time.Time // when the upstream said the window is full again
	sent    float64   // cost dispatched so far, for the correction below
	seen    float64   // the largest dispatch total an answer has reported on
}

// advance refills the bucket up to now.
func (b *budget) advance(now time.Time) {
	if !b.known || !now.After(b.at) {
		return
	}
	switch {
	case b.rate > 0:
		b.avail = math.Min(b.limit, b.avail+b.rate*now.Sub(b.at).Seconds())
	case !b.resetAt.IsZero() && !now.Before(b.resetAt):
		// Without a known rate the reset is one event: the window is full
		// once, then only an answer tells more.
		b.avail = b.limit
		b.resetAt = time.Time{}
	}
	b.at = now
}

// admit reports whether cost fits now, or else when it will. A cost larger
// than the whole window goes once the window is full. A zero time with
// ok=false means nothing but the next answer can tell: the caller waits for
// one if a request is in flight, and sends one otherwise.
func (b *budget) admit(now time.Time, cost float64) (time.Time, bool) {
	if !b.known {
		return time.Time{}, true
	}
	b.advance(now)
	need := b.charge(cost)
	if b.avail >= need {
		return time.Time{}, true
	}
	if b.rate > 0 {
		secs := math.Min((need-b.avail)/b.rate, maxWaitSeconds)
		return now.Add(max(time.Duration(secs*float64(time.Second)), time.Millisecond)), false
	}
	if b.resetAt.After(now) {
		return b.resetAt, false
	}
	return time.Time{}, false
}

// take charges cost and returns the running total, which the request keeps
// so its answer can tell what was sent after it.
func (b *budget) take(cost float64) float64 {
	b.sent += cost
	if b.known {
		// A cost larger than the window is charged as the whole window, as
		// admit let it go: more would stall the lane on a debt it never had.
		b.avail -= b.charge(cost)
	}
	return b.sent
}

// charge is what a request of cost takes from the window: all of it, but
// never more than the whole window when the window's size is known.
func (b *budget) charge(cost float64) float64 {
	if b.limit > 0 {
		return math.Min(cost, b.limit)
	}
	return cost
}

// maxWaitSeconds bounds one pacing wait (a day) so a tiny learned rate
// cannot overflow a time.Duration.
const maxWaitSeconds = 86400

// refund gives back cost for a dispatch that never reached the upstream.
func (b *budget) refund(cost float64) {
	if b.known {
		b.avail = math.Min(b.limit, b.avail+b.charge(cost))
	}
}

// settle swaps a request's estimated cost for its real one, unless an answer
// to a request dispatched at or after it has already replaced the local
// count with the upstream's own.
func (b *budget) settle(estimate, actual, sentAtDispatch float64) {
	if !b.known || b.seen >= sentAtDispatch {
		return
	}
	b.avail = math.Min(b.limit, b.avail+estimate-actual)
}

// maxRate bounds a believable refill: a full window per millisecond.
const maxRateFactor = 1000

// observe folds in what one answer said about this window. sentAtDispatch is
// the running total when that request was dispatched: what the lane sent
// after it may not be in the upstream's count yet, so it is taken off again.
// That errs on the side of sending too little, never too much.
//
// The upstream counts a request when it admits it, about when it was
// dispatched, so the refill rate is measured from the dispatch: a window
// that refills in less than the upstream's latency would otherwise look as
// if its reset had already passed. Relative resets must therefore be
// anchored at the dispatch time too (the proxy parses headers with the time
// it sent the attempt).
func (b *budget) observe(w headerparse.Window, sentAtDispatch float64, dispatched, now time.Time) {
	if !w.Known() {
		return
	}
	b.advance(now)
	if w.Limit > 0 {
		b.limit = float64(w.Limit)
	}
	if w.HasRemaining && float64(w.Remaining) > b.limit {
		b.limit = float64(w.Remaining)
	}
	if !w.HasRemaining {
		return // a size alone gives nothing to count down from
	}
	b.known = true
	remaining := float64(w.Remaining)
	b.seen = math.Max(b.seen, sentAtDispatch)
	b.avail = remaining - math.Max(0, b.sent-sentAtDispatch)
	b.at = now
	// The reset is counted from the dispatch; seen from now it may be later
	// by the answer's latency, so only trust it from then.
	b.resetAt = time.Time{}
	if !w.Reset.IsZero() {
		b.resetAt = w.Reset.Add(max(0, now.Sub(dispatched)))
	}
	if d := w.Reset.Sub(dispatched).Seconds(); d > 0 && remaining < b.limit {
		r := (b.limit - remaining) / d
		if r > 0 && r <= b.limit*maxRateFactor {
			b.rate = r
		}
	}
}

// pacer holds two budgets, on separate clocks: a request-window reset never
// releases a token-exhausted lane and vice versa. Lanes that share one
// upstream limit share one pacer (see Key.LimitGroup), so it has its own
// mutex, always taken after the lane's.
type pacer struct {
	mu       sync.Mutex
	requests budget
	tokens   budget

	// Pace learned from refusals when the upstream sends no headers (see
	// refusal.go).
	synthetic   bool
	lastRefusal time.Time
	lastProbe   time.Time
}

// mark is where the running totals stood right after a dispatch.
type mark struct{ requests, tokens float64 }

// admit combines both budgets: the later of their times, and "wait for an
// answer" (zero time) when either can only learn more from one.
func (p *pacer) admit(now time.Time, cost int64) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.admitLocked(now, cost)
}

// admitLocked is admit. Requires p.mu held.
func (p *pacer) admitLocked(now time.Time, cost int64) (time.Time, bool) {
	ra, rok := p.requests.admit(now, 1)
	ta, tok := p.tokens.admit(now, float64(cost))
	switch {
	case rok && tok:
		return time.Time{}, true
	case rok:
		return ta, false
	case tok:
		return ra, false
	case ra.IsZero() || ta.IsZero():
		return time.Time{}, false
	case ta.After(ra):
		return ta, false
	}
	return ra, false
}

// tryTake checks both budgets and charges them under one lock, so lanes
// sharing the pacer cannot both pass the check for the last unit. When the
// budgets can only learn more from an answer (zero time) and probe is set,
// it charges anyway: the request goes to find out.
func (p *pacer) tryTake(now time.Time, cost int64, probe bool) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.admitLocked(now, cost)
	if !ok && !(at.IsZero() && probe) {
		return at, false
	}
	p.requests.take(1)
	p.tokens.take(float64(cost))
	return time.Time{}, true
}

// totals is where the running totals stand now.
func (p *pacer) totals() mark {
	p.mu.Lock()
	defer p.mu.Unlock()
	return mark{requests: p.requests.sent, tokens: p.tokens.sent}
}

// plus is m after one more request of cost.
func (m mark) plus(cost int64) mark {
	return mark{requests: m.requests + 1, tokens: m.tokens + float64(cost)}
}

func (p *pacer) refund(cost int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests.refund(1)
	p.tokens.refund(float64(cost))
}

func (p *pacer) observe(l headerparse.Limits, m mark, dispatched, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.synthetic && l.Requests.HasRemaining {
		// Real headers replace what refusals taught.
		p.synthetic = false
		p.requests = budget{sent: p.requests.sent, seen: p.requests.seen}
	}
	p.requests.observe(l.Requests, m.requests, dispatched, now)
	p.tokens.observe(l.Tokens, m.tokens, dispatched, now)
}

func (p *pacer) settle(estimate, actual int64, m mark) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tokens.settle(float64(estimate), float64(actual), m.tokens)
}

// budgetView is what State shows of one budget.
type budgetView struct{ limit, avail, rate float64 }

func (p *pacer) view(now time.Time) (req, tok budgetView, reqKnown, tokKnown bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests.advance(now)
	p.tokens.advance(now)
	return budgetView{p.requests.limit, p.requests.avail, p.requests.rate},
		budgetView{p.tokens.limit, p.tokens.avail, p.tokens.rate},
		p.requests.known, p.tokens.known
}
