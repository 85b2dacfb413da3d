package limit

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// knowing is a pool's state that has learned a limit from headers: an
// accepted answer said 999 of 1000 requests are left.
func knowing(t *testing.T) *Memory {
	t.Helper()
	m := NewMemory(Config{})
	tk, _, ok := m.Admit(t0, 1, false)
	if !ok {
		t.Fatal("a fresh state held its first request")
	}
	m.Learn(&tk, Report{Status: 200, Verdict: Accepted,
		Limits: headerparse.Limits{Requests: win(1000, 999, at(time.Minute))}}, t0)
	m.Return(&tk, t0)
	if !m.Knows() {
		t.Fatal("headers taught the state nothing")
	}
	return m
}

// wantStart asks c whether a request of cost may start at now (with the
// pool's state sh), and fails unless it must wait until want (zero: it
// may start now).
func wantStart(t *testing.T, c *Ceiling, sh Shared, now time.Time, cost int64, want time.Time) {
	t.Helper()
	at, ok := c.Admit(now, cost, sh)
	if ok != at.IsZero() {
		t.Fatalf("Admit at %v = %v, %v: a refusal names when, an admission nothing", now.Sub(t0), at, ok)
	}
	if !at.Equal(want) {
		since := func(x time.Time) string {
			if x.IsZero() {
				return "now"
			}
			return "until " + x.Sub(t0).String()
		}
		t.Fatalf("%d tokens at %v: wait %s, want %s", cost, now.Sub(t0), since(at), since(want))
	}
}

// TestLimitsIsZeroOnlyWithoutAFigure: limits configure something when any
// of RPM, TPM, Concurrency or MinGap is set, whatever the others; Start
// and PerCredential alone configure no figure.
func TestLimitsIsZeroOnlyWithoutAFigure(t *testing.T) {
	if !(Limits{}).IsZero() || !(Limits{Start: true, PerCredential: true}).IsZero() {
		t.Error("limits without a figure are not zero")
	}
	for _, l := range []Limits{{RPM: 60}, {TPM: 1000}, {Concurrency: 2}, {MinGap: time.Millisecond}} {
		if l.IsZero() {
			t.Errorf("%+v is zero", l)
		}
	}
}

// TestCeilingRPMSpacesStartsEvenly: 600 RPM is a start every 100 ms, from
// the first on: the second waits for the gap, and goes once it has passed.
func TestCeilingRPMSpacesStartsEvenly(t *testing.T) {
	c := Limits{RPM: 600}.Ceiling()
	sh := NewMemory(Config{})
	wantStart(t, c, sh, t0, 1, time.Time{}) // the first goes at once
	c.Take(t0, 1)
	wantStart(t, c, sh, at(50*time.Millisecond), 1, at(100*time.Millisecond)) // the second waits for the gap
	wantStart(t, c, sh, at(100*time.Millisecond), 1, time.Time{})             // and goes once it has passed
}

// TestCeilingRPMKeepsItsCadenceButGivesNoBurst: a start up to a tenth of
// a gap late (a timer firing late) keeps the planned cadence, so the rate
// holds; one later than that, after an idle spell, spaces the next a
// whole gap after itself rather than letting the missed starts go at once.
func TestCeilingRPMKeepsItsCadenceButGivesNoBurst(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{RPM: 600}.Ceiling()
	c.Take(t0, 1)
	c.Take(at(110*time.Millisecond), 1)                                        // exactly a tenth of the gap late
	wantStart(t, c, sh, at(150*time.Millisecond), 1, at(200*time.Millisecond)) // the planned cadence

	c = Limits{RPM: 600}.Ceiling()
	c.Take(t0, 1)
	c.Take(at(111*time.Millisecond), 1)                                        // later than a tenth: the plan starts again
	wantStart(t, c, sh, at(150*time.Millisecond), 1, at(211*time.Millisecond)) // a gap after the late start

	c = Limits{RPM: 600}.Ceiling()
	c.Take(t0, 1)
	c.Take(at(600*time.Millisecond), 1) // after half a second idle
	for _, now := range []time.Duration{600 * time.Millisecond, 650 * time.Millisecond} {
		wantStart(t, c, sh, at(now), 1, at(700*time.Millisecond))
	}
}

