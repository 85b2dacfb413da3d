package bucket

import "time"

// Spacer spaces events evenly: one every gap, the gap given with each
// event, and no burst after an idle spell. The zero Spacer lets the first
// event go at once.
type Spacer struct {
	next time.Time // the earliest the next event may go; zero: any time
}

// Next is the earliest the next event may go; the zero time when any time
// will do.
func (s *Spacer) Next() time.Time { return s.next }

// Take records an event at now: the next may go gap after it. An event at
// most a tenth of a gap late (a timer that fired a little late) keeps to
// the plan, and the next may go gap after when this one was due, so the
// rate holds; a later one starts the plan again from now.
func (s *Spacer) Take(now time.Time, gap time.Duration) {
	if s.next.IsZero() || now.Sub(s.next) > gap/10 {
		s.next = now
	}
	s.next = s.next.Add(gap)
}
