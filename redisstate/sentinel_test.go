package redisstate

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/redistest"
)

// TestTheStoresFollowASentinelFailover: two replicas reach a primary
// through three Sentinels, one told the mode and one finding it from the
// master's name; the primary is killed while their lanes run. Every
// admission gets an answer, both go local and come back shared on the
// promoted replica (their writes land there), and no lease is left once
// every permit is back.
func TestTheStoresFollowASentinelFailover(t *testing.T) {
	t.Parallel()
	redistest.Need(t, "redis-server", "redis-sentinel")
	const master = "llmproxy-main"
	s, err := redistest.StartSentinel(master, redistest.Options{})
	stopAtEnd(t, s, err)
	// A call's cutoff a loaded machine meets, as newStore's: a call cut
	// off sends the store local, which the test looks for only after the
	// kill. The killed node refuses connections at once, so the stores go
	// local without waiting out the cutoff.
	stores := []*Store{
		storeOn(t, Config{URL: s.URL(), Mode: modeSentinel, SentinelMaster: master, LeaseTTL: 3 * time.Second, Timeout: 10 * time.Second}),
		storeOn(t, Config{URL: s.URL(), SentinelMaster: master, LeaseTTL: 3 * time.Second, Timeout: 10 * time.Second}),
	}
	for _, st := range stores {
		if st.Status() != "ok" {
			t.Fatalf("status %s through the Sentinels", st.Status())
		}
	}
	groups := groupNames(6)
	old := s.Primary.Addr()
	promoted := s.Replica
	direct := promoted.Client()
	defer direct.Close()
	failoverCheck(t, stores, groups, func() { _ = s.Primary.Kill() }, func() redis.Cmdable {
		if addr, err := s.WaitFailover(old, 10*time.Second); err != nil || addr != promoted.Addr() {
			t.Fatalf("the Sentinels name %s (%v), want the replica %s", addr, err, promoted.Addr())
		}
		return direct
	})
	// Written after the failover, on the promoted node: its state, and
	// the fleet's heartbeat.
	ctx := context.Background()
	for _, g := range groups {
		key := stores[0].Shared(g, groupCfg).(*shared).state
		if n, err := direct.Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Fatalf("%s's state is not on the promoted node (%d, %v)", g, n, err)
		}
	}
	// The count comes from this heartbeat: one that fails keeps the
	// count it had (peers.go), so the check starts from none.
	stores[0].peers.Store(0)
	stores[0].heartbeat(stores[0].now())
	if n := stores[0].peers.Load(); n != 2 {
		t.Fatalf("the heartbeat on the promoted node counts %d replicas, want 2", n)
	}
}
