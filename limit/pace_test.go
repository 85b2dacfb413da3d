package limit

import (
	"math"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// win is a reported window with a remaining count.
func win(limit, remaining int64, reset time.Time) headerparse.Window {
	return headerparse.Window{Limit: limit, Remaining: remaining, HasRemaining: true, Reset: reset}
}

func at(d time.Duration) time.Time { return t0.Add(d) }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// learnedBudget is a budget that observed w at t0 with nothing sent after.
func learnedBudget(w headerparse.Window) *budget {
	b := &budget{}
	b.observe(w, b.sent, t0, t0)
	return b
}

func TestBudgetUnknownAdmitsEverything(t *testing.T) {
	var b budget
	for i, cost := range []float64{1, 1e6, 1e12} {
		if _, ok := b.admit(t0, cost); !ok {
			t.Fatalf("admit #%d (cost %v) on an unknown budget refused", i, cost)
		}
		b.take(cost)
	}
	if b.known || b.bucket.Level() != 0 {
		t.Fatalf("take changed an unknown budget: %+v", b)
	}
	if b.sent != 1+1e6+1e12 {
		t.Fatalf("sent = %v, want every dispatch counted for later corrections", b.sent)
	}
	b.observe(headerparse.Window{Reset: at(time.Second)}, b.sent, t0, t0) // a reset alone says nothing
	if b.known {
		t.Fatal("an unknown window made the budget known")
	}
}

func TestBudgetAdmitWaitsAtLearnedRate(t *testing.T) {
	tests := []struct {
		name     string
		w        headerparse.Window
		cost     float64
		wantRate float64
		wantOK   bool
		wantAt   time.Time // when !wantOK
	}{
		{"exhausted window waits one request's refill", win(10, 0, at(time.Second)), 1, 10, false, at(100 * time.Millisecond)},
		{"cost that fits goes now", win(10, 5, at(time.Second)), 5, 5, true, time.Time{}},
		{"cost beyond what is left waits for the difference", win(10, 5, at(time.Second)), 7, 5, false, at(400 * time.Millisecond)},
		{"cost beyond the limit waits for a full window", win(10, 0, at(time.Second)), 50, 10, false, at(time.Second)},
		{"slow window", win(100, 40, at(time.Minute)), 41, 1, false, at(time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := learnedBudget(tt.w)
			if !near(b.bucket.Rate, tt.wantRate) {
				t.Fatalf("rate = %v/s, want %v/s", b.bucket.Rate, tt.wantRate)
			}
			got, ok := b.admit(t0, tt.cost)
			if ok != tt.wantOK {
				t.Fatalf("admit ok = %v, want %v", ok, tt.wantOK)
			}
			if ok {
				return
			}
			if d := got.Sub(tt.wantAt); d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("admit says wait until +%v, want +%v", got.Sub(t0), tt.wantAt.Sub(t0))
			}
			if _, ok := b.admit(tt.wantAt.Add(-time.Millisecond), tt.cost); ok {
				t.Fatal("admitted a millisecond before the promised time")
			}
			if _, ok := b.admit(tt.wantAt.Add(time.Microsecond), tt.cost); !ok {
				t.Fatal("not admitted at the promised time")
			}
		})
	}
}

// TestAnEmptyWindowFullLaterThanItsSizeOwes: a bucket of 4 at 2 a second,
// empty, is full 2 s on; an upstream that charges refusals puts it in
// debt, and says so only in its reset: a refusal's, full 2.136 s on, owes
// 0.272 of a request. That reading bounds the rate from below (its reset
// may hold a debt), and the debt is taken off, a window's worth at most:
// the next request waits for it and its own refill, 0.636 s. (Paced at the refill, each request refused and
// charged, four models of their own never got out of their debt: seed
// 969, 34× its ideal and 98 % refused; now 1.08×.)
func TestAnEmptyWindowFullLaterThanItsSizeOwes(t *testing.T) {
	var b budget
	b.observe(win(4, 3, at(500*time.Millisecond)), b.take(1), t0, t0)
	if !near(b.bucket.Rate, 2) {
		t.Fatalf("rate %v, want 2/s", b.bucket.Rate)
	}
	d := at(time.Second)
	rate, w, sent := b.bucket.Rate, win(4, 0, d.Add(2136*time.Millisecond)), b.take(1)
	b.observe(w, sent, d, d)
	b.owes(w, rate, sent, d)
	if !near(b.bucket.Rate, 2) {
		t.Fatalf("rate %v after an empty reading, want 2/s kept", b.bucket.Rate)
	}
	if got, ok := b.admit(d, 1); ok || got.Sub(d.Add(636*time.Millisecond)).Abs() > time.Millisecond {
		t.Fatalf("admit: ok %v, at +%v; want to wait until +636ms", ok, got.Sub(d))
	}
	// Whatever rate is read later, the reset said full: by then the debt
	// is paid, and the window holds its size less what went since.
	b.bucket.Rate = 0.1
	b.take(1) // one went since
	if _, ok := b.admit(w.Reset.Add(-time.Millisecond), 1); ok {
		t.Fatal("admitted before the reset at a tenth of the rate")
	}
	if _, ok := b.admit(w.Reset, 4); ok {
		t.Fatalf("the whole window at the reset, one gone since: level %v", b.bucket.Level())
	}
	if _, ok := b.admit(w.Reset, 3); !ok {
		t.Fatalf("not full less the one gone at the reset: level %v", b.bucket.Level())
	}
	// Full 2 s on, as its size at its rate says: nothing owed.
	var even budget
	even.observe(win(4, 3, at(500*time.Millisecond)), even.take(1), t0, t0)
	w, sent = win(4, 0, d.Add(2*time.Second)), even.take(1)
	even.observe(w, sent, d, d)
	even.owes(w, 2, sent, d)
	if got, _ := even.admit(d, 1); got.Sub(d.Add(500*time.Millisecond)).Abs() > time.Millisecond {
		t.Fatalf("nothing owed: waits until +%v, want +500ms", got.Sub(d))
	}
}

// TestARefusalThatCorrectsTheWindowOwesNothingAtTheOldRate: a stated
// 1,200 whose counts show no refill over 2 s is corrected by the refusal
// that reads it; the debt rule keeps the rate read before a refusal, but
// not one that same reading showed overstated (kept, it paced the
// quantized per-minute figure again).
func TestARefusalThatCorrectsTheWindowOwesNothingAtTheOldRate(t *testing.T) {
	var b budget
	b.observe(win(1200, 1, at(50*time.Second)), b.take(1), t0, t0)
	rate := b.bucket.Rate
	b.take(1)
	d := at(2 * time.Second)
	w, sent := win(1200, 0, d.Add(50*time.Second)), b.take(1)
	b.observe(w, sent, d, d)
	if b.size() != 2 {
		t.Fatalf("size %v, want the refusal's reading to correct it to 2", b.size())
	}
	b.owes(w, rate, sent, d)
	if b.bucket.Rate >= 1 {
		t.Fatalf("rate %v/s after the correction, want the corrected one, not %v/s", b.bucket.Rate, rate)
	}
}

