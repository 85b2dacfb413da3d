package limit

import (
	"testing"
	"time"
)

var t0 = time.Now().UTC().Truncate(time.Second)

// quietLocal is the in-process state of a pool whose upstream sends no
// headers, with an admission a moment ago (a live upstream).
func quietLocal() *Memory {
	s := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	s.learn.lastAccepted = t0
	return s
}

// grownConc is a concurrency past slow start (a refusal was seen far above
// limit), bounded by 1 and 64.
func grownConc(limit int) concLimit {
	return concLimit{min: 1, max: 64, limit: limit, refusedAt: 65, regrowAcks: minRegrowAcks, lastRefusal: t0}
}

// quantizedBudget is a window stated as 1200 whose upstream never shows
// more than 19 left and refills 20/s by its own counts: corrected to 20
// at 20/s. It returns the budget and the second answer's dispatch time.
func quantizedBudget(t *testing.T) (*budget, time.Time) {
	t.Helper()
	var b budget
	b.observe(win(1200, 19, at(50*time.Millisecond)), 1, t0, t0)
	for range 8 {
		b.take(1)
	}
	d := at(200 * time.Millisecond)
	b.observe(win(1200, 15, d.Add(250*time.Millisecond)), 9, d, d)
	if b.size() != 20 || !near(b.shown, 20) || !near(b.bucket.Rate, 20) {
		t.Fatalf("quantized: size %v, shown %v, rate %v; want 20, 20, 20", b.size(), b.shown, b.bucket.Rate)
	}
	return &b, d
}

// knownBudget is a budget learned to hold limit and refill at rate a
// second.
func knownBudget(limit, rate float64) budget {
	b := budget{known: true}
	b.resize(limit, 0)
	b.bucket.Rate = rate
	return b
}
