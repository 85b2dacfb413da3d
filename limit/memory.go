package limit

import (
	"math"
	"strconv"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// Memory is the in-process Shared: the state of one group in this
// process. A Shared kept elsewhere can learn with one beside it (see
// redisstate): it hands Memory the answers to learn from and tells it of
// the dispatches made elsewhere with NoteDispatch.
type Memory struct {
	pace        pacer
	conc        concurrency
	pausedUntil time.Time
	pauseReason string
	// Dispatches at one instant form a batch: each is marked as if sent
	// first in it, since they reach the upstream in any order.
	batchAt time.Time
	batch   mark
	// learn reads the limit from what the upstream does, when its headers
	// say nothing; held is when the learned pace last held a request back.
	learn   learner
	held    time.Time
	learnAt time.Time // the time of the answer being learned from
	// refusedHolding counts permits still held by refused requests: they
	// are not in flight at the upstream.
	refusedHolding int
	// fleetSent is the group's running count of dispatches, all replicas
	// together, at the last dispatch another store admitted.
	fleetSent uint64
	lastSent  time.Time // the latest dispatch
	// fleetPace is the pace the other replicas learned from refusals, as
	// the store kept elsewhere holds it (0: none).
	fleetPace float64
	// fleetPaceAt is when fleetPace last changed.
	fleetPaceAt time.Time
	// win reads fixed windows from closures: spans the upstream refuses
	// everything in (see windows). knockNext: the next dispatch noted is
	// the knock WindowGate allowed.
	win       windows
	knockNext bool
}

// NewMemory returns the in-process state for a group with cfg's
// concurrency bounds.
func NewMemory(cfg Config) *Memory {
	cfg = cfg.WithDefaults()
	return &Memory{conc: newConcurrency(cfg)}
}

// NoteDispatch records a dispatch another store admitted, one that every
// replica of the proxy shares, so that what Memory learns from behaviour
// is about the group as the upstream sees it, all replicas together: out
// is the number of permits out, all replicas together, before this one;
// sent the running count of the group's dispatches, all replicas
// together, right after it (0: not known); lastSecond the group's
// dispatches in the second up to now, all replicas, this one included (0:
// not known). It returns the dispatch's number, the number in flight it
// went at, and whether it goes in a probe of the pace learned from
// refusals, for the ticket. The probe
// cycle moves on here, as Admit moves it for the group's own admissions.
func (s *Memory) NoteDispatch(now time.Time, out int, sent uint64, lastSecond int) (seq uint64, level int, probe bool) {
	s.stepProbe(now)
	// Dispatches of the other replicas since this one's last count toward
	// the group's sending rate too (at most a meter's worth at once); at
	// this replica's first, those of the last second.
	n := uint64(1)
	switch {
	case sent > s.fleetSent && s.fleetSent > 0:
		n = min(sent-s.fleetSent, 10000)
	case s.fleetSent == 0 && lastSecond > 1:
		n = uint64(min(lastSecond, 10000))
	}
	s.fleetSent = max(s.fleetSent, sent)
	s.pace.recent.addN(now, int(n))
	seq = s.learn.dispatched()
	if sent > seq {
		// Numbered in the group's count, so that the dispatches admitted
		// between two refusals are all the replicas'.
		s.learn.seq, seq = sent, sent
	}
	level = out - s.refusedHolding + 1
	s.learn.noteSent(level)
	if s.knockNext {
		s.knockNext = false
		s.win.knocked(seq, now)
	} else {
		s.win.dispatched(now)
	}
	return seq, level, s.pace.fromRefusals && s.learn.phase == probeUp
}

// WindowGate tells a Shared kept elsewhere whether the group's fixed window
// lets a request go at now, before it admits one from the shared state:
// not while a closure holds it (until at; zero: until an answer), but one
// knock at a time, which the next NoteDispatch records. (A window is not
// closed for its allowance, which this replica's count cannot tell, but by
// its first refusal.) Windowed reports that the window's allowance paces
// the group: a pace learned from refusals does not.
func (s *Memory) WindowGate(now time.Time) (at time.Time, ok, windowed bool) {
	at, knock, ok := s.win.gate(now, false)
	s.knockNext = ok && knock
	return at, ok, s.win.pacing()
}

// NoteAccepted records that the upstream accepted a request of the group
// sent elsewhere, answered at at (zero: none): the upstream is live.
func (s *Memory) NoteAccepted(at time.Time) {
	if at.After(s.learn.lastAccepted) {
		s.learn.lastAccepted = at
	}
}

// NoteFleet records, at now, what the store kept elsewhere says of the
// group: the request pace the replicas learned from refusals (0: none),
// and the refusals every replica learned from so far. The other replicas
// send at this one's probe when it holds the raise lease, so a refusal
// anywhere ends the probe, unclean. A replica refused for the first time
// starts from the fleet's pace when it is lower than what the group was
// sending, and one whose rate is still a guess follows it down when it is
// under any pace the guess would send, instead of finding it again with
// refusals of its own. (Only a refusal lowers the fleet's pace, so a
// replica never follows its own.)
func (s *Memory) NoteFleet(pace float64, refusals uint64, now time.Time) {
	if pace != s.fleetPace {
		s.fleetPace, s.fleetPaceAt = pace, now
	}
	l := &s.learn
	refusedSince := refusals > l.fleetRefused
	l.fleetRefused = max(l.fleetRefused, refusals)
	if !s.pace.fromRefusals {
		return
	}
	changed := false
	if refusedSince && l.phase == probeUp {
		l.phase, l.phaseUntil = probeDown, now.Add(probeLength(l.estimate))
		changed = true
	}
	if pace > 0 && pace < l.estimate*drainGain && l.guess() {
		l.estimate, l.from = pace, rateReplicas
		changed = true
	}
	if changed {
		s.pace.setFromRefusals(s.pacing(), now)
	}
}

// NoteHeld records that the store kept elsewhere held a request back at
// now for the pace learned from refusals: the probe cycle probes only
// while the pace is what holds requests back.
func (s *Memory) NoteHeld(now time.Time) {
	if s.pace.fromRefusals {
		s.held = now
		s.stepProbe(now)
	}
}

// NoteRaiser records whether this replica holds the lease that lets one
// replica at a time raise a pace learned from refusals: a probe made
// without it reached no upstream, and does not raise the estimate when it
// ends. The latest word during the up phase counts.
func (s *Memory) NoteRaiser(holds bool) {
	if s.learn.phase == probeUp {
		s.learn.probeUnseen = !holds
	}
}

// stepProbe moves the probe cycle on at now, pacing by the phase it is in.
func (s *Memory) stepProbe(now time.Time) {
	if s.pace.fromRefusals && s.learn.step(now, now.Sub(s.held) < time.Second) {
		s.pace.setFromRefusals(s.pacing(), now)
	}
}

// ShareLevels replaces the counts of answers by the number in flight they
// went at, from which the bound of an upstream without headers is judged,
// with those of every replica together (admitted[i] and refused[i] for
// level i): each replica sees only its share of the refusals, too few
// alone to tell a concurrency limit from a rate. A group paced from
// refusals judges its bound again at once.
func (s *Memory) ShareLevels(admitted, refused []float64, now time.Time) {
	l := &s.learn
	n := min(max(len(admitted), len(refused)), maxLevel+1)
	l.growLevels(max(n-1, 1))
	for i := range l.admitted {
		l.admitted[i], l.refusedAt[i] = 0, 0
		if i < len(admitted) && i < n {
			l.admitted[i] = admitted[i]
		}
		if i < len(refused) && i < n {
			l.refusedAt[i] = refused[i]
		}
	}
	s.judgeAgain(now)
}

// judgeAgain judges the bound of a group paced from refusals again at now,
// from the counts by level, and holds the group by what it finds: the
// number in flight, or the pace.
func (s *Memory) judgeAgain(now time.Time) {
	if !s.pace.fromRefusals || !s.learn.classify() {
		return
	}
	s.learnAt = now
	if s.learn.concurrencyBound() {
		s.toConcurrency()
	} else {
		s.pace.setFromRefusals(s.pacing(), now)
	}
}

// NoteReturn records the end of an answer whose permit another store gave,
// for the mean answer time; Memory's own permit count is not touched.
func (s *Memory) NoteReturn(t *Ticket, now time.Time) {
	s.settle(t) // an answer nobody reported
	if t.HoldsRefused {
		t.HoldsRefused = false
		s.refusedHolding--
	}
	s.conc.answered(t, now)
	s.win.ended(t.Seq)
}

func (s *Memory) Admit(now time.Time, cost int64, probe bool) (Ticket, time.Time, bool) {
	if now.Before(s.pausedUntil) {
		return Ticket{}, s.pausedUntil, false
	}
	if !s.conc.free() {
		return Ticket{}, time.Time{}, false
	}
	at, knock, ok := s.win.gate(now, true)
	if !ok {
		return Ticket{}, at, false
	}
	// A knock, and a window's allowance, go whatever pace was learned
	// from refusals.
	windowed := knock || s.win.pacing()
	if !windowed {
		if at, ok := s.spread(now); !ok {
			return Ticket{}, at, false
		}
		s.stepProbe(now)
	}
	at, ok, room, paced := s.pace.admit(now, cost, probe, !windowed)
	if !ok {
		if s.pace.fromRefusals && !at.IsZero() {
			s.held = now
		}
		return Ticket{}, at, false
	}
	if !now.Equal(s.batchAt) {
		s.batchAt, s.batch = now, s.pace.totals()
	}
	m := s.batch.plus(cost)
	s.pace.take(now, cost)
	t := Ticket{Dispatched: now, Cost: cost, Requests: m.requests, Tokens: m.tokens,
		InFlight: s.conc.inFlight, Limit: s.conc.limit, Room: room, Paced: paced,
		Seq: s.learn.dispatched(), Probe: s.pace.fromRefusals && s.learn.phase == probeUp,
		Level: s.conc.inFlight - s.refusedHolding + 1}
	s.conc.inFlight++
	s.learn.noteSent(t.Level)
	s.lastSent = now
	if knock {
		s.win.knocked(t.Seq, now)
	} else {
		s.win.dispatched(now)
	}
	return t, time.Time{}, true
}

func (s *Memory) Learn(t *Ticket, r Report, now time.Time) {
	s.settle(t)
	if r.Verdict == NotSent {
		s.pauseFor(r)
		return
	}
	refusal := r.Verdict.Refusal()
	if r.Verdict != Failed {
		s.learn.answered(t.Level, refusal)
	}
	quiet := !s.pace.headers() && !r.Limits.Requests.HasRemaining && !r.Limits.Tokens.HasRemaining
	switch {
	case r.Verdict == Accepted:
		s.win.accepted(t, now)
	case r.Verdict == RateRefused || quiet && r.Verdict == Overloaded:
		if s.win.refused(t, r.Hint, r.Hint > 0, s.taken(t, now), now) {
			// A closure: the upstream refuses whatever the group sends
			// until its window's boundary. The windows hold the group;
			// the refusal says nothing of a pace or a concurrency.
			if refusal && !t.Returned && !t.HoldsRefused {
				t.HoldsRefused = true
				s.refusedHolding++
			}
			s.pace.observe(r.Limits, t, now)
			return
		}
	}
	if refusal && !t.Returned && !t.HoldsRefused {
		t.HoldsRefused = true
		s.refusedHolding++
	}
	if refusal {
		s.conc.slowStart = false // the upstream said no: no more doubling
		if t.Probe {
			s.learn.probeHit = true
		}
	}
	if quiet && (r.Verdict == RateRefused || r.Verdict == Overloaded) {
		// Nothing but the upstream's behaviour tells the limit.
		if s.behaved(t, r, now) {
			s.pauseFor(r)
		}
		return
	}
	s.pauseFor(r)
	corrected := false
	if r.Verdict == RateRefused {
		// Before the refusal's own headers are read: they describe the
		// window as the upstream enforces it, and the correction decides
		// how far to trust what the headers said before.
		corrected = s.pace.contradicted(t, r.Limits, now)
	}
	s.pace.observe(r.Limits, t, now)
	s.learnVerdict(t, r, now, corrected)
}

// learnVerdict learns from r's verdict on t, an answer that told more than
// its status (headers, or a verdict other than a quiet refusal); corrected:
// the refusal corrected what the headers said before.
func (s *Memory) learnVerdict(t *Ticket, r Report, now time.Time, corrected bool) {
	switch r.Verdict {
	case Accepted:
		t.Accepted = true
		s.learn.lastAccepted = now
		s.learn.admits.add(t.Dispatched)
		if s.learn.replySecs == 0 {
			s.learn.replySecs = now.Sub(t.Dispatched).Seconds()
		}
		// Admissions at the levels below the refusals can settle the
		// bound after the refusals came.
		s.judgeAgain(now)
		s.conc.accepted(t, now, s.outNow(t), s.floor())
	case RateRefused:
		if !corrected && t.Room && s.pace.underUsed(now) {
			// The pace is well under what the upstream admits by its own
			// account, yet it refused: what binds is the number in flight.
			s.conc.refused(t, now, s.outNow(t), s.floor(), false)
		}
	case ConcurrencyRefused:
		s.learn.named = true
		s.learn.refused(t.Seq, t.Dispatched, t.Refusals)
		s.conc.refused(t, now, s.outNow(t), 0, true)
	case Overloaded:
		s.conc.refused(t, now, s.outNow(t), 0, false)
	}
}

// behaved learns from a refusal of an upstream whose headers say nothing,
// and reports whether the group should take the refusal's pause. A
// refusal while the upstream is admitting other requests is about
// capacity: the learned pace or concurrency limit holds the group, and a
// pause would only idle it, unless the upstream named a wait for a rate.
func (s *Memory) behaved(t *Ticket, r Report, now time.Time) bool {
	l := &s.learn
	level := t.Level
	l.lastRefused = now
	s.learnAt = now
	if !l.live(now) {
		s.refusedWhileDown(t, r, now)
		l.heldUntil = clock.Later(l.heldUntil, r.PauseUntil)
		return true
	}
	s.estimateOnRefusal(t, r, now)
	if l.phaseUntil.IsZero() {
		// Cruise before the first probe; soon, while the rate is a guess
		// or a hint's (see learner.step).
		l.phaseUntil = now.Add(l.cruise())
		if !l.measured {
			l.phaseUntil = now.Add(guessCruise)
		}
	}
	if !l.reached(level) {
		// Nothing went through at this number in flight or above: slow
		// start overshot. Until the counts tell a rate from a
		// concurrency, go back to what went through, but not under the
		// configured start (a rate limit's first refusals come at any
		// level; Little's law needs the room for long answers).
		s.conc.limit = min(s.conc.limit, max(level-1, s.conc.start, s.floor()))
	}
	l.classify()
	if l.concurrencyBound() {
		// One step down as for any refusal of the number in flight (a
		// level refused again waits longer before it is tried), but not
		// below the level under the refusals.
		s.conc.refused(t, now, s.outNow(t), max(l.atLevel-1, s.floor()), false)
		s.toConcurrency()
		return false
	}
	s.pace.setFromRefusals(s.pacing(), now)
	// The upstream's bucket is empty now: so is the pace's. A request sent
	// before the pace last changed went faster than the pace allows: an
	// upstream that counts refusals is owed it too, and sending before the
	// debt is paid only deepens it.
	s.pace.requests.avail = math.Min(s.pace.requests.avail, 0)
	if t.Dispatched.Before(l.cut) {
		s.pace.requests.avail--
	}
	// A wait short enough to be a pace holds the group; a longer one
	// (Retry-After in whole seconds) holds only the refused request,
	// while the learned pace holds the rest.
	return hintPace(r.Hint) > 0
}

// refusedWhileDown learns from a refusal when nothing was admitted
// lately: an outage or a closed door, not a limit to measure. The
// refusal's pause (its hint, or a backoff) holds the group.
func (s *Memory) refusedWhileDown(t *Ticket, r Report, now time.Time) {
	l := &s.learn
	l.refused(t.Seq, t.Dispatched, t.Refusals)
	if r.Verdict == Overloaded {
		s.conc.refused(t, now, s.outNow(t), 0, false)
	}
	if hp := s.hintPace(r.Hint, t, now); hp > 0 && !l.measured {
		// A short hint still says how fast to go once it opens.
		l.estimate, l.from = hp, rateHint
		s.pace.setFromRefusals(s.pacing(), now)
		s.pace.requests.avail = math.Min(s.pace.requests.avail, 0)
	}
}

// estimateOnRefusal moves the admitted rate on a refusal while the
// upstream admits other requests: measured between refusals, guessed
// from the sending rate at the first, cut while a guess, capped by a
// short hint.
func (s *Memory) estimateOnRefusal(t *Ticket, r Report, now time.Time) {
	l := &s.learn
	was := l.estimate

	level := t.Level
	if sample := l.refused(t.Seq, t.Dispatched, t.Refusals); sample > 0 {
		// A refusal of the probe is expected, and what was admitted over
		// the cycle includes the cruise under the limit, lost to a
		// concurrency limit: it only raises a measured estimate. Elsewhere
		// a refusal says the estimate is too high, and a guess takes any
		// measurement: it takes the sample.
		if !t.Probe || sample > l.estimate || l.guess() {
			l.estimate, l.from, l.measured = sample, rateAdmitted, true
		}
		l.cut = now
	} else if l.estimate == 0 {
		// One refusal measures no rate yet. What the group has been
		// sending is too fast; a short hint may say how fast is right.
		l.estimate, l.from = s.pace.recent.rate(now), rateSending
		if secs := s.conc.answerSecs; secs > 0 && !l.reached(level) {
			// Refused at a number in flight nothing went through at: what
			// did go through, over the answer time, is what it sustains
			// (Little's law), if the number in flight is the bound.
			l.estimate = max(l.estimate, float64(level-1)/secs)
		}
		if s.fleetPace > 0 && s.fleetPace < l.estimate {
			// Other replicas learned a pace from their refusals already:
			// it is lower than what the group was sending, and known.
			l.estimate, l.from = s.fleetPace, rateReplicas
			if t.Paced && t.Dispatched.After(s.fleetPaceAt) && !l.concurrencyBound() {
				// And it was refused at that pace (sent after this replica
				// saw it, so not at an older, faster one): as one process
				// refused again at a pace not yet measured, slower. (Each
				// replica's first refusal is a first guess of its own;
				// without the cut the fleet needs a refusal per replica to
				// slow down.)
				l.estimate *= unmeasuredCut
			}
		}
		n, _ := s.pace.recent.recent(now)
		if hp := s.hintPace(r.Hint, t, now); hp > 0 && (hp < l.estimate || n < minSampleAdmits) {
			l.estimate, l.from = hp, rateHint // a sending rate of a few requests says little
		}
		l.cut = now
	} else if !l.measured && !t.Probe && !l.concurrencyBound() && t.Dispatched.After(l.cut) && !l.lastAccepted.Before(l.cut) && l.reached(level) {
		// Refused again at a pace not yet measured, at a number in flight
		// the upstream admits: slower, once for the requests sent since
		// the last change. Not before the upstream admitted one of them:
		// one that counts refusals refuses all until its debt is paid,
		// whatever the pace.
		l.estimate *= unmeasuredCut
		l.cut = now
	}
	if !l.measured && !t.Probe && l.short > 0 && l.short*shortCut < l.estimate && t.Dispatched.After(l.cut) {
		// Refusals too close together to measure the rate still show what
		// got through between them: a guess far above it (the whole of a
		// limit other models share, a sending rate several times the
		// limit) is cut to it at once rather than by unmeasuredCut a
		// round. (One a little above it is left to the measurement: what
		// gets through right after a refusal may be less than the refill,
		// where refusals count against the limit.) Only for a request
		// sent at the guess: those sent before it, refused close together,
		// show an upstream's debt as much as its rate.
		l.estimate = l.short
		l.cut = now
	}
	if t.Probe && l.from == rateProbe && l.raisedFrom > 0 && l.estimate > l.raisedFrom*probeGain {
		// The probe above a raise past the pace the clean probe ran at was
		// refused: the raise went too far. Back to what ran clean, at
		// once; staying at the raise until the refusals measure a rate
		// overdraws an upstream that counts them. (A smaller raise is left
		// to the measurement.)
		l.estimate, l.raisedFrom = l.raisedFrom, 0
		l.cut = now
	}
	if hp := s.hintPace(r.Hint, t, now); hp > 0 && hp < l.estimate {
		// The wait for the next request is at most one request's worth of
		// the refill: one per hint is as fast as the upstream can go.
		l.estimate, l.from = hp, rateHint
	}
	if l.estimate < was {
		l.streak = 0 // a refusal that lowers the rate ends a row of clean probes
	}
}

// hintPace is the pace a refusal's hint suggests (see hintPace), when it
// suggests one: a bucket's hint is about one request's refill, while a
// hint far longer than the upstream's recent admissions give one request
// is the time to a window's boundary (see boundary).
func (s *Memory) hintPace(hint time.Duration, t *Ticket, now time.Time) float64 {
	hp := hintPace(hint)
	if hp == 0 || boundary(hint, s.taken(t, now)) {
		return 0
	}
	return hp
}

// taken is how fast the upstream took requests lately, as t's refusal is
// learned from: those it admitted, and those still out besides t and the
// refused ones that hold a permit. A limit's refusal comes back at once;
// an admitted request takes its answer time, so right after a burst most
// of what the upstream took is still out, and the admissions alone would
// make a window's boundary look like a bucket's refill.
func (s *Memory) taken(t *Ticket, now time.Time) float64 {
	n, span := s.learn.admits.recent(now)
	out := s.outNow(t) - s.refusedHolding - 1
	if t.HoldsRefused {
		out++ // counted among those holding already
	}
	return float64(n+max(out, 0)) / span
}

// toConcurrency holds the group at the level below the one the upstream
// refuses at, and paces it loosely: the number in flight is what binds.
func (s *Memory) toConcurrency() {
	l := &s.learn
	if l.atLevel > 0 {
		c := &s.conc
		c.limit = min(c.limit, c.max, max(l.atLevel-1, c.min))
		if c.refusedAt == 0 || l.atLevel < c.refusedAt {
			c.refusedAt = l.atLevel
		}
		c.slowStart = false
	}
	s.pace.setFromRefusals(s.pacing(), s.learnAt)
}

// spread holds back a dispatch, before the group knows any limit, until
// 1/(startSpread × limit) of an answer time has passed since the last one:
// slow start sends what a burst of answers frees spread over part of an
// answer time instead of at one instant, so the first refusal, which comes
// back at once, sets the pace before the rest of the burst has gone.
func (s *Memory) spread(now time.Time) (time.Time, bool) {
	secs := s.conc.answerSecs
	if secs <= 0 {
		secs = s.learn.replySecs
	}
	if s.pace.fromRefusals || s.pace.headers() || !s.conc.slowStart || secs <= 0 || s.lastSent.IsZero() {
		return time.Time{}, true
	}
	gap := time.Duration(secs / (startSpread * float64(s.conc.limit)) * float64(time.Second))
	if next := s.lastSent.Add(gap); now.Before(next) {
		return next, false
	}
	return time.Time{}, true
}

// pacing is the learned pace: the learner's, and for a group bound by
// concurrency never under what its limit allows at the current answer
// time (loosely): there the limit holds the group, not the pace.
func (s *Memory) pacing() float64 {
	p := s.learn.pace()
	if s.learn.concurrencyBound() && s.conc.answerSecs > 0 {
		p = max(p, concurrencyLoose*float64(s.conc.limit)/s.conc.answerSecs)
	}
	return p
}

// floor is the concurrency the learned rate needs for answers of the
// current length (Little's law); 0 while either is unknown.
func (s *Memory) floor() int {
	if s.pace.fromRefusals {
		if !s.learn.measured {
			return 0 // a guess at the rate says nothing of what it needs
		}
		return ceilRate(s.learn.estimate*cruiseShare, s.conc.answerSecs)
	}
	return s.pace.littleFloor(s.conc.answerSecs)
}

// pauseFor takes r's pause, if it is longer than the current one.
func (s *Memory) pauseFor(r Report) {
	if r.PauseUntil.After(s.pausedUntil) {
		s.pausedUntil = r.PauseUntil
		s.pauseReason = r.Verdict.PauseReason()
	}
}

// settle ends t's count as pending, once.
func (s *Memory) settle(t *Ticket) {
	if !t.Settled {
		t.Settled = true
		s.learn.settled(t.Level)
	}
}

// outNow is how many permits are out as t's answer is learned from.
func (s *Memory) outNow(t *Ticket) int {
	if t.OutNow > 0 {
		return t.OutNow
	}
	return s.conc.inFlight
}

func (s *Memory) Refund(t *Ticket) { s.pace.refund(t.Cost) }

func (s *Memory) Settle(t *Ticket, usedTokens int64) {
	s.pace.settle(t.Cost, usedTokens, t.Tokens)
}

func (s *Memory) Return(t *Ticket, now time.Time) {
	s.settle(t) // an answer nobody reported
	if t.HoldsRefused {
		t.HoldsRefused = false
		s.refusedHolding--
	}
	s.conc.returned(t, now)
	s.win.ended(t.Seq)
}

// PausedUntil is the end of the pause, or of a window's closure whose
// boundary the upstream stated.
func (s *Memory) PausedUntil() time.Time { return clock.Later(s.pausedUntil, s.win.until()) }

func (s *Memory) View(now time.Time) View {
	v := View{Concurrency: s.conc.limit, InFlight: s.conc.inFlight, AnswerSeconds: s.conc.answerSecs}
	if now.Before(s.pausedUntil) {
		v.PausedUntil, v.PauseReason = s.pausedUntil, s.pauseReason
	}
	if until := s.win.until(); now.Before(until) && until.After(v.PausedUntil) {
		v.PausedUntil, v.PauseReason = until, "window"
	}
	v.Requests, v.Tokens = s.pace.view(now)
	switch {
	case s.pace.fromRefusals:
		v.Learned = learnedFromRefusals
		v.RateFrom = s.learn.from
		v.AdmittedRate = s.learn.estimate
		v.Bound = BoundRate
		if s.learn.concurrencyBound() {
			v.Bound = BoundConcurrency
		}
	case s.pace.requests.known || s.pace.tokens.known:
		v.Learned = learnedFromHeaders
		v.RateFrom = rateHeaders
	}
	switch {
	case s.learn.named:
		v.ConcurrencyFrom = "words"
		v.Bound = BoundConcurrency
	case s.learn.atLevel > 0:
		v.ConcurrencyFrom = "refusals at " + strconv.Itoa(s.learn.atLevel) + " in flight"
	}
	v.Corrected = s.pace.requests.capped > 0 || s.pace.tokens.capped > 0
	v.Window = s.win.view()
	v.ConcurrencyLowered = s.conc.refusedAt > 0 || s.learn.named || s.learn.atLevel > 0
	return v
}

// Knows reports whether the group has learned a limit of its own: from
// headers, or from the upstream's refusals.
func (s *Memory) Knows() bool { return s.pace.fromRefusals || s.pace.headers() }

// AnsweredElsewhere is false: no other process shares this state.
func (s *Memory) AnsweredElsewhere() bool { return false }