func TestBudgetRefillCapsAtLimit(t *testing.T) {
	b := learnedBudget(win(10, 0, at(time.Second)))
	b.advance(at(time.Hour))
	if b.bucket.Level() != 10 {
		t.Fatalf("avail after an hour = %v, want the limit 10", b.bucket.Level())
	}
	// A long idle time allows one window's burst, not more.
	now := at(time.Hour)
	for i := 0; i < 10; i++ {
		if _, ok := b.admit(now, 1); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
		b.take(1)
	}
	if got, ok := b.admit(now, 1); ok || !got.Equal(now.Add(100*time.Millisecond)) {
		t.Fatalf("11th request: admit = %v, %v; want to wait 100ms", got.Sub(now), ok)
	}
}

func TestBudgetCostLargerThanLimitGoesOnceFull(t *testing.T) {
	b := learnedBudget(win(10, 4, at(time.Second))) // 6/s
	got, ok := b.admit(t0, 25)
	if ok || !got.Equal(at(time.Second)) {
		t.Fatalf("admit = +%v, %v; want to wait until the window is full at +1s", got.Sub(t0), ok)
	}
	if _, ok := b.admit(at(time.Second), 25); !ok {
		t.Fatal("not admitted once the window is full")
	}
	b.take(25)
	if !near(b.bucket.Level(), 0) {
		t.Fatalf("avail = %v, want 0: a cost beyond the window is charged as the whole window", b.bucket.Level())
	}
	got, ok = b.admit(at(time.Second), 1)
	want := at(time.Second).Add(time.Second / 6)
	if d := got.Sub(want); ok || d < -time.Microsecond || d > time.Microsecond {
		t.Fatalf("next admit = +%v, %v; want +%v", got.Sub(t0), ok, want.Sub(t0))
	}
}

func TestBudgetObserveSubtractsLaterDispatches(t *testing.T) {
	costs := []float64{100, 200, 300, 400}
	tests := []struct {
		name      string
		observed  int // whose answer is observed
		remaining int64
		want      float64
	}{
		{"answer to the last dispatch", 3, 5000, 5000},
		{"answer to the third", 2, 5000, 4600},
		{"answer to the first", 0, 5000, 4100},
		{"correction may go negative", 0, 500, -400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b budget
			marks := make([]float64, len(costs))
			for i, c := range costs {
				marks[i] = b.take(c)
			}
			b.observe(win(10000, tt.remaining, at(time.Minute)), marks[tt.observed], t0, t0)
			if !near(b.bucket.Level(), tt.want) {
				t.Fatalf("avail = %v, want %v", b.bucket.Level(), tt.want)
			}
			// Once known, dispatches are charged at once.
			b.take(50)
			if !near(b.bucket.Level(), tt.want-50) {
				t.Fatalf("avail after take(50) = %v, want %v", b.bucket.Level(), tt.want-50)
			}
		})
	}
}

// TestEarlyResetIsSoonNotNow: a reset already past when its request went,
// while the window is not full, is early (rounded down, or on a clock
// behind the proxy's): it is read as soon, not as a full window, and
// every later reset at least as far after its dispatch as this one was
// early, plus its grain.
func TestEarlyResetIsSoonNotNow(t *testing.T) {
	var b budget
	w := win(10, 0, at(-time.Second))
	w.ResetGrain = time.Second
	b.observe(w, 0, t0, t0)
	if _, ok := b.admit(at(time.Millisecond), 1); ok {
		t.Fatal("an early reset refilled the window at once")
	}
	// Read as 2 s after the dispatch (a second early, a second's grain):
	// 10 requests over 2 s.
	if !near(b.bucket.Rate, 5) {
		t.Fatalf("rate %v, want 5/s", b.bucket.Rate)
	}
	// A later reset stated a second after its dispatch is read 2 s after
	// it too, not 1: the window is full at 3 s. Read at that floor, its
	// 5 missing over 2 s (2.5/s) only bound the refill from below, and
	// leave the 5/s learned before.
	w = win(10, 5, at(2*time.Second))
	w.ResetGrain = time.Second
	b.observe(w, 0, at(time.Second), at(time.Second))
	if !b.resetAt.Equal(at(3 * time.Second)) {
		t.Fatalf("reset read at %v, want 2 s after its dispatch", b.resetAt.Sub(t0))
	}
	if !near(b.bucket.Rate, 5) {
		t.Fatalf("rate %v after a reset read at the floor, want 5/s kept", b.bucket.Rate)
	}
	// A reset on time, with no early one before it, is believed.
	var honest budget
	honest.observe(win(10, 0, at(time.Second)), 0, t0, t0)
	if !near(honest.bucket.Rate, 10) {
		t.Fatalf("rate %v of an honest reset, want 10/s", honest.bucket.Rate)
	}
}

// TestAStatedPeriodIsARateAllowed: an IETF policy states q per w seconds,
// a quota the refill is held to from both sides,
// and its resets are whole seconds: t=1 for a bucket full in a third of a
// second reads as a refill of what is missing in a second. q/w is a rate
// the upstream allows, and the refill is no slower, also once refusals
// showed the window smaller than q (a burst of 2 under q=6 over w=1 was
// paced at one a second, seed 44: 7× its ideal; here 12 over 2 s).
func TestAStatedPeriodIsARateAllowed(t *testing.T) {
	var b budget
	w := win(12, 1, at(2*time.Second)) // 11 missing over 2 s: 5.5 a second
	w.ResetGrain, w.Period = time.Second, 2*time.Second
	b.observe(w, 1, t0, t0)
	if !near(b.bucket.Rate, 6) {
		t.Fatalf("rate %v, want the policy's 12 per 2 s", b.bucket.Rate)
	}
	if !b.correct(t0) || b.size() != 2 {
		t.Fatalf("a refusal with room: window %v, want corrected to 2", b.size())
	}
	w.Reset = at(3 * time.Second)
	b.observe(w, 1, at(time.Second), at(time.Second))
	if !near(b.bucket.Rate, 6) || b.size() != 2 {
		t.Fatalf("corrected window: rate %v, size %v; want 6/s over 2", b.bucket.Rate, b.size())
	}
	// Refused with room again, sent before the correction (the same
	// burst): nothing said of the rate. Sent after it: the stated rate is
	// what was wrong, and floors it no more.
	b.refusedAfterCorrection(true, t0)
	b.observe(w, 1, at(time.Second), at(time.Second))
	if !near(b.bucket.Rate, 6) {
		t.Fatalf("rate %v after a refusal of the burst that showed the window, want 6/s", b.bucket.Rate)
	}
	b.refusedAfterCorrection(true, at(1500*time.Millisecond))
	b.observe(w, 1, at(2*time.Second), at(2*time.Second))
	if b.bucket.Rate >= 6 {
		t.Fatalf("rate %v after a refusal with room in the corrected window, want the headers' own", b.bucket.Rate)
	}
	// q per w is the quota, a bound from above too: a reset that reads
	// faster (11 missing within a second) was read early, and the
	// refill is the policy's (Anthropic's resets rounded down read
	// 5.1 a second for 4.45, seed 10: 12 % refused).
	var fast budget
	w = win(12, 1, at(time.Second))
	w.ResetGrain, w.Period = time.Second, 2*time.Second
	fast.observe(w, 1, t0, t0)
	if !near(fast.bucket.Rate, 6) {
		t.Fatalf("rate %v, want the policy's 12 per 2 s, not the 11 a second the reset reads", fast.bucket.Rate)
	}
	// Refused with room after a correction, the policy floors it no
	// more, but still bounds it.
	fast.correctedAt = t0
	fast.refusedAfterCorrection(true, at(time.Second))
	fast.observe(w, 1, at(time.Second), at(time.Second))
	if fast.bucket.Rate > 6 {
		t.Fatalf("rate %v after the floor was dropped, want at most the policy's 6", fast.bucket.Rate)
	}
}

