package e2e

// Redis as production runs it, from outside: replicas of the binary on a
// Redis Cluster and on a primary under Sentinels, the node holding their
// group killed mid-run.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/internal/redistest"
)

// failoverRun is a run of three replicas sharing one key's limit through
// Redis (env), during which kill takes the node holding the group down a
// fifth of the way in. Every request must succeed, every replica must be
// sharing again within 20 s of the kill, and the upstream must have
// refused few requests. It returns the upstream's figures.
func failoverRun(t *testing.T, env []string, kill func() string) mockupstream.Stats {
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{RPM: 2400, Latency: 40 * time.Millisecond})
	reps := startReplicas(t, 3, bin, mock.URL(), append(env, "LLMPROXY_REDIS_LEASE_TTL=2s")...)
	waitRedisOK(t, reps)

	const perReplica, conc = 120, 10
	total := int64(len(reps) * perReplica)
	var completed atomic.Int64
	fifth := make(chan struct{})
	load := chatLoad{targets: reps, perReplica: perReplica, concurrency: conc, timeout: 2 * time.Minute,
		onDone: func(chatOutcome) {
			if completed.Add(1) == total/5 {
				close(fifth)
			}
		}}
	start := time.Now()
	run := load.start(t, loadClient(t))
	select {
	case <-fifth:
	case <-time.After(60 * time.Second):
		t.Fatalf("a fifth of the requests did not complete within 60s (%d of %d)", completed.Load(), total)
	}
	what := kill()
	killedAt := time.Now()
	t.Logf("%s, %v into the run, after %d of %d requests", what, killedAt.Sub(start).Round(time.Millisecond), completed.Load(), total)
	for _, r := range reps {
		err := pollAdmin(20*time.Second-time.Since(killedAt), func() error {
			got, err := r.lanesRedis()
			if err == nil && got != "ok" {
				err = fmt.Errorf(`/lanes says "redis":%q`, got)
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: not sharing through Redis within 20s of the kill: %v", r.name, err)
		}
	}
	results := run.wait()
	for i, outs := range results {
		if sent, failed, first := failures(outs); failed > 0 {
			t.Errorf("%s: %d of %d requests failed across the failover; first: %q", reps[i].name, failed, sent, first)
		}
	}
	felt := 0.0 // Redis calls that failed: the replicas went local for a while
	for _, r := range reps {
		page, err := r.metricsText()
		if v, ok := metricValue(page, "llmproxy_redis_failures_total"); err == nil && ok {
			t.Logf("%s: %v Redis calls failed", r.name, v)
			felt += v
		}
	}
	if felt == 0 {
		t.Error("no replica saw a Redis call fail: the kill was not felt, the test shows nothing")
	}
	st := mock.Stats()
	t.Logf("%d requests in %v; upstream %d requests, %d ok, %d refused (%.1f%%)", total,
		time.Since(start).Round(time.Millisecond), st.Requests, st.OK, st.RateLimited, 100*float64(st.RateLimited)/float64(max(st.Requests, 1)))
	// Measured with the standalone Redis killed (TestRedisStopAndRestart's
	// load): a few percent. A failover that lost the shared state for
	// good, or kept every replica on its share, would refuse far more.
	if limit := st.Requests / 10; st.RateLimited > limit {
		t.Errorf("the upstream refused %d of %d requests, over a tenth", st.RateLimited, st.Requests)
	}
	return st
}

// groupNode is the node among nodes that holds the run's limit group
// (the one group a run of sendChat makes), found by its keys.
func groupNode(t *testing.T, nodes []*redistest.Server) *redistest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, n := range nodes {
		cl := n.Client()
		keys, err := cl.Keys(ctx, "llmproxy:v2:{g:*}:state").Result()
		cl.Close()
		if err == nil && len(keys) > 0 {
			return n
		}
	}
	t.Fatal("no node holds the group's state")
	return nil
}

// TestFleetOnAClusterRidesOutAPrimaryFailure: three replicas pointed at
// a Redis Cluster of three primaries and their replicas (the URL names
// all six as seeds, mode auto), the primary holding their group killed a
// fifth of the way into the run. Its replica is promoted, the replicas
// use local limits meanwhile and share again once the cluster serves
// every slot; nothing is lost, and the group's state is then on the
// promoted node.
func TestFleetOnAClusterRidesOutAPrimaryFailure(t *testing.T) {
	redistest.Need(t, "redis-server", "redis-cli")
	c, err := redistest.StartCluster(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	var killed *redistest.Server
	failoverRun(t, []string{"LLMPROXY_REDIS_URL=" + c.URL()}, func() string {
		primaries, err := c.Primaries()
		if err != nil {
			t.Fatal(err)
		}
		killed = groupNode(t, primaries)
		if err := killed.Kill(); err != nil {
			t.Fatal(err)
		}
		return "killed the cluster primary " + killed.Addr() + " holding the group"
	})
	primaries, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	if now := groupNode(t, primaries); now == killed || !now.Alive() {
		t.Errorf("the group's state is on %s, not on a promoted replica", now.Addr())
	}
}

// TestFleetFollowsASentinelFailover: three replicas pointed at three
// Sentinels (LLMPROXY_REDIS_SENTINEL_MASTER), the primary killed a fifth
// of the way into the run: the Sentinels promote the replica, the
// proxies follow it, nothing is lost, and the group's state is written
// on the new primary.
func TestFleetFollowsASentinelFailover(t *testing.T) {
	redistest.Need(t, "redis-server", "redis-sentinel")
	s, err := redistest.StartSentinel("llm", redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	old, err := s.PrimaryAddr()
	if err != nil {
		t.Fatal(err)
	}
	failoverRun(t, []string{"LLMPROXY_REDIS_URL=" + s.URL(), "LLMPROXY_REDIS_SENTINEL_MASTER=llm"}, func() string {
		if err := s.Node(old).Kill(); err != nil {
			t.Fatal(err)
		}
		return "killed the primary " + old
	})
	now, err := s.PrimaryAddr()
	if err != nil || now == old || strings.TrimSpace(now) == "" {
		t.Fatalf("the Sentinels name %q (%v) after the failover from %s", now, err, old)
	}
	if n := groupNode(t, []*redistest.Server{s.Node(now)}); n == nil {
		t.Error("the new primary holds no state of the group")
	}
}
