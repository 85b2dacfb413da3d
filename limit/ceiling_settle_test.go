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

// TestACeilingsOverrunIsOwedAfterTheRefill: under a TPM of 600 the bucket
// holds 10 tokens. A request charged 10 that used 15 owes 5, taken from
// the bucket as the next refill leaves it: two seconds on, the bucket is
// full (10) less the 5 owed. Taken before the refill, the cap would have
// forgiven the debt and let 6 tokens go at once.
func TestACeilingsOverrunIsOwedAfterTheRefill(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 600}.Ceiling()
	c.Take(t0, 10)
	c.Settle(10, 15)
	now := t0.Add(2 * time.Second)
	if _, ok := c.Admit(now, 5, sh); !ok {
		t.Fatal("5 tokens refused: the bucket was full less the 5 owed")
	}
	at, ok := c.Admit(now, 6, sh)
	if ok {
		t.Fatal("6 tokens admitted: the cap forgave the overrun")
	}
	if want := now.Add(100 * time.Millisecond); !at.Equal(want) {
		t.Fatalf("6 tokens fit at %v, want %v", at.Sub(now), want.Sub(now))
	}
}