// TestFlooredResetDoesNotLowerTheRate: once resets are seen early (Anthropic's
// whole seconds rounded down), every reset is read at least a floor after
// its dispatch, and the real one may lie anywhere before it. A window
// nearly full then reads as a refill of what is missing over the floor:
// one token over 1.4 s, 0.7 tokens a second, which held a pool whose
// limit had just grown for ten minutes, past every request's deadline. Such a
// reading does not lower the rate; a changed stated limit moves it in its
// proportion.
func TestFlooredResetDoesNotLowerTheRate(t *testing.T) {
	var b budget
	w := win(1000, 0, at(-time.Second))
	w.ResetGrain = time.Second
	b.observe(w, 0, t0, t0) // early: every reset is read 2 s after its dispatch at least
	if !near(b.bucket.Rate, 500) {
		t.Fatalf("rate %v, want 500/s", b.bucket.Rate)
	}
	// Nearly full, its reset due within the second: one missing.
	w = win(1000, 999, at(5*time.Second))
	w.ResetGrain = time.Second
	b.observe(w, 0, at(5*time.Second), at(5*time.Second))
	if !near(b.bucket.Rate, 500) {
		t.Fatalf("rate %v after a nearly full window's reset at the floor, want 500/s kept", b.bucket.Rate)
	}
	// A stated limit halved halves the rate, at the floor or not (the
	// floor's arithmetic, 250 missing over 2 s, is only a bound below).
	w = win(500, 250, at(20*time.Second))
	w.ResetGrain = time.Second
	b.observe(w, 0, at(20*time.Second), at(20*time.Second))
	if !near(b.bucket.Rate, 250) {
		t.Fatalf("rate %v after the stated limit halved, want 250/s", b.bucket.Rate)
	}
	// Tripled, the window nearly full (seed 186, anthropic-down: 0.7
	// tokens a second after the limit grew ×3, and 25 requests given up
	// as waiting past their budget): three times the rate.
	w = win(1500, 1499, at(30*time.Second))
	w.ResetGrain = time.Second
	b.observe(w, 0, at(30*time.Second), at(30*time.Second))
	if !near(b.bucket.Rate, 750) {
		t.Fatalf("rate %v after the stated limit tripled with one token missing, want 750/s", b.bucket.Rate)
	}
}

func TestBudgetRateNotLearned(t *testing.T) {
	tests := []struct {
		name string
		w    headerparse.Window
		// after spending what is left, admit at t0+1ms; a zero time with
		// !ok means only the next answer can tell
		wantOK bool
		wantAt time.Time
	}{
		{"remaining equals limit: wait for the reset", win(10, 10, at(5*time.Second)), false, at(5 * time.Second)},
		{"nothing consumed yet, short reset", win(3, 3, at(time.Second)), false, at(time.Second)},
		{"no reset: wait for an answer", win(10, 0, time.Time{}), false, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := learnedBudget(tt.w)
			if b.bucket.Rate != 0 {
				t.Fatalf("rate = %v, want none learned", b.bucket.Rate)
			}
			b.take(float64(tt.w.Remaining))
			now := at(time.Millisecond)
			got, ok := b.admit(now, 1)
			if ok != tt.wantOK || !got.Equal(tt.wantAt) {
				t.Fatalf("admit = %v, %v; want %v, %v", got, ok, tt.wantAt, tt.wantOK)
			}
			if ok || tt.wantAt.IsZero() {
				return
			}
			if _, ok := b.admit(tt.wantAt.Add(-time.Nanosecond), 1); ok {
				t.Fatal("admitted before the reset")
			}
			if _, ok := b.admit(tt.wantAt, 1); !ok {
				t.Fatal("not admitted at the reset")
			}
			if b.bucket.Level() != float64(tt.w.Limit) {
				t.Fatalf("avail at the reset = %v, want the full window %d", b.bucket.Level(), tt.w.Limit)
			}
			// The reset refills once; the next window's reset is unknown.
			b.take(float64(tt.w.Limit))
			later := tt.wantAt.Add(time.Second)
			if got, ok := b.admit(later, 1); ok || !got.IsZero() {
				t.Fatalf("after spending the refilled window: admit = %v, %v; want to wait for an answer", got, ok)
			}
		})
	}
}

func TestBudgetKeepsLearnedRateWhenObservationTellsNone(t *testing.T) {
	b := learnedBudget(win(10, 0, at(time.Second)))
	b.observe(win(10, 10, at(2*time.Second)), b.sent, t0, t0)
	if !near(b.bucket.Rate, 10) {
		t.Fatalf("rate = %v, want the learned 10/s kept", b.bucket.Rate)
	}
}

func TestBudgetRejectsAbsurdRate(t *testing.T) {
	tests := []struct {
		name     string
		reset    time.Duration
		prior    float64 // rate learned before, 0 for none
		wantRate float64
	}{
		{"window per nanosecond", time.Nanosecond, 0, 0},
		{"window per 500µs", 500 * time.Microsecond, 0, 0},
		{"window per 2ms is believable", 2 * time.Millisecond, 0, 5000},
		{"absurd reading keeps the prior rate", time.Nanosecond, 10, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b budget
			if tt.prior > 0 {
				b.observe(win(10, 0, at(time.Duration(float64(10)/tt.prior*float64(time.Second)))), 0, t0, t0)
				if !near(b.bucket.Rate, tt.prior) {
					t.Fatalf("prior rate = %v", b.bucket.Rate)
				}
			}
			b.observe(win(10, 0, at(tt.reset)), 0, t0, t0)
			if !near(b.bucket.Rate, tt.wantRate) {
				t.Fatalf("rate = %v/s, want %v/s", b.bucket.Rate, tt.wantRate)
			}
		})
	}
}

