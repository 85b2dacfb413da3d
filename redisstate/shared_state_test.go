package redisstate

import (
	"context"
	"crypto/sha1"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// TestTheViewCountsThePermitsOutThroughRedis: while Redis is shared the
// group's view shows the permits out fleet-wide, one more after each
// admission and one fewer after each return, and before any reply the
// local concurrency limit, not 0.
func TestTheViewCountsThePermitsOutThroughRedis(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", limit.Config{Concurrency: 3, MaxConcurrency: 3})
	if v := sh.View(time.Now()); v.Concurrency != 3 || v.InFlight != 0 || v.Shared != "ok" {
		t.Fatalf("view before any admission: concurrency %d, in flight %d, shared %q; want 3, 0, ok", v.Concurrency, v.InFlight, v.Shared)
	}
	var tks []limit.Ticket
	for i := 1; i <= 2; i++ {
		tk, _, ok := admit(t, sh)
		if !ok {
			t.Fatal("admit")
		}
		tks = append(tks, tk)
		if v := sh.View(time.Now()); v.InFlight != i {
			t.Fatalf("after %d admissions the view shows %d in flight", i, v.InFlight)
		}
	}
	for i := range tks {
		sh.Return(&tks[i], time.Now())
		if v, want := sh.View(time.Now()), 1-i; v.InFlight != want {
			t.Fatalf("after %d returns the view shows %d in flight, want %d", i+1, v.InFlight, want)
		}
	}
}

// TestATicketSaysWhetherABudgetHadRoomOrAPacedIt: a ticket Redis gave
// says Room when a budget learned from headers had room for it, and
// Paced when a request pace learned from refusals admitted it; a group
// that knows no budget gives neither.
func TestATicketSaysWhetherABudgetHadRoomOrAPacedIt(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	fresh := st.Shared("fresh", cfg)
	tk, _, ok := admit(t, fresh)
	if !ok || tk.Room || tk.Paced {
		t.Fatalf("a group knowing nothing: ok %v room %v paced %v; want true, false, false", ok, tk.Room, tk.Paced)
	}
	fresh.Return(&tk, time.Now())

	headers := st.Shared("headers", cfg)
	now := time.Now()
	tk, _, _ = headers.Admit(now, 1, false)
	headers.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: reqLimits(now, 600, 500)}, now)
	headers.Return(&tk, now)
	tk, _, ok = admit(t, headers)
	if !ok || !tk.Room || tk.Paced {
		t.Fatalf("a window from headers with room: ok %v room %v paced %v; want true, true, false", ok, tk.Room, tk.Paced)
	}
	headers.Return(&tk, time.Now())

	paced := st.Shared("paced", cfg)
	learnWindow(t, st, paced.(*shared), "x", true, 100, 100)
	tk, _, ok = admit(t, paced)
	if !ok || tk.Room || !tk.Paced {
		t.Fatalf("a pace learned from refusals: ok %v room %v paced %v; want true, false, true", ok, tk.Room, tk.Paced)
	}
	paced.Return(&tk, time.Now())
}

// TestADegradedReplicasTokenShareIsTheSharedRate: the token bucket a
// replica uses while Redis is away fills at the shared token rate (per
// second, as Redis keeps it) divided by the replicas: a request waits
// for its tokens at that rate.
func TestADegradedReplicasTokenShareIsTheSharedRate(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", limit.Config{Concurrency: 8, MaxConcurrency: 8})
	now := time.Now()
	tk, _, _ := sh.Admit(now, 1, false)
	sh.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: tokLimits(now, 60000, 50000)}, now)
	sh.Return(&tk, now)
	tk, _, ok := admit(t, sh) // the shared limits as Redis has them now
	if !ok {
		t.Fatal("admit")
	}
	sh.Return(&tk, time.Now())
	rate, err := strconv.ParseFloat(hget(t, st, sh.(*shared).state, "t_rate"), 64)
	if err != nil || rate <= 0 {
		t.Fatalf("no shared token rate (%q, %v)", hget(t, st, sh.(*shared).state, "t_rate"), err)
	}
	srv.stop()
	now = time.Now()
	_, at, ok := sh.Admit(now, 100, false) // the share's bucket starts empty
	if st.Status() != "degraded" {
		t.Fatal("not degraded with Redis gone")
	}
	want := time.Duration(100 / rate * float64(time.Second))
	if got := at.Sub(now); ok || got < want*9/10 || got > want*11/10 {
		t.Fatalf("100 tokens while degraded: ok %v, wait %v; want a wait of %v at the shared %.1f tokens/s", ok, got, want, rate)
	}
}

