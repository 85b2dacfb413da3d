package redisstate

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// hfloat reads a numeric field of key from Redis, after the writer sent
// what it holds.
func hfloat(t *testing.T, st *Store, key, field string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(hget(t, st, key, field), 64)
	if err != nil {
		t.Fatalf("%s %s: %v", key, field, err)
	}
	return v
}

// goLocal sends st local as a slow Redis does, while Redis still answers.
func goLocal(st *Store) { st.failed("slow", errors.New("the test says so")) }

// TestALocalPermitChargesTheSharedBudgetsItsRequestAndTokens: a permit a
// replica takes on its share while Redis is only slow is charged to the
// shared budgets in Redis, one request and its estimated tokens, so the
// replicas still sharing see the room it used.
func TestALocalPermitChargesTheSharedBudgetsItsRequestAndTokens(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", limit.Config{Concurrency: 8, MaxConcurrency: 8})
	now := time.Now()
	tk, _, ok := sh.Admit(now, 1, false)
	if !ok {
		t.Fatal("admit")
	}
	lim := reqLimits(now, 100, 50)
	lim.Tokens = tokLimits(now, 10000, 5000).Tokens
	sh.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: lim}, now)
	sh.Return(&tk, now)
	key := sh.(*shared).state
	reqBefore, tokBefore := hfloat(t, st, key, "r_avail"), hfloat(t, st, key, "t_avail")

	goLocal(st)
	// The share's token bucket starts empty: two seconds on (as the
	// share counts it), 167 tokens have come in (the window's refill
	// read from the headers, 5,000 missing in 60 s).
	t0 := time.Now()
	sh.Admit(t0, 120, false)
	if _, at, ok := sh.Admit(t0.Add(2*time.Second), 120, false); !ok {
		t.Fatalf("a local admit on the share was refused until %v; share %+v, status %s", at.Sub(t0), *sh.(*shared).share, st.Status())
	}
	st.flush()
	// The budgets refill a little meanwhile (100/min, 10,000/min).
	if got := hfloat(t, st, key, "r_avail"); math.Abs(got-(reqBefore-1)) > 0.5 {
		t.Errorf("requests left after a local permit: %.2f, want %.2f less one", got, reqBefore)
	}
	if got := hfloat(t, st, key, "t_avail"); math.Abs(got-(tokBefore-120)) > 30 {
		t.Errorf("tokens left after a local permit of 120: %.1f, want %.1f less 120", got, tokBefore)
	}
}

// TestALocalTicketsLevelIsTheFleets: with three replicas, a permit taken
// on the share goes at the fleet's level: (this replica's permits out
// before it, plus those Redis gave it still out, plus one) times three.
// A named refusal of the first of three local permits, with one from
// Redis out, teaches 6; of the last, 11 (the limit less one: the fleet
// had 12 out).
func TestALocalTicketsLevelIsTheFleets(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	stores := []*Store{newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)}
	heartbeatAll(stores...)
	st := stores[0]
	cfg := limit.Config{Concurrency: 12, MinConcurrency: 1, MaxConcurrency: 12}
	for _, c := range []struct {
		group string
		learn int // which of the three local tickets is refused
		want  int
	}{{"first", 0, 6}, {"last", 2, 11}} {
		sh := st.Shared(c.group, cfg)
		if _, _, ok := sh.Admit(time.Now(), 1, false); !ok { // from Redis, and kept out
			t.Fatal("admit")
		}
		goLocal(st)
		var local []limit.Ticket
		for range 3 {
			tk, _, ok := sh.Admit(time.Now(), 1, false)
			if !ok {
				t.Fatalf("%s: local admit %d refused", c.group, len(local))
			}
			local = append(local, tk)
		}
		now := time.Now()
		tk := local[c.learn]
		sh.Learn(&tk, limit.Report{Status: 429, Verdict: limit.ConcurrencyRefused}, now)
		if got := sh.(*shared).local.View(now).Concurrency; got != c.want {
			t.Errorf("%s local ticket refused for concurrency: the group learned %d, want %d", c.group, got, c.want)
		}
		st.setUp(true)
	}
}