func TestBudgetSettle(t *testing.T) {
	// Each case starts from a token budget of 1000 with 500 left at t0
	// (50/s), and returns what it expects avail to be. The clock stays at t0.
	tests := []struct {
		name string
		run  func(b *budget) float64
	}{
		{"no answer since dispatch: the real cost replaces the estimate", func(b *budget) float64 {
			mA := b.take(100)
			b.settle(100, 30, mA)
			return 470
		}},
		{"real cost above the estimate takes more", func(b *budget) float64 {
			mA := b.take(100)
			b.settle(100, 250, mA)
			return 250
		}},
		{"the request's own answer already counted it", func(b *budget) float64 {
			mA := b.take(100)
			b.observe(win(1000, 400, at(10*time.Second)), mA, t0, t0)
			b.settle(100, 30, mA)
			return 400
		}},
		{"a later request's answer already counted it", func(b *budget) float64 {
			mA := b.take(100)
			mB := b.take(100)
			b.observe(win(1000, 300, at(10*time.Second)), mB, t0, t0)
			b.settle(100, 30, mA)
			return 300
		}},
		{"an earlier request's answer did not count it", func(b *budget) float64 {
			mP := b.take(100)
			mA := b.take(100)
			b.observe(win(1000, 400, at(10*time.Second)), mP, t0, t0) // 400 - A's 100
			b.settle(100, 30, mA)
			return 370
		}},
		{"an older answer arriving late does not undo a later one's cover", func(b *budget) float64 {
			mP := b.take(100)
			mA := b.take(100)
			mB := b.take(100)
			b.observe(win(1000, 200, at(10*time.Second)), mB, t0, t0)
			b.observe(win(1000, 400, at(10*time.Second)), mP, t0, t0) // 400 - A's and B's 200
			b.settle(100, 30, mA)
			return 200
		}},
		{"settle never fills past the limit", func(b *budget) float64 {
			mA := b.take(100)
			b.advance(at(time.Minute))
			b.settle(100, 0, mA)
			return 1000
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := learnedBudget(win(1000, 500, at(10*time.Second)))
			want := tt.run(b)
			b.advance(b.bucket.At()) // what the next look sees: an overrun is owed from then
			if !near(b.bucket.Level(), want) {
				t.Fatalf("avail = %v, want %v", b.bucket.Level(), want)
			}
		})
	}
	t.Run("unknown budget ignores settle", func(t *testing.T) {
		var b budget
		m := b.take(100)
		b.settle(100, 10, m)
		if b.known || b.bucket.Level() != 0 {
			t.Fatalf("budget changed: %+v", b)
		}
	})
}

func TestBudgetRefund(t *testing.T) {
	b := learnedBudget(win(10, 2, at(time.Second)))
	b.take(1)
	b.take(1)
	if _, ok := b.admit(t0, 1); ok {
		t.Fatal("admitted with nothing left")
	}
	b.refund(1)
	if b.bucket.Level() != 1 {
		t.Fatalf("avail after refund = %v, want 1", b.bucket.Level())
	}
	if _, ok := b.admit(t0, 1); !ok {
		t.Fatal("refunded request not admitted")
	}
	b.advance(at(time.Hour))
	b.refund(5)
	if b.bucket.Level() != 10 {
		t.Fatalf("avail = %v, want a refund capped at the limit 10", b.bucket.Level())
	}

	var unknown budget
	unknown.refund(5)
	if unknown.known || unknown.bucket.Level() != 0 {
		t.Fatalf("refund changed an unknown budget: %+v", unknown)
	}
}

func TestPacerWaitsForTheLaterWindow(t *testing.T) {
	tests := []struct {
		name   string
		lim    headerparse.Limits
		cost   int64
		wantOK bool
		wantAt time.Time
	}{
		{"nothing known", headerparse.Limits{}, 1e9, true, time.Time{}},
		{"both have room", headerparse.Limits{Requests: win(10, 5, at(time.Second)), Tokens: win(1000, 500, at(time.Second))}, 100, true, time.Time{}},
		{"only requests short", headerparse.Limits{Requests: win(10, 0, at(time.Second)), Tokens: win(1000, 500, at(time.Second))}, 100, false, at(100 * time.Millisecond)},
		{"only tokens short", headerparse.Limits{Requests: win(10, 5, at(time.Second)), Tokens: win(1000, 0, at(time.Second))}, 100, false, at(100 * time.Millisecond)},
		{"both short, tokens later", headerparse.Limits{Requests: win(10, 0, at(time.Second)), Tokens: win(1000, 0, at(2*time.Second))}, 1000, false, at(2 * time.Second)},
		{"both short, requests later", headerparse.Limits{Requests: win(1, 0, at(3*time.Second)), Tokens: win(1000, 0, at(time.Second))}, 100, false, at(3 * time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p pacer
			p.observe(tt.lim, &Ticket{Dispatched: t0}, t0, false)
			got, ok, _, _ := p.admit(t0, tt.cost, false, true)
			if d := got.Sub(tt.wantAt); ok != tt.wantOK || d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("admit = %v, %v; want %v, %v", got, ok, tt.wantAt, tt.wantOK)
			}
		})
	}
}

// An upstream may report an exhausted window with its reset but no limit:
// OpenAI's x-ratelimit-remaining-requests: 0 with x-ratelimit-reset-requests
// and no x-ratelimit-limit-requests, or IETF RateLimit: "default";r=0;t=5
// without a RateLimit-Policy (headerparse yields Window{Limit: 0,
// Remaining: 0, HasRemaining: true, Reset: ...}, which it calls Exhausted).
func TestBudgetExhaustedWindowWithoutLimitWaitsForReset(t *testing.T) {
	reset := at(5 * time.Second)
	b := learnedBudget(headerparse.Window{Remaining: 0, HasRemaining: true, Reset: reset})
	got, ok := b.admit(at(time.Second), 1)
	if ok {
		t.Fatal("admitted while the upstream says nothing is left until +5s")
	}
	if got.After(reset) || !got.After(at(time.Second)) {
		t.Fatalf("admit says wait until +%v, want a wait no later than the reset", got.Sub(t0))
	}
}

func TestBudgetRateAndResetAnchoredAtDispatch(t *testing.T) {
	// Dispatched at t0, answered 500ms later, full again at t0+1s.
	var b budget
	m := b.take(1)
	b.observe(win(10, 0, at(time.Second)), m, t0, at(500*time.Millisecond))
	if !near(b.bucket.Rate, 10) {
		t.Fatalf("rate = %v/s, want 10/s measured from the dispatch", b.bucket.Rate)
	}
	if want := at(1500 * time.Millisecond); !b.resetAt.Equal(want) {
		t.Fatalf("resetAt = +%v, want +%v (trusted only after the answer's latency)", b.resetAt.Sub(t0), want.Sub(t0))
	}
}