// TestAWaiterAskingAgainWithinASecondKeepsItsPlace: a replica's refused
// Admits less than a second apart, up to a second included, are one
// waiter, whose age orders it before replicas that started waiting
// later; one asking after more than a second is a new waiter.
func TestAWaiterAskingAgainWithinASecondKeepsItsPlace(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	for _, c := range []struct {
		gap   time.Duration
		bGoes bool // b's waiter is older than c's
	}{{time.Second, true}, {time.Second + time.Millisecond, false}} {
		fc := clock.NewFake(fakeStart)
		st := fakeStores(t, srv.url(), fc, 3)
		one := limit.Config{Concurrency: 1, MaxConcurrency: 1}
		group := "g" + c.gap.String()
		sa, sb, sc := st[0].Shared(group, one), st[1].Shared(group, one), st[2].Shared(group, one)
		held := admitOn(t, fc, sa, 1)
		t0 := fc.Now()
		if _, _, ok := sb.Admit(t0, 1, false); ok { // b starts waiting
			t.Fatal("b admitted past the limit")
		}
		fc.Advance(time.Millisecond)
		if _, _, ok := sc.Admit(fc.Now(), 1, false); ok { // c starts waiting later
			t.Fatal("c admitted past the limit")
		}
		fc.Advance(time.Millisecond) // Redis' clock: c's ask is older than b's next
		// b asks again, its clock c.gap after its first ask.
		if _, _, ok := sb.Admit(t0.Add(c.gap), 1, false); ok {
			t.Fatal("b admitted past the limit")
		}
		sa.Return(&held, fc.Now())
		st[0].flush()
		if _, _, ok := sc.Admit(fc.Now(), 1, false); ok == c.bGoes {
			t.Fatalf("b asked again %v after its first ask: c admitted %v, want %v", c.gap, ok, !c.bGoes)
		}
	}
}

