package limit

import (
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// learner reads an upstream's limit from status codes and timing alone
// (see the package doc, Learning from behaviour).
type learner struct {
	seq uint64 // dispatches so far; tickets carry theirs

	// refusals are the latest refusals by dispatch order, oldest first.
	refusals []refusalMark
	// admitted and refusedAt count the latest answers by their level in
	// flight (permits out when each went, itself included), for the
	// bound; counted is their total. Both halve when it passes
	// levelMemory, so old answers fade.
	admitted, refusedAt []float64
	counted             float64
	// pending counts the dispatches by level whose answers are not in:
	// a refusal comes back at once, an admission only after the answer
	// time, so until then they count as admitted.
	pending []float64
	// atLevel is the level in flight at which the upstream refuses, when
	// the counts show the number in flight is what it limits; 0 when they
	// show a rate, or nothing yet (see classify).
	atLevel int
	// named: the upstream named concurrency in words.
	named bool

	estimate float64  // the admitted rate, requests a second; 0 = unknown
	from     rateFrom // where estimate comes from
	measured bool     // estimate was measured between refusals once
	// sample is how many admissions the latest measurement counted: an
	// estimate counted over few is off by a larger share (see cruise).
	sample float64
	// unsustained: the level of a first refusal nothing went through at,
	// until an answer time is known (see ruleInFlight); 0: none waits.
	unsustained int
	// short is the admitted rate between the latest refusals when they
	// lie too close to measure it (0: none): a guess far above it is cut
	// to it at once rather than by unmeasuredCut a round.
	short float64

	lastAccepted time.Time // the latest accepted answer
	// admits: admitted dispatches, by when they went, and, with replicas,
	// the others' admitted answers, by when this one heard of them
	// (see fleetAdmitted): what the upstream takes is the fleet's.
	admits meter
	// fleetAdmits is the replicas' count of admitted answers when this
	// one last heard it, ownAdmits this one's admitted answers since.
	fleetAdmits uint64
	ownAdmits   int
	replySecs   float64   // the first accepted answer's time to its headers
	cut         time.Time // when the estimate last changed on a refusal
	// heldUntil is the end of the latest pause taken while the upstream
	// admitted nothing lately: refusals sent before it start no
	// measurement that ends after it, as the pool sent nothing in
	// between for the upstream to admit.
	heldUntil time.Time

	// The probe cycle: cruise, then up for probeUp, then down as long.
	phase      probePhase
	phaseUntil time.Time
	probeHit   bool // a request dispatched in it was refused
	// probeUnseen: the probe's pace did not reach the upstream (another
	// replica held the raise lease), so it cannot come back clean.
	probeUnseen bool
	// fleetRefused counts every replica's refusals (Fleet.Said),
	// probeMark its count when the up phase began: a probe is clean only
	// if no replica was refused during it, as the others send at its pace.
	fleetRefused, probeMark uint64
	streak                  int // clean probes in a row
	// raisedFrom is the estimate before the latest clean probe's raise
	// (0: the estimate did not come from one): a probe above the raise
	// that is refused takes the raise back.
	raisedFrom float64
}

type refusalMark struct {
	seq uint64
	at  time.Time // dispatched
	// before is Ticket.Refusals: one more than the pool's refusals
	// learned before it went, all replicas together; 0 when not counted.
	before uint64
}

type probePhase uint8

const (
	cruise probePhase = iota
	probeUp
	probeDown
)

const (
	// refusalMemory is how many refusals the rate is measured over, at
	// most; refusalSpan how far back.
	refusalMemory = 16
	refusalSpan   = time.Minute
	// minSampleSpan: refusals closer together than this measure nothing;
	// minShortSpan: closer than this, they do not even show a guess off.
	minSampleSpan = 500 * time.Millisecond
	minShortSpan  = 200 * time.Millisecond
	// shortCut: a guess is cut to a short sample only when more than
	// this many times above it.
	shortCut = 2
	// levelMemory is how many answers the bound is judged from; minBelow
	// is how many admissions at the level under a refusal show it was the
	// highest the upstream holds.
	levelMemory = 512
	minBelow    = 8
	maxLevel    = 4096
	// A concurrency bound: at some level and above, refusals outnumber
	// admissions refusedShare to one, hold concurrencyShare of all the
	// refusals, and the two levels below it were admitted minBelow times
	// (or see minRepeated).
	refusedShare     = 1
	concurrencyShare = 0.75
	// minRepeated refusals at one level, where at most half as many were
	// admitted, show a concurrency bound too: a rate refuses at whatever
	// level the pool is at, and a ramp passes each level in a few
	// requests. (The proxy counts an answer in flight a moment longer than
	// the upstream, so some admissions show at levels above its limit.)
	minRepeated = 3
	// minSampleAdmits: a rate measured over fewer admissions is off by
	// more than a sixth (the bucket's part-token at either end, and the
	// one counted off to err slow). Long streams whose answer times vary
	// meet their first refusals close together: measured over 8, the
	// rate came out 12 % low and the climb back cost the run 1.15× the
	// ideal (1.11× over 12; docs/benchmarks.md, streams-jitter).
	minSampleAdmits = 12
	// minSendingSample: a sending rate over fewer dispatches says little
	// (a hint may seed the rate instead).
	minSendingSample = 8
	// cruiseShare is the share of the admitted rate sent while cruising:
	// a little under it, so the upstream's bucket does not sit empty.
	cruiseShare = 0.97
	// probeGain and drainGain are the pace of the up and down phases.
	probeGain = 1.25
	drainGain = 0.75
	// probeEvery is the cruise between probes, at least; probeSpan the
	// shortest up phase. Both grow for slow rates, so that a probe risks
	// about probeRequests extra requests and comes every cycleRequests.
	probeEvery    = 4 * time.Second
	probeSpan     = 500 * time.Millisecond
	probeRequests = 2
	cycleRequests = 60
	// unmeasuredCut is how far a rate not yet measured falls when a
	// request sent at it is refused.
	unmeasuredCut = 0.7
	// probeRaise is how much a probe that met no refusal raises the rate;
	// each clean probe in a row doubles the raise, up to eight times.
	probeRaise = 1.1
	// liveFor: an upstream that admitted a request this recently is
	// working, and its refusals are about capacity, not an outage.
	liveFor = 5 * time.Second
	// concurrencyLoose is how far above the admitted rate a pool bound by
	// concurrency paces: the concurrency limit holds it, not the pace.
	concurrencyLoose = 1.5
	// guessCruise is the cruise between probes while the rate is a guess
	// (not yet measured between refusals).
	guessCruise = time.Second
	guessRaise  = 1.25 // and the raise of a clean probe then
	// startSpread: before any limit is known, dispatches are at least
	// 1/(startSpread × limit) of an answer time apart (see Memory.spread).
	startSpread = 2.0
	// maxHintPace is the longest hint taken as a pace: a wait of a second
	// or more (Retry-After is in whole seconds) says when to try again,
	// not how fast.
	maxHintPace = time.Second
	// maxHintAdmits: a hint is a pace while the upstream admitted fewer
	// than this many requests a hint lately (a bucket's hint is at most
	// one request's refill), and from this many on it names a window's
	// end: a 100-150 ms wait while a 1 s window of 20 admitted 20 a
	// second, read as a 7-10/s pace, cost a run 1.15-1.5×. A bucket right
	// after a burst it held, while its admissions and the requests still
	// out count double its rate, reads as a window too: the test request
	// does not tell the two apart at millisecond hints, and the pool paces
	// by windows of what it admits, which holds such a bucket at its rate
	// (the simulator's and loadbench's hint cells kept their figures).
	maxHintAdmits = 2
)

// fleetAdmitted notes at now that every replica together had total
// answers admitted: those of the others since the last word count
// toward what the upstream takes (a meter's worth at most at once). A
// replica that counted only its own would read a window's end, a wait of
// 150 ms while the fleet's 20 a second go through, as the pace of its
// third.
func (l *learner) fleetAdmitted(total uint64, now time.Time) {
	if total <= l.fleetAdmits {
		return // no word yet of this replica's own since
	}
	if l.fleetAdmits > 0 { // the first word only marks the count
		l.admits.add(now, int(min(total-l.fleetAdmits, 10000))-l.ownAdmits)
	}
	l.fleetAdmits, l.ownAdmits = total, 0
}

// dispatched numbers a dispatch.
func (l *learner) dispatched() uint64 {
	l.seq++
	return l.seq
}

// growLevels makes room for counts at level.
func (l *learner) growLevels(level int) {
	if level >= len(l.admitted) {
		n := level + 1 - len(l.admitted)
		l.admitted = append(l.admitted, make([]float64, n)...)
		l.refusedAt = append(l.refusedAt, make([]float64, n)...)
		l.pending = append(l.pending, make([]float64, n)...)
	}
}

// sent notes a dispatch at level in flight, until settled.
func (l *learner) noteSent(level int) {
	level = min(max(level, 1), maxLevel)
	l.growLevels(level)
	l.pending[level]++
}

// settled notes that a dispatch at level has its answer, or none will
// come.
func (l *learner) settled(level int) {
	level = min(max(level, 1), maxLevel)
	if level < len(l.pending) && l.pending[level] > 0 {
		l.pending[level]--
	}
}

// answered notes an answer at level in flight. Mirrored by
// learner.answered in redisstate/lua/levels.lua.
func (l *learner) answered(level int, refused bool) {
	level = min(max(level, 1), maxLevel)
	l.growLevels(level)
	if refused {
		l.refusedAt[level]++
	} else {
		l.admitted[level]++
	}
	if l.counted++; l.counted > levelMemory {
		for i := range l.admitted {
			l.admitted[i] /= 2
			l.refusedAt[i] /= 2
		}
		l.counted /= 2
	}
}

// concurrencyBound reports whether the evidence says the number in flight
// is what the upstream limits.
func (l *learner) concurrencyBound() bool { return l.named || l.atLevel > 0 }

// classify reads the bound from the counts by level. A concurrency limit
// refuses (nearly) every request at the levels above it and none below,
// where it admits again and again; a rate limit refuses at whatever level
// the pool is at when its pace runs ahead, levels where it also admits. It
// sets atLevel to the lowest level the upstream refuses at when the counts
// show a concurrency limit, else 0, and reports whether that changed.
func (l *learner) classify() bool {
	was := l.atLevel
	l.atLevel = 0
	var total float64
	for _, r := range l.refusedAt {
		total += r
	}
	var admitted, refused float64 // at the level and above
	for level := len(l.admitted) - 1; level >= 2; level-- {
		admitted += l.admitted[level] + l.pending[level]
		refused += l.refusedAt[level]
		if refused < 2 || refusedShare*admitted > refused || refused < concurrencyShare*total {
			continue
		}
		below := l.admitted[level-1]
		if level > 2 {
			below += l.admitted[level-2]
		}
		if below >= minBelow || l.refusedAt[level] >= minRepeated && 2*(l.admitted[level]+l.pending[level]) <= l.refusedAt[level] {
			l.atLevel = level
		}
	}
	return l.atLevel != was
}

// reached reports whether the upstream admitted more requests than it
// refused at level or above lately. (The proxy counts an answer in flight a
// moment longer than the upstream does, so a few admissions show at
// levels the upstream refuses.)
func (l *learner) reached(level int) bool {
	var admitted, refused float64
	for i := max(level, 1); i < len(l.admitted); i++ {
		admitted += l.admitted[i]
		refused += l.refusedAt[i]
	}
	return admitted > refused
}

// refused notes a refusal of the dispatch numbered seq at at, with the
// pool's refusals before it (see refusalMark.before), and measures the
// admitted rate over the latest refusals. It returns the rate, 0 when the
// refusals do not span enough time yet.
func (l *learner) refused(seq uint64, at time.Time, before uint64) float64 {
	i := len(l.refusals)
	for i > 0 && l.refusals[i-1].seq > seq {
		i--
	}
	l.refusals = append(l.refusals, refusalMark{})
	copy(l.refusals[i+1:], l.refusals[i:])
	l.refusals[i] = refusalMark{seq: seq, at: at, before: before}
	if len(l.refusals) > refusalMemory {
		l.refusals = l.refusals[len(l.refusals)-refusalMemory:]
	}
	last := l.refusals[len(l.refusals)-1]
	first := 0
	for first < len(l.refusals)-1 && (last.at.Sub(l.refusals[first].at) > refusalSpan ||
		l.refusals[first].at.Before(l.heldUntil) && !last.at.Before(l.heldUntil)) {
		first++
	}
	f := l.refusals[first]
	span := last.at.Sub(f.at)
	// Dispatches after the first refusal up to the last, less the refused:
	// every replica's when counted (a replica sees only its own share of
	// the refusals, and counting the others' as admitted would measure a
	// rate too high by the share refused), else this process's own.
	refusedBetween := float64(len(l.refusals) - 1 - first)
	if f.before > 0 && last.before >= f.before {
		refusedBetween = float64(last.before - f.before)
	}
	admitted := float64(last.seq-f.seq) - refusedBetween
	l.short = 0
	if span < minSampleSpan || admitted < minSampleAdmits {
		if span >= minShortSpan && admitted >= 1 {
			// Too short to measure, long enough to show a guess far off:
			// what got through since, counted generously.
			l.short = (admitted + 1) / span.Seconds()
		}
		return 0
	}
	l.sample = admitted
	// The bucket may have held up to one part-token more at the first
	// refusal than at the last: count one fewer, to err slow.
	return (admitted - 1) / span.Seconds()
}

// pace is the learned pace for the current phase of the probe cycle.
func (l *learner) pace() float64 {
	switch {
	case l.concurrencyBound():
		return l.estimate * concurrencyLoose
	case l.phase == probeUp:
		return l.estimate * probeGain
	case l.phase == probeDown:
		return l.estimate * drainGain
	}
	return l.estimate * cruiseShare
}

// sustains raises a guess not measured yet to what the level below the
// first refusal sustains for answers of secs, once known (Little's law).
func (l *learner) sustains(secs float64) bool {
	if l.unsustained == 0 || secs <= 0 || l.measured {
		return false
	}
	l.estimate, l.unsustained = max(l.estimate, float64(l.unsustained-1)/secs), 0
	return true
}

// guess reports whether the estimate is only what the pool was sending
// when it was first refused, less the cuts of later refusals.
func (l *learner) guess() bool { return !l.measured && l.from != rateHint }

// probeLength is how long the up phase lasts at rate r: long enough to
// send probeRequests more than the estimate would.
func probeLength(r float64) time.Duration {
	return max(probeSpan, time.Duration(probeRequests/((probeGain-1)*r)*float64(time.Second)))
}

// cruise is how long the pool cruises between probes: guessCruise while
// the rate is not measured (a guess is probed often, so that refusals
// measure it or clean probes raise it soon; so is a hint's, which may be
// a window's boundary read as a pace); else cycleRequests at the
// estimate, or, while the estimate was measured over few admissions (off
// by up to one in that many), twice that many, so that a low one is
// found out soon; at least probeEvery.
func (l *learner) cruise() time.Duration {
	if !l.measured {
		return guessCruise
	}
	n := float64(cycleRequests)
	if l.sample > 0 {
		n = min(n, 2*l.sample)
	}
	return max(probeEvery, time.Duration(n/l.estimate*float64(time.Second)))
}

// step moves the probe cycle on at now and reports whether the phase
// changed. Probes run only while the pace is what holds requests back
// (held), and never for a pool bound by concurrency, whose limit probes
// on its own.
func (l *learner) step(now time.Time, held bool) bool {
	if l.estimate <= 0 || l.concurrencyBound() {
		if l.phase != cruise {
			l.phase = cruise
			return true
		}
		return false
	}
	if now.Before(l.phaseUntil) {
		return false
	}
	switch l.phase {
	case cruise:
		if !held {
			return false
		}
		l.phase, l.probeHit, l.probeUnseen = probeUp, false, false
		l.probeMark = l.fleetRefused
		l.phaseUntil = now.Add(probeLength(l.estimate))
	case probeUp:
		l.phase = probeDown
		l.phaseUntil = now.Add(probeLength(l.estimate))
	case probeDown:
		cruiseFor := l.cruise()
		if l.probeHit || l.probeUnseen || l.fleetRefused > l.probeMark {
			l.streak = 0
		} else {
			// The upstream took the probe without a refusal: it allows
			// more than was learned. Each clean probe in a row raises it
			// further and comes sooner, so an estimate far too low (a
			// limit that grew, a start misread) recovers in a few cycles.
			raise := probeRaise - 1
			if l.guess() {
				raise = guessRaise - 1
			}
			l.raisedFrom = l.estimate
			l.estimate *= 1 + raise*float64(int(1)<<min(l.streak, 3))
			l.from = rateProbe
			l.streak++
			cruiseFor >>= min(l.streak, 2)
		}
		l.phase = cruise
		l.phaseUntil = now.Add(cruiseFor)
	}
	return true
}

// refusalEvidence is what the pool knows, besides the learner's own
// counts, as it learns from a refusal (see estimateOnRefusal).
type refusalEvidence struct {
	// sending is the pool's sending rate lately (requests a second),
	// over sent dispatches: every replica's, when a store kept elsewhere
	// counts them.
	sending float64
	sent    int
	// answerSecs is the mean answer time; 0 while none is known.
	answerSecs float64
	// hintPace is the pace the refusal's hint suggests (see
	// Memory.hintPace); 0: none.
	hintPace float64
	// fleetPace is the pace the other replicas learned from refusals (0:
	// none), and fleetPaceAt when it last changed (see Fleet.Said).
	fleetPace   float64
	fleetPaceAt time.Time
}

// accepted notes an answer to t that the upstream accepted at now: the
// upstream is live, and admitted t when it went.
func (l *learner) accepted(t *Ticket, now time.Time) {
	l.lastAccepted = now
	l.admits.add(t.Dispatched, 1)
	l.ownAdmits++
	if l.replySecs == 0 {
		l.replySecs = now.Sub(t.Dispatched).Seconds()
	}
}

// acceptedElsewhere notes that the upstream accepted a request of the
// pool sent elsewhere, answered at at (zero: none).
func (l *learner) acceptedElsewhere(at time.Time) { l.lastAccepted = clock.Later(at, l.lastAccepted) }

// raiser notes whether this replica holds the lease that lets one replica
// at a time raise a pace learned from refusals (see Fleet.Raiser).
func (l *learner) raiser(holds bool) {
	if l.phase == probeUp {
		l.probeUnseen = !holds
	}
}

// shareLevels replaces the counts of answers by level with every
// replica's (see Fleet.Levels).
func (l *learner) shareLevels(admitted, refused []float64) {
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
}

// fleetSaid learns what the store kept elsewhere says of the pool (see
// Fleet.Said): refusals, every replica's so far, and pace, the one
// the replicas learned from refusals (0: none). Only a pace learned from
// refusals (learning) moves. It reports whether the pace changed: a
// refusal anywhere ends a probe, unclean, and a rate not yet measured (a
// guess, a hint's) follows the fleet's down when it is under any pace it
// sends.
func (l *learner) fleetSaid(pace float64, refusals uint64, learning bool, now time.Time) bool {
	refusedSince := refusals > l.fleetRefused
	l.fleetRefused = max(l.fleetRefused, refusals)
	if !learning {
		return false
	}
	changed := false
	if refusedSince && l.phase == probeUp {
		l.phase, l.phaseUntil = probeDown, now.Add(probeLength(l.estimate))
		changed = true
	}
	if pace > 0 && pace < l.estimate*drainGain && !l.measured {
		// Following is a cut, as a refusal's change is: a refusal of a
		// request sent before it, at this replica's faster pace, cuts
		// nothing more (see estimateOnRefusal); else each replica cuts
		// the pace another set, in turn, and the cuts compound. A hint's
		// pace follows too: a wait bounds the refill from above, far
		// above it when a token was about to come, and the fleet paces
		// by what a replica learned last.
		l.estimate, l.from, l.cut = pace, rateReplicas, now
		changed = true
	}
	return changed
}

// refusedDown learns from a refusal of t while the upstream admitted
// nothing lately: an outage or a closed door, not a limit to measure. The
// pool pauses until pausedUntil (the report's pause, which such a
// refusal always takes, see poolPause): refusals sent before it start no
// measurement that ends after it. A short hint (hintPace, 0: none) still
// says how fast to go once it opens, while no rate was measured; it
// reports whether the estimate took it.
func (l *learner) refusedDown(t *Ticket, hintPace float64, pausedUntil time.Time) bool {
	l.refused(t.Seq, t.Dispatched, t.Refusals)
	l.heldUntil = clock.Later(l.heldUntil, pausedUntil)
	if hintPace > 0 && !l.measured {
		l.estimate, l.from = hintPace, rateHint
		return true
	}
	return false
}

// estimateOnRefusal moves the admitted rate on a refusal while the
// upstream admits other requests, by the named rules of refusalRules
// (rules.go), in their order: measured between refusals, guessed from the
// sending rate at the first, cut while a guess, capped by a short hint.
func (l *learner) estimateOnRefusal(t *Ticket, e refusalEvidence, now time.Time) {
	was := l.estimate
	c := refusal{t: t, e: e, now: now, sample: l.refused(t.Seq, t.Dispatched, t.Refusals)}
	c.first = c.sample == 0 && l.estimate == 0
	for _, r := range refusalRules {
		r.apply(l, c)
	}
	if l.estimate < was {
		// A refusal that lowers the rate ends a row of clean probes, and
		// says the first guess was too fast already (see sustains).
		l.streak, l.unsustained = 0, 0
	}
}

// live reports whether the upstream admitted a request lately.
func (l *learner) live(now time.Time) bool {
	return !l.lastAccepted.IsZero() && now.Sub(l.lastAccepted) < liveFor
}

// hintPace is the pace a refusal's hint suggests: one request per hint, for
// hints shorter than maxHintPace; 0 otherwise.
func hintPace(hint time.Duration) float64 {
	if hint <= 0 || hint >= maxHintPace {
		return 0
	}
	return 1 / hint.Seconds()
}