// TestCeilingMinGapSpacesEveryTwoStarts: a minimum gap holds the next
// start until that long after the latest, however the starts came.
func TestCeilingMinGapSpacesEveryTwoStarts(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{MinGap: time.Second}.Ceiling()
	wantStart(t, c, sh, t0, 1, time.Time{}) // the first goes at once
	c.Take(t0, 1)
	wantStart(t, c, sh, at(300*time.Millisecond), 1, at(time.Second))    // inside the gap
	c.Take(at(2500*time.Millisecond), 1)                                 // a late start: the gap counts from it
	wantStart(t, c, sh, at(3*time.Second), 1, at(3500*time.Millisecond)) // a gap after it
	wantStart(t, c, sh, at(3500*time.Millisecond), 1, time.Time{})       // the gap's end
}

// TestCeilingTPMIsABucketOfOneSecond: 6,000 tokens a minute is 100 a
// second, and the bucket holds one second's worth, full at first: a
// request of exactly 100 tokens goes at once, then each token missing
// takes 10 ms to come back, and the bucket never holds more than 100.
func TestCeilingTPMIsABucketOfOneSecond(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 6000}.Ceiling()
	wantStart(t, c, sh, t0, 100, time.Time{}) // a full bucket
	c.Take(t0, 100)
	wantStart(t, c, sh, t0, 1, at(10*time.Millisecond)) // an empty one
	// 20 back at 200 ms: 50 tokens wait for the 30 missing.
	wantStart(t, c, sh, at(200*time.Millisecond), 50, at(500*time.Millisecond))
	wantStart(t, c, sh, at(500*time.Millisecond), 50, time.Time{})
	// A long idle spell fills the bucket to one second's worth, no more.
	c.Take(at(500*time.Millisecond), 50)
	wantStart(t, c, sh, at(time.Minute), 100, time.Time{})
	c.Take(at(time.Minute), 100)
	wantStart(t, c, sh, at(time.Minute), 1, at(time.Minute+10*time.Millisecond)) // emptied
}

// TestCeilingTakeChargesTheBucketAsItIsThen: a start charged after an
// idle spell takes its tokens from a bucket refilled to its size, not
// from what the idle spell would have given beyond it.
func TestCeilingTakeChargesTheBucketAsItIsThen(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 6000}.Ceiling()
	c.Take(t0, 100)
	c.Take(at(5*time.Second), 100) // the bucket is full again, and emptied
	wantStart(t, c, sh, at(5*time.Second), 1, at(5*time.Second+10*time.Millisecond))
}

// TestCeilingBucketHoldsAtLeastOneToken: at 30 tokens a minute (half a
// token a second) the bucket still holds one token, and a request larger
// than the bucket goes once it is full, charged the whole bucket.
func TestCeilingBucketHoldsAtLeastOneToken(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 30}.Ceiling()
	wantStart(t, c, sh, t0, 10, time.Time{}) // a full bucket
	c.Take(t0, 10)
	wantStart(t, c, sh, t0, 10, at(2*time.Second))          // the whole bucket, one token
	wantStart(t, c, sh, at(2*time.Second), 10, time.Time{}) // full again
}

// TestCeilingWaitIsAtMostADayAndAtLeastAMillisecond: a tiny token rate
// waits no longer than a day (a time.Duration cannot overflow), and a
// sliver of a token missing waits a millisecond, not nothing.
func TestCeilingWaitIsAtMostADayAndAtLeastAMillisecond(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 0.0006}.Ceiling() // a token every 100,000 s
	c.Take(t0, 1)
	wantStart(t, c, sh, t0, 1, at(24*time.Hour)) // 100,000 s, cut to a day
	c = Limits{TPM: 6000}.Ceiling()
	c.Take(t0, 100)
	now := at(time.Second - time.Nanosecond) // a ten-millionth of a token short
	wantStart(t, c, sh, now, 100, now.Add(time.Millisecond))
}

