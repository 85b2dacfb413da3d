package limit

import (
	"testing"
	"time"
)

// TestACeilingsSettle: under a TPM of 600 the token bucket holds a
// second's worth, 10, and refills at 10 a second. A settle swaps what a
// request was charged for what it used: after it, fits tokens fit at
// after, one more waits a tenth of a second for its refill.
func TestACeilingsSettle(t *testing.T) {
	cases := []struct {
		name           string
		estimate, used int64
		after          time.Duration
		fits           int64
	}{
		// Charged the whole bucket, 10, for an estimate of 20; it used 8,
		// so the settle gives back 2, not the 12 its estimate exceeds
		// its use by.
		{"gives back what was charged less what was used", 20, 8, 0, 2},
		// Charged 10, used 15: the 5 owed are taken from the bucket as
		// the next refill leaves it, full two seconds on. Taken before
		// the refill, the cap would have forgiven them.
		{"an overrun is owed after the refill", 10, 15, 2 * time.Second, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sh := NewMemory(Config{})
			ceil := Limits{TPM: 600}.Ceiling()
			ceil.Take(t0, c.estimate)
			ceil.Settle(c.estimate, c.used)
			now := t0.Add(c.after)
			if _, ok := ceil.Admit(now, c.fits, sh); !ok {
				t.Fatalf("%d tokens refused", c.fits)
			}
			at, ok := ceil.Admit(now, c.fits+1, sh)
			if ok {
				t.Fatalf("%d tokens admitted: the settle gave back too much", c.fits+1)
			}
			if want := now.Add(100 * time.Millisecond); !at.Equal(want) {
				t.Fatalf("%d tokens fit at %v, want %v", c.fits+1, at.Sub(now), want.Sub(now))
			}
		})
	}
}
