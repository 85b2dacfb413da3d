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
	refuse(s, 10*time.Millisecond) // a shorter hint does not speed it up
	if st := l.State(); !near(st.RequestsPerSecond, 20) {
		t.Fatalf("pace %v after a shorter hint, want 20", st.RequestsPerSecond)
	}
	fc.Advance(50 * time.Millisecond)
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
