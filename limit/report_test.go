package limit

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// TestMoreRoomShownLiftsACorrection: a correction is evidence, not a
// verdict; an answer that shows more left raises the window again.
func TestMoreRoomShownLiftsACorrection(t *testing.T) {
	var b budget
	b.observe(win(1200, 19, at(time.Second)), 0, t0, t0)
	if !b.correct(t0) || b.size() != 20 {
		t.Fatalf("correct: size %v", b.size())
	}
	b.observe(win(1200, 500, at(time.Second)), 0, t0, t0)
	if b.size() != 501 {
		t.Fatalf("size %v after 500 shown left, want 501", b.size())
	}
	if b.correct(t0) {
		t.Fatal("correct lowered a window below what it has shown")
	}
}

// TestHeadersThatOverstateTheirWindowAreCorrectedBeforeARefusal: two
// answers 200ms apart, 8 requests sent between, remaining 19 then 15: the
// upstream's own counts show a refill of (15-19+8)/0.2s = 20 a second,
// while (1200-15)/reset claims thousands, and the window never showed half
// its stated size. The budget shrinks to what was shown before any
// refusal. Honest headers with the same traffic stay as they are.
func TestHeadersThatOverstateTheirWindowAreCorrectedBeforeARefusal(t *testing.T) {
	tests := []struct {
		name                 string
		first, second        headerparse.Window
		wantSize             float64
		wantRateAtMostOrNear float64
	}{
		{"quantized", win(1200, 19, at(50*time.Millisecond)), win(1200, 15, at(200*time.Millisecond+250*time.Millisecond)), 20, 20},
		{"honest, full", win(1200, 1199, at(50*time.Millisecond)), win(1200, 1199, at(250*time.Millisecond)), 1200, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b budget
			b.observe(tt.first, 1, t0, t0)
			for range 8 {
				b.take(1)
			}
			b.observe(tt.second, 9, at(200*time.Millisecond), at(200*time.Millisecond))
			if b.size() != tt.wantSize || b.bucket.Rate > tt.wantRateAtMostOrNear+0.01 || b.bucket.Rate < tt.wantRateAtMostOrNear-0.01 {
				t.Fatalf("size %v rate %v; want %v, %v", b.size(), b.bucket.Rate, tt.wantSize, tt.wantRateAtMostOrNear)
			}
		})
	}
}

// TestMeterReadsRatesAboveItsSampleCount: the meter once kept the last 32
// dispatches, so it could not read more than 32 a second, and a pool at
// its full rate looked under-used.
func TestMeterReadsRatesAboveItsSampleCount(t *testing.T) {
	var p pacer
	p.requests = knownBudget(100, 100)
	now := t0
	for range 200 { // 100 a second
		now = now.Add(10 * time.Millisecond)
		p.recent.add(now, 1)
	}
	if r := p.recent.rate(now); r < 95 || r > 105 {
		t.Fatalf("meter reads %v/s for 100/s", r)
	}
	if p.underUsed(now) {
		t.Fatal("sending at the full learned rate counts as under-used")
	}
}

// TestRefusalNeverRaisesConcurrency: an inferred refusal's floor (the
// learned rate times the answer time) once lifted the limit above
// MaxConcurrency.
func TestRefusalNeverRaisesConcurrency(t *testing.T) {
	c := newConcLimit(Config{Concurrency: 8, MaxConcurrency: 8}.WithDefaults())
	c.slowStart = false
	c.inFlight = 1
	c.refused(&Ticket{InFlight: 0, Limit: 8}, t0, 1, 200, false)
	if c.limit != 8 {
		t.Fatalf("limit %d after a refusal with floor 200, want it to stay 8", c.limit)
	}
}

