package redisstate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// TestAConfiguredConcurrencyHoldsTheFleet: a concurrency an operator
// configures on every replica (each hears of it) bounds the permits out
// over all of them at once, lowered or raised.
func TestAConfiguredConcurrencyHoldsTheFleet(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a, b := newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	sa, sb := a.Shared("g", cfg), b.Shared("g", cfg)
	two := limit.Config{Concurrency: 8, MaxConcurrency: 8, Limits: limit.Limits{Concurrency: 2}}
	sa.Configure(two)
	sb.Configure(two)
	for i, sh := range []limit.Shared{sa, sb} {
		if _, _, ok := admit(t, sh); !ok {
			t.Fatalf("request %d refused under a concurrency of 2", i)
		}
	}
	if _, _, ok := admit(t, sb); ok {
		t.Fatal("a third request went under a configured concurrency of 2")
	}
	three := limit.Config{Concurrency: 8, MaxConcurrency: 8, Limits: limit.Limits{Concurrency: 3}}
	sa.Configure(three)
	sb.Configure(three)
	if _, _, ok := admit(t, sb); !ok {
		t.Fatal("a third request refused once 3 was configured")
	}
	if v := sa.View(time.Now()); v.Concurrency != 3 {
		t.Fatalf("the replica's state shows a limit of %d, want 3", v.Concurrency)
	}
}

// TestForgetClearsWhatEveryReplicaLearned: a clear on one replica drops
// the budget and the pause every replica learned, in Redis, while the
// permits out stay counted; a replica away from Redis forgets its own
// state only.
func TestForgetClearsWhatEveryReplicaLearned(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a, b := newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)
	sa, sb := a.Shared("g", groupCfg), b.Shared("g", groupCfg)
	t1, _, ok := admit(t, sa)
	if !ok {
		t.Fatal("the first request refused")
	}
	now := time.Now()
	sa.Learn(&t1, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: now.Add(time.Hour), Limits: headerparse.Limits{
		Requests: headerparse.Window{Limit: 10, Remaining: 0, HasRemaining: true, Reset: now.Add(50 * time.Second)}}}, now)
	if _, _, ok := admit(t, sb); ok {
		t.Fatal("set-up: the other replica went through the pause and an empty budget")
	}
	sa.Forget()
	if v := sa.View(time.Now()); v.Requests.Known || !v.PausedUntil.IsZero() {
		t.Fatalf("the replica that cleared still knows %+v", v)
	}
	if _, _, ok := admit(t, sb); !ok {
		t.Fatal("the other replica is still held after the clear")
	}
	if _, _, ok := admit(t, sb); ok {
		t.Fatal("a third permit went: the clear lost the permits out (concurrency 2)")
	}
	b.up.Store(false)
	before := testutil.ToFloat64(b.commands.WithLabelValues("forget"))
	sb.Forget()
	if after := testutil.ToFloat64(b.commands.WithLabelValues("forget")); after != before {
		t.Fatal("a replica away from Redis asked Redis to forget")
	}
}

// TestChangesReachEveryReplica: a change one replica puts reaches
// another's watcher within its poll, once; the replica that put it does
// not hear it back; a replica started later hears the changes in force
// at once, as the first; the hash lives as long as replicas poll it.
func TestChangesReachEveryReplica(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	cfg := Config{URL: srv.url(), Timeout: 10 * time.Second, ChangesEvery: 20 * time.Millisecond, KeyTTL: time.Minute, ChangesToken: testToken}
	a, b := storeOn(t, cfg), storeOn(t, cfg)
	type heard struct {
		field, value string
		first        bool
	}
	var mu sync.Mutex
	got := map[*Store][]heard{}
	watch := func(st *Store) {
		st.WatchChanges(func(f, v string, first bool) {
			mu.Lock()
			defer mu.Unlock()
			got[st] = append(got[st], heard{f, v, first})
		})
	}
	heardBy := func(st *Store) []heard {
		mu.Lock()
		defer mu.Unlock()
		return append([]heard(nil), got[st]...)
	}
	watch(a)
	watch(b)
	if err := a.PutChange(context.Background(), "route:x:limits", "v1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(heardBy(b)) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if h := heardBy(b); len(h) != 1 || h[0] != (heard{"route:x:limits", "v1", false}) {
		t.Fatalf("the other replica heard %+v", h)
	}
	c := storeOn(t, cfg)
	watch(c)
	if h := heardBy(c); len(h) != 1 || h[0] != (heard{"route:x:limits", "v1", true}) {
		t.Fatalf("a replica started later heard %+v at once", h)
	}
	time.Sleep(100 * time.Millisecond) // five polls
	if h := heardBy(a); len(h) != 0 {
		t.Fatalf("the replica that put the change heard %+v", h)
	}
	if h := heardBy(b); len(h) != 1 {
		t.Fatalf("the other replica heard the change %d times", len(h))
	}
	ttl, err := a.rdb().PTTL(context.Background(), a.changesKey()).Result()
	if err != nil || ttl <= 50*time.Second || ttl > time.Minute {
		t.Fatalf("the changes expire in %v (%v), want about a minute", ttl, err)
	}
}

// TestChangesWaitForRedis: a replica away from Redis when it starts
// watching asks nothing, and its first poll once Redis is shared hands it
// the changes in force as the first; a change it puts itself comes back
// only when another replica changes that field again.
func TestChangesWaitForRedis(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	cfg := Config{URL: srv.url(), Timeout: 10 * time.Second, ChangesEvery: 10 * time.Millisecond, ChangesToken: testToken}
	a, b := storeOn(t, cfg), storeOn(t, cfg)
	if err := a.PutChange(context.Background(), "lane:ab:hold", "v1"); err != nil {
		t.Fatal(err)
	}
	b.up.Store(false)
	type heard struct {
		value string
		first bool
	}
	got := make(chan heard, 10)
	before := testutil.ToFloat64(b.commands.WithLabelValues("changes"))
	b.WatchChanges(func(_, v string, first bool) { got <- heard{v, first} })
	time.Sleep(50 * time.Millisecond)
	if after := testutil.ToFloat64(b.commands.WithLabelValues("changes")); after != before || len(got) != 0 {
		t.Fatalf("a replica away from Redis polled (%v → %v) or heard %d", before, after, len(got))
	}
	b.up.Store(true)
	if h := <-got; h != (heard{"v1", true}) {
		t.Fatalf("the first poll with Redis back heard %+v", h)
	}
	if err := b.PutChange(context.Background(), "lane:ab:hold", "v2"); err != nil {
		t.Fatal(err)
	}
	if err := a.PutChange(context.Background(), "lane:ab:hold", "v3"); err != nil {
		t.Fatal(err)
	}
	if h := <-got; h != (heard{"v3", false}) {
		t.Fatalf("after its own v2 and another's v3 it heard %+v", h)
	}
}

// TestChangesArePolledEveryQuarterSecondByDefault: a zero ChangesEvery is
// DefaultChangesEvery, 250 ms; one set is kept.
func TestChangesArePolledEveryQuarterSecondByDefault(t *testing.T) {
	if d := (Config{}).withDefaults().ChangesEvery; d != 250*time.Millisecond {
		t.Fatalf("default %v, want 250ms", d)
	}
	if d := (Config{ChangesEvery: time.Millisecond}).withDefaults().ChangesEvery; d != time.Millisecond {
		t.Fatalf("1ms set became %v", d)
	}
}
