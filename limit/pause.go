package limit

import "time"

// pause is a pool's pause: until when, and why (View.PauseReason). The
// zero pause is none.
type pause struct {
	until  time.Time
	reason pauseReason
	trial  bool // one request goes alone at its end (see lengthen)
}

// pauseEvidence is what learning from a report found that bears on the
// pause the report asks for (see poolPause).
type pauseEvidence struct {
	// closed: the fixed windows read the refusal as a closure; they hold
	// the pool until the window's boundary, whatever pace is asked.
	// opens: the earliest that boundary can be, where a confirmed
	// closure knows it (zero: not known).
	closed bool
	opens  time.Time
	// quiet: a rate refusal or an overload from an upstream whose headers
	// say nothing, learned from by its behaviour.
	quiet bool
	// live: the upstream admitted a request lately (see learner.live).
	live bool
	// concurrencyBound: after learning from the refusal, the state judges
	// the number in flight to be what the upstream limits.
	concurrencyBound bool
}

// poolPause decides whether the pool takes the pause r asks for
// (r.PauseUntil; the proxy asks for one when it retries after a verdict
// that Pauses), from what learning from r found (e). It takes it, for
// r's verdict's reason, unless what was learned holds the pool better:
//
//   - a fixed window's closure: the windows hold the pool until the
//     boundary; a confirmed one is a pause to the earliest the boundary
//     can be, which lengthen lengthens as any other (where refusals
//     count, a refusal's own charge moves the boundary it named);
//   - a quiet refusal while the upstream admits other requests is about
//     capacity: the learned concurrency limit holds the pool when the
//     number in flight is the bound, else the learned pace does, and a
//     pause would only idle it, unless the upstream named a wait short
//     enough to be a pace (hintPace). A longer one (Retry-After is in
//     whole seconds) holds only the refused request.
//
// A quiet refusal while the upstream admits nothing is an outage, not a
// limit: the pool takes the pause. It returns the zero pause when the
// pool takes none. (Memory takes a pause only when it ends later than
// the one under way.)
func poolPause(r Report, e pauseEvidence) pause {
	if !e.opens.IsZero() {
		return pause{until: e.opens, reason: pauseWindow}
	}
	if r.PauseUntil.IsZero() || e.closed {
		return pause{}
	}
	if e.quiet && e.live && (e.concurrencyBound || hintPace(r.Hint) == 0) {
		return pause{}
	}
	return pause{until: r.PauseUntil, reason: r.Verdict.PauseReason()}
}

// unpaid tracks the pauses in a row that paid the upstream nothing:
// resumed is the end of the latest pause the pool sent after, counted
// the one found unpaid, last how long the latest pause was, named the
// end of the first wait refused since an admission.
type unpaid struct {
	resumed, counted, named time.Time
	last                    time.Duration
}

// lengthen returns p, the pause the answer r to t asks of the pool at
// now, lengthened when the pause before it paid nothing. A wait is the
// upstream's data, not a guarantee: one that counts refused requests
// charges each, so a pause as long as the wait it named ends a request (or
// a burst) short, the next refusal names the same wait again, and the
// pool sends at the refill, refused every time, for ever. So when all
// the pool sent after a pause was refused, nothing admitted since and
// nothing else out that might be, that pause paid only what its end cost:
// the next one is its wait and twice that pause (at most maxKnock)
// besides. (Not when the upstream's new wait is under half the last pause:
// a short wait after a long pause is a pace, which the lengthening only
// turned into refusals elsewhere. A refusal with no wait names no pace.)
// Words show it too: a refusal naming a wait that ends over its grain
// after the first named since an admission, nothing else out, shows the
// refusals between charged: the pool takes it, one request at its end.
func (s *Memory) lengthen(p pause, t *Ticket, r Report, now time.Time) pause {
	u := &s.unpaid
	if r.Verdict == Accepted {
		*u = unpaid{}
	}
	if end := now.Add(r.Hint); r.Hint > 0 && r.Verdict.Refusal() && s.fleetSent == 0 {
		if u.named.IsZero() {
			u.named = end
		} else if end.After(u.named.Add(grainOf(r.Hint))) && s.conc.inFlight <= s.refusedHolding {
			p.trial = true
			if r.PauseUntil.After(p.until.Add(grainOf(r.Hint))) {
				p.until, p.reason = r.PauseUntil, r.Verdict.PauseReason()
			}
		}
	}
	if p.until.IsZero() || s.fleetSent > 0 {
		// Among replicas one sees only its part: another's admissions,
		// or its requests out, would have paid.
		return p
	}
	if !s.paused.until.IsZero() && !s.paused.until.After(now) {
		u.resumed = s.paused.until
	}
	if !u.resumed.IsZero() && !u.resumed.Equal(u.counted) && !t.Dispatched.Before(u.resumed) &&
		s.learn.lastAccepted.Before(u.resumed) && s.conc.inFlight <= s.refusedHolding && (r.Hint == 0 || 2*p.until.Sub(now) >= u.last) {
		u.counted = u.resumed
		p.until = p.until.Add(min(2*u.last, maxKnock))
	}
	if p.until.After(now) && p.until.After(s.paused.until) {
		u.last = p.until.Sub(now)
	}
	return p
}
