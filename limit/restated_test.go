package limit

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// TestARestatedLimitScalesWhatTheWindowTaught: a window corrected by
// refusals to 20 of a stated 1200, pacing at the 20/s its counts showed,
// whose stated limit halves (a key's share cut, a tier lowered) holds half
// of each: 10 of 600 at 10/s, still not correctable below what it showed.
// Before, the refill shown under the old limit kept the pace at 20/s and
// the window at 20 after the upstream halved both (seed 12 of the
// universe, anthropic-down: 6-8 % of its requests refused after the cut).
// Tripled, each grows three times. What the window showed left stays what
// it showed: scaled with the rest, a window that charges refusals read as
// having shown room it never had, and sent into its debt for half an hour
// (seed 3359: 18,510 requests, 99.8 % refused, 106 lost).
func TestARestatedLimitScalesWhatTheWindowTaught(t *testing.T) {
	b, d := quantizedBudget(t)
	if !near(b.slope, 20) || b.maxRemaining != 19 {
		t.Fatalf("setup: slope %v, most shown left %v; want 20 and 19", b.slope, b.maxRemaining)
	}
	// The reset 300 ms from the dispatch, as the last one was 250 ms:
	// too close to read a new slope, so the scaled one stands.
	next := d.Add(50 * time.Millisecond)
	b.observe(win(600, 9, next.Add(300*time.Millisecond)), 9, next, next)
	if b.size() != 10 || !near(b.shown, 10) || !near(b.slope, 10) || !near(b.bucket.Rate, 10) {
		t.Fatalf("halved: size %v, shown %v, slope %v, rate %v; want 10 and 10/s each", b.size(), b.shown, b.slope, b.bucket.Rate)
	}
	if b.maxRemaining != 19 || b.correctable() {
		t.Fatalf("halved: most shown left %v (correctable %v), want the 19 it showed, not correctable", b.maxRemaining, b.correctable())
	}
	later := next.Add(50 * time.Millisecond)
	b.observe(win(1800, 20, later.Add(300*time.Millisecond)), 9, later, later)
	if b.size() != 30 || !near(b.shown, 30) || !near(b.slope, 30) || b.maxRemaining != 20 {
		t.Fatalf("tripled: size %v, shown %v, slope %v, most shown left %v; want 30, 30/s, 30/s, 20",
			b.size(), b.shown, b.slope, b.maxRemaining)
	}
}

// TestNoRefillIsMeasuredAcrossARestatedLimit: counts read under the old
// limit and the new one show no refill between them. A window of 1200 with
// 100 left whose stated limit halves, 40 left 200 ms later, did not refill
// at nothing a second; read as such it was corrected to a fifth of what
// the upstream now states.
func TestNoRefillIsMeasuredAcrossARestatedLimit(t *testing.T) {
	var b budget
	b.observe(win(1200, 100, at(50*time.Second)), 0, t0, t0)
	d := at(200 * time.Millisecond)
	b.observe(win(600, 40, d.Add(50*time.Second)), 0, d, d)
	if b.capped != 0 || b.size() != 600 {
		t.Fatalf("corrected to %v (size %v) across the restated limit, want 600 as stated", b.capped, b.size())
	}
}

// TestAnUnstatedLimitIsNoRestatement: an answer with no stated limit whose
// remaining count is over the one stated before grows the window to it,
// and is no restated limit: the refill shown at the correction stands.
func TestAnUnstatedLimitIsNoRestatement(t *testing.T) {
	b, d := quantizedBudget(t)
	next := d.Add(50 * time.Millisecond)
	b.observe(headerparse.Window{Remaining: 1300, HasRemaining: true, Reset: next.Add(time.Second)}, 9, next, next)
	if !near(b.shown, 20) {
		t.Fatalf("shown %v after a count over the stated limit with none stated, want the 20/s of the correction", b.shown)
	}
}
