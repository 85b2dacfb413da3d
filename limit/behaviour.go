package limit

import (
	"math"
	"time"
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
	from     RateFrom // where estimate comes from
	measured bool     // estimate was measured between refusals once
	// sample is how many admissions the latest measurement counted: an
	// estimate counted over few is off by a larger share (see cruise).
	sample float64
	// short is the admitted rate between the latest refusals when they
	// lie too close to measure it (0: none): a guess far above it is cut
	// to it at once rather than by unmeasuredCut a round.
	short float64

	lastAccepted time.Time // the latest accepted answer
	admits       meter     // admitted dispatches, by when they went
	replySecs    float64   // the first accepted answer's time to its headers
	lastRefused  time.Time // the latest refusal learned from
	cut          time.Time // when the estimate last changed on a refusal
	// heldUntil is the end of the latest pause taken while the upstream
	// admitted nothing lately: refusals sent before it start no
	// measurement that ends after it, as the group sent nothing in
	// between for the upstream to admit.
	heldUntil time.Time

	// The probe cycle: cruise, then up for probeUp, then down as long.
	phase      probePhase
	phaseUntil time.Time
	probeFrom  time.Time // start of the latest up phase
	probeHit   bool      // a request dispatched in it was refused
	// probeUnseen: the probe's pace did not reach the upstream (another
	// replica held the raise lease), so it cannot come back clean.
	probeUnseen bool
	// fleetRefused counts every replica's refusals (Memory.NoteFleet),
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
	// before is Ticket.Refusals: one more than the group's refusals
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
	// level the group is at, and a ramp passes each level in a few
	// requests. (The proxy counts an answer in flight a moment longer than
	// the upstream, so some admissions show at levels above its limit.)
	minRepeated = 3
	// minSampleAdmits: a rate measured over fewer admissions is off by
	// more than an eighth (the bucket's part-token at either end).
	minSampleAdmits = 8
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
	// concurrencyLoose is how far above the admitted rate a group bound by
	// concurrency paces: the concurrency limit holds it, not the pace.
	concurrencyLoose = 1.5
	// guessCruise is the cruise between probes while the rate is a guess
	// (not yet measured between refusals).
	guessCruise = time.Second
	guessRaise  = 1.25 // and the raise of a clean probe then
	// startSpread: before any limit is known, dispatches are at least
	// 1/(startSpread × limit) of an answer time apart (see local.spread).
	startSpread = 2.0
	// maxHintPace is the longest hint taken as a pace: a wait of a second
	// or more (Retry-After is in whole seconds) says when to try again,
	// not how fast.
	maxHintPace = time.Second
	// maxHintAdmits: a hint is a pace while the upstream admitted at most
	// this many requests a hint lately (a bucket's hint is one request's
	// refill).
	maxHintAdmits = 3
)

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

// answered notes an answer at level in flight.
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
// where it admits again and again; a rate limit refuses at whatever
// level the group is at when its pace runs ahead, levels where it also
// admits. It sets atLevel to the lowest level the upstream refuses at
// when the counts show a concurrency limit, else 0, and reports whether
// that changed.
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
		below := l.admitted[level-1] + l.admitted[max(level-2, 1)]*boolFloat(level > 2)
		if below >= minBelow || l.refusedAt[level] >= minRepeated && 2*(l.admitted[level]+l.pending[level]) <= l.refusedAt[level] {
			l.atLevel = level
		}
	}
	return l.atLevel != was
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
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
// group's refusals before it (see refusalMark.before), and measures the
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

// guess reports whether the estimate is only what the group was sending
// when it was first refused, less the cuts of later refusals.
func (l *learner) guess() bool { return !l.measured && l.from != rateHint }

// probeLength is how long the up phase lasts at rate r: long enough to
// send probeRequests more than the estimate would.
func probeLength(r float64) time.Duration {
	return max(probeSpan, time.Duration(probeRequests/((probeGain-1)*r)*float64(time.Second)))
}

// cruise is how long the group cruises between probes: cycleRequests at
// the estimate, or, while the estimate was measured over few admissions
// (off by up to one in that many), twice that many, so that a low one
// is found out soon; at least probeEvery.
func (l *learner) cruise() time.Duration {
	n := float64(cycleRequests)
	if l.measured && l.sample > 0 {
		n = min(n, 2*l.sample)
	}
	return max(probeEvery, time.Duration(n/l.estimate*float64(time.Second)))
}

// step moves the probe cycle on at now and reports whether the phase
// changed. Probes run only while the pace is what holds requests back
// (held), and never for a group bound by concurrency, whose limit probes
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
		l.phase, l.probeFrom, l.probeHit, l.probeUnseen = probeUp, now, false, false
		l.probeMark = l.fleetRefused
		l.phaseUntil = now.Add(probeLength(l.estimate))
	case probeUp:
		l.phase = probeDown
		l.phaseUntil = now.Add(probeLength(l.estimate))
	case probeDown:
		cruiseFor := l.cruise()
		if !l.measured {
			// A guessed rate is probed often, so that refusals measure
			// it or clean probes raise it soon; so is one from a hint,
			// which may have been a window's boundary read as a pace.
			cruiseFor = guessCruise
		}
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

// ceilRate is the concurrency that rate needs for answers of secs (Little's
// law), 0 when either is unknown.
func ceilRate(rate, secs float64) int {
	if rate <= 0 || secs <= 0 {
		return 0
	}
	return int(math.Ceil(rate * secs))
}
