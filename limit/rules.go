package limit

import "time"

// refusal is what the rules of refusalRules read of one refusal while the
// upstream admits other requests: its ticket and evidence, when it came,
// the rate measured between it and the refusals before it (0: none), and
// whether it is the pool's first (no rate measured, none guessed).
type refusal struct {
	t      *Ticket
	e      refusalEvidence
	now    time.Time
	sample float64
	first  bool
}

// refusalRule is one way a refusal moves the admitted rate: apply
// reports whether the rule applied (and so may have moved it).
type refusalRule struct {
	name  string
	apply func(l *learner, c refusal) bool
}

// refusalRules are the rules a refusal is read by, in order; each reads
// the estimate the ones before it left. The first four make a first
// refusal's guess; the measurement and the repeated cut apply only when
// it is not the first.
var refusalRules = [...]refusalRule{
	{"measured between refusals", ruleMeasured},
	{"first guess: the sending rate", ruleSending},
	{"first guess: what the number in flight sustains", ruleInFlight},
	{"first guess: the fleet's pace", ruleFleetPace},
	{"first guess: a hint's pace", ruleFirstHint},
	{"refused again at a guess", ruleGuessCut},
	{"refusals too close to measure", ruleTooClose},
	{"a refused raise goes back", ruleRaiseBack},
	{"a hint caps the rate", ruleHintCap},
}

// ruleMeasured: refusals far enough apart measure the rate the upstream
// admitted between them. A refusal of the probe is expected, and what was
// admitted over the cycle includes the cruise under the limit, lost to a
// concurrency limit: it only raises a measured estimate. Elsewhere a
// refusal says the estimate is too high, and a guess takes any
// measurement.
func ruleMeasured(l *learner, c refusal) bool {
	if c.sample <= 0 {
		return false
	}
	if !c.t.Probe || c.sample > l.estimate || l.guess() {
		l.estimate, l.from, l.measured = c.sample, rateAdmitted, true
	}
	l.cut = c.now
	return true
}

// ruleSending: one refusal measures no rate yet; what the pool has been
// sending is too fast, and the first guess.
func ruleSending(l *learner, c refusal) bool {
	if !c.first {
		return false
	}
	l.estimate, l.from = c.e.sending, rateSending
	l.cut = c.now
	return true
}

// ruleInFlight: refused at a number in flight nothing went through at,
// what did go through, over the answer time, is what it sustains
// (Little's law), if the number in flight is the bound. Before any answer
// ended (a stream holds its place long after its headers came) the answer
// time is not known: the guess waits for it (see learner.sustains).
func ruleInFlight(l *learner, c refusal) bool {
	if !c.first || l.reached(c.t.Level) {
		return false
	}
	l.unsustained = c.t.Level
	return l.sustains(c.e.answerSecs)
}

// ruleFleetPace: other replicas learned a pace from their refusals
// already, lower than what the pool was sending, and known. Refused at
// that pace (sent after this replica saw it, so not at an older, faster
// one), it is cut as one process's guess refused again is. (Each
// replica's first refusal is a first guess of its own; without the cut
// the fleet needs a refusal per replica to slow down.)
func ruleFleetPace(l *learner, c refusal) bool {
	if !c.first || c.e.fleetPace <= 0 || c.e.fleetPace >= l.estimate {
		return false
	}
	l.estimate, l.from = c.e.fleetPace, rateReplicas
	if c.t.Paced && c.t.Dispatched.After(c.e.fleetPaceAt) && !l.concurrencyBound() {
		l.estimate *= unmeasuredCut
	}
	return true
}

// ruleFirstHint: a short hint says how fast is right, below the guess, or
// in place of a sending rate of a few requests, which says little.
func ruleFirstHint(l *learner, c refusal) bool {
	hp := c.e.hintPace
	if !c.first || hp <= 0 || hp >= l.estimate && c.e.sent >= minSendingSample {
		return false
	}
	l.estimate, l.from = hp, rateHint
	return true
}

// ruleGuessCut: refused again at a pace not yet measured, at a number in
// flight the upstream admits: slower, once for the requests sent since
// the last change. Not before the upstream admitted one of them: one that
// counts refusals refuses all until its debt is paid, whatever the pace.
func ruleGuessCut(l *learner, c refusal) bool {
	t := c.t
	if c.first || c.sample > 0 || l.measured || t.Probe || l.concurrencyBound() || !t.Dispatched.After(l.cut) ||
		l.lastAccepted.Before(l.cut) || !l.reached(t.Level) {
		return false
	}
	l.estimate *= unmeasuredCut
	l.cut = c.now
	return true
}

// ruleTooClose: refusals too close together to measure the rate still
// show what got through between them: a guess far above it (the whole of
// a limit other models share, a sending rate several times the limit) is
// cut to it at once rather than by unmeasuredCut a round. (One a little
// above it is left to the measurement: what gets through right after a
// refusal may be less than the refill, where refusals count against the
// limit.) Only for a request sent at the guess: those sent before it,
// refused close together, show an upstream's debt as much as its rate.
func ruleTooClose(l *learner, c refusal) bool {
	if l.measured || c.t.Probe || l.short <= 0 || l.short*shortCut >= l.estimate || !c.t.Dispatched.After(l.cut) {
		return false
	}
	l.estimate = l.short
	l.cut = c.now
	return true
}

// ruleRaiseBack: the probe above a raise past the pace the clean probe
// ran at was refused: the raise went too far. Back to what ran clean, at
// once; staying at the raise until the refusals measure a rate overdraws
// an upstream that counts them. (A smaller raise is left to the
// measurement.)
func ruleRaiseBack(l *learner, c refusal) bool {
	if !c.t.Probe || l.from != rateProbe || l.raisedFrom <= 0 || l.estimate <= l.raisedFrom*probeGain {
		return false
	}
	l.estimate, l.raisedFrom = l.raisedFrom, 0
	l.cut = c.now
	return true
}

// ruleHintCap: the wait for the next request is at most one request's
// worth of the refill, so one per hint is as fast as the upstream can go.
// Unless the refusals just measured the upstream admitting faster than
// that: then the hint was no refill's (a fixed window's end, a moment
// away), and the measurement caps the rate instead.
func ruleHintCap(l *learner, c refusal) bool {
	hp := c.e.hintPace
	if hp <= 0 || hp >= l.estimate {
		return false
	}
	if c.sample <= hp {
		l.estimate, l.from = hp, rateHint
	} else if c.sample < l.estimate {
		l.estimate, l.from, l.measured = c.sample, rateAdmitted, true
	}
	return true
}
