package limit

import (
	"cmp"
	"math"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/internal/bucket"
)

// budget models one upstream window (requests or tokens) as a token bucket:
// a capacity, what is left of it at a time, and a refill rate. Everything is
// learned from the upstream's headers; until then the budget is unknown and
// never holds anything back. Methods require the group's mutex held.
type budget struct {
	known bool
	limit float64 // capacity as the headers state it
	// bucket is the window: its Size is size() (see resize), its Rate
	// the refill per second, 0 while unknown.
	bucket  bucket.Bucket
	resetAt time.Time // when the upstream said the window is full again
	sent    float64   // cost dispatched so far, for the correction below
	seen    float64   // the largest dispatch total an answer has reported on
	seenAt  time.Time // and when its request went
	// refused: requests refused since seenAt, which the upstream's counts
	// never had (see uncount).
	refused []dispatch

	// What refusals taught about the window (see contradicted).
	capped       float64 // the window's size as the upstream enforces it; 0 = as stated
	maxRemaining float64 // the most the upstream ever said was left
	lastLeft     float64 // the latest answer's remaining
	lastSecs     float64 // and its reset, in seconds from the dispatch
	// early: resets were seen already past when their request went, by up
	// to this (and their grain); every reset is read at least this far
	// after its dispatch.
	early time.Duration
	// shown is the refill the upstream's own counts showed when the
	// window was corrected: a corrected window paces no slower than that.
	shown float64
	// slope is the refill two answers' remaining counts and resets show:
	// a bucket's remaining is its size less its rate times the time to
	// full, at any instant, whatever its size (see observe).
	slope float64
	// fullAt is when a refusal's reset said the window is full again,
	// and fullSent the running total its request went with (see owes);
	// zero: none pending.
	fullAt   time.Time
	fullSent float64
	// correctedAt is when refusals last corrected the window, and
	// periodRefused that one had room after (see refusedAfterCorrection).
	correctedAt   time.Time
	periodRefused bool
	uncredited    bool // no refill credited (see count): the token budget (what went after is estimates), a limit with peers (Ticket.Peers)
	// ref is an earlier answer, to measure the refill the upstream's own
	// counts show (see refillShown).
	ref struct {
		dispatched time.Time
		remaining  float64
		sent       float64
	}
}

// size is the window's capacity: as the headers state it, unless refusals
// showed that the upstream enforces less.
func (b *budget) size() float64 {
	if b.capped > 0 && b.capped < b.limit {
		return b.capped
	}
	return b.limit
}

// resize sets the window's size as the headers state it (limit) and as
// refusals showed the upstream enforces it (capped; 0: as stated), and
// holds the bucket to it: its Size, and no more in it than fits.
func (b *budget) resize(limit, capped float64) {
	b.limit, b.capped = limit, capped
	b.bucket.Size = b.size()
	if b.bucket.Level() > b.bucket.Size {
		b.bucket.Set(b.bucket.At(), b.bucket.Size)
	}
}

// advance refills the bucket up to now.
func (b *budget) advance(now time.Time) {
	if !b.known {
		return
	}
	if b.bucket.Rate <= 0 && !b.resetAt.IsZero() && !now.Before(b.resetAt) && now.After(b.bucket.At()) {
		// Without a known rate the reset is one event: the window is full
		// once, then only an answer tells more.
		b.bucket.Set(now, b.size())
		b.resetAt = time.Time{}
	}
	b.bucket.Refill(now)
	if !b.fullAt.IsZero() && !now.Before(b.fullAt) {
		b.bucket.Set(now, math.Max(b.bucket.Level(), b.size()-(b.sent-b.fullSent)))
		b.fullAt = time.Time{}
	}
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
	at, ok := b.bucket.Admit(now, cost)
	if !ok && at.IsZero() && b.resetAt.After(now) {
		return b.resetAt, false
	}
	return at, ok
}

// take charges cost and returns the running total, which the request keeps
// so its answer can tell what was sent after it.
func (b *budget) take(cost float64) float64 {
	b.sent += cost
	if b.known {
		b.bucket.Charge(cost)
	}
	return b.sent
}