func TestBudgetLimitOnlyWindowDoesNotPace(t *testing.T) {
	var b budget
	m := b.take(1)
	b.observe(headerparse.Window{Limit: 5}, m, t0, t0)
	if b.known {
		t.Fatal("a window with a size but no remaining count was taken as something to count down")
	}
	if _, ok := b.admit(at(time.Second), 1); !ok {
		t.Fatal("a limit-only window held a request back")
	}
}

func TestBudgetRefundGivesBackOnlyWhatWasCharged(t *testing.T) {
	b := learnedBudget(win(10, 5, at(time.Second)))
	before := b.bucket.Level()
	b.take(40) // charged as the whole window: 10
	b.refund(40)
	if !near(b.bucket.Level(), before) {
		t.Fatalf("avail = %v after take+refund, want %v", b.bucket.Level(), before)
	}
}

// TestAnswerWithoutALimitKeepsTheLearnedLimit: a remaining count without a
// limit header does not shrink the window to what is left.
func TestAnswerWithoutALimitKeepsTheLearnedLimit(t *testing.T) {
	b := learnedBudget(win(100, 99, at(time.Second)))
	b.observe(headerparse.Window{Remaining: 50, HasRemaining: true, Reset: at(2 * time.Second)}, 0, at(time.Second), at(time.Second))
	if v := b.view(); v.Limit != 100 || v.Available != 50 {
		t.Fatalf("after a count without a limit: %+v, want limit 100 with 50 left", v)
	}
}

// TestCorrectedWindowGrowsWhenTheUpstreamShowsAsMuchLeftAsItsSize: a window
// corrected to 20 that then shows 20 left held at least 21.
func TestCorrectedWindowGrowsWhenTheUpstreamShowsAsMuchLeftAsItsSize(t *testing.T) {
	var b budget
	b.observe(win(1200, 19, at(time.Second)), 0, t0, t0)
	if !b.correct(t0) || b.size() != 20 {
		t.Fatalf("correct: size %v, want 20", b.size())
	}
	b.observe(win(1200, 20, at(2*time.Second)), 0, at(time.Second), at(time.Second))
	if b.size() != 21 {
		t.Fatalf("size %v after 20 shown left of a window corrected to 20, want 21", b.size())
	}
}

// TestHeadersAreNotOverstatedWhenTheShownRefillIsWithinATwentiethOfTheirRate:
// the headers say 10/s (500 missing of 600, reset in 50 s); the upstream's
// counts show a 4/s refill while others share the key and keep it low. That
// is not 20 times slower: the window stands as stated.
func TestHeadersAreNotOverstatedWhenTheShownRefillIsWithinATwentiethOfTheirRate(t *testing.T) {
	var b budget
	b.observe(win(600, 100, at(50*time.Second)), 1, t0, t0)
	for range 2 {
		b.take(1)
	}
	d := at(500 * time.Millisecond)
	b.observe(win(600, 100, d.Add(50*time.Second)), 3, d, d)
	if b.size() != 600 || b.capped != 0 || !near(b.bucket.Rate, 10) {
		t.Fatalf("size %v, capped %v, rate %v; want 600 uncorrected at 10/s", b.size(), b.capped, b.bucket.Rate)
	}
}

// TestCorrectedWindowPacesAtTheRefillItShowed: in a corrected window whose
// next answer's arithmetic says far less (others hold remaining low and the
// reset far), the refill shown at the correction stays the pace.
func TestCorrectedWindowPacesAtTheRefillItShowed(t *testing.T) {
	b, d := quantizedBudget(t)
	b.take(1)
	next := d.Add(50 * time.Millisecond)
	b.observe(win(1200, 0, next.Add(10*time.Second)), 10, next, next) // arithmetic: 20 in 10 s
	if !near(b.bucket.Rate, 20) {
		t.Fatalf("rate = %v, want the 20/s shown at the correction, not 2/s", b.bucket.Rate)
	}
}

// TestCorrectedWindowKeepsTheRefillOfItsCorrection: later answers of a
// corrected window that show a slower refill (others drain the key) do not
// replace the refill shown at the correction; only a new correction does.
// Before, the second of two such answers dropped the pace from 20/s to 2/s.
func TestCorrectedWindowKeepsTheRefillOfItsCorrection(t *testing.T) {
	b, d := quantizedBudget(t)
	for i := range 2 {
		next := d.Add(time.Duration(i+1) * 300 * time.Millisecond)
		b.observe(win(1200, 0, next.Add(10*time.Second)), 9, next, next) // nothing refilled, reset 10 s away
		if !near(b.bucket.Rate, 20) || !near(b.shown, 20) {
			t.Fatalf("answer %d: rate %v, shown %v; want the 20/s of the correction", i+1, b.bucket.Rate, b.shown)
		}
	}
}

// TestLiftedCorrectionPacesByTheHeadersAgain: once an answer shows the
// whole stated window left (less one), the correction no longer holds and
// the headers' own arithmetic is the pace again: not at that answer, one
// missing of 1,200 until the reset in a minute, which bounds the refill
// only from below (a fixed window's reading as well as a slow bucket's),
// but at the next, half the window missing until the reset in a minute.
func TestLiftedCorrectionPacesByTheHeadersAgain(t *testing.T) {
	b, d := quantizedBudget(t)
	b.take(1)
	next := d.Add(50 * time.Millisecond)
	b.observe(win(1200, 1199, next.Add(time.Minute)), 10, next, next)
	if b.size() != 1200 || !near(b.bucket.Rate, 20) {
		t.Fatalf("size %v, rate %v; want 1200 at the 20/s it had, not 1/60 per second", b.size(), b.bucket.Rate)
	}
	later := next.Add(time.Second)
	b.observe(win(1200, 600, later.Add(time.Minute)), 11, later, later)
	if b.size() != 1200 || !near(b.bucket.Rate, 10) {
		t.Fatalf("size %v, rate %v; want 1200 at 10/s, 600 missing over a minute", b.size(), b.bucket.Rate)
	}
}

// TestRefillIsMeasuredOverExactlyRefillSpan: two answers refillSpan apart
// are far enough apart to show the refill, and so to correct overstated
// headers.
func TestRefillIsMeasuredOverExactlyRefillSpan(t *testing.T) {
	var b budget
	b.observe(win(1200, 19, at(50*time.Millisecond)), 1, t0, t0)
	for range 8 {
		b.take(1)
	}
	d := t0.Add(refillSpan)
	b.observe(win(1200, 15, d.Add(250*time.Millisecond)), 9, d, d)
	if b.size() != 20 {
		t.Fatalf("size %v after answers refillSpan apart, want corrected to 20", b.size())
	}
}