// TestOneOverloadDoesNotCrippleGrowth: a 529 while one request was out
// once pinned the refused level at 1 for good, making every later step up
// slow regrowth (about 5,000 answers from 1 back to 32). Now it costs one
// step, and the refused level is forgotten after refusedMemory.
func TestOneOverloadDoesNotCrippleGrowth(t *testing.T) {
	c := newConcLimit(Config{Concurrency: 8, MaxConcurrency: 1024}.WithDefaults())
	c.refused(&Ticket{InFlight: 0, Limit: 8}, t0, 1, 0, false)
	if c.limit != 7 {
		t.Fatalf("limit %d after one overload, want one step down to 7", c.limit)
	}
	later := at(refusedMemory + time.Second)
	n := 0
	for c.limit < 32 {
		c.inFlight = c.limit
		c.accepted(&Ticket{InFlight: c.limit - 1, Limit: c.limit}, later, c.limit, 0)
		n++
	}
	if n > 32*32/2 {
		t.Fatalf("%d answers at the limit to grow from 7 to 32; additive growth needs about %d", n, (7+31)*25/2)
	}
}

// TestABudgetWaitingForATimeHoldsALoneRequestBack: one budget can only
// learn more from an answer, the other refills at a known time; a request
// with no answer awaited waits for that time instead of going to find out.
func TestABudgetWaitingForATimeHoldsALoneRequestBack(t *testing.T) {
	var p pacer
	p.observe(headerparse.Limits{
		Requests: headerparse.Window{Remaining: 0, HasRemaining: true},                                      // exhausted, no limit or reset
		Tokens:   headerparse.Window{Limit: 1000, Remaining: 0, HasRemaining: true, Reset: at(time.Second)}, // refills by +1s
	}, &Ticket{Dispatched: t0}, t0, false)
	at1, ok, _, _ := p.admit(t0, 100, true, true)
	if ok || at1.IsZero() {
		t.Fatalf("admit = %v, %v; want to wait for the token refill", at1, ok)
	}
}

// TestWhatEachVerdictMeans: which verdicts are refusals, which of those
// are of the limits, which pause the pool on a retry, and the reason
// such a pause shows.
func TestWhatEachVerdictMeans(t *testing.T) {
	for _, c := range []struct {
		v                        Verdict
		refusal, limited, pauses bool
		reason                   pauseReason
	}{
		{Accepted, false, false, false, pauseRetry},
		{RateRefused, true, true, true, pauseRateLimited},
		{ConcurrencyRefused, true, true, false, pauseRetry},
		{Overloaded, true, false, true, pauseOverloaded},
		{Failed, false, false, false, pauseRetry},
		{NotSent, false, false, false, pauseRetry},
	} {
		if c.v.Refusal() != c.refusal || c.v.Limited() != c.limited || c.v.Pauses() != c.pauses || c.v.PauseReason() != c.reason {
			t.Errorf("%v: refusal %v, limited %v, pauses %v, reason %q; want %v, %v, %v, %q", c.v, c.v.Refusal(), c.v.Limited(),
				c.v.Pauses(), c.v.PauseReason(), c.refusal, c.limited, c.pauses, c.reason)
		}
	}
}

// TestVerdictOf: each kind of answer reads as the verdict its
// capacity meaning asks for.
func TestVerdictOf(t *testing.T) {
	for _, c := range []struct {
		status                 int
		retryable, concurrency bool
		want                   Verdict
	}{
		{0, true, false, NotSent},
		{0, false, false, NotSent},
		{200, false, false, Accepted},
		{400, false, false, Accepted},
		{401, false, false, NotSent}, // refused for the credential: never counted
		{403, false, false, NotSent},
		{402, false, false, Accepted},
		{404, false, false, Accepted},
		{429, false, false, Failed},
		{429, true, true, ConcurrencyRefused},
		{503, true, true, ConcurrencyRefused},
		{429, true, false, RateRefused},
		{503, true, false, Overloaded},
		{529, true, false, Overloaded},
		{500, true, false, Failed},
		{408, true, false, Failed},
	} {
		if got := VerdictOf(c.status, c.retryable, c.concurrency); got != c.want {
			t.Errorf("VerdictOf(%d, retryable %v, concurrency %v) = %v, want %v", c.status, c.retryable, c.concurrency, got, c.want)
		}
	}
}
