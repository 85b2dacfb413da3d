package state

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// fakeShared is a pool's state that admits everything and shows the
// view it is given.
type fakeShared struct {
	limit.Shared // nil: the methods not written here are not called
	view         limit.View
	knows        bool
	seq          uint64
	cfg          limit.Config
}

func (f *fakeShared) Admit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	f.seq++
	return limit.Ticket{Dispatched: now, Seq: f.seq, Cost: cost}, time.Time{}, true
}
func (f *fakeShared) Learn(*limit.Ticket, limit.Report, time.Time) {}
func (f *fakeShared) Return(*limit.Ticket, time.Time)              {}
func (f *fakeShared) PausedUntil() time.Time                       { return time.Time{} }
func (f *fakeShared) View(time.Time) limit.View                    { return f.view }
func (f *fakeShared) Knows() bool                                  { return f.knows }
func (f *fakeShared) Forget()                                      { f.view = limit.View{} }
func (f *fakeShared) Configure(c limit.Config)                     { f.cfg = c }

var opened = map[string]*Store{}

var t0 = time.Date(2026, 12, 6, 14, 2, 0, 0, time.UTC)

// bookAt opens the state file at path with its book's clock at now.
func bookAt(t *testing.T, path string, now time.Time) (*Store, *Book) {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Limits()
	if err != nil {
		t.Fatal(err)
	}
	b.now = func() time.Time { return now }
	b.began = time.Time{}
	return s, b
}

// learnedThen makes a pool in a fresh file, shows it view through one
// answer at t0, and closes the file as a SIGTERM would.
func learnedThen(t *testing.T, view limit.View) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	s, b := bookAt(t, path, t0)
	inner := &fakeShared{view: view}
	sh := b.Shared("pool", limit.Config{}, func(limit.Config) limit.Shared { return inner })
	tk, _, _ := sh.Admit(t0, 1, true)
	sh.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, t0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// restart opens path again at now (closing it when the test ends, or
// before the next restart of the same test) and makes the pool anew.
func restart(t *testing.T, path string, now time.Time) (limit.Shared, *fakeShared, limit.Config) {
	t.Helper()
	if c := opened[path]; c != nil {
		c.Close()
	}
	s, b := bookAt(t, path, now)
	opened[path] = s
	t.Cleanup(func() { s.Close(); delete(opened, path) })
	inner := &fakeShared{}
	sh := b.Shared("pool", limit.Config{}, func(c limit.Config) limit.Shared { inner.cfg = c; return inner })
	return sh, inner, inner.cfg
}

func TestARestartedPoolIsPacedByTheBudgetItLearned(t *testing.T) {
	path := learnedThen(t, limit.View{Concurrency: 12, Requests: limit.BudgetView{Known: true, Limit: 4, PerSecond: 2, Available: 0}})
	now := t0.Add(time.Second) // 2 refilled since
	sh, _, cfg := restart(t, path, now)
	if cfg.Limits.Concurrency != 12 || !cfg.Limits.Start {
		t.Errorf("the new pool starts at concurrency %d (start %v), want the 12 it had", cfg.Limits.Concurrency, cfg.Limits.Start)
	}
	if v := sh.View(now); !strings.HasPrefix(v.Shared, "restored from state at 14:02:00 UTC") || v.Requests.PerSecond != 2 {
		t.Fatalf("view %q, %v", v.Shared, v.Requests)
	}
	for i := range 2 {
		if _, _, ok := sh.Admit(now, 1, false); !ok {
			t.Fatalf("request %d of the 2 the budget refilled since the snapshot was held", i+1)
		}
	}
	_, at, ok := sh.Admit(now, 1, false)
	if ok || at.Sub(now) != 500*time.Millisecond {
		t.Fatalf("a third at once: %v, next at +%v; want held 0.5 s (2 a second)", ok, at.Sub(now))
	}
}

