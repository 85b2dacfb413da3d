package redisstate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/redistest"
	"github.com/llmproxy/llmproxy/limit"
)

func startCluster(t *testing.T) *redistest.Cluster {
	t.Helper()
	redistest.Need(t, "redis-server", "redis-cli")
	c, err := redistest.StartCluster(redistest.Options{})
	stopAtEnd(t, c, err)
	return c
}

// groupNames are n limit groups' names.
func groupNames(n int) []string {
	g := make([]string, n)
	for i := range g {
		g[i] = fmt.Sprintf("group-%d", i)
	}
	return g
}

// TestGroupsSpreadOverTheClusterPrimaries: on a Redis Cluster of three
// primaries, a store finds the cluster by itself (auto) or is told
// (cluster); each group's keys share one slot, the groups' slots spread
// over every primary, and two replicas share each group's permits, its
// pause and the permits given back, on whichever node holds it.
func TestGroupsSpreadOverTheClusterPrimaries(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	a := storeOn(t, Config{URL: c.URL(), LeaseTTL: time.Minute, Timeout: 10 * time.Second})
	b := storeOn(t, Config{URL: c.URL(), Mode: modeCluster, LeaseTTL: time.Minute, Timeout: 10 * time.Second})
	for name, st := range map[string]*Store{"auto": a, "cluster": b} {
		if _, ok := st.rdb().(*redis.ClusterClient); !ok || st.Status() != "ok" {
			t.Fatalf("%s: client %T, status %s; want a cluster client, shared", name, st.rdb(), st.Status())
		}
	}
	primaries, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held := map[*redistest.Server]int{}
	for _, g := range groupNames(24) {
		sa, sb := a.Shared(g, groupCfg).(*shared), b.Shared(g, groupCfg)
		owner := sameSlot(t, c, sa.state, sa.leases, sa.waiting, sa.climits, sa.raise, sa.levels)
		t1, _, ok1 := admit(t, sa)
		t2, _, ok2 := admit(t, sa)
		if !ok1 || !ok2 || t1.Lease == "" || t2.Lease == "" {
			t.Fatalf("%s: a could not take the group's two permits through Redis", g)
		}
		if _, _, ok := admit(t, sb); ok {
			t.Fatalf("%s: b got a third permit", g)
		}
		direct := owner.Client()
		if n, err := direct.ZCard(ctx, sa.leases).Result(); err != nil || n != 2 {
			t.Fatalf("%s: the node serving its slot holds %d leases (%v), want 2", g, n, err)
		}
		held[owner]++
		until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
		sa.Learn(&t1, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: until}, time.Now())
		if _, at, ok := admit(t, sb); ok || at.Sub(until).Abs() > time.Second {
			t.Fatalf("%s: b admitted %v, asks again in %v; want the pause a learned", g, ok, time.Until(at))
		}
		sa.Return(&t1, time.Now())
		sa.Return(&t2, time.Now())
		a.flush()
		if n, err := direct.ZCard(ctx, sa.leases).Result(); err != nil || n != 0 {
			t.Fatalf("%s: %d leases left after both were given back (%v)", g, n, err)
		}
		direct.Close()
	}
	if len(held) != len(primaries) {
		t.Fatalf("24 groups on %d of the %d primaries", len(held), len(primaries))
	}
	t.Logf("groups by primary: %v", held)
	// The fleet's keys share their slot too: the heartbeat counts both.
	a.heartbeat(a.now())
	if n := a.peers.Load(); n != 2 {
		t.Fatalf("the heartbeat counts %d replicas, want 2", n)
	}
}

// sameSlot fails t unless every key hashes to one slot, and returns the
// primary that serves it.
func sameSlot(t *testing.T, c *redistest.Cluster, keys ...string) *redistest.Server {
	t.Helper()
	owner, err := c.Owner(keys[0])
	if err != nil {
		t.Fatal(err)
	}
	cl := owner.Client()
	defer cl.Close()
	ctx := context.Background()
	first, err := cl.ClusterKeySlot(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys[1:] {
		if s, err := cl.ClusterKeySlot(ctx, k).Result(); err != nil || s != first {
			t.Fatalf("%s in slot %d, %s in %d (%v)", keys[0], first, k, s, err)
		}
	}
	return owner
}

// TestAClusterPrimaryKilledMidRunFailsOverToItsReplica: two replicas'
// lanes run on groups over the three primaries; one primary is killed.
// Every admission gets an answer, the stores go local and come back
// shared once its replica is promoted, the group it held admits through
// the promoted node, and no lease is left once every permit is back.
func TestAClusterPrimaryKilledMidRunFailsOverToItsReplica(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	logger, out := capturedLog()
	// A call's cutoff a loaded machine meets, as newStore's: a call cut
	// off sends the store local, which the test looks for only after the
	// kill. The killed node refuses connections at once, so the stores go
	// local without waiting out the cutoff.
	cfg := Config{URL: c.URL(), Mode: modeCluster, LeaseTTL: 3 * time.Second, Timeout: 10 * time.Second, Logger: logger}
	t.Cleanup(func() {
		if t.Failed() {
			var lines []string
			for _, l := range strings.Split(out.String(), "\n") {
				if !strings.Contains(l, "level=DEBUG") {
					lines = append(lines, l)
				}
			}
			t.Log(strings.Join(lines, "\n"))
		}
	})
	stores := []*Store{storeOn(t, cfg), storeOn(t, cfg)}
	groups := groupNames(9)
	key := stores[0].Shared(groups[0], groupCfg).(*shared).state
	victim, err := c.Owner(key)
	if err != nil {
		t.Fatal(err)
	}
	var check *redis.ClusterClient
	t.Cleanup(func() {
		if check != nil {
			check.Close()
		}
	})
	failoverCheck(t, stores, groups, func() { _ = victim.Kill() }, func() redis.Cmdable {
		check = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
		return check
	})
	now, err := c.Owner(key)
	if err != nil {
		t.Fatal(err)
	}
	if now == victim {
		t.Fatal("the killed primary still serves the group's slot")
	}
	direct := now.Client()
	defer direct.Close()
	if n, err := direct.Exists(context.Background(), key).Result(); err != nil || n != 1 {
		t.Fatalf("the group's state is not on the promoted node %s (%d, %v)", now.Addr(), n, err)
	}
}
