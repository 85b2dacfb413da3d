package lanequeue

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// refusedLane is a lane whose upstream sends no headers and just refused a
// request with hint.
func refusedLane(t *testing.T, hint time.Duration) (*Lane, *Slot) {
	t.Helper()
	l, _ := testLane(64, 1000)
	s := mustGet(t, acquireAsync(context.Background(), l))
	accept(s, headerparse.Limits{}) // no headers at all
	refuse(s, hint)
	return l, s
}

func TestRefusalHintBecomesAPace(t *testing.T) {
	l, s := refusedLane(t, 50*time.Millisecond)
	defer s.Release()
	if st := l.State(); !near(st.RequestsPerSecond, 20) {
		t.Fatalf("learned %v req/s from a 50ms hint, want 20", st.RequestsPerSecond)
	}
	// Queued requests now go one per 50ms, not all at once.
	fc := l.g.clock.(interface{ Advance(time.Duration) })
	var chans []<-chan result
	for i := 0; i < 5; i++ {
		chans = append(chans, acquireAsync(context.Background(), l))
		waitQueued(t, l, i+1) // fixes the arrival order
	}
	for i, ch := range chans {
		mustBlock(t, ch)
		fc.Advance(50 * time.Millisecond)
		mustGet(t, ch).Release()
		if q := l.State().Queued; q != len(chans)-i-1 {
			t.Fatalf("after %d steps %d queued, want %d", i+1, q, len(chans)-i-1)
		}
	}
}

func TestRefusalsOnlyLowerThePaceAndQuietSecondsRaiseIt(t *testing.T) {
	l, s := refusedLane(t, 50*time.Millisecond)
	defer s.Release()
	fc := l.g.clock.(interface{ Advance(time.Duration) })
	fc.Advance(50 * time.Millisecond)
	refuse(s, 10*time.Millisecond) // a shorter hint does not speed it up;
	// the pace let the request go, so the refusal slows it.
	if st := l.State(); !near(st.RequestsPerSecond, 20*paceBackoff) {
		t.Fatalf("pace %v after a shorter hint, want %v", st.RequestsPerSecond, 20*paceBackoff)
	}
	fc.Advance(100 * time.Millisecond)
	refuse(s, 100*time.Millisecond) // a longer one slows it
	if st := l.State(); !near(st.RequestsPerSecond, 10) {
		t.Fatalf("pace %v after a 100ms hint, want 10", st.RequestsPerSecond)
	}
	fc.Advance(probeInterval)
	accept(s, headerparse.Limits{})
	if st := l.State(); !near(st.RequestsPerSecond, 10*probeFactor) {
		t.Fatalf("pace %v after a quiet second, want %v", st.RequestsPerSecond, 10*probeFactor)
	}
}

func TestRefusalWithoutUsableHintLearnsNoPace(t *testing.T) {
	for _, hint := range []time.Duration{0, -time.Second, time.Minute} {
		l, s := refusedLane(t, hint)
		if st := l.State(); st.RequestsPerSecond != 0 || st.RequestsLimit != 0 {
			t.Fatalf("hint %v: learned %+v", hint, st)
		}
		s.Release()
	}
}

func TestHeadersReplaceAPaceLearnedFromRefusals(t *testing.T) {
	l, s := refusedLane(t, 50*time.Millisecond)
	l.g.clock.(interface{ Advance(time.Duration) }).Advance(50 * time.Millisecond)
	accept(s, headerparse.Limits{Requests: win(100, 99, at(10*time.Millisecond))})
	s.Release()
	if st := l.State(); st.RequestsLimit != 100 {
		t.Fatalf("limit %v after real headers, want 100", st.RequestsLimit)
	}
	// And a refusal no longer overrides what the headers say.
	s2 := mustGet(t, acquireAsync(context.Background(), l))
	refuse(s2, time.Second)
	if st := l.State(); st.RequestsLimit != 100 {
		t.Fatalf("a refusal replaced header-learned limits: %+v", st)
	}
	s2.Release()
}

// TestRefusalOfAPacedRequestSlowsThePace: a pace learned from refusals runs
// faster than the upstream (the hints were short), and the upstream refuses
// a request the pace had room for with another short hint. The hint alone
// would leave the pace where it is; the refusal says it is too fast, so it
// falls to the rate the upstream admitted, or by paceBackoff when too few
// answers tell that rate.
func TestRefusalOfAPacedRequestSlowsThePace(t *testing.T) {
	t.Run("to the admitted rate", func(t *testing.T) {
		var p pacer
		p.setSynthetic(10, t0) // learned from a 100ms hint
		// The upstream admitted one request every 250ms: 4 a second.
		for i := range 9 {
			d := at(time.Duration(i) * 250 * time.Millisecond)
			p.accepted(&Ticket{Dispatched: d}, d)
		}
		now := at(2 * time.Second)
		p.refused(&Ticket{Dispatched: now, Paced: true}, 20*time.Millisecond, now)
		if r := p.requests.rate; r > 4.5 || r < 3.5 {
			t.Fatalf("pace %v after refusal, want about the 4/s admitted", r)
		}
	})
	t.Run("by the backoff factor", func(t *testing.T) {
		var p pacer
		p.setSynthetic(10, t0)
		p.refused(&Ticket{Dispatched: at(time.Second), Paced: true}, 20*time.Millisecond, at(time.Second))
		if !near(p.requests.rate, 10*paceBackoff) {
			t.Fatalf("pace %v, want %v", p.requests.rate, 10*paceBackoff)
		}
		// Another refusal of a request sent before that decrease is the
		// same evidence.
		p.refused(&Ticket{Dispatched: at(time.Second), Paced: true}, 20*time.Millisecond, at(time.Second+time.Millisecond))
		if !near(p.requests.rate, 10*paceBackoff) {
			t.Fatalf("pace %v after a refusal of the same burst, want %v", p.requests.rate, 10*paceBackoff)
		}
	})
	t.Run("not when the pace held it back", func(t *testing.T) {
		var p pacer
		p.setSynthetic(10, t0)
		p.refused(&Ticket{Dispatched: at(time.Second)}, 20*time.Millisecond, at(time.Second))
		if !near(p.requests.rate, 10) {
			t.Fatalf("pace %v, want 10: the request was not one the pace let go", p.requests.rate)
		}
	})
}
