package limit

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// longAnswerBudget is a window of 13 that showed 12 left once (a full
// window, less the request itself), then five sent; it returns the budget
// and the answer to the request sent third (two sent before it, three
// after), which said 3 left and a reset 500 ms after its dispatch at 1 s.
func longAnswerBudget(admission bool) (*budget, headerparse.Window, time.Time) {
	b := &budget{admission: admission}
	b.observe(win(13, 12, at(time.Second)), 0, t0, t0)
	for range 5 {
		b.take(1)
	}
	d := at(time.Second)
	return b, win(13, 3, d.Add(500*time.Millisecond)), d
}

// TestAnAnswerPastItsResetFindsTheWindowFull: a request window is counted
// when the upstream admits the request; an answer that came after the
// reset it named (a long answer, a short window) finds the window as full
// as it ever showed (12 + 1), less the three sent after its request, not
// the 3 left it said at the dispatch, less those three: nothing.
func TestAnAnswerPastItsResetFindsTheWindowFull(t *testing.T) {
	for _, tt := range []struct {
		name  string
		after time.Duration // from the dispatch to the answer
		grain time.Duration
		early time.Duration
		want  float64
	}{
		{"past the reset", 1900 * time.Millisecond, 0, 0, 10},
		{"a moment past", 500*time.Millisecond + time.Nanosecond, 0, 0, 10},
		{"at the reset", 500 * time.Millisecond, 0, 0, 0},
		{"within its grain", 1400 * time.Millisecond, time.Second, 0, 0},
		{"past its grain", 1600 * time.Millisecond, time.Second, 0, 10},
		{"within the early floor", 700 * time.Millisecond, 0, 300 * time.Millisecond, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, w, d := longAnswerBudget(true)
			w.ResetGrain, b.early = tt.grain, tt.early
			now := d.Add(tt.after)
			b.observe(w, 2, d, now)
			if got := b.bucket.Level(); !near(got, tt.want) {
				t.Fatalf("level %v; want %v", got, tt.want)
			}
		})
	}
}

// TestTokensPastTheirResetAreNotCredited: a window counted from the usage
// (tokens, at the answer's end) may have counted the answer itself after
// the reset: what it said was left stands, less what went after.
func TestTokensPastTheirResetAreNotCredited(t *testing.T) {
	b, w, d := longAnswerBudget(false)
	b.observe(w, 2, d, d.Add(1900*time.Millisecond))
	if got := b.bucket.Level(); !near(got, 0) {
		t.Fatalf("level %v; want 0", got)
	}
}

// TestThePacerCountsRequestsAtAdmission: the request window is counted at
// admission, the token window not.
func TestThePacerCountsRequestsAtAdmission(t *testing.T) {
	var p pacer
	l := headerparse.Limits{Requests: win(13, 12, at(time.Second)), Tokens: win(1000, 900, at(time.Second))}
	p.observe(l, &Ticket{Dispatched: t0}, t0)
	if !p.requests.admission || p.tokens.admission {
		t.Fatalf("requests %v, tokens %v; want true, false", p.requests.admission, p.tokens.admission)
	}
}
