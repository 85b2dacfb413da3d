package limit

import (
	"github.com/llmproxy/llmproxy/headerparse"
	"testing"
	"time"
)

// Dispatches another store admitted go at the number in flight it says,
// all replicas together, and are numbered in the pool's running count;
// a refused one's permit stops counting when it is given back.
func TestFleetDispatchedTakesTheFleetsLevelAndCount(t *testing.T) {
	s := NewMemory(Config{Concurrency: 8, MaxConcurrency: 8})
	tk := s.Fleet().Dispatched(t0, 3, 100, 0)
	if tk.Seq != 100 || tk.Level != 4 || tk.InFlight != 3 || !tk.Dispatched.Equal(t0) {
		t.Fatalf("seq %d level %d, %d out, at %v; want the fleet's 100, 3 out + itself = 4, 3, t0", tk.Seq, tk.Level, tk.InFlight, tk.Dispatched)
	}
	tk.Lease = "l1"
	s.Learn(&tk, Report{Status: 429, Verdict: RateRefused}, t0)
	if level := s.Fleet().Dispatched(t0, 3, 101, 0).Level; level != 3 {
		t.Fatalf("level %d beside a refused permit still held, want 3", level)
	}
	s.Fleet().Returned(&tk, t0)
	if level := s.Fleet().Dispatched(t0, 3, 102, 0).Level; level != 4 {
		t.Fatalf("level %d after the refused permit came back, want 4", level)
	}
	if n, _ := s.pace.recent.recent(t0); n != 3 {
		t.Fatalf("%d dispatches in the sending rate, want 3 (one each)", n)
	}
	s.Fleet().Dispatched(t0, 0, 112, 0) // nine more elsewhere since
	if n, _ := s.pace.recent.recent(t0); n != 13 {
		t.Fatalf("%d dispatches in the sending rate, want 13: the other replicas' count too", n)
	}
}

// TestAnswerThatWentAtTheLimitIsBindingAfterOthersLeft: an answer whose
// request went as the last permit the limit allowed says the limit held
// requests back, even when the others have come back by the time it
// arrives; one that went with room to spare does not.
func TestAnswerThatWentAtTheLimitIsBindingAfterOthersLeft(t *testing.T) {
	c := newConcLimit(Config{Concurrency: 4, MinConcurrency: 1, MaxConcurrency: 64})
	last := Ticket{InFlight: 3, Limit: 4} // went with 3 others at limit 4
	c.accepted(&last, t0, 1, 0)
	c.accepted(&last, t0, 1, 0)
	if c.limit != 5 {
		t.Fatalf("limit = %d after two answers that went at the limit, want 5 (slow start)", c.limit)
	}
	roomy := Ticket{InFlight: 2, Limit: 5} // went with a permit to spare
	for range 4 {
		c.accepted(&roomy, at(time.Second), 1, 0)
	}
	if c.limit != 5 {
		t.Fatalf("limit = %d after answers that went with room, want still 5", c.limit)
	}
}

// TestRefusedLevelIsRememberedForAFullRefusedMemory: growth back to a level
// the upstream refused stays slow up to and including refusedMemory after
// the latest concurrency refusal, and is forgotten just after it.
func TestRefusedLevelIsRememberedForAFullRefusedMemory(t *testing.T) {
	full := Ticket{InFlight: 3, Limit: 4}
	c := grownConc(4)
	c.refusedAt = 5 // growing back to 5 takes 4 × regrowAcks answers
	for range 4 {
		c.accepted(&full, t0.Add(refusedMemory), 4, 0)
	}
	if c.limit != 4 || c.refusedAt != 5 {
		t.Fatalf("at exactly refusedMemory: limit %d, refusedAt %d; want 4 and 5 (still regrowing)", c.limit, c.refusedAt)
	}
	c = grownConc(4)
	c.refusedAt, c.regrowAcks = 5, 4*minRegrowAcks
	for range 4 {
		c.accepted(&full, t0.Add(refusedMemory+time.Nanosecond), 4, 0)
	}
	if c.limit != 5 || c.refusedAt != 0 || c.regrowAcks != minRegrowAcks {
		t.Fatalf("just after refusedMemory: limit %d, refusedAt %d, regrowAcks %d; want 5, 0, %d",
			c.limit, c.refusedAt, c.regrowAcks, minRegrowAcks)
	}
}

