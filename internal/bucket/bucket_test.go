package bucket

import (
	"testing"
	"time"
)

var t0 = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// filled is a bucket of size refilling at rate, holding level at t0.
func filled(size, rate, level float64) *Bucket {
	b := &Bucket{Size: size, Rate: rate}
	b.Set(t0, level)
	return b
}

// TestBucketLevels: what a bucket holds after each operation, and at
// what time.
func TestBucketLevels(t *testing.T) {
	cases := []struct {
		name   string
		b      *Bucket
		do     func(b *Bucket)
		level  float64
		atTime time.Time
	}{
		{"refills at its rate", filled(10, 2, 1), func(b *Bucket) { b.Refill(at(1500 * time.Millisecond)) }, 4, at(1500 * time.Millisecond)},
		{"refills no higher than its size", filled(10, 2, 1), func(b *Bucket) { b.Refill(at(time.Hour)) }, 10, at(time.Hour)},
		{"refills a debt first", filled(10, 2, -5), func(b *Bucket) { b.Refill(at(2 * time.Second)) }, -1, at(2 * time.Second)},
		{"a rate of 0 refills nothing", filled(10, 0, 3), func(b *Bucket) { b.Refill(at(time.Hour)) }, 3, at(time.Hour)},
		{"a rate of 0 leaves a level above the size as it is", filled(10, 0, 12), func(b *Bucket) { b.Refill(at(time.Hour)) }, 12, at(time.Hour)},
		{"a clock gone back refills nothing and keeps the time", filled(10, 2, 1), func(b *Bucket) {
			b.Refill(at(time.Second))
			b.Refill(at(-time.Minute))
			b.Refill(at(time.Second))
		}, 3, at(time.Second)},
		{"the zero bucket starts its time at its first refill", &Bucket{Size: 10, Rate: 2}, func(b *Bucket) {
			b.Refill(at(time.Hour))
			b.Refill(at(time.Hour + time.Second))
		}, 2, at(time.Hour + time.Second)},
		{"a charge takes its cost", filled(10, 2, 7), func(b *Bucket) { b.Charge(3) }, 4, t0},
		{"a charge larger than the size takes the size", filled(10, 2, 7), func(b *Bucket) { b.Charge(25) }, -3, t0},
		{"a charge without a size takes its cost whole", filled(0, 0, 0), func(b *Bucket) { b.Charge(25) }, -25, t0},
		{"a refund gives back the charge", filled(10, 2, 7), func(b *Bucket) { b.Charge(3); b.Refund(3) }, 7, t0},
		{"a refund of a cost over the size gives back the size", filled(10, 2, 10), func(b *Bucket) { b.Charge(25); b.Refund(25) }, 10, t0},
		{"a refund fills no higher than the size", filled(10, 2, 9), func(b *Bucket) { b.Refund(5) }, 10, t0},
		{"a refund without a size gives back the cost whole", filled(0, 0, -25), func(b *Bucket) { b.Refund(25) }, 0, t0},
		{"a settle under the estimate gives the rest back", filled(10, 2, 2), func(b *Bucket) { b.Settle(5, 2) }, 5, t0},
		{"a settle gives back no higher than the size", filled(10, 2, 9), func(b *Bucket) { b.Settle(5, 2) }, 10, t0},
		{"a settle of an estimate over the size gives back the charge less the use", filled(10, 2, -10), func(b *Bucket) {
			b.Settle(20, 8)
		}, -8, t0},
		{"a settle leaves no more than the size, of a level above it too", filled(10, 2, 12), func(b *Bucket) { b.Settle(5, 5) }, 10, t0},
		{"a settle of the estimate changes nothing", filled(10, 2, 2), func(b *Bucket) { b.Settle(5, 5); b.Refill(t0) }, 2, t0},
		{"a settle over the estimate is owed, not taken at once", filled(10, 2, 2), func(b *Bucket) { b.Settle(5, 9) }, 2, t0},
		{"a settle over the estimate is taken at the next refill", filled(10, 2, 2), func(b *Bucket) {
			b.Settle(5, 9)
			b.Refill(at(time.Second))
		}, 0, at(time.Second)},
		{"an overrun is owed after the cap, not forgiven by it", filled(10, 2, 9), func(b *Bucket) {
			b.Settle(5, 9)
			b.Refill(at(time.Minute))
		}, 6, at(time.Minute)},
		{"an overrun is taken once", filled(10, 2, 9), func(b *Bucket) {
			b.Settle(5, 9)
			b.Refill(t0)
			b.Refill(t0)
		}, 5, t0},
		{"set replaces the level and time but keeps what is owed", filled(10, 2, 9), func(b *Bucket) {
			b.Settle(5, 9)
			b.Set(at(time.Second), 10)
			b.Refill(at(time.Second))
		}, 6, at(time.Second)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.do(c.b)
			if got := c.b.Level(); got != c.level {
				t.Errorf("level %v, want %v", got, c.level)
			}
			if got := c.b.At(); !got.Equal(c.atTime) {
				t.Errorf("at %v, want %v", got.Sub(t0), c.atTime.Sub(t0))
			}
		})
	}
}