// TestShownRefillIsPerSecond: over 2 s the upstream's counts show one
// request refilled, half a request a second, while the headers claim 22/s
// and never show more than 100 of 1200 left: overstated, corrected.
func TestShownRefillIsPerSecond(t *testing.T) {
	var b budget
	b.observe(win(1200, 100, at(50*time.Second)), 1, t0, t0)
	b.take(1)
	d := at(2 * time.Second)
	b.observe(win(1200, 100, d.Add(50*time.Second)), 2, d, d)
	if b.size() != 101 || !near(b.shown, 0.5) {
		t.Fatalf("size %v, shown %v; want corrected to 101 with 0.5/s shown", b.size(), b.shown)
	}
}

// TestWindowThatShowedHalfItsSizeIsNotOverstated: headers whose rate is far
// above the refill shown are still honest once the window has shown half
// its stated size left.
func TestWindowThatShowedHalfItsSizeIsNotOverstated(t *testing.T) {
	var b budget
	b.observe(win(600, 300, at(300*time.Millisecond)), 1, t0, t0) // 1000/s
	b.take(1)
	d := at(500 * time.Millisecond)
	b.observe(win(600, 300, d.Add(300*time.Millisecond)), 2, d, d) // 2/s shown
	if b.size() != 600 || b.capped != 0 {
		t.Fatalf("size %v, capped %v; want 600 uncorrected", b.size(), b.capped)
	}
}

// TestAWindowPerMillisecondIsTheFastestBelievableRate: a reset one
// millisecond away for a whole window is still believed.
func TestAWindowPerMillisecondIsTheFastestBelievableRate(t *testing.T) {
	b := learnedBudget(win(10, 0, at(time.Millisecond)))
	if !near(b.bucket.Rate, 10*maxRateFactor) {
		t.Fatalf("rate = %v/s, want %v/s", b.bucket.Rate, 10*maxRateFactor)
	}
}

// TestRefusalCorrectsEveryBudgetWhenItsHeadersShowNoneExhausted: a refusal
// with room whose headers still show a request left, or exactly the
// request's cost in tokens, does not point at one budget: both are
// corrected.
func TestRefusalCorrectsEveryBudgetWhenItsHeadersShowNoneExhausted(t *testing.T) {
	tests := []struct {
		name             string
		reqLeft, tokLeft int64
	}{
		{"one request left", 1, 5000},
		{"tokens left equal the cost", 50, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p pacer
			p.observe(headerparse.Limits{Requests: win(100, 10, at(time.Second)), Tokens: win(10000, 1000, at(time.Second))},
				&Ticket{Dispatched: t0}, t0, false)
			refusal := headerparse.Limits{Requests: win(100, tt.reqLeft, at(time.Second)), Tokens: win(10000, tt.tokLeft, at(time.Second))}
			if !p.contradicted(&Ticket{Dispatched: t0, Room: true, Cost: 100}, refusal, at(10*time.Millisecond)) {
				t.Fatal("a refusal with room corrected nothing")
			}
			if p.requests.capped != 11 || p.tokens.capped != 1001 {
				t.Fatalf("capped: requests %v, tokens %v; want 11 and 1001 (both)", p.requests.capped, p.tokens.capped)
			}
		})
	}
}

// TestSendingAtExactlyHalfTheLearnedRateIsNotUnderUse: under-use is less
// than half the headers' rate.
func TestSendingAtExactlyHalfTheLearnedRateIsNotUnderUse(t *testing.T) {
	var p pacer
	p.requests = knownBudget(10, 10)
	for range 5 {
		p.recent.add(t0, 1)
	}
	if p.underUsed(t0) {
		t.Fatal("5/s against a learned 10/s counts as under-used")
	}
	p.recent = meter{}
	for range 4 {
		p.recent.add(t0, 1)
	}
	if !p.underUsed(t0) {
		t.Fatal("4/s against a learned 10/s does not count as under-used")
	}
}

// TestMeterCountsTheCurrentSecondAndForgetsTenSecondsAgo: events in the
// current second count; events meterSeconds ago have left the window.
func TestMeterCountsTheCurrentSecondAndForgetsTenSecondsAgo(t *testing.T) {
	var m meter
	for range 5 {
		m.add(t0, 1)
	}
	if r := m.rate(t0); r != 5 {
		t.Fatalf("rate %v with 5 events this second, want 5", r)
	}
	if n, _ := m.recent(t0.Add((meterSeconds - 1) * time.Second)); n != 5 {
		t.Fatalf("%d events seen %d s later, want 5", n, meterSeconds-1)
	}
	if n, _ := m.recent(t0.Add(meterSeconds * time.Second)); n != 0 {
		t.Fatalf("%d events seen %d s later, want 0", n, meterSeconds)
	}
}

// TestLearnedPaceBurstsAQuarterSecondOfItsRate: a pace learned from
// refusals holds burstSeconds of its rate, at least one request.
func TestLearnedPaceBurstsAQuarterSecondOfItsRate(t *testing.T) {
	var p pacer
	p.setFromRefusals(20, t0)
	if p.requests.limit != 5 {
		t.Fatalf("bucket %v at 20/s, want 5", p.requests.limit)
	}
	p.setFromRefusals(2, t0)
	if p.requests.limit != 1 {
		t.Fatalf("bucket %v at 2/s, want 1", p.requests.limit)
	}
}

// TestHeadersExactlyTwentyTimesTheShownRefillAreNotYetOverstated: the
// headers overstate a window only when their rate is more than
// overstatedRate times the refill shown (here 20/s against 1/s).
func TestHeadersExactlyTwentyTimesTheShownRefillAreNotYetOverstated(t *testing.T) {
	var b budget
	b.observe(win(1200, 100, at(55*time.Second)), 1, t0, t0) // 1100 in 55 s: 20/s
	b.take(1)
	d := at(time.Second)
	b.observe(win(1200, 100, d.Add(55*time.Second)), 2, d, d) // 1 refilled in 1 s
	if b.size() != 1200 || b.capped != 0 || !near(b.bucket.Rate, 20) {
		t.Fatalf("size %v, capped %v, rate %v; want 1200 uncorrected at 20/s", b.size(), b.capped, b.bucket.Rate)
	}
}

// TestWindowWhoseShownSizeReachesHalfIsNotOverstated: with 299 of 600
// shown left, the window has held at least 300, half its stated size:
// honest, however slow the refill it shows.
func TestWindowWhoseShownSizeReachesHalfIsNotOverstated(t *testing.T) {
	var b budget
	b.observe(win(600, 299, at(301*time.Millisecond)), 1, t0, t0) // about 1000/s
	b.take(1)
	d := at(500 * time.Millisecond)
	b.observe(win(600, 299, d.Add(301*time.Millisecond)), 2, d, d) // 2/s shown
	if b.size() != 600 || b.capped != 0 {
		t.Fatalf("size %v, capped %v; want 600 uncorrected", b.size(), b.capped)
	}
}