// refund gives back cost for a dispatch that never reached the upstream.
func (b *budget) refund(cost float64) {
	if b.known {
		b.bucket.Refund(cost)
	}
}

// settle swaps what a request was charged (its estimate, as take charged
// it) for what it used, unless an answer to a request dispatched at or
// after it has already replaced the local count with the upstream's own.
func (b *budget) settle(estimate, actual, sentAtDispatch float64) {
	// A running total of 0 is a dispatch of nothing before any other: no
	// answer can have counted it.
	if !b.known || sentAtDispatch > 0 && b.seen >= sentAtDispatch {
		return
	}
	b.bucket.Settle(estimate, actual)
}

// drain empties the window, as a refusal shows the upstream's to be: what
// is left goes, what is owed stays owed, and owe more is owed besides.
func (b *budget) drain(owe float64) {
	b.bucket.Set(b.bucket.At(), math.Min(b.bucket.Level(), 0)-owe)
}

// dispatch is a request's cost and when it went.
type dispatch struct {
	at   time.Time
	cost float64
}

// maxRefused bounds the refused requests a budget keeps: past it the
// oldest is forgotten, and counted as sent.
const maxRefused = 64

// uncount notes that the upstream refused a request of cost sent at `at`:
// it never had it in its counts, so an answer to one sent before it, or
// with it, does not take it off what that answer says is left.
func (b *budget) uncount(at time.Time, cost float64) {
	if !b.known || at.Before(b.seenAt) {
		return // an answer to a later request already left it out
	}
	if len(b.refused) == maxRefused {
		b.refused = b.refused[1:]
	}
	b.refused = append(b.refused, dispatch{at, cost})
}

// maxRateFactor bounds a believable refill: a full window per millisecond
// (the size × maxRateFactor a second).
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
	limit, prevLimit := b.limit, b.limit
	if w.Limit > 0 {
		limit = float64(w.Limit)
	}
	if w.HasRemaining && float64(w.Remaining) > limit {
		limit = float64(w.Remaining)
	}
	if k := limit / prevLimit; w.Limit > 0 && prevLimit > 0 && k != 1 {
		// The stated limit changed (a tier raised, a key's share cut):
		// what refusals and counts taught of the window under the old
		// one holds in its proportion, not as it was, and no refill is
		// measured across the change. What it showed left stays what it
		// showed (read as room, scaled, it sent a counting upstream's
		// queue into its debt).
		b.capped, b.shown, b.slope, b.bucket.Rate = b.capped*k, b.shown*k, b.slope*k, b.bucket.Rate*k
		b.ref.dispatched = time.Time{}
	}
	b.resize(limit, b.capped)
	if !w.HasRemaining {
		return // a size alone gives nothing to count down from
	}
	b.known = true
	remaining := float64(w.Remaining)
	if b.capped > 0 && remaining+1 > b.capped {
		b.resize(b.limit, remaining+1) // the upstream shows more room than refusals did
	}
	b.maxRemaining = math.Max(b.maxRemaining, remaining)
	b.count(remaining, sentAtDispatch, dispatched, now)
	floored := b.readReset(w, remaining, dispatched, now)
	// A reset read at the floor was sooner than the floor, by how much
	// nobody knows; and a window nearly full, a few missing until its
	// reset, is a fixed window's as well as a slow bucket's (one token
	// missing a second before a window of 3,164 resets read as a refill
	// of 1 a second, seed 1065). What is missing refills at least as fast
	// as the arithmetic says, perhaps far faster: only a refusal lowers
	// the rate then, or a changed stated limit, in its proportion.
	b.learnRate(floored || remaining >= nearlyFull*b.size())
	b.holdToPeriod(w.Period)
	if shown, ok := b.refillShown(remaining, sentAtDispatch, dispatched); ok &&
		b.bucket.Rate > overstatedRate*shown && b.maxRemaining+1 < overstatedShare*b.limit &&
		b.correctable() {
		// shown is the refill at a correction: a window already corrected
		// keeps the one it was corrected with.
		b.shown = shown
		b.correct(now)
	}
}

