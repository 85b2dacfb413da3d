package redisstate

import (
	"testing"
	"time"
)

// TestAReplicaBusyForABusyWindowSharesWithTheBusyOnes: for busyWindow
// after it became busy a replica divides the limits by every replica
// alive; from busyWindow on, that instant included, by the busy ones.
func TestAReplicaBusyForABusyWindowSharesWithTheBusyOnes(t *testing.T) {
	t.Parallel()
	st := &Store{}
	st.peers.Store(3)     // alive
	st.busyPeers.Store(0) // none of the others busy
	t0 := time.Unix(1_000, 0)
	st.ask(t0)
	if n := st.sharers(t0.Add(busyWindow - time.Nanosecond)); n != 3 {
		t.Errorf("busy for a nanosecond less than busyWindow, it shares with %d, want all 3 alive", n)
	}
	if n := st.sharers(t0.Add(busyWindow)); n != 1 {
		t.Errorf("busy for busyWindow, it shares with %d, want 1 (none other busy)", n)
	}
}
