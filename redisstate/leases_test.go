package redisstate

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/limit"
)

// TestARenewalLeavesPendingLeasesToTheWriter: a permit taken locally
// whose lease the writer has not yet sent is not written by a renewal;
// given back before the writer sends it, it never reaches Redis. (The
// renewal wrote it, and the return, which drops a lease still pending as
// never sent, left it counted in Redis until it expired: a failover test
// found such leases after every permit was back.)
func TestARenewalLeavesPendingLeasesToTheWriter(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", groupCfg).(*shared)
	// As addLater, but without waking the writer: still pending.
	st.mu.Lock()
	st.adds["pending"], st.leases["pending"] = sh.leases, sh.leases
	st.mu.Unlock()
	if err := st.renew(); err != nil {
		t.Fatal(err)
	}
	st.drop("pending")
	st.returnLater("pending", sh.leases)
	st.flush()
	err := st.rdb().ZScore(context.Background(), sh.leases, "pending").Err()
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("the lease given back before it was sent is in Redis (%v)", err)
	}
}

// TestARejoinRemovesAgainTheLeasesAFailoverBroughtBack: a permit given
// back and removed from Redis, whose removal the replica promoted in a
// failover never copied (the lease is written back directly here), is
// removed again when the store rejoins; a lease removed over a lease TTL
// ago is not sent again. (A Sentinel failover test found such a lease
// counted after every permit was back, until it expired.)
func TestARejoinRemovesAgainTheLeasesAFailoverBroughtBack(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", groupCfg).(*shared)
	now := time.Now()
	var tks []limit.Ticket
	for range 2 {
		tk, _, ok := sh.Admit(now, 1, false)
		if !ok || tk.Lease == "" {
			t.Fatalf("not admitted through Redis (%v, lease %q)", ok, tk.Lease)
		}
		tks = append(tks, tk)
	}
	for i := range tks {
		sh.Return(&tks[i], now)
	}
	st.flush()
	// A third whose return goes with the next admission (given back as
	// Return does, but with the writer not woken to send it first).
	tk, _, ok := sh.Admit(now, 1, false)
	if !ok || tk.Lease == "" {
		t.Fatal("the third request was not admitted through Redis")
	}
	st.drop(tk.Lease)
	st.mu.Lock()
	st.returns[tk.Lease] = sh.leases
	st.mu.Unlock()
	next, _, ok := sh.Admit(now, 1, false)
	if !ok {
		t.Fatal("the fourth request was not admitted")
	}
	sh.Return(&next, now)
	st.flush()
	tks = append(tks, tk)
	// The first one's removal is older than a lease TTL: it has expired
	// wherever it is, and is not sent again.
	st.mu.Lock()
	if len(st.removed) != 4 {
		st.mu.Unlock()
		t.Fatalf("%d removals kept, want 4", len(st.removed))
	}
	for i, r := range st.removed {
		if r.lease == tks[0].Lease {
			st.removed[i].at = r.at.Add(-2 * time.Minute)
		}
	}
	st.mu.Unlock()
	ctx := context.Background()
	exp := float64(time.Now().Add(time.Minute).UnixMilli())
	for _, tk := range tks {
		if err := st.rdb().ZAdd(ctx, sh.leases, redis.Z{Score: exp, Member: tk.Lease}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	goLocal(st)
	if !st.rejoin() {
		t.Fatal("the store did not rejoin")
	}
	for _, tk := range tks[1:] {
		if err := st.rdb().ZScore(ctx, sh.leases, tk.Lease).Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("the lease %s whose removal the failover lost is still counted after the rejoin (%v)", tk.Lease, err)
		}
	}
	if err := st.rdb().ZScore(ctx, sh.leases, tks[0].Lease).Err(); err != nil {
		t.Errorf("the lease removed over a TTL ago was removed again (%v): the rejoin sends more than it needs", err)
	}
}

// TestTheRemovalsKeptForARejoinAreBounded: past maxRemovals recent
// removals, each new one drops the oldest; removals older than a lease TTL
// are dropped whatever their number.
func TestTheRemovalsKeptForARejoinAreBounded(t *testing.T) {
	st := &Store{cfg: Config{LeaseTTL: time.Minute}}
	now := time.Now()
	for i := range maxRemovals + 1 {
		st.noteRemovedLocked(strconv.Itoa(i), "k", now)
	}
	if n := len(st.removed); n != maxRemovals || st.removed[0].lease != "1" {
		t.Fatalf("%d removals kept from %q, want %d from the second", n, st.removed[0].lease, maxRemovals)
	}
	st.noteRemovedLocked("late", "k", now.Add(time.Minute+time.Millisecond))
	if n := len(st.removed); n != 1 || st.removed[0].lease != "late" {
		t.Fatalf("%d removals kept after a lease TTL, want only the latest", n)
	}
}