// holdToPeriod: the limit per the period the headers name (an IETF
// policy's w) is the quota, the most the rate may be. That, or per minute
// where headers that name none overstated the window (OpenAI's, PROVIDERS.md
// §11), is a rate the upstream allows: the least, until refused with room after a correction.
func (b *budget) holdToPeriod(period time.Duration) {
	if period > 0 {
		b.bucket.Rate = min(b.bucket.Rate, b.limit/period.Seconds())
	}
	if (period > 0 || b.size() < b.limit) && !b.periodRefused {
		b.bucket.Rate = max(b.bucket.Rate, b.limit/cmp.Or(period, time.Minute).Seconds())
	}
}

// count sets the bucket from remaining, what an answer showed left, less
// what was sent after its request. An answer to a request sent before one
// already answered is older news: that answer's count had this request in
// it, and what went between, refused requests too, counted or not.
func (b *budget) count(remaining, sentAtDispatch float64, dispatched, now time.Time) {
	if sentAtDispatch < b.seen {
		return
	}
	b.seen, b.seenAt = sentAtDispatch, dispatched
	after := b.sent - sentAtDispatch
	kept := b.refused[:0]
	for _, r := range b.refused {
		if !r.at.Before(dispatched) {
			after -= r.cost // sent with or after it, but never counted
			kept = append(kept, r)
		}
	}
	b.refused = kept
	// As of the arrival: the refill since counts, less a request (seed 189), unless uncredited or overstated.
	refilled := 0.0
	if !b.uncredited && !b.correctable() {
		refilled = max(0, b.bucket.Rate*now.Sub(dispatched).Seconds()-1)
	}
	b.bucket.Set(now, math.Min(b.size(), remaining+refilled-math.Max(0, after)))
}

// readReset reads w's reset, of an answer showing remaining left, and
// reports whether it read it at the early floor. The reset is counted from
// the dispatch; seen from now it may be later by the answer's latency, so
// only trust it from then. A reset is a time on the upstream's clock, to
// its grain: one already past when the request went, while the window is
// not full, is early (rounded down, or a clock behind the proxy's). From
// the first such reset on, every reset is read as late as that one was
// early and its grain allow: soon, not now.
func (b *budget) readReset(w headerparse.Window, remaining float64, dispatched, now time.Time) bool {
	reset := w.Reset
	if !reset.IsZero() && remaining < b.size() {
		if w.ResetEarly > 0 || !reset.After(dispatched) {
			b.early = max(b.early, w.ResetEarly+dispatched.Sub(reset)+max(w.ResetGrain, time.Millisecond))
		}
	}
	floored := !reset.IsZero() && b.early > 0 && reset.Before(dispatched.Add(b.early))
	if floored {
		reset = dispatched.Add(b.early)
	}
	b.resetAt = time.Time{}
	if !reset.IsZero() {
		b.resetAt = reset.Add(max(0, now.Sub(dispatched)))
	}
	secs := reset.Sub(dispatched).Seconds()
	if ds := secs - b.lastSecs; b.early == 0 && !reset.IsZero() && b.lastSecs > 0 && math.Abs(ds) >= refillSpan.Seconds() {
		if r := (b.lastLeft - remaining) / ds; r > 0 {
			b.slope = r
		}
	}
	b.lastLeft, b.lastSecs = remaining, secs
	return floored
}

// Headers overstate a window when the rate their arithmetic gives is
// overstatedRate times what the upstream's own remaining counts show, while
// the window has never shown overstatedShare of its stated size left.
// (Honest headers cannot do that: a refill slower than the rate means the
// window is full, and a full window shows its size.)
const (
	overstatedRate  = 20
	overstatedShare = 0.5
	refillSpan      = 100 * time.Millisecond // shortest span to measure a refill over
	nearlyFull      = 0.9                    // a window this full shows too little missing to lower its refill
)

