package redisstate

// Plumbing for the tests on a real Redis Cluster, Sentinels, TLS and ACLs
// (cluster_test.go, sentinel_test.go, tls_test.go, acl_test.go): the
// servers come from internal/redistest; here are lanes driven through a
// failover and a log captured to search for secrets.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/limit"
)

// stopAtEnd stops what a redistest start returned when the test ends,
// and fails the test now if the start failed.
func stopAtEnd(t *testing.T, s interface{ Stop() error }, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
}

// capturedLog is a logger at debug, go-redis' own lines included,
// writing to a buffer the test reads.
func capturedLog() (*slog.Logger, *lockedBuffer) {
	var out lockedBuffer
	return slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})), &out
}

// waitUntil polls cond every 20 ms until it holds or within passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}

// laneRun drives groups on stores as lanes do, each (store, group) pair
// from one goroutine, until stop: admit (cost 1), answer 200, give the
// permit back after the next admission (a request takes 1 ms), so up to two are out per lane;
// a refusal gives back the oldest held and asks again when it says (at
// most 20 ms on). Every Admit returns (an answer: admitted or a time to
// ask again); admitted counts them, shared those with a Redis lease.
type laneRun struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	admitted atomic.Int64
	shared   atomic.Int64
	local    atomic.Int64
	// lastLease is, by group, a lease admitted lately through Redis.
	mu        sync.Mutex
	lastLease map[string]string
}

func runLanes(stores []*Store, groups []string, cfg limit.Config) *laneRun {
	r := &laneRun{stop: make(chan struct{}), lastLease: map[string]string{}}
	for _, st := range stores {
		for _, g := range groups {
			sh := st.Shared(g, cfg)
			r.wg.Add(1)
			go func() { defer r.wg.Done(); r.lane(g, sh) }()
		}
	}
	return r
}

func (r *laneRun) lane(group string, sh limit.Shared) {
	var held []limit.Ticket
	giveBack := func() {
		sh.Return(&held[0], time.Now())
		held = held[1:]
	}
	defer func() {
		for len(held) > 0 {
			giveBack()
		}
	}()
	for {
		select {
		case <-r.stop:
			return
		default:
		}
		tk, at, ok := sh.Admit(time.Now(), 1, len(held) == 0)
		if !ok {
			if len(held) > 0 {
				giveBack()
			}
			if wait := time.Until(at); wait > 0 {
				time.Sleep(min(wait, 20*time.Millisecond))
			}
			continue
		}
		r.admitted.Add(1)
		if tk.Lease != "" {
			r.shared.Add(1)
			r.mu.Lock()
			r.lastLease[group] = tk.Lease
			r.mu.Unlock()
		} else {
			r.local.Add(1)
		}
		time.Sleep(time.Millisecond) // the request upstream
		sh.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, time.Now())
		held = append(held, tk)
		if len(held) == 2 {
			giveBack()
		}
	}
}

// finish stops the lanes, once each has given back what it holds, and
// flushes the stores' returns to Redis.
func (r *laneRun) finish(stores []*Store) {
	close(r.stop)
	r.wg.Wait()
	for _, st := range stores {
		st.flush()
	}
}

// lease is the latest lease admitted through Redis for group.
func (r *laneRun) lease(group string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastLease[group]
}

// leasesLeft counts, over groups, the leases Redis still holds, through
// a client of the test's own (rdb), and the expiries of those that are
// there (ms, Redis' clock), for the message.
func leasesLeft(t *testing.T, rdb redis.Cmdable, st *Store, groups []string) (int64, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int64
	var detail []string
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		key := st.Shared(g, groupCfg).(*shared).leases
		z, err := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatalf("ZRANGE %s: %v", key, err)
		}
		n += int64(len(z))
		for _, m := range z {
			detail = append(detail, fmt.Sprintf("%s:%s(expires %+dms)", g, m.Member, int64(m.Score)-now.UnixMilli()))
		}
	}
	return n, detail
}

// failoverCheck is the common course of the failover tests: lanes over
// groups on stores, Redis' primary killed (kill) once they have admitted
// through it; every store goes local, and shared again (within 25 s),
// after which each lane admits through Redis once more; at the end no
// lease is left in Redis (read through rdb) and every store holds none.
// It returns the run for more checks.
func failoverCheck(t *testing.T, stores []*Store, groups []string, kill func(), rdb func() redis.Cmdable) *laneRun {
	t.Helper()
	r := runLanes(stores, groups, groupCfg)
	defer func() {
		select {
		case <-r.stop:
		default:
			r.finish(stores)
		}
	}()
	waitUntil(t, 10*time.Second, "lanes admitting through Redis", func() bool { return r.shared.Load() >= 200 })
	before := r.admitted.Load()
	kill()
	waitUntil(t, 10*time.Second, "every store local after the kill", func() bool {
		for _, st := range stores {
			if testutil.ToFloat64(st.failures) == 0 {
				return false
			}
		}
		return true
	})
	killedAt := time.Now()
	waitUntil(t, 25*time.Second, "every store shared again after the failover", func() bool {
		for _, st := range stores {
			if st.Status() != "ok" {
				return false
			}
		}
		return true
	})
	t.Logf("shared again %v after the stores went local", time.Since(killedAt).Round(time.Millisecond))
	sharedAt := r.shared.Load()
	// Each group admits through Redis again: the lanes' leases are new ones.
	seen := map[string]string{}
	for _, g := range groups {
		seen[g] = r.lease(g)
	}
	waitUntil(t, 10*time.Second, "every group admitting through Redis after the failover", func() bool {
		for _, g := range groups {
			if r.lease(g) == seen[g] {
				return false
			}
		}
		return true
	})
	r.finish(stores)
	t.Logf("admitted %d (%d before the kill), %d through Redis (%d before it was shared again), %d local",
		r.admitted.Load(), before, r.shared.Load(), sharedAt, r.local.Load())
	for i, st := range stores {
		if n := st.Held(); n != 0 {
			t.Errorf("store %d holds %d leases after every lane gave its permits back", i, n)
		}
	}
	n, detail := leasesLeft(t, rdb(), stores[0], groups)
	if n != 0 {
		t.Errorf("%d leases left in Redis after every permit was given back: %s", n, strings.Join(detail, " "))
	}
	return r
}
