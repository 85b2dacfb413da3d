package limit

import (
	"testing"
	"time"
)

// TestEachRefusalRuleAlone runs one rule of refusalRules at a time on a
// learner and a refusal made for it, and checks whether it applies and
// what it leaves: each rule's conditions and its effect, apart from the
// others'.
func TestEachRefusalRuleAlone(t *testing.T) {
	now := t0.Add(10 * time.Second)
	before, after := now.Add(-2*time.Second), now.Add(-time.Second) // dispatches before and after the last cut
	// admittedAt: a learner whose counts show level 3 reached (admitted
	// more than refused at it and above).
	admittedAt := func(l *learner) { l.admitted, l.refusedAt = []float64{0, 0, 0, 5}, []float64{0, 0, 0, 1} }
	for _, tt := range []struct {
		rule     string
		learner  func(l *learner)
		refusal  refusal
		applies  bool
		estimate float64
		from     rateFrom
	}{
		{"measured between refusals", nil, refusal{sample: 12}, true, 12, rateAdmitted},
		{"measured between refusals", nil, refusal{}, false, 30, rateProbe},
		{"measured between refusals", nil, refusal{sample: 12, t: &Ticket{Probe: true}}, true, 30, rateProbe}, // measured: a refused probe only raises
		{"first guess: the sending rate", nil, refusal{first: true, e: refusalEvidence{sending: 40}}, true, 40, rateSending},
		{"first guess: the sending rate", nil, refusal{e: refusalEvidence{sending: 40}}, false, 30, rateProbe},
		{"first guess: what the number in flight sustains", func(l *learner) { l.estimate, l.measured = 2, false },
			refusal{first: true, t: &Ticket{Level: 9}, e: refusalEvidence{answerSecs: 0.5}}, true, 16, rateProbe},
		{"first guess: what the number in flight sustains", func(l *learner) { l.estimate, l.measured = 2, false }, // no answer time yet
			refusal{first: true, t: &Ticket{Level: 9}}, false, 2, rateProbe},
		{"first guess: what the number in flight sustains", func(l *learner) { l.estimate = 2; admittedAt(l) },
			refusal{first: true, t: &Ticket{Level: 3}, e: refusalEvidence{answerSecs: 0.5}}, false, 2, rateProbe},
		{"first guess: the fleet's pace", nil, refusal{first: true, e: refusalEvidence{fleetPace: 10}}, true, 10, rateReplicas},
		{"first guess: the fleet's pace", nil, refusal{first: true, t: &Ticket{Paced: true, Dispatched: after},
			e: refusalEvidence{fleetPace: 10, fleetPaceAt: before}}, true, 10 * unmeasuredCut, rateReplicas},
		{"first guess: the fleet's pace", nil, refusal{first: true, e: refusalEvidence{fleetPace: 50}}, false, 30, rateProbe},
		{"first guess: a hint's pace", nil, refusal{first: true, e: refusalEvidence{hintPace: 20, sent: 100}}, true, 20, rateHint},
		{"first guess: a hint's pace", nil, refusal{first: true, e: refusalEvidence{hintPace: 50, sent: 3}}, true, 50, rateHint},
		{"first guess: a hint's pace", nil, refusal{first: true, e: refusalEvidence{hintPace: 50, sent: 100}}, false, 30, rateProbe},
		{"refused again at a guess", func(l *learner) { l.measured = false; l.lastAccepted = now; admittedAt(l) },
			refusal{t: &Ticket{Dispatched: after, Level: 3}}, true, 30 * unmeasuredCut, rateProbe},
		{"refused again at a guess", func(l *learner) { l.measured = false; admittedAt(l) }, // nothing admitted since the cut
			refusal{t: &Ticket{Dispatched: after, Level: 3}}, false, 30, rateProbe},
		{"refused again at a guess", func(l *learner) { l.measured = false; l.lastAccepted = now; admittedAt(l) },
			refusal{t: &Ticket{Dispatched: before, Level: 3}}, false, 30, rateProbe}, // sent before the cut
		{"refusals too close to measure", func(l *learner) { l.measured = false; l.short = 10 },
			refusal{t: &Ticket{Dispatched: after}}, true, 10, rateProbe},
		{"refusals too close to measure", func(l *learner) { l.measured = false; l.short = 20 },
			refusal{t: &Ticket{Dispatched: after}}, false, 30, rateProbe}, // within shortCut of the guess
		{"a refused raise goes back", func(l *learner) { l.raisedFrom = 20 }, refusal{t: &Ticket{Probe: true}}, true, 20, rateProbe},
		{"a refused raise goes back", func(l *learner) { l.raisedFrom = 25 }, refusal{t: &Ticket{Probe: true}}, false, 30, rateProbe},
		{"a hint caps the rate", nil, refusal{e: refusalEvidence{hintPace: 10}}, true, 10, rateHint},
		{"a hint caps the rate", nil, refusal{sample: 20, e: refusalEvidence{hintPace: 10}}, true, 20, rateAdmitted},
		{"a hint caps the rate", nil, refusal{e: refusalEvidence{hintPace: 40}}, false, 30, rateProbe},
		{"a hint caps the rate", nil, refusal{sample: 10, e: refusalEvidence{hintPace: 10}}, true, 10, rateHint},  // measured no faster than the hint
		{"a hint caps the rate", nil, refusal{sample: 30, e: refusalEvidence{hintPace: 10}}, true, 30, rateProbe}, // measured at the estimate: it stays
	} {
		// A learner with a measured estimate of 30/s from a probe, last
		// cut 1.5 s ago, unless the case says otherwise.
		l := &learner{estimate: 30, from: rateProbe, measured: true, cut: now.Add(-1500 * time.Millisecond)}
		if tt.learner != nil {
			tt.learner(l)
		}
		c := tt.refusal
		c.now = now
		if c.t == nil {
			c.t = &Ticket{Dispatched: after}
		}
		rule := ruleNamed(t, tt.rule)
		applied := rule.apply(l, c)
		if applied != tt.applies || l.estimate != tt.estimate || l.from != tt.from {
			t.Errorf("%s, %+v: applied %v, estimate %.2f from %q; want %v, %.2f from %q",
				tt.rule, tt.refusal, applied, l.estimate, l.from, tt.applies, tt.estimate, tt.from)
		}
		if applied && tt.rule != "first guess: what the number in flight sustains" &&
			tt.rule != "first guess: the fleet's pace" && tt.rule != "first guess: a hint's pace" &&
			tt.rule != "a hint caps the rate" && !l.cut.Equal(now) {
			t.Errorf("%s: applied without marking the cut", tt.rule)
		}
	}
}

func ruleNamed(t *testing.T, name string) refusalRule {
	t.Helper()
	for _, r := range refusalRules {
		if r.name == name {
			return r
		}
	}
	t.Fatalf("no rule %q", name)
	return refusalRule{}
}
