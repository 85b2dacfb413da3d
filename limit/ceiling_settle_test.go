package limit

import (
	"testing"
	"time"
)

// TestACeilingsSettleGivesBackWhatWasChargedLessWhatWasUsed: under a TPM
// of 600 the token bucket holds a second's worth, 10. A request estimated
// at 20 is charged the whole bucket, 10; it used 8, so its settle gives
// back 2, not the 12 its estimate exceeds its use by.
func TestACeilingsSettleGivesBackWhatWasChargedLessWhatWasUsed(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 600}.Ceiling()
	c.Take(t0, 20)
	c.Settle(20, 8)
	if _, ok := c.Admit(t0, 2, sh); !ok {
		t.Fatal("2 tokens were not given back")
	}
	at, ok := c.Admit(t0, 3, sh)
	if ok {
		t.Fatal("more than 2 tokens given back: the settle credited more than was charged")
	}
	// The missing token refills in a tenth of a second at 10 a second.
	if want := t0.Add(100 * time.Millisecond); !at.Equal(want) {
		t.Fatalf("3 tokens fit at %v, want %v", at.Sub(t0), want.Sub(t0))
	}
}
