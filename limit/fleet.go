package limit

import "time"

// Fleet is what the other replicas that keep a pool's state together with
// this one tell this replica's Memory, so that what it learns from the
// upstream's behaviour is about the pool as the upstream sees it: a Shared
// kept elsewhere (redisstate) admits from the state every replica shares
// and tells Memory of the dispatches it admitted, the permits they gave
// back and what it counts of every replica's answers.
type Fleet struct{ s *Memory }

// Fleet is what the other replicas tell s through.
func (s *Memory) Fleet() Fleet { return Fleet{s} }

// Dispatched records a dispatch the store kept elsewhere admitted: out is
// the number of permits out, all replicas together, before this one; sent
// the running count of the pool's dispatches, all replicas together, right
// after it (0: not known); lastSecond the pool's dispatches in the second
// up to now, all replicas, this one included (0: not known). It returns
// the dispatch's ticket as far as Memory knows it; the store fills in what
// it charged and gave. The probe cycle moves on here, as Admit moves it
// for the pool's own admissions.
func (f Fleet) Dispatched(now time.Time, out int, sent uint64, lastSecond int) Ticket {
	s := f.s
	s.stepProbe(now)
	// Dispatches of the other replicas since this one's last count toward
	// the pool's sending rate too (at most a meter's worth at once); at
	// this replica's first, those of the last second.
	n := uint64(1)
	switch {
	case sent > s.fleetSent && s.fleetSent > 0:
		n = min(sent-s.fleetSent, 10000)
	case s.fleetSent == 0 && lastSecond > 1:
		n = uint64(min(lastSecond, 10000))
	}
	s.fleetSent = max(s.fleetSent, sent)
	s.pace.recent.add(now, int(n))
	seq := s.learn.dispatched()
	if sent > seq {
		// Numbered in the pool's count, so that the dispatches admitted
		// between two refusals are all the replicas'.
		s.learn.seq, seq = sent, sent
	}
	level := out - s.refusedHolding + 1
	s.learn.noteSent(level)
	t := Ticket{Dispatched: now, InFlight: out, Seq: seq, Level: level, Probe: s.pace.fromRefusals && s.learn.phase == probeUp}
	if s.knockNext, t.Knock = false, s.knockNext; t.Knock {
		s.win.knocked(seq, now)
	} else {
		s.win.dispatched(now)
	}
	return t
}

// WindowGate tells whether the pool's fixed window lets a request go at
// now, before the store kept elsewhere admits one from the shared state:
// not while a closure holds it (until at; zero: until an answer), but one
// knock at a time, which the next Dispatched records. (This replica's
// count cannot tell the window's allowance spent: its first refusal
// closes it here, and the store counts the fleet's.) Knock reports that
// the request is that knock: the closure's test, which a pause the fleet
// took for the closure does not hold. Windowed reports that the window's
// allowance paces the pool: a pace learned from refusals does not.
func (f Fleet) WindowGate(now time.Time) (at time.Time, ok, knock, windowed bool) {
	at, knock, ok = f.s.win.gate(now, false)
	f.s.knockNext = ok && knock
	return at, ok, f.s.knockNext, f.s.win.pacing()
}

// Said records, at now, what the store kept elsewhere says of the pool:
// when the upstream last accepted a request of it sent elsewhere (zero:
// never; the upstream is live then), the request pace the replicas learned
// from refusals (0: none; only a refusal lowers it, so a replica never
// follows its own), the refusals every replica learned from so far, and
// the answers every replica had admitted so far (0: not counted), which
// tell what the upstream takes. A refusal anywhere ends a probe, unclean;
// a replica's first refusal starts from the fleet's pace (ruleFleetPace),
// and a rate not yet measured follows it down (learner.fleetSaid).
func (f Fleet) Said(accepted time.Time, pace float64, refusals, admitted uint64, now time.Time) {
	s := f.s
	s.learn.acceptedElsewhere(accepted)
	s.learn.fleetAdmitted(admitted, now)
	if pace != s.fleetPace {
		s.fleetPace, s.fleetPaceAt = pace, now
	}
	if s.learn.fleetSaid(pace, refusals, s.pace.fromRefusals, now) {
		s.pace.setFromRefusals(s.pacing(), now)
	}
}

// Held records that the store kept elsewhere held a request back at now
// for the pace learned from refusals: the probe cycle probes only while
// the pace is what holds requests back.
func (f Fleet) Held(now time.Time) {
	if f.s.pace.fromRefusals {
		f.s.held = now
		f.s.stepProbe(now)
	}
}

// Raiser records whether this replica holds the lease that lets one
// replica at a time raise a pace learned from refusals: a probe made
// without it reached no upstream, and does not raise the estimate when it
// ends. The latest word during the up phase counts.
func (f Fleet) Raiser(holds bool) { f.s.learn.raiser(holds) }

// Levels replaces the counts of answers by the number in flight they went
// at, from which the bound of an upstream without headers is judged, with
// those of every replica together (admitted[i] and refused[i] for level
// i): each replica sees only its share of the refusals, too few alone to
// tell a concurrency limit from a rate. A pool paced from refusals judges
// its bound again at once.
func (f Fleet) Levels(admitted, refused []float64, now time.Time) {
	f.s.learn.shareLevels(admitted, refused)
	f.s.judgeAgain(now)
}

// Returned records the end of an answer whose permit the store gave, for
// the mean answer time; Memory's own permit count is not touched.
func (f Fleet) Returned(t *Ticket, now time.Time) { f.s.returned(t, now) }