// TestASettleGivesBackTheUnusedTokens: settling a ticket whose answer
// used fewer tokens than estimated gives the difference back to the
// shared budget, and one that used more takes the excess from it.
func TestASettleGivesBackTheUnusedTokens(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := newFakeStore(t, srv.url(), fc, fc)
	sh := st.Shared("g", limit.Config{Concurrency: 8, MaxConcurrency: 8})
	now := fc.Now()
	tk, _, _ := sh.Admit(now, 1, false)
	sh.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: tokLimits(now, 1_000_000, 500_000)}, now)
	sh.Return(&tk, now)
	avail := func() float64 {
		v, err := strconv.ParseFloat(hget(t, st, sh.(*shared).state, "t_avail"), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, used := range []int64{400, 5000} {
		fc.Advance(time.Second) // the window refills before the admission, not between the reads
		tk, _, ok := sh.Admit(fc.Now(), 1000, false)
		if !ok {
			t.Fatal("admit")
		}
		before := avail()
		sh.Settle(&tk, used)
		sh.Return(&tk, fc.Now())
		st.flush()
		if got, want := avail(), before+float64(1000-used); got != want {
			t.Fatalf("used %d of 1000: t_avail %.0f after the settle, %.0f before; want %.0f", used, got, before, want)
		}
	}
}

// TestLeasesExpireOnRedisClock: a replica renewing or counting a lease
// sets its expiry on Redis' clock, however far its own clock is from it.
func TestLeasesExpireOnRedisClock(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	ctx := context.Background()
	const ahead = time.Hour // Redis' clock, as the last reply showed it
	st.clockOffset.Store(ahead.Milliseconds())
	st.hold("renewed", "k1")
	if err := st.renew(); err != nil {
		t.Fatal(err)
	}
	st.addLater("counted", "k2")
	st.flush()
	for _, c := range []struct{ key, lease string }{{"k1", "renewed"}, {"k2", "counted"}} {
		score, err := st.rdb().ZScore(ctx, c.key, c.lease).Result()
		if err != nil {
			t.Fatalf("lease %s: %v", c.lease, err)
		}
		want := float64(time.Now().Add(ahead + time.Minute).UnixMilli())
		if score < want-5000 || score > want+5000 {
			t.Fatalf("lease %s expires at %.0f, want about %.0f (a minute on Redis' clock, an hour ahead)", c.lease, score, want)
		}
	}
}

// TestTheUpGaugeFollowsTheStatus: llmproxy_redis_up is 1 while the
// replica shares through Redis, 0 once it went local, and 1 again once
// it rejoined.
func TestTheUpGaugeFollowsTheStatus(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	if g := testutil.ToFloat64(st.upGauge); st.Status() != "ok" || g != 1 {
		t.Fatalf("with Redis up: status %s, gauge %v", st.Status(), g)
	}
	st.failed("test", errString("gone for a moment"))
	if g := testutil.ToFloat64(st.upGauge); st.Status() != "degraded" || g != 0 {
		t.Fatalf("after a failed call: status %s, gauge %v", st.Status(), g)
	}
	if !st.rejoin() {
		t.Fatal("no rejoin")
	}
	if g := testutil.ToFloat64(st.upGauge); st.Status() != "ok" || g != 1 {
		t.Fatalf("after the rejoin: status %s, gauge %v", st.Status(), g)
	}
}

// TestAHeartbeatCountsAReplicaStartedLater: leases held or not and
// however long their TTL, a replica says it is alive and reads how many
// are, when it starts, an eighth of heartbeatEvery after, then twice as
// long each time up to heartbeatEvery: one that starts soon after it is
// counted at its first beat; one that starts later, within heartbeatEvery.
func TestAHeartbeatCountsAReplicaStartedLater(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	a := newFakeStore(t, srv.url(), fc, fc)
	if n := a.Replicas(); n != 1 {
		t.Fatalf("a alone counts %d replicas", n)
	}
	b := newFakeStore(t, srv.url(), fc, fc)
	// The beats' times from a's start, and how many replicas a counts at
	// each: c starts between the third beat and the fourth.
	const e = heartbeatEvery / 8
	for i, beat := range []struct {
		at    time.Duration
		count int
	}{{e, 2}, {3 * e, 2}, {7 * e, 2}, {15 * e, 3}, {23 * e, 3}} {
		fc.Set(fakeStart.Add(beat.at - time.Millisecond))
		if i == 3 {
			b.die()
			newFakeStore(t, srv.url(), fc, fc)
		}
		if n := counterValue(a, "heartbeat"); n != float64(i+1) {
			t.Fatalf("%d heartbeats %v after the start, want %d", int(n), beat.at-time.Millisecond, i+1)
		}
		fc.Set(fakeStart.Add(beat.at))
		for deadline := time.Now().Add(10 * time.Second); counterValue(a, "heartbeat") != float64(i+2) || a.Replicas() != beat.count; {
			if time.Now().After(deadline) {
				t.Fatalf("%v after the start: %v heartbeats, %d replicas counted; want %d and %d",
					beat.at, counterValue(a, "heartbeat"), a.Replicas(), i+2, beat.count)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestANeverSlowStoreRejoinsWhenRedisAnswers: with Slow zero (never
// too slow) a degraded replica rejoins at the first ping that answers.
func TestANeverSlowStoreRejoinsWhenRedisAnswers(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := storeOn(t, Config{URL: srv.url(), Timeout: 10 * time.Second}) // a ping a loaded machine slows still answers
	srv.stop()
	admit(t, st.Shared("g", groupCfg))
	if st.Status() != "degraded" {
		t.Fatal("not degraded with Redis gone")
	}
	srv.start()
	waitUp(t, st)
}

// TestAPermitTakenWhileAwayIsCountedAfterTheRejoin: permits taken while
// Redis was away are counted there by their own leases, sent as they are
// taken or at the rejoin, and stay counted beside the next admission's.
func TestAPermitTakenWhileAwayIsCountedAfterTheRejoin(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", limit.Config{Concurrency: 4, MaxConcurrency: 4})
	first, _, _ := admit(t, sh)
	sh.Return(&first, time.Now())
	st.flush() // its lease is removed from Redis
	st.failed("test", errString("gone for a moment"))
	away, _, ok := admit(t, sh)
	if !ok || away.Lease != "" {
		t.Fatalf("degraded admit: ok %v lease %q", ok, away.Lease)
	}
	if !st.rejoin() {
		t.Fatal("no rejoin")
	}
	tk, _, ok := admit(t, sh)
	if !ok || tk.Lease == "" {
		t.Fatalf("admit after the rejoin: ok %v lease %q", ok, tk.Lease)
	}
	if n, err := st.rdb().ZCard(context.Background(), sh.(*shared).leases).Result(); err != nil || n != 2 {
		t.Fatalf("Redis counts %d permits (%v), want the one from while away and the new one", n, err)
	}
}

// TestASlowPingKeepsTheReplicaLocal: a degraded replica whose ping
// answers, but slower than Slow, stays local: Redis is there but would
// hold up every request.
func TestASlowPingKeepsTheReplicaLocal(t *testing.T) {
	t.Parallel()
	slow := startSlowRedis(t, startServer(t))
	st, err := New(Config{URL: slow.url(), Timeout: 10 * time.Second, Slow: DefaultSlow})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Every ping answers, 100 ms late: two rejoin periods, and more, with
	// the replica local throughout.
	slow.hold(100 * time.Millisecond)
	st.failed("test", errString("gone for a moment"))
	for end := time.Now().Add(3 * minRejoinWait); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if st.Status() == "ok" {
			t.Fatal("the replica rejoined on a ping slower than Slow")
		}
	}
	slow.hold(0)
	waitUp(t, st) // and a ping in time brings it back
}

// countScriptRuns starts counting, on the server at url, the runs of the
// script whose SHA-1 is sha (sent by hash or whole, run or failed), and
// returns the count so far. It reads the slow log with every command
// logged, so the replica's heartbeats and other scripts are not counted.
func countScriptRuns(t *testing.T, url, sha string) (runs func() int) {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "slowlog-max-len", "10000").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return func() int {
		logs, err := c.SlowLogGet(ctx, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range logs {
			switch {
			case len(l.Args) < 2:
			case strings.EqualFold(l.Args[0], "evalsha") && l.Args[1] == sha,
				strings.EqualFold(l.Args[0], "eval") && fmt.Sprintf("%x", sha1.Sum([]byte(l.Args[1]))) == sha:
				n++
			}
		}
		return n
	}
}

// TestAFailedCallIsNotRetried: a call Redis fails (here a write to a
// read-only replica, which the client would retry) is sent once; the
// replica falls back to its local limits at once and the pinger tries
// again later.
func TestAFailedCallIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--replicaof", "127.0.0.1", "1") // read-only, its primary never answers
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", groupCfg)
	if err := admitScript.Load(context.Background(), st.rdb()).Err(); err != nil { // EVALSHA finds it
		t.Fatal(err)
	}
	runs := countScriptRuns(t, srv.url(), admitScript.Hash())
	tk, _, ok := admit(t, sh)
	if !ok || tk.Lease != "" || st.Status() != "degraded" {
		t.Fatalf("admit on a read-only Redis: ok %v lease %q status %s; want a local permit", ok, tk.Lease, st.Status())
	}
	if n := runs(); n != 1 {
		t.Fatalf("the admission's script was sent %d times, want once", n)
	}
}

// TestAWindowsClosureHoldsTheFleet: a refusal whose Retry-After points at a
// window's boundary, after admissions, closes the group: the closure is a
// pause in Redis too, so another replica holds its requests until the
// test, and a second refusal that agrees holds both until the boundary.
// (What a known window does to the fleet's pace, e2e/replicabench's window
// row shows.)
func TestAWindowsClosureHoldsTheFleet(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	a := st[0].Shared("w", limit.Config{Concurrency: 8, MaxConcurrency: 8})
	b := st[1].Shared("w", limit.Config{Concurrency: 8, MaxConcurrency: 8})
	now := fc.Now()
	for range 3 {
		tk, _, ok := a.Admit(now, 1, false)
		if !ok {
			t.Fatal("admit")
		}
		a.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, now)
		a.Return(&tk, now)
	}
	tk, _, ok := a.Admit(now, 1, false)
	if !ok {
		t.Fatal("admit")
	}
	a.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: 9 * time.Second,
		PauseUntil: now.Add(9 * time.Second)}, now)
	a.Return(&tk, now)
	// Suspected: held until the test, on both replicas.
	_, held, ok := a.Admit(now, 1, false)
	if ok || held.Before(now.Add(time.Second)) {
		t.Fatalf("the replica that was refused admits (%v) or holds only until %v", ok, held.Sub(now))
	}
	fc.Advance(10 * time.Millisecond)
	if _, at, ok := b.Admit(fc.Now(), 1, false); ok || !at.Equal(held) {
		t.Fatalf("the other replica admits (%v) or holds until %v; want %v, the test's time", ok, at.Sub(now), held.Sub(now))
	}
	// The test, refused at the same instant: held until the boundary.
	fc.Set(held.Add(-time.Millisecond))
	if _, _, ok := a.Admit(fc.Now(), 1, false); ok {
		t.Fatalf("a test %v after the refusal, before its time", fc.Now().Sub(now))
	}
	fc.Set(held)
	test := fc.Now()
	tk, _, ok = a.Admit(test, 1, false)
	if !ok {
		t.Fatalf("no test after %v", test.Sub(now))
	}
	a.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused, Hint: 8 * time.Second,
		PauseUntil: test.Add(8 * time.Second)}, test)
	a.Return(&tk, test)
	b.Admit(test, 1, false) // b's next reply brings the shared pause
	if v := b.View(test); !v.PausedUntil.Equal(now.Add(9*time.Second)) || v.PauseReason.String() != "shared" {
		t.Fatalf("the other replica's view: paused until %v (%q), want the boundary 9s on", v.PausedUntil.Sub(now), v.PauseReason)
	}
	if _, _, ok := b.Admit(test.Add(time.Second), 1, false); ok {
		t.Fatal("the other replica admitted a request before the boundary")
	}
}