func TestABucketRestoreEndsAtARefusalOrOnceThePoolLearnedForAWhile(t *testing.T) {
	view := limit.View{Requests: limit.BudgetView{Known: true, Limit: 1, PerSecond: 1}}
	path := learnedThen(t, view)
	now := t0.Add(time.Second)
	sh, inner, _ := restart(t, path, now)
	sh.Admit(now, 1, false)
	if _, _, ok := sh.Admit(now, 1, false); ok {
		t.Fatal("not paced after the restart")
	}
	inner.knows = true
	sh.View(now) // the pool learned from the upstream at now
	if _, _, ok := sh.Admit(now.Add(5*time.Second), 1, false); !ok {
		t.Fatal("held past what the restored budget allows")
	}
	if _, _, ok := sh.Admit(now.Add(5*time.Second), 1, false); ok {
		t.Fatal("the restored cap ended before confirmFor")
	}
	if _, _, ok := sh.Admit(now.Add(confirmFor+time.Second), 1, false); !ok {
		t.Fatal("held by the restored budget confirmFor after the pool learned anew")
	}

	sh2, _, _ := restart(t, learnedThen(t, view), now)
	tk, _, _ := sh2.Admit(now, 1, false)
	sh2.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused}, now)
	for range 3 {
		if _, _, ok := sh2.Admit(now, 1, false); !ok {
			t.Fatal("a refusal did not end the restored budget: the upstream's refusals are the ground truth")
		}
	}
}

func TestARestoredPauseHoldsUntilItEnds(t *testing.T) {
	path := learnedThen(t, limit.View{PausedUntil: t0.Add(time.Minute), Requests: limit.BudgetView{Known: true, Limit: 9, PerSecond: 9, Available: 9}})
	sh, _, _ := restart(t, path, t0.Add(10*time.Second))
	if _, at, ok := sh.Admit(t0.Add(10*time.Second), 1, false); ok || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("during the restored pause: %v until %v", ok, at)
	}
	if u := sh.PausedUntil(); !u.Equal(t0.Add(time.Minute)) {
		t.Fatalf("PausedUntil %v", u)
	}
	late, _, _ := restart(t, path, t0.Add(2*time.Minute))
	if _, _, ok := late.Admit(t0.Add(2*time.Minute), 1, false); !ok {
		t.Fatal("a pause that ended before the restart holds the pool")
	}
}

func TestARestoredWindowWaitsForItsBoundary(t *testing.T) {
	s := saved{At: t0, WindowAllowance: 3, WindowLength: 10 * time.Second, WindowStart: t0.Add(-2 * time.Second), WindowCount: 2, Clean: true}
	r := &remembered{Shared: &fakeShared{}, book: &Book{dirty: map[string]*remembered{}}}
	now := t0.Add(time.Second)
	r.restore(s, now)
	if _, _, ok := r.Admit(now, 1, false); !ok {
		t.Fatal("the window's last request was held")
	}
	_, at, ok := r.Admit(now, 1, false)
	if boundary := t0.Add(8 * time.Second); ok || !at.Equal(boundary) {
		t.Fatalf("a spent window: %v, next at %v; want held to its boundary %v", ok, at, boundary)
	}
	next := t0.Add(8 * time.Second)
	for i := range 3 {
		if _, _, ok := r.Admit(next, 1, false); !ok {
			t.Fatalf("request %d of the next window held", i+1)
		}
	}
	if _, _, ok := r.Admit(next, 1, false); ok {
		t.Fatal("a fourth in a window of 3")
	}
}

func TestAfterAKillTheRunningWindowIsProbedOneRequestAtATime(t *testing.T) {
	s := saved{At: t0, WindowAllowance: 5, WindowLength: 10 * time.Second, WindowStart: t0.Add(-time.Second), WindowCount: 1}
	r := &remembered{Shared: &fakeShared{}, book: &Book{dirty: map[string]*remembered{}}}
	now := t0.Add(time.Second)
	r.restore(s, now)
	probe, _, ok := r.Admit(now, 1, false)
	if !ok {
		t.Fatal("the probe was held")
	}
	if _, _, ok := r.Admit(now, 1, false); ok {
		t.Fatal("a second request went while the probe's answer was awaited")
	}
	r.Learn(&probe, limit.Report{Status: 200, Verdict: limit.Accepted}, now)
	r.Return(&probe, now)
	probe, _, ok = r.Admit(now, 1, false)
	if !ok {
		t.Fatal("the next probe was held after an admitted one")
	}
	r.Learn(&probe, limit.Report{Status: 429, Verdict: limit.RateRefused}, now)
	r.Return(&probe, now)
	_, at, ok := r.Admit(now.Add(time.Second), 1, false)
	if boundary := t0.Add(9 * time.Second); ok || !at.Equal(boundary) {
		t.Fatalf("after the refused probe: %v, next at %v; want held to the boundary %v", ok, at, boundary)
	}
}