// TestCeilingSettleSwapsTheEstimateForWhatWasUsed: a request charged 100
// tokens that used 40 gives 60 back; one that used more than its estimate
// owes the rest; what is given back never overfills the bucket.
func TestCeilingSettleSwapsTheEstimateForWhatWasUsed(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 6000}.Ceiling()
	c.Take(t0, 100)
	c.Settle(100, 40)
	wantStart(t, c, sh, t0, 60, time.Time{})             // 60 back
	wantStart(t, c, sh, t0, 61, at(10*time.Millisecond)) // not 61
	c.Take(t0, 60)
	c.Settle(10, 40)                                     // 30 more used than charged: owed
	wantStart(t, c, sh, t0, 1, at(310*time.Millisecond)) // 30 owed and 1 missing
	c.Settle(100, 0)                                     // two requests charged 100 that used nothing:
	c.Settle(100, 0)                                     // more given back than the bucket holds
	wantStart(t, c, sh, t0, 100, time.Time{})            // full
	c.Take(t0, 100)
	wantStart(t, c, sh, t0, 1, at(10*time.Millisecond)) // and no fuller
}

// TestACeilingHoldsWhateverTheUpstreamSays: configured limits that are
// ceilings hold after the state learned limits of its own; its view says
// ceiling throughout.
func TestACeilingHoldsWhateverTheUpstreamSays(t *testing.T) {
	sh := knowing(t)
	c := Limits{RPM: 60, TPM: 60}.Ceiling()
	c.Take(t0, 1)
	wantStart(t, c, sh, at(500*time.Millisecond), 1, at(time.Second))
	if m := c.View().Mode; m != "ceiling" {
		t.Fatalf("mode %q, want ceiling", m)
	}
}

// TestAStartIsReplacedOnceTheStateKnowsALimit: configured limits that are
// only a start hold while the state knows nothing, and from its first
// learned limit on neither RPM nor TPM holds any more, nor charges.
func TestAStartIsReplacedOnceTheStateKnowsALimit(t *testing.T) {
	fresh := NewMemory(Config{})
	c := Limits{RPM: 60, TPM: 60, Start: true}.Ceiling()
	c.Take(t0, 1)
	wantStart(t, c, fresh, at(100*time.Millisecond), 1, at(time.Second))
	if m := c.View().Mode; m != "start" {
		t.Fatalf("mode %q before anything was learned, want start", m)
	}
	sh := knowing(t)
	for i := range 3 {
		now := at(200*time.Millisecond + time.Duration(i)*time.Millisecond)
		wantStart(t, c, sh, now, 1, time.Time{})
		c.Take(now, 1)
	}
	if m := c.View().Mode; m != "replaced" {
		t.Fatalf("mode %q after the state learned a limit, want replaced", m)
	}
	// Replaced for good: a state that knows nothing does not bring it back.
	wantStart(t, c, fresh, at(300*time.Millisecond), 1, time.Time{})
}

// TestAStartGrowsEachSecondItHoldsRequestsBack: a start of 30 RPM (a start
// every 2 s) that holds requests back for a full second with nothing
// learned grows by a quarter (1.6 s apart from the next start on); one
// held back for less does not, nor does a ceiling held as long.
func TestAStartGrowsEachSecondItHoldsRequestsBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lim   Limits
		held  []time.Duration // when a request is held back
		after time.Duration   // the gap after the start at 2 s
	}{
		{"a start held a second", Limits{RPM: 30, Start: true}, []time.Duration{0, time.Second}, 1600 * time.Millisecond},
		{"a start held less", Limits{RPM: 30, Start: true}, []time.Duration{0, time.Second - time.Millisecond}, 2 * time.Second},
		{"a start held once", Limits{RPM: 30, Start: true}, []time.Duration{0}, 2 * time.Second},
		{"a ceiling held a second", Limits{RPM: 30}, []time.Duration{0, time.Second}, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := NewMemory(Config{})
			c := tc.lim.Ceiling()
			c.Take(t0, 1)
			for _, h := range tc.held {
				wantStart(t, c, sh, at(h), 1, at(2*time.Second))
			}
			wantStart(t, c, sh, at(2*time.Second), 1, time.Time{})
			c.Take(at(2*time.Second), 1)
			wantStart(t, c, sh, at(2*time.Second), 1, at(2*time.Second+tc.after))
		})
	}
}

