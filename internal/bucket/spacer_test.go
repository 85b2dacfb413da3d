package bucket

import (
	"testing"
	"time"
)

// TestSpacer: when the next event may go after each of a series taken
// with a gap of a second.
func TestSpacer(t *testing.T) {
	const gap = time.Second
	cases := []struct {
		name  string
		takes []time.Duration // each event, from t0
		next  time.Duration   // when the next may go, from t0
	}{
		{"the first goes at once, the next a gap later", []time.Duration{0}, time.Second},
		{"on time keeps the plan", []time.Duration{0, time.Second, 2 * time.Second}, 3 * time.Second},
		{"a tenth of a gap late keeps the plan", []time.Duration{0, 1100 * time.Millisecond}, 2 * time.Second},
		{"later than a tenth starts the plan again", []time.Duration{0, 1100*time.Millisecond + 1}, 2100*time.Millisecond + 1},
		{"an idle spell gives no burst", []time.Duration{0, time.Hour}, time.Hour + time.Second},
		{"an event before its time pushes the next a gap on", []time.Duration{0, 0}, 2 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s Spacer
			if !s.Next().IsZero() {
				t.Fatalf("the zero spacer's next is %v, want any time", s.Next())
			}
			for _, d := range c.takes {
				s.Take(t0.Add(d), gap)
			}
			if got, want := s.Next(), t0.Add(c.next); !got.Equal(want) {
				t.Errorf("next at %v, want %v", got.Sub(t0), c.next)
			}
		})
	}
}

// TestSpacerTakesTheGapOfEachEvent: a gap that changes (a rate that
// grew) counts from the event it is given with.
func TestSpacerTakesTheGapOfEachEvent(t *testing.T) {
	var s Spacer
	s.Take(t0, time.Second)
	s.Take(at(time.Second), 500*time.Millisecond)
	if want := at(1500 * time.Millisecond); !s.Next().Equal(want) {
		t.Fatalf("next at %v, want %v", s.Next().Sub(t0), want.Sub(t0))
	}
}