func TestForgetDropsWhatWasKept(t *testing.T) {
	path := learnedThen(t, limit.View{Requests: limit.BudgetView{Known: true, Limit: 1, PerSecond: 1}})
	s, b := bookAt(t, path, t0)
	inner := &fakeShared{}
	sh := b.Shared("pool", limit.Config{}, func(limit.Config) limit.Shared { return inner })
	sh.Forget()
	if v := sh.View(t0); v.Shared != "" {
		t.Fatalf("after Forget the view says %q", v.Shared)
	}
	s.Close()
	s2, b2 := bookAt(t, path, t0)
	defer s2.Close()
	if _, ok := b2.load("pool"); ok {
		t.Fatal("the snapshot is still in the file: a forgotten pool would be restored")
	}
}

func TestTheFileNamesNoPoolInClear(t *testing.T) {
	if k := string(fileKey("route\x00credhash\x00gpt-4o")); strings.Contains(k, "gpt") || len(k) != 32 {
		t.Fatalf("file key %q", k)
	}
}

func TestASpentQuotaIsProbedByOneRequestAfterARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, b := bookAt(t, path, t0)
	sh := b.Shared("pool", limit.Config{}, func(limit.Config) limit.Shared { return &fakeShared{} })
	tk, _, _ := sh.Admit(t0, 1, true)
	rep := limit.Report{Status: 429, Verdict: limit.Accepted}
	rep.Quota.Spent, rep.Quota.Renews = true, t0.Add(time.Hour)
	sh.Learn(&tk, rep, t0)
	s.Close()

	r, _, _ := restart(t, path, t0.Add(time.Minute))
	now := t0.Add(time.Minute)
	if _, _, ok := r.Admit(now, 1, false); ok {
		t.Fatal("a request went while others were under way, with the quota still said spent")
	}
	probedByOne(t, r, now, "the quota still said spent")

	late, _, _ := restart(t, path, t0.Add(2*time.Hour))
	if _, _, ok := late.Admit(t0.Add(2*time.Hour), 1, false); !ok {
		t.Fatal("a quota past its renewal holds the pool")
	}
}

// TestAKeptPoolStillStartsFromWhatWasInFlight: lanequeue starts a pool of
// models found sharing one limit from what they had in flight
// (limit.Memory.StartFrom); the wrapper passes it on.
func TestAKeptPoolStillStartsFromWhatWasInFlight(t *testing.T) {
	s, b := bookAt(t, filepath.Join(t.TempDir(), "s.db"), t0)
	defer s.Close()
	sh := b.Shared("k", limit.Config{}, func(c limit.Config) limit.Shared { return limit.NewMemory(c) })
	from, ok := sh.(interface {
		StartFrom(time.Time, int, float64, float64)
	})
	if !ok {
		t.Fatal("the kept state hides StartFrom")
	}
	from.StartFrom(time.Now(), 40, 1, 0)
	if c := sh.View(t0).Concurrency; c != 40 {
		t.Fatalf("concurrency %d after StartFrom(40), want 40", c)
	}
}

// TestALongRestoredPauseIsProbedNotObeyed: a pause longer than a rate's
// (an hour, from an upstream's words or a file someone wrote) is tried
// by one request rather than held.
func TestALongRestoredPauseIsProbedNotObeyed(t *testing.T) {
	path := learnedThen(t, limit.View{PausedUntil: t0.Add(time.Hour)})
	now := t0.Add(time.Second)
	sh, _, _ := restart(t, path, now)
	probedByOne(t, sh, now, "an hour's restored pause")
}

// probedByOne checks that what held sh (why) is tried by one request:
// it goes alone, a second waits for its answer, and its admission lets
// the rest go.
func probedByOne(t *testing.T, sh limit.Shared, now time.Time, why string) {
	t.Helper()
	probe, _, ok := sh.Admit(now, 1, true)
	if !ok {
		t.Fatalf("no request went to see past %s", why)
	}
	if _, _, ok := sh.Admit(now, 1, true); ok {
		t.Fatal("a second request went before the probe's answer")
	}
	sh.Learn(&probe, limit.Report{Status: 200, Verdict: limit.Accepted}, now)
	if _, _, ok := sh.Admit(now, 1, false); !ok {
		t.Fatal("held after the probe was admitted")
	}
}

