package redisstate

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// windowUpstream counts in fixed windows aligned to the clock, allowance
// requests each, and names the time to the next boundary, to the
// millisecond, when it refuses (Azure OpenAI's retry-after-ms).
type windowUpstream struct {
	length            time.Duration
	allowance         int
	count             map[int64]int // admitted, by window
	admitted, refused map[int64]int // answers, by window
}

func newWindowUpstream(length time.Duration, allowance int) *windowUpstream {
	return &windowUpstream{length: length, allowance: allowance, count: map[int64]int{}, admitted: map[int64]int{}, refused: map[int64]int{}}
}

// take decides on a request that reaches the upstream at now: admitted,
// or refused with the time to the window's end.
func (u *windowUpstream) take(now time.Time) (ok bool, hint time.Duration) {
	w := now.UnixNano() / int64(u.length)
	if u.count[w] < u.allowance {
		u.count[w]++
		u.admitted[w]++
		return true, 0
	}
	u.refused[w]++
	return false, time.Unix(0, (w+1)*int64(u.length)).Sub(now)
}

// TestAFleetSendsAWindowsAllowanceTogether: three replicas before an
// upstream that counts 10 requests in each 1 s window, aligned to the
// clock, and states its boundary to the millisecond when it refuses. Once
// the fleet has learned the window, it sends the allowance at each
// window's start, every replica's requests counted together, and holds
// until the next: nearly no refusals, and a window's allowance used. A
// replica that counted only its own third would send until a refusal
// came back, and the fleet with it.
func TestAFleetSendsAWindowsAllowanceTogether(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart.Add(300 * time.Millisecond)) // in a window, not at its start
	stores := fakeStores(t, srv.url(), fc, 3)
	up := newWindowUpstream(time.Second, 10)
	type answer struct {
		at     time.Time
		sh     limit.Shared
		tk     limit.Ticket
		ok     bool
		hint   time.Duration
		window int64
	}
	var pending []answer
	sh := make([]limit.Shared, len(stores))
	next := make([]time.Time, len(stores))
	for i, st := range stores {
		sh[i] = st.Shared("azure", limit.Config{Concurrency: 50, MaxConcurrency: 50})
	}
	end := fc.Now().Add(12 * time.Second)
	for fc.Now().Before(end) {
		now := fc.Now()
		// Answers due: an admitted one after 40 ms, a refusal after 2 ms.
		rest := pending[:0]
		for _, a := range pending {
			if a.at.After(now) {
				rest = append(rest, a)
				continue
			}
			r := limit.Report{Status: 200, Verdict: limit.Accepted}
			if !a.ok {
				r = limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: a.hint, PauseUntil: now.Add(a.hint)}
			}
			a.sh.Learn(&a.tk, r, now)
			a.sh.Return(&a.tk, now)
		}
		pending = rest
		for i := range sh {
			for tries := 0; tries < 30 && !now.Before(next[i]); tries++ {
				tk, at, ok := sh[i].Admit(now, 1, false)
				if !ok {
					next[i] = clock.Later(at, now.Add(time.Millisecond))
					break
				}
				took, hint := up.take(now)
				delay := 40 * time.Millisecond
				if !took {
					delay = 2 * time.Millisecond
					hint -= delay // the answer's hint is read when it arrives
				}
				pending = append(pending, answer{at: now.Add(delay), sh: sh[i], tk: tk, ok: took, hint: hint})
			}
		}
		for _, st := range stores {
			st.flush()
		}
		fc.Advance(time.Millisecond)
	}
	first := fakeStart.Add(300*time.Millisecond).UnixNano() / int64(time.Second)
	var early, late, lateAdmitted int
	for w := first; w < first+12; w++ {
		if w < first+5 {
			early += up.refused[w]
			continue
		}
		late += up.refused[w]
		lateAdmitted += up.admitted[w]
	}
	t.Logf("refused in the first 5 windows %d; in the last 7 %d, admitted %d of 70", early, late, lateAdmitted)
	if late > 3 {
		t.Errorf("%d refusals in the 7 windows after the fleet learned the window, want at most 3 (a probe in 4 windows)", late)
	}
	if lateAdmitted < 63 {
		t.Errorf("the fleet had %d of the 70 requests the last 7 windows allow admitted: held back", lateAdmitted)
	}
}

// TestASuspectedWindowHoldsTheFleetButItsTest: a refusal whose wait,
// stated to the millisecond, points at a boundary holds the other
// replicas until that boundary, while the replica that suspects the
// window sends its test before it, as one process would.
func TestASuspectedWindowHoldsTheFleetButItsTest(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	a := st[0].Shared("w", limit.Config{Concurrency: 50, MaxConcurrency: 50})
	b := st[1].Shared("w", limit.Config{Concurrency: 50, MaxConcurrency: 50})
	for range 20 { // the fleet's 20 a second admitted
		now := fc.Now()
		for _, sh := range []limit.Shared{a, b} {
			tk, _, ok := sh.Admit(now, 1, false)
			if !ok {
				continue
			}
			sh.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, now)
			sh.Return(&tk, now)
		}
		fc.Advance(50 * time.Millisecond)
	}
	now := fc.Now()
	boundary := now.Add(600 * time.Millisecond)
	tk, _, ok := a.Admit(now, 1, false)
	if !ok {
		t.Fatal("admit")
	}
	a.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: boundary.Sub(now), PauseUntil: boundary}, now)
	a.Return(&tk, now)
	if _, at, ok := b.Admit(now.Add(time.Millisecond), 1, false); ok || at.Before(boundary) || at.After(boundary.Add(2*time.Millisecond)) {
		t.Fatalf("the other replica admits (%v) or holds until %v; want the boundary, %v on", ok, at.Sub(now), boundary.Sub(now))
	}
	test := a.(*shared).local.PausedUntil() // its own closure's: until its test
	if !test.Before(boundary) {
		t.Fatalf("the suspecting replica holds until %v, not until its test before the boundary", test.Sub(now))
	}
	fc.Set(test)
	if _, at, ok := a.Admit(test, 1, false); !ok {
		t.Fatalf("the test did not go at %v; held until %v", test.Sub(now), at.Sub(now))
	}
}