// TestACorrectedWindowHoldsNoMoreThanItsSize: a window stated as 1,200
// that never showed more than 19 left is corrected to 20: however long it
// then idles, it holds 20, not 1,200; shown 29 left later, it holds 30.
func TestACorrectedWindowHoldsNoMoreThanItsSize(t *testing.T) {
	var b budget
	b.observe(win(1200, 19, at(time.Second)), 0, t0, t0)
	if !b.correct(t0) {
		t.Fatal("not corrected")
	}
	if b.bucket.Level() > 20 {
		t.Fatalf("holds %v right after the correction to 20", b.bucket.Level())
	}
	full := knownBudget(1200, 20)
	full.bucket.Set(t0, 1200)
	full.resize(1200, 20)
	if full.bucket.Level() != 20 {
		t.Fatalf("a full window of 1,200 resized to 20 holds %v, want 20 at once", full.bucket.Level())
	}
	b.advance(at(time.Hour))
	if b.bucket.Level() != 20 {
		t.Fatalf("holds %v after an hour idle, want the corrected size 20", b.bucket.Level())
	}
	now := at(time.Hour)
	b.observe(win(1200, 29, now.Add(time.Second)), 0, now, now)
	b.advance(at(2 * time.Hour))
	if b.bucket.Level() != 30 {
		t.Fatalf("holds %v after 29 shown left and an hour idle, want 30", b.bucket.Level())
	}
}

// TestCorrectedWindowRateFromItsLine: a window corrected to the most it
// ever showed left, plus one, is nearly full whenever it shows that much,
// and its arithmetic reads a refill of one token over the reset: 0.4 a
// second (seed 135, openai-quantized: 16-25 requests given up as waiting
// past their budget). A bucket's remaining is its size less its rate times
// the time to full, whatever its size: two answers tell the rate.
func TestCorrectedWindowRateFromItsLine(t *testing.T) {
	var b budget
	b.observe(win(58229, 291, at(2572*time.Millisecond)), 0, t0, t0)
	d := at(50 * time.Millisecond) // too soon to measure a refill from the counts
	b.observe(win(58229, 1462, d.Add(1365*time.Millisecond)), 0, d, d)
	if !b.correct(t0) {
		t.Fatal("not corrected")
	}
	if want := (1462.0 - 291) / (2.572 - 1.365); math.Abs(b.bucket.Rate-want) > 1e-6 {
		t.Fatalf("rate %v of the corrected window, want %v (its line), not %v (one token over the reset)",
			b.bucket.Rate, want, 1/1.365)
	}
}

// TestOlderAnswerKeepsTheNewerCount: an answer to a request sent before
// one already answered is older news; it does not take off again what
// went after it (seed 135: tok 146 left -3111).
func TestOlderAnswerKeepsTheNewerCount(t *testing.T) {
	b := learnedBudget(win(1000, 1000, at(time.Second)))
	a := b.take(300)
	c := b.take(300)
	// The newer count has what refilled since the older one's.
	b.observe(win(1000, 600, at(time.Second)), c, at(100*time.Millisecond), at(100*time.Millisecond))
	b.observe(win(1000, 700, at(time.Second)), a, t0, at(100*time.Millisecond))
	if got := b.bucket.Level(); got != 600 {
		t.Fatalf("level %v after the older answer, want 600 (the newer count)", got)
	}
}

// TestRefusedRequestIsNotCountedAsSent: the upstream never counted a
// request it refused, so an answer to one sent with it does not take it
// off what that answer says is left.
func TestRefusedRequestIsNotCountedAsSent(t *testing.T) {
	b := learnedBudget(win(1000, 1000, at(time.Second)))
	d := at(time.Millisecond)
	// Two sent at one instant, each marked as if sent first (Memory's
	// batch): the refusal of the cheaper one comes back first, and took
	// off the other as sent after it.
	b.take(300)
	b.take(500)
	b.observe(win(1000, 700, at(time.Second)), 300, d, d)
	b.uncount(d, 300)
	b.observe(win(1000, 700, at(time.Second)), 500, d, d)
	if got := b.bucket.Level(); got != 700 {
		t.Fatalf("level %v, want 700: the refused request never reached the count", got)
	}
}

// TestRoomIsVouchedByTheLatestRemainingLessWhatWentSince: the upstream
// said 5 left in the answer to the request sent as the 10th; 3 went
// after it: 2 are vouched for, 3 are not. No refill is reckoned in.
func TestRoomIsVouchedByTheLatestRemainingLessWhatWentSince(t *testing.T) {
	b := budget{known: true, lastLeft: 5, seen: 10, sent: 13}
	if !b.vouched(2) || b.vouched(2.5) {
		t.Fatalf("vouched(2) %v, vouched(2.5) %v; want 2 of 5 - 3 vouched, no more", b.vouched(2), b.vouched(2.5))
	}
}

// TestEveryStatedBudgetMustVouchForARequest: the pacer vouches for a
// request when a budget the headers state has room by the upstream's own
// count and none has too little; a request pace learned from refusals is
// no statement of room.
func TestEveryStatedBudgetMustVouchForARequest(t *testing.T) {
	room := budget{known: true, lastLeft: 100}
	for _, c := range []struct {
		name         string
		req, tok     budget
		fromRefusals bool
		want         bool
	}{
		{"nothing stated", budget{}, budget{}, false, false},
		{"requests left", room, budget{}, false, true},
		{"no request left", budget{known: true, lastLeft: 0.5}, budget{}, false, false},
		{"a pace from refusals", room, budget{}, true, false},
		{"tokens left, a pace from refusals", budget{known: true}, room, true, true},
		{"tokens for exactly the cost", room, budget{known: true, lastLeft: 40}, false, true},
		{"too few tokens", room, budget{known: true, lastLeft: 39}, false, false},
	} {
		p := pacer{requests: c.req, tokens: c.tok, fromRefusals: c.fromRefusals}
		if got := p.vouched(40); got != c.want {
			t.Errorf("%s: vouched %v, want %v", c.name, got, c.want)
		}
	}
}

// TestANearlyFullWindowKeepsItsRefill: a reading with a tenth or less of
// the window missing until its reset bounds the refill only from below
// (seed 1065: one token of 3,164 missing a second before the window
// reset read as a refill of 1 a second, and requests were given up as
// waiting past their budget); one with more missing sets it.
func TestANearlyFullWindowKeepsItsRefill(t *testing.T) {
	var b budget
	b.observe(win(100, 50, at(2500*time.Millisecond)), 0, t0, t0)
	if !near(b.bucket.Rate, 20) {
		t.Fatalf("rate %v, want 20: 50 missing in 2.5 s", b.bucket.Rate)
	}
	d := at(time.Second)
	b.observe(win(100, 90, d.Add(10*time.Second)), 1, d, d)
	if !near(b.bucket.Rate, 20) {
		t.Fatalf("rate %v after 10 missing over 10 s, want the 20 it had", b.bucket.Rate)
	}
	d = at(2 * time.Second)
	b.observe(win(100, 89, d.Add(10*time.Second)), 2, d, d)
	if !near(b.bucket.Rate, 1.1) {
		t.Fatalf("rate %v after 11 missing over 10 s, want 1.1", b.bucket.Rate)
	}
}