// TestWithOneReplicaALocalTicketCountsRemotePermitsAsOne: alone, a
// replica's local permit goes at its own level: the permits Redis gave it
// still out do not multiply, and the level is its local count.
func TestWithOneReplicaALocalTicketGoesAtItsOwnLevel(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", limit.Config{Concurrency: 8, MinConcurrency: 1, MaxConcurrency: 8})
	if _, _, ok := sh.Admit(time.Now(), 1, false); !ok { // from Redis, kept out
		t.Fatal("admit")
	}
	goLocal(st)
	a, _, okA := sh.Admit(time.Now(), 1, false)
	_, _, okB := sh.Admit(time.Now(), 1, false)
	if !okA || !okB {
		t.Fatal("local admits refused")
	}
	if a.InFlight != 0 {
		t.Fatalf("the first local ticket of one replica went at %d others out, want 0 (its own count)", a.InFlight)
	}
	now := time.Now()
	sh.Learn(&a, limit.Report{Status: 429, Verdict: limit.ConcurrencyRefused}, now)
	if got := sh.(*shared).local.View(now).Concurrency; got != 1 {
		t.Fatalf("a named refusal at level 1 taught %d, want 1", got)
	}
}

// TestAFailedAnswerCountsAtNoLevel: an answer that says nothing about
// capacity (a 500) adds nothing to the shared levels, and its learn call
// keeps the store shared (its short reply is not a failure).
func TestAFailedAnswerCountsAtNoLevel(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", limit.Config{Concurrency: 4, MaxConcurrency: 4})
	now := time.Now()
	tk, _, ok := sh.Admit(now, 1, false)
	if !ok {
		t.Fatal("admit")
	}
	sh.Learn(&tk, limit.Report{Status: 500, Verdict: limit.Failed, Limits: headerparse.Limits{}}, now)
	if st.Status() != "ok" {
		t.Fatal("a learn call with no level degraded the store")
	}
	levels, err := st.rdb().HGetAll(context.Background(), sh.(*shared).levels).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(levels) != 0 {
		t.Fatalf("a failed answer counted in the shared levels: %v", levels)
	}
	tk2, _, ok := sh.Admit(now, 1, false)
	if !ok {
		t.Fatal("admit")
	}
	sh.Learn(&tk2, limit.Report{Status: 200, Verdict: limit.Accepted}, now)
	if levels, _ := st.rdb().HGetAll(context.Background(), sh.(*shared).levels).Result(); len(levels) == 0 {
		t.Fatal("an accepted answer did not count in the shared levels")
	}
}

// TestAShareTakesTheMedianHeaderRateFromRedis: through Redis, the rates
// read from headers that replicas push are kept as readings, and a
// replica gone local paces its share at their median: after readings of
// 10/s, 10/s and 3.3/s, 10/s (the header rate is not a pace learned from
// refusals, which would be taken as it is).
func TestAShareTakesTheMedianHeaderRateFromRedis(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", limit.Config{Concurrency: 8, MaxConcurrency: 8})
	for _, remaining := range []int64{600, 600, 1000} { // (1200 - remaining) / 60 s
		now := time.Now()
		tk, _, ok := sh.Admit(now, 1, false)
		if !ok {
			t.Fatal("admit")
		}
		sh.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: reqLimits(now, 1200, remaining)}, now)
		sh.Return(&tk, now)
	}
	tk, _, ok := sh.Admit(time.Now(), 1, false) // the last reading
	if !ok {
		t.Fatal("admit")
	}
	sh.Return(&tk, time.Now())
	if r := sh.(*shared).shareLimits().reqRate; r < 9.5 || r > 10.5 {
		t.Fatalf("the share's request rate after readings of 10, 10 and 3.3/s: %.2f, want their median, 10", r)
	}
}

