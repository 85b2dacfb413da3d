package lanequeue

import (
	"math"
	"slices"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// An upstream that states no remaining count shows a limit that several
// models of a group share only in its refusals: once it is spent it
// refuses whichever lane sends next, so the lanes are refused together;
// and each model's learner, pacing its share, is refused by what the
// others send, so their paces drift apart and the slowest holds up the
// run. Limits of their own refuse a lane when its own limit is spent,
// whatever the others send: a refusal of the request that took a lane to
// its concurrency limit, at a number in flight nothing went through at
// (limit.Ticket.Overshot), is what a limit of the lane's own number in
// flight does, and joins nothing.
//
// So limits of a group that say nothing of their counts, refused within
// togetherSpan of each other after each was admitted, and asked about as
// often, are joined on trial: one limit, learned afresh, its lanes taking
// turns. Asked evenly, one pace in turns serves limits of their own of one
// size as well as a shared one. A lane whose own limit is smaller is
// refused more than its turns explain: each refusal is as likely to fall
// on a lane as the lane's share of the latest dispatches, and when so many
// fall on one lane that chance allows it less than splitChance, that limit
// leaves the trial, to learn its own afresh; the group starts no trial
// after that.
//
// Replicas that share the state each see a part of the refusals, so they
// cannot wait to see two limits refused together: among them a group has
// one trial, named by the group, that a refused silent limit joins with
// the group's other silent limits asked as often, refused here or not (a
// limit counts as admitted there when admitted here, or when its state
// learned a pace from a refusal here while the upstream admitted other
// replicas' requests: a replica's first answers may all be refusals);
// and a limit that leaves it does so on every replica once one judges it
// apart, to a fresh state every replica names alike (see togetherLocked,
// joinLocked, splitLocked, apartSharer).
const (
	togetherSpan = time.Second
	// evenArrivals: limits are asked about as often when the least asked
	// had at least this share of the most asked one's requests, less
	// what chance moves a count that size (see evenLocked).
	evenArrivals = 2.0 / 3
	// splitRefusals is the fewest refusals a split is judged on;
	// trialMemory the most: the counts halve there, so the latest tell.
	splitRefusals = 8
	trialMemory   = 32
	splitChance   = 0.001
)

// refusedTogether is why limits draw on a limit on trial (see sharedWith).
const refusedTogether = "refused together"

// togetherLocked learns from the answer r to a dispatch by issuer for a
// lane made with own (the limit of its model) whether limits of the group
// are refused together, joining them on trial if so; and, in a trial,
// whether own is refused apart, splitting it off if so. It reports whether
// the limits lanes draw on changed; overshot is the answered ticket's
// Overshot. Requires g.mu held.
func (g *group) togetherLocked(own, issuer *pool, r limit.Report, now time.Time, overshot bool) bool {
	if r.Limits.Requests.HasRemaining || r.Limits.Tokens.HasRemaining {
		own.spoke = true // its headers tell (see shareEvidence)
	}
	if r.Verdict == limit.Accepted {
		own.admitted = true
	}
	root := own.root()
	if g.fleet && root.trial != nil && g.leftElsewhereLocked(root) {
		return true
	}
	if !r.Verdict.Limited() {
		return false
	}
	own.refusedAt = now
	if root.trial != nil {
		// Only what the trial's pace sent tells of it, and only while
		// another member's lanes wait too: then the turns are what
		// decides who is refused, not one member's asking alone.
		return issuer == root && g.contrastLocked(own, root) && g.judgeLocked(own, root)
	}
	if overshot || g.apart || !g.cfg.Limits.IsZero() || !own.silent() && !(g.fleet && own.pacedFromRefusals(now)) || root.sharedBy != "" {
		return false
	}
	g.limMu.Lock()
	defer g.limMu.Unlock()
	// Among replicas, each sees its own part of the refusals, and the
	// group has one trial: a refused limit joins it, or joins the group's
	// other limits that were admitted without a word, refused here or not.
	with := []*pool{root}
	for _, o := range g.limits {
		r := o.root()
		partner := o.silent() && now.Sub(o.refusedAt) <= togetherSpan
		if g.fleet {
			partner = (o.admitted || o.pacedFromRefusals(now)) && !o.spoke
		}
		if partner && (r.sharedBy == "" || r.trial != nil) && !slices.Contains(with, r) {
			with = append(with, r)
		}
	}
	if len(with) < 2 || !g.evenLocked(with) {
		return false
	}
	g.joinLocked(with)
	return true
}

// evenLocked reports whether the limits whose lanes draw on those in with
// were asked about as often: the least asked had at least evenArrivals of
// the most asked one's requests, or fell short by no more than chance
// moves a count that size (its square root). Early on a few requests
// decide, and among replicas each sees a third of them or so: 4 against
// 7 is as even as asking gets there. Requires g.limMu held.
func (g *group) evenLocked(with []*pool) bool {
	lo, hi := uint64(math.MaxUint64), uint64(0)
	for _, l := range g.limits {
		if slices.Contains(with, l.root()) {
			lo, hi = min(lo, l.arrived), max(hi, l.arrived)
		}
	}
	return float64(lo)+math.Sqrt(float64(hi)) >= evenArrivals*float64(hi)
}

// joinLocked puts the lanes of the limits in with on one limit on trial:
// the first trial among them, or a new limit, which learns the one they
// share afresh while theirs keep what they learned. Among replicas that
// share the state, a group has one trial (see togetherLocked): each
// replica sees its own part of the refusals, so they join different
// models first, and the trials they make must pace on one state all the
// same. Requires g.mu and g.limMu held.
func (g *group) joinLocked(with []*pool) {
	var t *pool
	for _, r := range with {
		if r.trial != nil {
			t = r
			break
		}
	}
	if t == nil {
		key := with[0].key
		if g.fleet { // the name every replica gives the group's trial
			key = g.key
		}
		key += "\x00" + refusedTogether
		t = newPool(key, g.cfg, g.newShared(key, g.cfg.limitConfig()))
		t.learned, t.sharedBy, t.trial = true, refusedTogether, &trial{}
		g.startTrialLocked(t, with)
	}
	for _, r := range with {
		if r == t {
			continue
		}
		members := []*pool{r}
		if r.trial != nil {
			members = r.trial.members // a trial of its own: its members join
		}
		for _, m := range members {
			m.mergedInto = t
			m.standing = standing{}
			t.trial.members = append(t.trial.members, m)
			t.addModel(m.models...)
		}
	}
}

// startTrialLocked starts t's new state from what the limits in with had
// out together, when its state can (limit.Memory): the upstream refused
// their rate, not their number in flight, so the trial does not crawl up
// from the configured start again. Requires g.mu held.
func (g *group) startTrialLocked(t *pool, with []*pool) {
	s, ok := t.shared.(interface {
		StartFrom(time.Time, int, float64, float64)
	})
	if !ok {
		return
	}
	now := g.clock.Now()
	out, secs, sending := 0, 0.0, 0.0
	for _, r := range with {
		v := r.shared.View(now)
		out, sending = out+v.InFlight, sending+v.Sending
		secs += float64(v.InFlight) * v.AnswerSeconds
	}
	if out > 0 {
		s.StartFrom(now, out, secs/float64(out), sending)
	}
}

// contrastLocked reports whether lanes of t's trial other than own's have
// waiters. Requires g.mu held.
func (g *group) contrastLocked(own, t *pool) bool {
	for l := g.turns.first; l != nil; l = l.turnNext {
		if l.lim != own && l.lim.root() == t {
			return true
		}
	}
	return false
}

// judgeLocked counts a refusal of own's lanes in t's trial, and splits
// own off when its refusals are too many for its share of the dispatches
// to explain. Requires g.mu held.
func (g *group) judgeLocked(own, t *pool) bool {
	tr := t.trial
	var total float64
	for _, m := range tr.members {
		total += m.standing.share
	}
	if total <= 0 {
		return false
	}
	for _, m := range tr.members {
		m.standing.expected += m.standing.share / total
	}
	own.standing.refused++
	tr.refusals++
	if tr.refusals >= trialMemory {
		for _, m := range tr.members {
			m.standing.expected /= 2
			m.standing.refused /= 2
		}
		tr.refusals /= 2
	}
	st := own.standing
	if tr.refusals < splitRefusals ||
		tail(int(math.Round(tr.refusals)), int(math.Round(st.refused)), st.expected/tr.refusals) > splitChance {
		return false
	}
	if s, ok := t.shared.(apartSharer); ok && g.fleet {
		s.PutApart(own.key) // the other replicas split it too
	}
	g.splitLocked(own, t)
	return true
}

// apartSharer is a trial's state shared among replicas that tells them
// which limits one of them took out of the trial (redisstate's does).
// Each replica judges from its own part of the refusals, so one judges
// first; a limit the others kept on the trial would be paced twice, on
// the trial and on its own state, each refused for what the other sends,
// and the pace its state learns from that is far too slow.
type apartSharer interface {
	// PutApart notes that the limit named member left the trial.
	PutApart(member string)
	// Apart reports whether some replica noted member apart.
	Apart(member string) bool
}

// leftElsewhereLocked splits off t's trial the limits another replica
// took out of it, and reports whether any left. Requires g.mu held.
func (g *group) leftElsewhereLocked(t *pool) bool {
	s, ok := t.shared.(apartSharer)
	if !ok {
		return false
	}
	left := false
	// splitLocked takes m out of the members, and ends the trial when one
	// limit is left on it.
	for i := 0; t.trial != nil && i < len(t.trial.members); {
		if m := t.trial.members[i]; s.Apart(m.key) {
			g.splitLocked(m, t)
			left = true
			continue
		}
		i++
	}
	return left
}

// splitLocked takes own out of t's trial: its lanes draw on a limit of
// their own again, learned afresh on a state every replica names alike
// (what it learned before the trial is as old as the trial: a pace
// measured from its last refusal then to its first now counts the time
// its requests went on the trial as time nothing went, and among replicas
// the fleet follows that pace down). The others go on drawing on t, on
// trial while two or more remain; the group starts no other. Requires
// g.mu held.
func (g *group) splitLocked(own, t *pool) {
	own.mergedInto = nil
	if own.unanswered == 0 { // no answer is owed to the state it had
		own.shared = g.newShared(own.key+"\x00apart", g.cfg.limitConfig())
	}
	tr := t.trial
	tr.members = slices.DeleteFunc(tr.members, func(m *pool) bool { return m == own })
	t.models = t.models[:0]
	for _, m := range tr.members {
		m.standing = standing{}
		t.addModel(m.models...)
	}
	tr.refusals = 0
	if len(tr.members) < 2 {
		t.sharedBy, t.trial = "", nil
	}
	g.apart = true
}

// tail is the chance of k or more successes in n independent trials of
// chance p each.
func tail(n, k int, p float64) float64 {
	switch {
	case k <= 0 || p >= 1:
		return 1
	case k > n || p <= 0:
		return 0
	}
	var sum float64
	lp, lq := math.Log(p), math.Log1p(-p)
	for i := k; i <= n; i++ {
		sum += math.Exp(lchoose(n, i) + float64(i)*lp + float64(n-i)*lq)
	}
	return sum
}

// lchoose is the natural logarithm of n choose k.
func lchoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}