// TestAnOverstatedWindowPacesItsFigurePerMinute: headers that name no
// period and overstate the window (1,200 stated, never more than 15 shown
// left: OpenAI's or Anthropic's per-minute figure enforced over a second)
// are corrected to the window shown; their figure per minute is a rate
// the upstream allows, while the arithmetic over resets rounded to the
// second reads one a second (seed 189: 13.9 a second paced at 5.1, 2.08×).
// A refusal with room after the correction drops it, as a stated period
// is dropped; an honest window is never floored (a per-day figure).
func TestAnOverstatedWindowPacesItsFigurePerMinute(t *testing.T) {
	var b budget
	w := win(1200, 15, at(time.Second))
	w.ResetGrain = time.Second
	b.observe(w, 1, t0, t0)
	if !b.correct(t0) || b.size() != 16 {
		t.Fatalf("a refusal with room: window %v, want corrected to 16", b.size())
	}
	b.observe(w, 1, at(time.Second), at(time.Second))
	if !near(b.bucket.Rate, 20) {
		t.Fatalf("corrected window paced at %v/s, want 1200 a minute, 20/s", b.bucket.Rate)
	}
	b.refusedAfterCorrection(true, at(1500*time.Millisecond))
	w = win(1200, 5, at(3*time.Second)) // 11 missing over a second
	w.ResetGrain = time.Second
	b.observe(w, 1, at(2*time.Second), at(2*time.Second))
	if b.bucket.Rate >= 20 {
		t.Fatalf("rate %v/s after a refusal with room in the corrected window, want the headers' own", b.bucket.Rate)
	}

	var honest budget
	honest.observe(win(1200, 1100, at(time.Hour)), 1, t0, t0)
	if r := honest.bucket.Rate; !near(r, 100/3600.0) {
		t.Fatalf("an honest window paced at %v/s, want 100 an hour", r)
	}
}

// TestAnAnswerCountsTheRefillSinceItsDispatch: an answer's remaining was
// counted when its request arrived; by the answer, the window has refilled
// for as long as the answer took, less what went after it. Without the
// refill a bucket of 8 at 13.9 a second with answers of 1.2 s was held 17
// short at every answer: half its rate (universe seed 189). A request's
// worth is kept back (the count was taken at the arrival, after the
// dispatch: pacing on the exact level refused one request in ten after a
// restart, quantized headers). The token budget is never credited
// (TestATokenBudgetIsCreditedNoRefill).
func TestAnAnswerCountsTheRefillSinceItsDispatch(t *testing.T) {
	fresh := func(limit, remaining int64) *budget {
		// 20 a second, or the headers' size over the reset
		return learnedBudget(win(limit, remaining, at(50*time.Millisecond)))
	}
	b := fresh(20, 19)
	mark := b.take(1)
	b.take(4)
	// Nothing left when it arrived at 2 s; answered at 2.5 s: 10 refilled
	// since, one kept back, 4 sent after it.
	b.observe(win(20, 0, at(3*time.Second)), mark, at(2*time.Second), at(2500*time.Millisecond))
	if got := b.bucket.Level(); !near(got, 5) {
		t.Fatalf("level %v at the answer, want 0 + 10 refilled - 1 kept - 4 sent after = 5", got)
	}
	// Never more than the window.
	b.observe(win(20, 15, at(3*time.Second)), b.sent, at(2500*time.Millisecond), at(4*time.Second))
	if got := b.bucket.Level(); !near(got, 20) {
		t.Fatalf("level %v, want the window's 20 at most", got)
	}
	// Headers that state more than the window ever showed: their rate is
	// read from the size stated (1,200 over a reset of a bucket of 20:
	// 23,700 a second). No refill is credited.
	over := fresh(1200, 15)
	mark = over.take(1)
	over.take(4)
	over.observe(win(1200, 0, at(3*time.Second)), mark, at(2*time.Second), at(2500*time.Millisecond))
	if got := over.bucket.Level(); !near(got, -4) {
		t.Errorf("overstated: level %v, want no refill credited: 0 - 4 sent after = -4", got)
	}
}

// TestALimitWithPeersIsCreditedNoRefill: others of the group that state
// the same window may spend its refill unseen (Ticket.Peers): a refill
// credited to each of two limits of one bucket refused 23-47 % of
// shared-models/headers in 1 run of 500 or so.
func TestALimitWithPeersIsCreditedNoRefill(t *testing.T) {
	for _, peers := range []bool{false, true} {
		p := pacer{requests: *learnedBudget(win(20, 19, at(50*time.Millisecond)))}
		mark := p.requests.take(1)
		p.requests.take(4)
		p.observe(headerparse.Limits{Requests: win(20, 0, at(3*time.Second))},
			&Ticket{Dispatched: at(2 * time.Second), Requests: mark, Peers: peers}, at(2500*time.Millisecond), false)
		want := 5.0 // 0 + 10 refilled - 1 kept - 4 sent after
		if peers {
			want = -4
		}
		if got := p.requests.bucket.Level(); !near(got, want) {
			t.Errorf("peers %v: level %v, want %v", peers, got, want)
		}
	}
}

// TestAWindowOfNothingStatedKeepsANumberForItsRate: remaining 0 with no
// limit stated (Azure's remaining-only headers on an empty window) names
// no period; the rate stays a number (a bound of 0 over no period is
// NaN, which would pace nothing and never recover).
func TestAWindowOfNothingStatedKeepsANumberForItsRate(t *testing.T) {
	var b budget
	b.observe(headerparse.Window{HasRemaining: true, Reset: at(time.Second)}, 0, t0, t0)
	if r := b.bucket.Rate; math.IsNaN(r) || math.IsInf(r, 0) {
		t.Fatalf("rate %v", r)
	}
}

// TestATokenBudgetIsCreditedNoRefill: tokens are estimated as they go, and
// what went after an answer's request is known only as estimates; a refill
// credited over them refused 25-30 % of tpm-quantized/headers in two runs of
// five on the binary. The pacer's token budget counts as the upstream
// shows, less what went after, with nothing refilled since.
func TestATokenBudgetIsCreditedNoRefill(t *testing.T) {
	var p pacer
	p.observe(headerparse.Limits{Tokens: win(20000, 19999, at(time.Millisecond))}, &Ticket{Dispatched: t0}, t0, false)
	mark := p.tokens.take(100)
	p.tokens.take(400)
	p.observe(headerparse.Limits{Tokens: win(20000, 0, at(3*time.Second))}, &Ticket{Dispatched: at(2 * time.Second), Tokens: mark},
		at(2500*time.Millisecond), false)
	if got := p.tokens.bucket.Level(); !near(got, -400) {
		t.Fatalf("token level %v, want 0 shown - 400 sent after, no refill credited", got)
	}
}