// TestBucketAdmits: whether a cost fits, and when it will if not: at the
// refill of what is missing, rounded up to the nanosecond, at least a
// millisecond on and at most MaxWait.
func TestBucketAdmits(t *testing.T) {
	cases := []struct {
		name string
		b    *Bucket
		now  time.Time
		cost float64
		ok   bool
		when time.Time
	}{
		{"a cost that fits", filled(10, 1, 3), t0, 3, true, time.Time{}},
		{"a cost that fits after the refill to now", filled(10, 1, 0), at(3 * time.Second), 3, true, time.Time{}},
		{"one short waits the refill of one", filled(10, 1, 2), t0, 3, false, at(time.Second)},
		{"a debt is refilled before the cost", filled(10, 2, -4), t0, 2, false, at(3 * time.Second)},
		{"a cost larger than the size waits for a full bucket", filled(10, 2, 0), t0, 25, false, at(5 * time.Second)},
		{"a cost larger than the size fits a full bucket", filled(10, 2, 10), t0, 25, true, time.Time{}},
		{"without a size the whole cost must fit", filled(0, 2, 0), t0, 25, false, at(12500 * time.Millisecond)},
		{"a wait is rounded up to the nanosecond", filled(10, 3, 0), t0, 1, false, at(333333334)},
		{"a wait under a millisecond is a millisecond", filled(10, 1, 1-1e-7), t0, 1, false, at(time.Millisecond)},
		{"a wait of exactly a millisecond", filled(10, 1000, 0), t0, 1, false, at(time.Millisecond)},
		{"a wait is at most a day (MaxWait)", filled(1e9, 1e-9, 0), t0, 1e6, false, at(24 * time.Hour)},
		{"no rate: nothing but the owner can tell when", filled(10, 0, 0), t0, 1, false, time.Time{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			when, ok := c.b.Admit(c.now, c.cost)
			if ok != c.ok || !when.Equal(c.when) {
				t.Errorf("Admit = %v, %v; want %v, %v", when.Sub(t0), ok, c.when.Sub(t0), c.ok)
			}
			if !c.b.At().Equal(c.now) {
				t.Errorf("Admit left the bucket at %v, want refilled to %v", c.b.At().Sub(t0), c.now.Sub(t0))
			}
		})
	}
}

// TestAnAdmitTakesNothing: an admitted cost is charged by Charge alone.
func TestAnAdmitTakesNothing(t *testing.T) {
	b := filled(10, 1, 5)
	for range 3 {
		if _, ok := b.Admit(t0, 5); !ok {
			t.Fatal("5 of 5 refused")
		}
	}
	if b.Level() != 5 {
		t.Fatalf("level %v after three admits, want 5", b.Level())
	}
}