// TestLittleFloorRaisesTheLimitOnlyWhileBelowIt: below the concurrency the
// learned rate needs, each binding answer raises the limit at once; at that
// floor, growth takes a limit's worth of answers again.
func TestLittleFloorRaisesTheLimitOnlyWhileBelowIt(t *testing.T) {
	full := Ticket{InFlight: 3, Limit: 4}
	c := grownConc(3)
	c.accepted(&full, t0, 4, 4)
	if c.limit != 4 {
		t.Fatalf("below the floor: limit %d, want 4 at once", c.limit)
	}
	for i := range 3 {
		c.accepted(&full, t0, 4, 4)
		if c.limit != 4 {
			t.Fatalf("at the floor, answer %d: limit %d, want still 4", i+1, c.limit)
		}
	}
	c.accepted(&full, t0, 4, 4)
	if c.limit != 5 {
		t.Fatalf("at the floor after a limit's worth of answers: limit %d, want 5", c.limit)
	}
}

// TestLongAnswersGrowConcurrencyToRateTimesAnswerTime: 4 requests a
// second from headers, answers that take 2 s: 8 must be in flight to keep
// the rate, whatever refusals taught before, so the limit grows at once.
func TestLongAnswersGrowConcurrencyToRateTimesAnswerTime(t *testing.T) {
	m := NewMemory(Config{Concurrency: 2, MinConcurrency: 1, MaxConcurrency: 64})
	m.conc.slowStart = false
	m.conc.answerSecs = 2
	var tickets [2]Ticket
	for i := range tickets {
		tk, _, ok := m.Admit(t0, 1, false)
		if !ok {
			t.Fatalf("dispatch %d not admitted", i)
		}
		tickets[i] = tk
	}
	m.Learn(&tickets[1], Report{Status: 200, Verdict: Accepted, Limits: headerparse.Limits{Requests: win(4, 2, at(500*time.Millisecond))}}, t0)
	if got := m.floor(); got != 8 {
		t.Fatalf("little floor = %d, want 8", got)
	}
	if got := m.View(t0).Concurrency; got != 3 {
		t.Fatalf("concurrency %d, want 3: grown at once, not after a limit's worth", got)
	}
}

// TestAnAnswerThatFindsTheLimitFullIsBinding: an answer that comes while
// as many permits are out as the limit allows says the limit held
// requests back, even if its own request went with room to spare; with
// one permit free it does not.
func TestAnAnswerThatFindsTheLimitFullIsBinding(t *testing.T) {
	roomy := Ticket{InFlight: 0, Limit: 4}
	for _, tc := range []struct {
		out, want int
	}{{4, 5}, {3, 4}} {
		c := newConcLimit(Config{Concurrency: 4, MinConcurrency: 1, MaxConcurrency: 64})
		c.accepted(&roomy, t0, tc.out, 0)
		c.accepted(&roomy, t0, tc.out, 0)
		if c.limit != tc.want {
			t.Errorf("two answers with %d of 4 out: limit %d, want %d", tc.out, c.limit, tc.want)
		}
	}
}

// TestTheLimitNeverGrowsPastItsHighest: at the highest limit, answers that
// found it full raise it no further, not even below the concurrency the
// learned rate needs.
func TestTheLimitNeverGrowsPastItsHighest(t *testing.T) {
	c := newConcLimit(Config{Concurrency: 4, MinConcurrency: 1, MaxConcurrency: 4})
	full := Ticket{InFlight: 3, Limit: 4}
	for range 20 {
		c.accepted(&full, t0, 4, 8)
	}
	if c.limit != 4 {
		t.Fatalf("limit %d, want its highest, 4", c.limit)
	}
}

// TestARefusalAtTheRefusedLevelAgainDoublesTheRegrowth: growing back to a
// level refused before takes regrowAcks limits' worth of answers; a
// refusal there again, while the limit reached it, doubles that, up to
// maxRegrowAcks; one at that level while the limit is under it (a request
// counted before the limit fell) does not.
func TestARefusalAtTheRefusedLevelAgainDoublesTheRegrowth(t *testing.T) {
	atLevel5 := Ticket{InFlight: 4}
	for _, tc := range []struct {
		name          string
		limit, regrow int
		want          int
	}{
		{"at the level", 5, minRegrowAcks, 2 * minRegrowAcks},
		{"at the level, past half the most", 5, 6 * minRegrowAcks, maxRegrowAcks},
		{"under the level", 4, minRegrowAcks, minRegrowAcks},
	} {
		c := grownConc(tc.limit)
		c.refusedAt, c.regrowAcks = 5, tc.regrow
		c.refused(&atLevel5, t0, 5, 0, false)
		if c.regrowAcks != tc.want || c.refusedAt != 5 {
			t.Errorf("%s: regrowAcks %d, refused level %d; want %d, 5", tc.name, c.regrowAcks, c.refusedAt, tc.want)
		}
	}
}