// refillShown is the refill rate the upstream's remaining counts show
// between an earlier answer and this one: what remains now, minus what
// remained then, plus what was sent in between, over the time between their
// dispatches. ok is false until the two are refillSpan apart.
func (b *budget) refillShown(remaining, sent float64, dispatched time.Time) (float64, bool) {
	r := &b.ref
	span := dispatched.Sub(r.dispatched)
	if r.dispatched.IsZero() || span < 0 {
		r.dispatched, r.remaining, r.sent = dispatched, remaining, sent
		return 0, false
	}
	if span < refillSpan {
		return 0, false
	}
	shown := (remaining - r.remaining + sent - r.sent) / span.Seconds()
	r.dispatched, r.remaining, r.sent = dispatched, remaining, sent
	return max(shown, 0), true
}

// learnRate derives the refill rate from the latest answer: what is missing
// from the window refills by its reset.
//
// In a corrected window the arithmetic can say far less than the upstream
// showed (others using the same key hold remaining low and the reset far):
// the refill shown at the correction is then the pace.
//
// A reading that bounds the refill only from below (keep) never lowers
// it. (A reset within one grain of its dispatch, an IETF policy's t=1 for
// a bucket full in a third of a second, would be one too; but Anthropic's
// resets, rounded up to the second over a bucket full in 60 ms, are as
// well, and there the rate kept was the stated per-minute figure's:
// 50 % refused, seed 596.)
func (b *budget) learnRate(keep bool) {
	if b.lastSecs > 0 && b.lastLeft < b.size() {
		r := (b.size() - b.lastLeft) / b.lastSecs
		if b.capped > 0 && b.capped < b.limit {
			// The window the upstream refills is at least the size the
			// refusals showed: the arithmetic bounds the rate only from
			// below, and a bucket's own line tells it.
			r = math.Max(r, math.Max(b.shown, b.slope))
		}
		if keep {
			r = math.Max(r, b.bucket.Rate)
		}
		if r > 0 && r <= b.size()*maxRateFactor {
			b.bucket.Rate = r
		}
	}
}

// correct is called when the upstream refused a request this budget had
// room for. Its headers overstated the window (a per-minute limit enforced
// per second, say): the upstream has never shown more than maxRemaining
// left, so that, plus one, is taken as the window's size, and the rate is
// learned again from it, at now. It reports whether that lowered
// anything.
func (b *budget) correct(now time.Time) bool {
	if !b.correctable() {
		return false
	}
	b.correctedAt = now
	b.resize(b.limit, b.maxRemaining+1)
	b.learnRate(false)
	return true
}

// correctable reports whether correct would lower the window: the most
// the upstream ever showed left, plus one, is under its size.
func (b *budget) correctable() bool {
	return b.known && b.maxRemaining+1 < b.size()
}

// pacer holds a pool's two budgets, on separate clocks: a request-window
// reset never releases a token-exhausted pool and vice versa. It also
// keeps the recent dispatch times, to tell how fast the pool really sends.
type pacer struct {
	requests budget
	tokens   budget
	recent   meter // dispatches

	// fromRefusals: the request pace was learned from the upstream's
	// behaviour (see learner), not from headers.
	fromRefusals bool
}

// mark is where the running totals stood right after a dispatch.
type mark struct{ requests, tokens float64 }

// totals is where the running totals stand now.
func (p *pacer) totals() mark { return mark{requests: p.requests.sent, tokens: p.tokens.sent} }

// admit combines both budgets: the later of their times, and "wait for an
// answer" (zero time) when either can only learn more from one; with alone
// set (no answer awaited), that case lets the request go to find out. room reports whether a
// budget learned from headers had room for the request. learned says
// whether a request pace learned from refusals holds (a window's
// allowance goes without it).
func (p *pacer) admit(now time.Time, cost int64, alone, learned bool) (at time.Time, ok, room, paced bool) {
	ra, rok := time.Time{}, true
	if learned || !p.fromRefusals {
		ra, rok = p.requests.admit(now, 1)
	}
	ta, tok := p.tokens.admit(now, float64(cost))
	room = rok && tok && (p.requests.known && !p.fromRefusals || p.tokens.known)
	paced = rok && tok && p.fromRefusals
	switch {
	case rok && tok:
		return time.Time{}, true, room, paced
	case rok:
		at = ta
	case tok:
		at = ra
	case ra.IsZero() && ta.IsZero():
		at = time.Time{}
	case ra.IsZero() || ta.After(ra):
		// A budget that waits for a time goes first: only then can the
		// other one's "wait for an answer" let a lone request through.
		at = ta
	default:
		at = ra
	}
	return at, at.IsZero() && alone, false, false
}

