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

// cruiseShare is the share of a rate learned from refusals that the group
// cruises at (limit's cruiseShare).
const cruiseShare = 0.97

func TestRefusalHintBecomesAPace(t *testing.T) {
	l, s := refusedLane(t, 50*time.Millisecond)
	defer s.release()
	if st := l.State(); !near(st.AdmittedRate, 20) || st.RateFrom != "hint" || !near(st.RequestsPerSecond, 20*cruiseShare) {
		t.Fatalf("learned %v req/s from %q, pace %v, from a 50ms hint; want 20 from the hint, paced at %v",
			st.AdmittedRate, st.RateFrom, st.RequestsPerSecond, 20*cruiseShare)
	}
	// Queued requests now go one per 1/19.4 s, not all at once.
	fc := l.g.clock.(interface{ Advance(time.Duration) })
	var chans []<-chan result
	for i := 0; i < 5; i++ {
		chans = append(chans, acquireAsync(context.Background(), l))
		waitQueued(t, l, i+1) // fixes the arrival order
	}
	for i, ch := range chans {
		mustBlock(t, ch)
		fc.Advance(52 * time.Millisecond)
		mustGet(t, ch).release()
		if q := l.State().Queued; q != len(chans)-i-1 {
			t.Fatalf("after %d steps %d queued, want %d", i+1, q, len(chans)-i-1)
		}
	}
}

func TestHeadersReplaceAPaceLearnedFromRefusals(t *testing.T) {
	l, s := refusedLane(t, 50*time.Millisecond)
	l.g.clock.(interface{ Advance(time.Duration) }).Advance(60 * time.Millisecond)
	accept(s, headerparse.Limits{Requests: win(100, 99, at(10*time.Millisecond))})
	s.release()
	if st := l.State(); st.RequestsLimit != 100 {
		t.Fatalf("limit %v after real headers, want 100", st.RequestsLimit)
	}
	// And a refusal no longer overrides what the headers say.
	s2 := mustGet(t, acquireAsync(context.Background(), l))
	refuse(s2, time.Second)
	if st := l.State(); st.RequestsLimit != 100 {
		t.Fatalf("a refusal replaced header-learned limits: %+v", st)
	}
	s2.release()
}
