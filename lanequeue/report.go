package lanequeue

import (
	"math"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// Report tells the lane what the answer to the slot's latest dispatch said.
// Call it once per attempt, as soon as the answer's status and headers are
// in (or the attempt failed without one), before WaitRetry or Done.
//
// It returns what holds the lane's retry once the group learned from r:
// its pause, until pausedUntil (zero: none), and, when r asks for a pause
// (r.PauseUntil), held: the number in flight is the bound (a free permit
// ends the wait), or r refused a knock (the window's knocks end it). The
// group may decline a pause when what it learned holds the group better
// (see Shared.Learn).
func (s *Slot) Report(r limit.Report) (pausedUntil time.Time, held bool) {
	l := s.lane
	g := l.g
	g.mu.Lock()
	if s.phase != phaseSent {
		defer g.mu.Unlock()
		return l.drawsOn().shared.PausedUntil(), false // reported already, or released
	}
	now := g.clock.Now()
	s.phase = phaseAnswered
	s.lastStatus = r.Status
	s.lim.unanswered--
	if r.Verdict != limit.NotSent {
		s.lim.learned = true
	}
	l.stats.countAttempt(r.Status, now)
	l.noteAnswer(r)
	if r.Verdict.Refusal() {
		l.stats.throttled++
	}
	changes := g.learnLocked(s, r, now)
	lim := l.drawsOn()
	pausedUntil = lim.shared.PausedUntil()
	held = !r.PauseUntil.IsZero() && (s.ticket.Knock && r.Verdict.Limited() || lim.shared.View(now).Bound == limit.BoundConcurrency)
	g.dispatchLocked(now)
	g.mu.Unlock()
	for _, c := range changes {
		g.onChange(c)
	}
	return pausedUntil, held
}

// learnLocked has the limit s drew on learn from its answer r at now,
// and returns the changes to report. Requires g.mu held.
func (g *group) learnLocked(s *Slot, r limit.Report, now time.Time) []laneChange {
	l, lim := s.lane, s.lim
	before := lim.shared.PausedUntil()
	s.ticket.Peers = r.Limits.Requests.HasRemaining && g.peersLocked(lim) // only a counted window is credited
	lim.shared.Learn(&s.ticket, r, now)
	if r.Verdict == limit.NotSent {
		g.refundLocked(s) // it never reached the upstream's accounting
		if r.Status != 0 && lim.ceil != nil {
			lim.ceil.Refund(s.ticket.Dispatched, s.ticket.Cost) // refused for its credential
		}
	}
	shared := g.shareLocked(lim, s, r.Limits.Requests, now) || g.joinedElsewhereLocked(lim)
	shared = g.togetherLocked(l.lim, s.lim, r, now, s.ticket.Overshot) || shared
	lim = l.drawsOn() // the limit the lane draws on from now on
	var changes []laneChange
	if lim.quota.learn(r, s.ticket.Dispatched, now) && g.onChange != nil {
		changes = append(changes, laneChange{Kind: changeQuota, Lane: l, At: now, Status: r.Status, QuotaUntil: lim.quota.until})
	}
	var v limit.View
	if g.onChange != nil {
		v = lim.shared.View(now)
	}
	// The group may decline an answer's pause (see Shared.Learn): count
	// the one it took.
	if from, until := clock.Later(before, now), lim.shared.PausedUntil(); r.PauseUntil.After(from) && until.After(from) {
		// This answer started a pause, or made one longer.
		started := !before.After(now)
		l.stats.countPause(r.Verdict.PauseReason().String(), until.Sub(from), started)
		if started && g.onChange != nil {
			changes = append(changes, laneChange{Kind: changePaused, Lane: l, At: now, Status: r.Status, Verdict: r.Verdict,
				View: v, PauseFor: until.Sub(now)})
		}
	}
	if g.onChange != nil {
		changes = g.changesLocked(l, lim, r, v, now, changes, shared)
	}
	return changes
}

// moved reports whether a differs from b by more than a tenth of the larger.
func moved(a, b float64) bool {
	return math.Abs(a-b) > 0.1*math.Max(math.Abs(a), math.Abs(b))
}

// changesLocked compares the view of lim, l's limit, after an answer with
// what it last reported, and returns the changes to report; shared says
// the answer showed lim shared with other models. Requires g.mu held.
func (g *group) changesLocked(l *Lane, lim *pool, r limit.Report, v limit.View, now time.Time, out []laneChange, shared bool) []laneChange {
	s := &lim.seen
	base := laneChange{Lane: l, At: now, Status: r.Status, Verdict: r.Verdict, View: v}
	base.SharesLimitWith, base.SharesLimitWithMore, base.SharedBecause = lim.sharedWith(l.key.Model)
	// A window's rate from headers moves with every answer's remaining
	// count; only its size says the limit changed. A pace learned from
	// refusals is its rate.
	shape := v.Window.String()
	limits := shared || shape != s.shape || v.Corrected != s.corrected ||
		v.FromHeaders() != s.fromHeaders || v.FromRefusals() != s.fromRefusals ||
		moved(v.Requests.Limit, s.reqLimit) || moved(v.Tokens.Limit, s.tokLimit) ||
		v.FromRefusals() && moved(v.Requests.PerSecond, s.reqRate)
	if limits {
		c := base
		c.Kind = changeLimits
		out = append(out, c)
		s.fromHeaders, s.fromRefusals, s.corrected, s.shape = v.FromHeaders(), v.FromRefusals(), v.Corrected, shape
		s.reqLimit, s.tokLimit = v.Requests.Limit, v.Tokens.Limit
		s.reqRate = v.Requests.PerSecond
	}
	if s.conc == 0 {
		s.conc, s.concAt = g.cfg.Concurrency, now
	}
	if v.Concurrency != s.conc && (v.Concurrency < s.conc || now.Sub(s.concAt) >= concReportEvery) {
		c := base
		c.Kind, c.From = changeConcurrency, s.conc
		out = append(out, c)
		s.conc, s.concAt = v.Concurrency, now
	}
	return out
}