// take charges a dispatch of cost tokens.
func (p *pacer) take(now time.Time, cost int64) {
	p.requests.take(1)
	p.tokens.take(float64(cost))
	p.recent.add(now, 1)
}

func (p *pacer) observe(l headerparse.Limits, t *Ticket, now time.Time, refused bool) {
	if p.fromRefusals && l.Requests.HasRemaining {
		// Real headers replace what refusals taught.
		p.fromRefusals = false
		p.requests = budget{sent: p.requests.sent, seen: p.requests.seen}
	}
	rr, rt := p.requests.bucket.Rate, p.tokens.bucket.Rate
	p.tokens.uncredited = true      // credited over estimates: 25-30 % refused (tpm-quantized/headers), 27 % (tpm-upstream-count)
	p.requests.uncredited = t.Peers // two limits, each credited one refill: 23-47 % refused (shared-models/headers, 1 run in 750)
	p.requests.observe(l.Requests, t.Requests, t.Dispatched, now)
	p.tokens.observe(l.Tokens, t.Tokens, t.Dispatched, now)
	if refused {
		p.requests.owes(l.Requests, rr, t.Requests, now)
		p.tokens.owes(l.Tokens, rt, t.Tokens, now)
	}
}

// owes reads a refusal's empty window w, whose request went with the
// running total sentAtDispatch and whose budget refilled at rate before
// it: a reset to the millisecond says when the window is full again, and
// a bucket that owes (an upstream that charges refusals) is full later
// than its size at its rate. The reading bounds the rate only from below,
// and what the reset shows owed is taken off (seed 969: 34×, 98 % refused).
func (b *budget) owes(w headerparse.Window, rate, sentAtDispatch float64, now time.Time) {
	if !w.HasRemaining || w.Remaining > 0 || w.Reset.IsZero() || w.ResetGrain > 0 || b.early > 0 {
		return
	}
	if !b.correctedAt.Equal(now) { // a correction read now stands
		b.bucket.Rate = max(b.bucket.Rate, rate)
	}
	if owed := b.bucket.Rate*b.lastSecs - b.size(); owed > 0 {
		b.bucket.Set(now, b.bucket.Level()-owed)
		// Full by the reset, whatever a rate read since repays it at.
		b.fullAt, b.fullSent = w.Reset, sentAtDispatch
	}
}

// contradicted handles a rate refusal, before its own headers are read.
// When a budget learned from headers had room for the request, the headers
// were wrong, and the refusal is the stronger evidence: the budgets it
// points at (those its headers show exhausted, else all) are corrected. It
// reports whether any was.
func (p *pacer) contradicted(t *Ticket, l headerparse.Limits, now time.Time) bool {
	if !t.Room {
		return false
	}
	reqOut := l.Requests.HasRemaining && l.Requests.Remaining < 1
	tokOut := l.Tokens.HasRemaining && l.Tokens.Remaining < max(1, t.Cost)
	if !reqOut && !tokOut {
		reqOut, tokOut = true, true
	}
	reqCorrected := reqOut && !p.fromRefusals && p.requests.correct(now)
	tokCorrected := tokOut && p.tokens.correct(now)
	p.requests.refusedAfterCorrection(reqOut, t.Dispatched)
	p.tokens.refusedAfterCorrection(tokOut, t.Dispatched)
	return reqCorrected || tokCorrected
}

