package limit

import (
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// Memory is the in-process Shared: the state of one pool in this
// process. A Shared kept elsewhere can learn with one beside it (see
// redisstate): it hands Memory the answers to learn from and tells it
// what the other replicas did through Fleet.
type Memory struct {
	cfg    Config // as given, with its defaults
	pace   pacer
	conc   concLimit
	paused pause // see poolPause
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
	// fleetSent is the pool's running count of dispatches, all replicas
	// together, at the last dispatch another store admitted.
	fleetSent uint64
	lastSent  time.Time // the latest dispatch
	prevSent  time.Time // the one before it, which a refund of the latest puts back
	// fleetPace is the pace the other replicas learned from refusals, as
	// the store kept elsewhere holds it (0: none), fleetPaceAt when it
	// last changed.
	fleetPace   float64
	fleetPaceAt time.Time
	// win reads fixed windows from closures: spans the upstream refuses
	// everything in (see windows). knockNext: the next dispatch noted is
	// the knock Fleet.WindowGate allowed.
	win       windows
	knockNext bool
	// unpaid counts the pauses in a row that paid the upstream nothing
	// (see lengthen).
	unpaid unpaid
	// trial is the Seq of the one request sent when the pause ending at
	// trialOf ended, while its answer is awaited (0: none; see Admit).
	trial   uint64
	trialOf time.Time
}

// NewMemory returns the in-process state for a pool with cfg's
// concurrency bounds.
func NewMemory(cfg Config) *Memory {
	cfg = cfg.WithDefaults()
	return &Memory{cfg: cfg, conc: newConcLimit(cfg)}
}

// Configure keeps what was learned, within cfg's concurrency bounds.
func (s *Memory) Configure(cfg Config) {
	s.cfg = cfg.WithDefaults()
	s.conc.reconfigure(s.cfg)
}

// Forget keeps what the permits out still need: their count, the refused
// ones among them, and the running totals their tickets were marked with.
func (s *Memory) Forget() {
	f := Memory{cfg: s.cfg, conc: newConcLimit(s.cfg), refusedHolding: s.refusedHolding, fleetSent: s.fleetSent}
	f.conc.inFlight = s.conc.inFlight
	f.learn.seq = s.learn.seq
	f.pace.requests.sent, f.pace.tokens.sent = s.pace.requests.sent, s.pace.tokens.sent
	*s = f
}

// StartFrom starts a new state, one that takes over from limits found to
// share one upstream limit, from what they had out together at now:
// inFlight requests, answered in answerSecs on average (0: not known),
// sent at sending a second. It learns afresh the rate that refused them
// from that (not its own first dispatches: 27/s for two windows of 58,
// seed 121); its concurrency starts at inFlight, and slow start goes on.
func (s *Memory) StartFrom(now time.Time, inFlight int, answerSecs, sending float64) {
	s.pace.recent.add(now, int(sending+0.5))
	s.conc.limit = min(max(s.conc.limit, inFlight), s.conc.max)
	if s.conc.answerSecs == 0 {
		s.conc.answerSecs = answerSecs
	}
}

// stepProbe moves the probe cycle on at now, pacing by the phase it is in.
func (s *Memory) stepProbe(now time.Time) {
	if s.pace.fromRefusals && s.learn.step(now, now.Sub(s.held) < time.Second) {
		s.pace.setFromRefusals(s.pacing(), now)
	}
}

// judgeAgain judges the bound of a pool paced from refusals again at now,
// from the counts by level, and holds the pool by what it finds: the
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

func (s *Memory) Admit(now time.Time, cost int64, alone bool) (Ticket, time.Time, bool) {
	if now.Before(s.paused.until) {
		return Ticket{}, s.paused.until, false
	}
	if s.trial != 0 {
		// A pause after one that paid nothing, or one refusals showed
		// charged (see lengthen): the queue built up in it goes once one
		// request shows the upstream admits again, not all at once into a
		// limit that may still be spent and count each refusal.
		return Ticket{}, time.Time{}, false
	}
	if !s.conc.free() {
		return Ticket{}, time.Time{}, false
	}
	// A window's spent allowance closes it at once, unless the upstream
	// said it has room left: then its refusal closes it.
	at, knock, ok := s.win.gate(now, !s.pace.vouched(cost))
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
	at, ok, room, paced := s.pace.admit(now, cost, alone, !windowed)
	if !ok {
		if s.pace.fromRefusals && !at.IsZero() {
			s.held = now
		}
		return Ticket{}, at, false
	}
	if !now.Equal(s.batchAt) {
		s.batchAt, s.batch = now, s.pace.totals()
	}
	s.pace.take(now, cost) // the batch's totals plus this one: dispatched together, each counts as sent first
	t := Ticket{Dispatched: now, Cost: cost, Requests: s.batch.requests + 1, Tokens: s.batch.tokens + float64(cost),
		InFlight: s.conc.inFlight, Limit: s.conc.limit, Room: room, Paced: paced,
		Seq: s.learn.dispatched(), Probe: s.pace.fromRefusals && s.learn.phase == probeUp,
		Level: s.conc.inFlight - s.refusedHolding + 1}
	if (s.paused.trial || !s.unpaid.counted.IsZero()) && !s.paused.until.IsZero() && !s.paused.until.Equal(s.trialOf) {
		s.trial, s.trialOf = t.Seq, s.paused.until
	}
	s.conc.inFlight++
	s.learn.noteSent(t.Level)
	s.prevSent, s.lastSent = s.lastSent, now
	if t.Knock = knock; knock {
		s.win.knocked(t.Seq, now)
	} else {
		s.win.dispatched(now)
	}
	return t, time.Time{}, true
}

func (s *Memory) Learn(t *Ticket, r Report, now time.Time) {
	s.settle(t)
	p := s.lengthen(poolPause(r, s.learnFrom(t, r, now)), t, r, now)
	if r.Verdict.Refusal() {
		s.pace.requests.uncount(t.Dispatched, 1) // the upstream never counted it
		s.pace.tokens.uncount(t.Dispatched, float64(t.Cost))
	}
	if p.until.After(s.paused.until) {
		s.paused = p
	}
}

// learnFrom folds r, the answer to t, into what the pool knows, and
// returns what it found that bears on r's pause (see poolPause).
func (s *Memory) learnFrom(t *Ticket, r Report, now time.Time) pauseEvidence {
	if r.Verdict == NotSent {
		return pauseEvidence{} // it never reached the upstream
	}
	refusal := r.Verdict.Refusal()
	if r.Verdict != Failed {
		s.learn.answered(t.Level, refusal)
	}
	if refusal && !t.returned && !t.holdsRefused {
		t.holdsRefused = true
		s.refusedHolding++
	}
	quiet := !s.pace.headers() && !r.Limits.Requests.HasRemaining && !r.Limits.Tokens.HasRemaining
	switch {
	case r.Verdict == Accepted:
		if gap := s.win.accepted(t, now); gap > 0 && !s.learn.measured {
			// The upstream paid its debt at the knocks' pace, not the
			// guess's: the guess goes no faster.
			s.learn.estimate = min(s.learn.estimate, 1/gap.Seconds())
			s.pace.setFromRefusals(s.pacing(), now)
		}
	case r.Verdict == RateRefused || quiet && r.Verdict == Overloaded:
		if s.win.refused(t, r.Hint, r.Hint > 0, s.taken(t, now), now) {
			// A closure: the upstream refuses whatever the pool sends
			// until its window's boundary. The windows hold the pool;
			// the refusal says nothing of a pace or a concurrency.
			s.pace.observe(r.Limits, t, now, true)
			e := pauseEvidence{closed: true}
			if s.win.confirmed {
				e.opens = s.win.lo // the boundary lies in (lo, hi], where known
			}
			return e
		}
	}
	if refusal && s.learn.live(now) {
		// The upstream said no while it admits others: no more
		// doubling. A refusal while it admits nothing (a fresh state
		// whose first requests met a spent limit) says nothing of
		// the number in flight.
		s.conc.slowStart = false
	}
	if refusal && t.Probe {
		s.learn.probeHit = true // sent in the up phase: the probe is unclean
	}
	if quiet && (r.Verdict == RateRefused || r.Verdict == Overloaded) {
		// Nothing but the upstream's behaviour tells the limit.
		return s.behaved(t, r, now)
	}
	corrected := false
	if r.Verdict == RateRefused {
		// Before the refusal's own headers are read: they describe the
		// window as the upstream enforces it, and the correction decides
		// how far to trust what the headers said before.
		corrected = s.pace.contradicted(t, r.Limits, now)
	}
	s.pace.observe(r.Limits, t, now, r.Verdict.Refusal())
	s.learnVerdict(t, r, now, corrected)
	return pauseEvidence{}
}

// learnVerdict learns from r's verdict on t, an answer that told more than
// its status (headers, or a verdict other than a quiet refusal); corrected:
// the refusal corrected what the headers said before.
func (s *Memory) learnVerdict(t *Ticket, r Report, now time.Time, corrected bool) {
	switch r.Verdict {
	case Accepted:
		t.accepted = true
		s.learn.accepted(t, now)
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
// and returns what bears on the refusal's pause (see poolPause). A
// refusal while the upstream is admitting other requests is about
// capacity: the learned pace or concurrency limit holds the pool.
func (s *Memory) behaved(t *Ticket, r Report, now time.Time) pauseEvidence {
	l := &s.learn
	e := pauseEvidence{quiet: true, live: l.live(now)}
	level := t.Level
	s.learnAt = now
	if !e.live {
		s.refusedWhileDown(t, r, now)
		return e
	}
	// The admitted rate moves, and the probe cycle starts with a cruise:
	// soon, while the rate is a guess.
	l.estimateOnRefusal(t, s.refusalEvidence(t, r, now), now)
	if l.phaseUntil.IsZero() {
		l.phaseUntil = now.Add(l.cruise()) // before the first probe
	}
	if !l.reached(level) {
		// Nothing went through at this number in flight or above: slow
		// start overshot. Until the counts tell a rate from a
		// concurrency, go back to what went through.
		s.conc.overshot(level, s.floor())
		t.Overshot = level >= t.Limit
	}
	l.classify()
	if l.concurrencyBound() {
		// One step down as for any refusal of the number in flight (a
		// level refused again waits longer before it is tried), but not
		// below the level under the refusals.
		s.conc.refused(t, now, s.outNow(t), max(l.atLevel-1, s.floor()), false)
		s.toConcurrency()
		e.concurrencyBound = true
		return e
	}
	s.pace.setFromRefusals(s.pacing(), now)
	// The upstream's bucket is empty now: so is the pace's. A request sent
	// before the pace last changed went faster than the pace allows: an
	// upstream that counts refusals is owed it too, and sending before the
	// debt is paid only deepens it.
	owe := 0.0
	if t.Dispatched.Before(l.cut) {
		owe = 1
	}
	s.pace.requests.drain(owe)
	return e
}

// refusedWhileDown learns from a refusal when nothing was admitted
// lately: an outage or a closed door, not a limit to measure (see
// learner.refusedDown).
func (s *Memory) refusedWhileDown(t *Ticket, r Report, now time.Time) {
	if r.Verdict == Overloaded {
		s.conc.refused(t, now, s.outNow(t), 0, false)
	}
	if s.learn.refusedDown(t, s.hintPace(r.Hint, t, now), r.PauseUntil) {
		s.pace.setFromRefusals(s.pacing(), now)
		s.pace.requests.drain(0)
	}
}

// refusalEvidence is what the pool knows, besides the learner's counts,
// as it learns from a refusal of t whose hint is r's.
func (s *Memory) refusalEvidence(t *Ticket, r Report, now time.Time) refusalEvidence {
	n, span := s.pace.recent.recent(now)
	return refusalEvidence{sending: float64(n) / span, sent: n, answerSecs: s.conc.answerSecs,
		hintPace: s.hintPace(r.Hint, t, now), fleetPace: s.fleetPace, fleetPaceAt: s.fleetPaceAt}
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
	if t.holdsRefused {
		out++ // counted among those holding already
	}
	return float64(n+max(out, 0)) / span
}

// toConcurrency holds the pool at the level below the one the upstream
// refuses at, and paces it loosely: the number in flight is what binds.
func (s *Memory) toConcurrency() {
	if s.learn.atLevel > 0 {
		s.conc.boundAt(s.learn.atLevel)
	}
	s.pace.setFromRefusals(s.pacing(), s.learnAt)
}

// spread holds back a dispatch, before the pool knows any limit, until
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

// pacing is the learned pace: the learner's, and for a pool bound by
// concurrency never under what its limit allows at the current answer
// time (loosely): there the limit holds the pool, not the pace.
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
		return littleFloor(s.learn.estimate*cruiseShare, s.conc.answerSecs)
	}
	return littleFloor(s.pace.requests.view().PerSecond, s.conc.answerSecs)
}

// settle ends t's count as pending, once.
func (s *Memory) settle(t *Ticket) {
	if !t.settled {
		t.settled = true
		s.learn.settled(t.Level)
	}
	if t.Seq == s.trial {
		s.trial = 0
	}
}

// outNow is how many permits are out as t's answer is learned from.
func (s *Memory) outNow(t *Ticket) int {
	if t.OutNow > 0 {
		return t.OutNow
	}
	return s.conc.inFlight
}

func (s *Memory) Refund(t *Ticket) {
	s.pace.requests.refund(1)
	s.pace.tokens.refund(float64(t.Cost))
	s.win.undispatched(t.Dispatched)
	if t.Dispatched.Equal(s.lastSent) {
		s.lastSent = s.prevSent // the slow start's spread counts from the one before
	}
}

func (s *Memory) Settle(t *Ticket, usedTokens int64) {
	s.pace.tokens.settle(float64(t.Cost), float64(usedTokens), t.Tokens)
}

func (s *Memory) Return(t *Ticket, now time.Time) {
	s.conc.inFlight--
	s.returned(t, now)
}

// returned learns from the end of t's answer, its permit given back: t
// is settled, and off the count of refused requests holding theirs.
func (s *Memory) returned(t *Ticket, now time.Time) {
	s.settle(t) // an answer nobody reported
	t.returned = true
	if t.holdsRefused {
		t.holdsRefused = false
		s.refusedHolding--
	}
	s.conc.answered(t, now)
	s.win.ended(t.Seq)
	if s.learn.sustains(s.conc.answerSecs) {
		s.pace.setFromRefusals(s.pacing(), now) // the first answer time
	}
}

// PausedUntil is the end of the pause, or of a window's closure whose
// boundary the upstream stated.
func (s *Memory) PausedUntil() time.Time { return clock.Later(s.paused.until, s.win.until()) }

func (s *Memory) View(now time.Time) View {
	v := View{Concurrency: s.conc.limit, InFlight: s.conc.inFlight, AnswerSeconds: s.conc.answerSecs, Sending: s.pace.recent.rate(now)}
	if now.Before(s.paused.until) {
		v.PausedUntil, v.PauseReason = s.paused.until, s.paused.reason
	}
	if until := s.win.until(); now.Before(until) && until.After(v.PausedUntil) {
		v.PausedUntil, v.PauseReason = until, pauseWindow
	}
	v.Requests, v.Tokens = s.pace.view(now)
	switch {
	case s.pace.fromRefusals:
		v.RateFrom = s.learn.from
		v.AdmittedRate = s.learn.estimate
		v.Bound = BoundRate
		if s.learn.concurrencyBound() {
			v.Bound = BoundConcurrency
		}
	case s.pace.requests.known || s.pace.tokens.known:
		v.RateFrom = rateHeaders
	}
	switch {
	case s.learn.named:
		v.ConcurrencyFrom = concurrencyNamed
		v.Bound = BoundConcurrency
	case s.learn.atLevel > 0:
		v.ConcurrencyFrom = concurrencyFrom(s.learn.atLevel)
	}
	v.Corrected = s.pace.requests.capped > 0 || s.pace.tokens.capped > 0
	v.Window = s.win.view()
	v.ConcurrencyLowered = s.conc.refusedAt > 0 || s.learn.named || s.learn.atLevel > 0
	return v
}

// Knows reports whether the pool has learned a limit of its own: from
// headers, or from the upstream's refusals.
func (s *Memory) Knows() bool { return s.pace.fromRefusals || s.pace.headers() }

// AnsweredElsewhere is false: no other process shares this state.
func (s *Memory) AnsweredElsewhere() bool { return false }