// A replica local for slowness divides the shared limits among the
// replicas busy lately, not all those alive: once the others' clients
// are done (no request to admit for a heartbeat and busyWindow), it
// takes the whole, and
// it does so on the share it already has, as soon as a heartbeat says so.
func TestAShareGrowsWhenTheOtherReplicasGoIdle(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	stores := []*Store{newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)}
	heartbeatAll(stores...)
	st := stores[0]
	sh := st.Shared("g", limit.Config{Concurrency: 6, MaxConcurrency: 6})
	tk, _, ok := admit(t, sh) // sees the shared limit
	if !ok {
		t.Fatal("admit")
	}
	sh.Return(&tk, time.Now())
	st.flush()
	goLocal(st)
	takeAll := func() int {
		var got []limit.Ticket
		for range 8 {
			if tk, _, ok := sh.Admit(time.Now(), 1, false); ok {
				got = append(got, tk)
			}
		}
		for i := range got {
			sh.Return(&got[i], time.Now())
		}
		return len(got)
	}
	if n := takeAll(); n != 2 {
		t.Fatalf("with three replicas busy, a local replica took %d permits of the shared 6, want 2", n)
	}
	// The view says so, for /lanes: a third of the shared concurrency.
	if v := sh.View(time.Now()); v.Shared != "degraded" || v.Share == nil || v.Share.Replicas != 3 || v.Share.Concurrency != 2 {
		t.Fatalf("a local replica's view: shared %q, share %+v; want degraded, 1/3 of concurrency 6", v.Shared, v.Share)
	}
	// Their own loops may have said busy up to a heartbeat after they
	// last asked; st has requests to admit all along.
	for end := time.Now().Add(heartbeatEvery + busyWindow + 100*time.Millisecond); time.Now().Before(end); {
		st.ask(time.Now())
		time.Sleep(100 * time.Millisecond)
	}
	for _, other := range stores[1:] { // alive, nothing to admit
		other.heartbeat(time.Now())
	}
	st.heartbeat(time.Now()) // it asked just now
	if n := st.sharers(time.Now()); n != 1 {
		t.Fatalf("the others idle for %v, the replica shares with %d", heartbeatEvery+busyWindow, n)
	}
	if st.Replicas() != 3 {
		t.Fatalf("idle replicas are still alive: counted %d, want 3", st.Replicas())
	}
	goLocal(st) // it may have rejoined meanwhile: Redis was never slow
	if n := takeAll(); n != 6 {
		t.Fatalf("the others idle, a local replica took %d permits of the shared 6, want all", n)
	}
}

// A replica that has just become busy divides by every replica alive, not
// by those Redis last said were busy: replicas whose clients start
// together have not told each other yet. Once busy for busyWindow it
// divides by the busy ones.
func TestAReplicaJustBusySharesWithEveryReplicaAlive(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	stores := []*Store{newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)}
	for range 2 { // alive, none busy
		for _, st := range stores {
			st.heartbeat(time.Now())
		}
	}
	st := stores[0]
	t0 := time.Now()
	st.ask(t0)
	if n := st.sharers(t0); n != 3 {
		t.Fatalf("just busy, with no replica said busy, it shares with %d, want all 3 alive", n)
	}
	at := t0
	for at.Sub(t0) <= busyWindow { // busy all along
		at = at.Add(500 * time.Millisecond)
		st.ask(at)
	}
	if n := st.sharers(at); n != 1 {
		t.Fatalf("busy for %v while Redis says no other is, it shares with %d, want 1", at.Sub(t0), n)
	}
	later := at.Add(heartbeatEvery + time.Millisecond) // nothing to admit for a heartbeat: a new run
	st.ask(later)
	if n := st.sharers(later); n != 3 {
		t.Fatalf("busy again after a pause, it shares with %d, want all 3 alive", n)
	}
	for _, other := range stores[1:] { // the others have requests too
		other.ask(time.Now())
		other.heartbeat(time.Now())
	}
	st.heartbeat(time.Now())
	end := later
	for end.Sub(later) <= busyWindow { // busy all along again
		end = end.Add(400 * time.Millisecond)
		st.ask(end)
	}
	if n := st.sharers(end); n != 3 {
		t.Fatalf("busy for %v with both others said busy, it shares with %d, want 3", end.Sub(later), n)
	}
}