// refusedAfterCorrection notes a refusal with room, pointing at this
// budget when out, of a request dispatched then: sent after refusals
// corrected the window, the rate is what was wrong, and a stated period
// floors it no more. (The refusals of the burst that showed the window
// were sent before it, and say nothing of the rate.)
func (b *budget) refusedAfterCorrection(out bool, dispatched time.Time) {
	if out && !b.correctedAt.IsZero() && dispatched.After(b.correctedAt) {
		b.periodRefused = true
	}
}

// underUse: the pool sends at less than half the request rate its headers
// report. A refusal then is not about the rate.
const underUse = 0.5

// underUsed reports whether the pool's recent dispatch rate is well under
// the request rate learned from headers.
func (p *pacer) underUsed(now time.Time) bool {
	r := p.requests.view().PerSecond
	return r > 0 && !p.fromRefusals && p.recent.rate(now) < underUse*r
}

// view is what State shows of both budgets.
func (p *pacer) view(now time.Time) (req, tok BudgetView) {
	p.requests.advance(now)
	p.tokens.advance(now)
	return p.requests.view(), p.tokens.view()
}

func (b *budget) view() BudgetView {
	if !b.known {
		return BudgetView{}
	}
	return BudgetView{Known: true, Limit: b.size(), Available: b.bucket.Level(), PerSecond: b.bucket.Rate}
}

// meter counts events per second over the last meterSeconds seconds.
type meter struct {
	counts [meterSeconds]int
	secs   [meterSeconds]int64     // the Unix second each count is for
	first  [meterSeconds]time.Time // the first event in that second
}

// meterSeconds is how far back the meter looks.
const meterSeconds = 10

// add counts n events at now.
func (m *meter) add(now time.Time, n int) {
	sec := now.Unix()
	i := sec % meterSeconds
	if m.secs[i] != sec || m.counts[i] == 0 {
		m.secs[i], m.counts[i], m.first[i] = sec, 0, now
	}
	m.counts[i] += max(n, 0)
}

// recent is the number of events in the window and the seconds they span,
// from the oldest of them to now (at least one).
func (m *meter) recent(now time.Time) (n int, span float64) {
	sec := now.Unix()
	oldest := now
	for i := range m.secs {
		if s := m.secs[i]; m.counts[i] > 0 && sec-s < meterSeconds && s <= sec {
			n += m.counts[i]
			if m.first[i].Before(oldest) {
				oldest = m.first[i]
			}
		}
	}
	return n, max(now.Sub(oldest).Seconds(), 1)
}

// rate is events per second over the window.
func (m *meter) rate(now time.Time) float64 {
	n, span := m.recent(now)
	return float64(n) / span
}

// minPace is the slowest pace learned without headers, in requests a
// second; the bucket of such a pace holds burstSeconds of it.
const (
	minPace      = 0.1
	burstSeconds = 0.25
)

// vouched reports whether the upstream's latest stated remaining, less
// what went since, has room for cost: room it stated itself, with no
// refill reckoned in.
func (b *budget) vouched(cost float64) bool { return b.lastLeft-(b.sent-b.seen) >= cost }

// vouched reports whether every budget the headers state has room for a
// request of cost by the upstream's own count (see budget.vouched), and
// one does.
func (p *pacer) vouched(cost int64) bool {
	req := p.requests.known && !p.fromRefusals
	return (req || p.tokens.known) && (!req || p.requests.vouched(1)) && (!p.tokens.known || p.tokens.vouched(float64(cost)))
}

// headers reports whether a budget was learned from headers.
func (p *pacer) headers() bool {
	return p.requests.known && !p.fromRefusals || p.tokens.known
}

// setFromRefusals paces the pool at rate requests a second, learned from the
// upstream's behaviour.
func (p *pacer) setFromRefusals(rate float64, now time.Time) {
	rate = math.Max(rate, minPace)
	b := &p.requests
	b.advance(now)
	if !p.fromRefusals {
		b.bucket.Set(now, 0)
	}
	p.fromRefusals = true
	b.known = true
	b.bucket.Rate = rate
	b.resize(math.Max(1, rate*burstSeconds), b.capped)
	b.resetAt = time.Time{}
}