// TestATokenStartGrowsLikeARequestStart: a start of 6,000 TPM held back a
// full second grows to 7,500 a minute: 125 tokens a second, in a bucket
// of 125.
func TestATokenStartGrowsLikeARequestStart(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{TPM: 6000, Start: true}.Ceiling()
	c.Take(t0, 100)
	wantStart(t, c, sh, t0, 100, at(time.Second))
	c.Take(at(500*time.Millisecond), 50) // the 50 back at 0.5 s go
	// At 1 s, 50 back again, held a second: still at 100 a second, the
	// 50 missing take 0.5 s; grown from then on, they come back at 125 a
	// second.
	wantStart(t, c, sh, at(time.Second), 100, at(1500*time.Millisecond))
	wantStart(t, c, sh, at(time.Second), 100, at(1400*time.Millisecond))
	wantStart(t, c, sh, at(3*time.Second), 125, time.Time{})
}

// TestCeilingViewShowsTheConfiguredLimits: the view carries the
// configured figures as they are.
func TestCeilingViewShowsTheConfiguredLimits(t *testing.T) {
	v := Limits{RPM: 600, TPM: 6000, Concurrency: 4, MinGap: 50 * time.Millisecond}.Ceiling().View()
	want := ConfiguredView{RPM: 600, TPM: 6000, Concurrency: 4, MinGapSecs: 0.05, Mode: "ceiling"}
	if *v != want {
		t.Fatalf("view %+v, want %+v", *v, want)
	}
}

// TestCeilingRefundGivesBackTheLatestStart (issue 49): a start the
// upstream refused for its credential gives back its tokens, and, when it
// was the latest start, the RPM spacing and the minimum gap it took; a
// start made after it keeps the spacing it was given.
func TestCeilingRefundGivesBackTheLatestStart(t *testing.T) {
	sh := NewMemory(Config{})
	c := Limits{RPM: 60, MinGap: 500 * time.Millisecond, TPM: 6000}.Ceiling()
	c.Take(t0, 1)
	c.Take(at(time.Second), 100) // the bucket of 100 emptied
	wantStart(t, c, sh, at(time.Second), 1, at(2*time.Second))
	c.Refund(at(time.Second), 100)
	wantStart(t, c, sh, at(time.Second), 100, time.Time{}) // a second after the first: its gap
	c.Refund(at(time.Second), 100)                         // once only: the spacing is the first's
	wantStart(t, c, sh, at(time.Second-time.Nanosecond), 1, at(time.Second))

	// A refund of an earlier start leaves the later one's spacing.
	c = Limits{RPM: 60}.Ceiling()
	c.Take(t0, 1)
	c.Take(at(time.Second), 1)
	c.Refund(t0, 1)
	wantStart(t, c, sh, at(time.Second), 1, at(2*time.Second))

	// A ticket with no time matches no start.
	c = Limits{MinGap: time.Second}.Ceiling()
	c.Refund(time.Time{}, 1)
	c.Take(t0, 1)
	c.Refund(time.Time{}, 1)
	wantStart(t, c, sh, t0, 1, at(time.Second))

	// The minimum gap alone is given back too.
	c.Refund(t0, 1)
	wantStart(t, c, sh, t0, 1, time.Time{})
}