func TestAWindowsRequestsAreCountedInTheFileBeforeTheyGo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, b := bookAt(t, path, t0)
	defer s.Close()
	inner := &fakeShared{view: withWindow(limit.View{}, 40, 10*time.Second)}
	sh := b.Shared("pool", limit.Config{}, func(limit.Config) limit.Shared { return inner })
	now := t0
	first, _, _ := sh.Admit(now, 1, false)
	sh.Learn(&first, accepted, now) // the pool knows its window: 40 per 10 s
	sent, held := 1, 0
	for sent < 26 {
		_, at, ok := sh.Admit(now, 1, false)
		if !ok {
			if !at.Equal(now.Add(aheadWait)) {
				t.Fatalf("held until +%v, want aheadWait for the write", at.Sub(now))
			}
			held++
			time.Sleep(time.Millisecond) // the book writes on its own goroutine
			continue
		}
		sent++
		if f, _ := b.load("pool"); f.WindowAhead < sent {
			t.Fatalf("%d went in the window while the file counted %d: a kill -9 now would lose some", sent, f.WindowAhead)
		}
	}
	if held == 0 {
		t.Fatal("no request waited for the file to count it")
	}
	f, _ := b.load("pool")
	if step := 40 / 20; f.WindowAhead > sent+step {
		t.Fatalf("the file counts %d for %d sent: ahead by more than a step of %d", f.WindowAhead, sent, step)
	}
	// A kill -9 here: the pool made from the file sends what it leaves of
	// the window and waits for the boundary, with nothing to probe.
	r := restoredAt(f, now.Add(time.Second), &fakeShared{})
	for i := range 40 - f.WindowAhead {
		if _, _, ok := r.Admit(now.Add(time.Second), 1, false); !ok {
			t.Fatalf("request %d of the %d the file leaves in the window held", i+1, 40-f.WindowAhead)
		}
	}
	if _, at, ok := r.Admit(now.Add(time.Second), 1, false); ok || !at.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("past the window's allowance: %v, next at +%v; want held to the boundary +10s", ok, at.Sub(t0))
	}
}

func TestASharedLimitFoundIsKeptForTheNextProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, b := bookAt(t, path, t0)
	sh := b.Shared("pool-b", limit.Config{}, func(limit.Config) limit.Shared { return &fakeShared{} })
	sh.(interface{ PutJoined(string) }).PutJoined("pool-a")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, b2 := bookAt(t, path, t0.Add(time.Minute))
	defer s2.Close()
	again := b2.Shared("pool-b", limit.Config{}, func(limit.Config) limit.Shared { return &fakeShared{} })
	j := again.(interface{ Joined(string) bool })
	if !j.Joined("pool-a") || j.Joined("pool-c") {
		t.Fatalf("after a restart: joined pool-a %v, pool-c %v; want true, false", j.Joined("pool-a"), j.Joined("pool-c"))
	}
	again.Forget()
	if j.Joined("pool-a") {
		t.Fatal("a forgotten pool still pools with the one it was found sharing")
	}
}

// windowUpstream admits allowance requests per window of length, a window
// beginning at the first request after the last one ended (as Redis INCR
// with EXPIRE counts).
type windowUpstream struct {
	allowance int
	length    time.Duration
	start     time.Time
	count     int
}

func (u *windowUpstream) admit(at time.Time) bool {
	if u.start.IsZero() || !at.Before(u.start.Add(u.length)) {
		u.start, u.count = at, 0
	}
	u.count++
	return u.count <= u.allowance
}

// restoredShortRun drives a pool restored with a window of restoredLen
// against 10 s windows of 20 (the running one began at t0 and is spent)
// with endless demand for a minute, answers answerIn after their dispatch
// (refusals in 50 ms);
// it returns what the upstream admitted and refused, and the window's
// length the pool would write for the next process.
func restoredShortRun(t *testing.T, restoredLen, answerIn time.Duration) (admitted, refused int, kept time.Duration) {
	t.Helper()
	up := &windowUpstream{allowance: 20, length: 10 * time.Second, start: t0, count: 20}
	now := t0.Add(time.Second)
	r := restoredAt(saved{At: t0, WindowAllowance: 20, WindowLength: restoredLen, WindowStart: t0, WindowCount: 20, Clean: true}, now, &fakeShared{})
	type out struct {
		tk limit.Ticket
		ok bool
		at time.Time
	}
	var flying []out
	for end := t0.Add(time.Minute); now.Before(end); now = now.Add(10 * time.Millisecond) {
		for len(flying) > 0 && !flying[0].at.After(now) {
			o := flying[0]
			flying = flying[1:]
			rep := accepted
			if !o.ok {
				rep = limit.Report{Status: 429, Verdict: limit.RateRefused}
			}
			r.Learn(&o.tk, rep, now)
			r.Return(&o.tk, now)
		}
		for range 50 { // at most 50 in flight, as a client at -j 50
			if len(flying) >= 50 {
				break
			}
			tk, _, ok := r.Admit(now, 1, false)
			if !ok {
				break
			}
			in := up.admit(now)
			if in {
				admitted++
			} else {
				refused++
			}
			at := now.Add(50 * time.Millisecond) // a refusal comes at once
			if in {
				at = now.Add(answerIn)
			}
			flying = append(flying, out{tk, in, at})
			slices.SortStableFunc(flying, func(a, b out) int { return a.at.Compare(b.at) })
		}
	}
	return admitted, refused, r.last.WindowLength
}

func TestARestoredWindowReadShortLearnsItsLengthAtItsFirstEarlyRoll(t *testing.T) {
	// Read right (10 s and a little): the windows at 10, 20, ..., 50 s.
	if admitted, refused, _ := restoredShortRun(t, 10*time.Second+50*time.Millisecond, 50*time.Millisecond); admitted != 100 || refused != 0 {
		t.Fatalf("a window restored at its length: %d admitted, %d refused in a minute; want 100, 0", admitted, refused)
	}
	// Read short (8 s): the first roll comes early and its burst is
	// refused; the boundary is then knocked for, and the window's length
	// taken from where it opened, so the later rolls come on time. Waiting
	// out the early window instead (to 16 s, then 32 and 48) admits 60.
	admitted, refused, kept := restoredShortRun(t, 8*time.Second, 50*time.Millisecond)
	if admitted < 100 {
		t.Errorf("a window restored short: %d admitted in a minute, want the 100 of five windows", admitted)
	}
	if refused > 30 {
		t.Errorf("a window restored short: %d refused, want at most the early burst (20) and the knocks to the boundary", refused)
	}
	if kept < 10*time.Second || kept > 10*time.Second+knockEvery {
		t.Errorf("a window restored short is written as %v long, want the 10 s the knocks found", kept)
	}
	// Read at half the length: the window is not rolled on while its
	// boundary is knocked for (rolled on, at 5 s, it would be refused again).
	if admitted, refused, kept := restoredShortRun(t, 5*time.Second, 50*time.Millisecond); admitted < 100 || refused > 40 || kept > 10*time.Second+knockEvery {
		t.Errorf("a window restored at half its length: %d admitted, %d refused, written as %v long; want 100, at most 40, about 10 s", admitted, refused, kept)
	}
	// Answers of 2 s: the knock that opens the window says so only when
	// its answer comes, and the length is taken from when it went.
	if admitted, _, kept := restoredShortRun(t, 8*time.Second, 2*time.Second); admitted < 100 || kept > 10*time.Second+knockEvery {
		t.Errorf("a window restored short, answers of 2 s: %d admitted, written as %v long; want 100 and at most 10.25 s", admitted, kept)
	}
}

// TestAKnockHeldApartFromTheRefusalLearnsNoLength: the first request after
// a roll refused, and the next admitted only 30 s later (something else
// held the pool): that bounds no boundary, and the length stays as read.
func TestAKnockHeldApartFromTheRefusalLearnsNoLength(t *testing.T) {
	now := t0.Add(time.Second)
	r := restoredAt(saved{At: t0, WindowAllowance: 20, WindowLength: 8 * time.Second, WindowStart: t0, WindowCount: 20, Clean: true}, now, &fakeShared{})
	now = t0.Add(8 * time.Second)
	tk, _, ok := r.Admit(now, 1, false)
	if !ok {
		t.Fatal("the first request after the roll was held")
	}
	r.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused}, now)
	if !r.win.early {
		t.Fatal("the refused first request after a roll did not mark the roll early")
	}
	now = now.Add(30 * time.Second)
	tk, _, ok = r.Admit(now, 1, false)
	if !ok {
		t.Fatal("no knock 30 s later")
	}
	r.Learn(&tk, accepted, now)
	if r.win.length != 8*time.Second || r.win.early {
		t.Fatalf("a knock 30 s after the refusal: length %v, early %v; want 8s as read, and the window open", r.win.length, r.win.early)
	}
}
