package e2e

// Rolling restarts, as a Kubernetes rolling update makes them: the three
// replicas behind a front (e2e/front: round robin over the ready ones, the
// next one when a connection is refused or dropped before an answer), each
// in turn sent SIGTERM, left to drain and exit, and replaced by a new
// process on the same ports and the same Redis.

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/e2e/fleetstate"
	"github.com/llmproxy/llmproxy/e2e/front"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

// rollingLeaseTTL is far longer than the test's wait for a stopped
// replica's leases to go: only their return at shutdown can explain it.
const rollingLeaseTTL = 60 * time.Second

// rollingRun is what one run of TestRollingRestart measured.
type rollingRun struct {
	makespan                 time.Duration
	upRequests, upOK, up429  int64
	failovers, frontFailures int64
	answered                 []int64
}

func (r rollingRun) refusedPct() float64 {
	if r.upRequests == 0 {
		return 0
	}
	return 100 * float64(r.up429) / float64(r.upRequests)
}

// TestRollingRestart: 300 requests at client concurrency 30 through a
// front and three replicas in front of an upstream that allows 20 req/s and
// 8 in flight, once as they are and once while the replicas are restarted
// one after another. With the restarts, every request is answered 200 and
// reaches the upstream's admission once (none lost, none sent twice), the
// upstream refuses at most 2 points more of what it gets than without them,
// and each stopped replica, which held permits as it was told to stop,
// holds none in Redis once it has exited: with a lease TTL of 60s, only
// their return on the clean shutdown removes them.
func TestRollingRestart(t *testing.T) {
	bin := llmproxyBinary(t)
	var steady, rolled rollingRun
	if !t.Run("steady", func(t *testing.T) { steady = runRolling(t, bin, false) }) {
		t.FailNow()
	}
	if !t.Run("restarts", func(t *testing.T) { rolled = runRolling(t, bin, true) }) {
		t.FailNow()
	}
	t.Logf("makespan %v with restarts, %v without (×%.2f); upstream refused %.1f%% with, %.1f%% without",
		rolled.makespan.Round(time.Millisecond), steady.makespan.Round(time.Millisecond),
		rolled.makespan.Seconds()/steady.makespan.Seconds(), rolled.refusedPct(), steady.refusedPct())
	if rolled.refusedPct() > steady.refusedPct()+2 {
		t.Errorf("with restarts the upstream refused %d of %d (%.1f%%), more than 2 points over the %.1f%% without",
			rolled.up429, rolled.upRequests, rolled.refusedPct(), steady.refusedPct())
	}
}

// runRolling runs the load through a fresh Redis, upstream, three
// replicas and the front; with restarts, it restarts each replica in turn
// while the load runs and checks what the stopped one leaves in Redis.
func runRolling(t *testing.T, bin string, restarts bool) rollingRun {
	rs := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	mock := startMockUpstream(t, mockupstream.Config{RPM: 1200, MaxInFlight: 8, Latency: 200 * time.Millisecond})
	// The drain gets all the time it needs: a request cut by its timeout
	// would be a 503, which this test must not see.
	env := append(redisEnv(rs.URL()), "LLMPROXY_REDIS_LEASE_TTL="+rollingLeaseTTL.String(), "LLMPROXY_SHUTDOWN_TIMEOUT=30s")

	// One at a time, so that each one's id is the one new in the fleet's
	// set once it runs.
	reps := make([]*replica, 3)
	ids := make([]string, 3)
	for i := range reps {
		reps[i], ids[i] = startKnownReplica(t, rdb, fmt.Sprintf("replica %d", i), bin, mock.URL(), env)
	}
	waitRedisOK(t, reps)
	backends := make([]front.Backend, len(reps))
	for i, r := range reps {
		backends[i] = front.Backend{Addr: r.addr, Admin: r.admin}
	}
	fr, err := front.Start(front.Config{Backends: backends})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fr.Close)

	const total, conc = 300, 30
	var completed atomic.Int64
	load := chatLoad{
		targets: []*replica{{addr: fr.Addr()}}, perReplica: total, concurrency: conc, timeout: time.Minute,
		onDone: func(chatOutcome) { completed.Add(1) },
	}
	start := time.Now()
	run := load.start(t, loadClient(t))
	if restarts {
		for i := range reps {
			// The restarts begin a fifth of the way through and leave the
			// last two fifths, at least, to the new processes.
			if !waitCompleted(&completed, int64((i+1)*total/5), run.done, 60*time.Second) {
				t.Fatalf("restart %d: the load ended or stalled at %d of %d requests", i, completed.Load(), total)
			}
			t.Logf("restarting %s (%s) %v into the run, %d requests done", reps[i].name, ids[i],
				time.Since(start).Round(time.Millisecond), completed.Load())
			reps[i], ids[i] = restartReplica(t, rdb, reps[i], ids[i], bin, mock.URL(), env)
		}
	}
	outs := run.wait()[0]
	res := rollingRun{makespan: time.Since(start)}
	if _, failed, first := failures(outs); failed > 0 {
		t.Errorf("%d of %d requests were not answered 200; first: %q", failed, total, first)
	}
	st, fs := mock.Stats(), fr.Stats()
	res.upRequests, res.upOK, res.up429 = st.Requests, st.OK, st.RateLimited
	res.failovers, res.frontFailures, res.answered = fs.Failovers, fs.Failed, fs.Answered
	t.Logf("%d requests in %v; upstream %d requests, %d ok, %d refused (%.1f%%); front: answers by replica %v, %d failovers",
		total, res.makespan.Round(time.Millisecond), st.Requests, st.OK, st.RateLimited, res.refusedPct(), fs.Answered, fs.Failovers)
	// Each request the client saw answered reached the upstream's
	// admission once: a request the front sent again after a replica had
	// taken it would show here.
	if st.OK != total {
		t.Errorf("the upstream admitted %d requests, want %d (one per request)", st.OK, total)
	}
	return res
}

// waitCompleted waits until n requests have completed; false when the
// load ended first or d passed.
func waitCompleted(completed *atomic.Int64, n int64, done <-chan struct{}, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for completed.Load() < n {
		select {
		case <-done:
			return completed.Load() >= n
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// restartReplica stops old as Kubernetes does (SIGTERM, then its drain),
// checks that it exited cleanly and left none of its permits in Redis, and
// starts a new process on the same ports and Redis; it returns the new
// replica, ready and on Redis, and its id.
func restartReplica(t *testing.T, rdb *redis.Client, old *replica, oldID, bin, upstream string, env []string) (*replica, string) {
	t.Helper()
	// The check below would pass for a replica holding nothing: wait
	// until this one holds a permit (under this load, at once).
	err := pollAdmin(5*time.Second, func() error {
		held, err := leasesOf(rdb, oldID)
		if err == nil && held == 0 {
			err = fmt.Errorf("no lease of %s in Redis", oldID)
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s never held a permit under load: %v", old.name, err)
	}
	stopAt := time.Now()
	clean, err := old.stop(45 * time.Second)
	if err != nil || !clean {
		t.Fatalf("%s did not exit within 45s of SIGTERM (killed: %v)", old.name, err)
	}
	exited := time.Now()
	if old.exitErr != nil {
		t.Errorf("%s exited with %v after SIGTERM, want status 0", old.name, old.exitErr)
	}
	held, err := leasesOf(rdb, oldID)
	switch {
	case err != nil:
		t.Fatalf("reading the leases after %s exited: %v", old.name, err)
	case held > 0:
		t.Errorf("%s exited (drained in %v) and still has %d permits counted in Redis; with a lease TTL of %v they are counted until it runs out",
			old.name, exited.Sub(stopAt).Round(time.Millisecond), held, rollingLeaseTTL)
	}
	if in, err := fleetHas(rdb, oldID); err == nil && in {
		t.Errorf("%s exited and is still in the fleet's set of live replicas", old.name)
	}
	t.Logf("%s drained and exited %v after SIGTERM; permits left in Redis: %d", old.name, exited.Sub(stopAt).Round(time.Millisecond), held)
	env = append(slices.Clone(env), "LLMPROXY_ADDR="+old.addr, "LLMPROXY_ADMIN_ADDR="+old.admin)
	r, id := startKnownReplica(t, rdb, old.name+"'", bin, upstream, env)
	err = pollAdmin(10*time.Second, func() error {
		code, status, err := r.readyz()
		if err == nil && (code != 200 || status != "ready") {
			err = fmt.Errorf("/readyz %d %q", code, status)
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s not ready 10s after start: %v", r.name, err)
	}
	waitRedisOK(t, []*replica{r})
	return r, id
}

// startKnownReplica starts a replica with env and learns its id: the one
// member the fleet's set did not have before it started.
func startKnownReplica(t *testing.T, rdb *redis.Client, name, bin, upstream string, env []string) (*replica, string) {
	t.Helper()
	before, err := fleet(rdb)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, name, bin, upstream, env...)
	var id string
	err = pollAdmin(5*time.Second, func() error {
		now, err := fleet(rdb)
		if err != nil {
			return err
		}
		var fresh []string
		for _, m := range now {
			if !slices.Contains(before, m) {
				fresh = append(fresh, m)
			}
		}
		if len(fresh) != 1 {
			return fmt.Errorf("the fleet's set has %d new members: %v", len(fresh), fresh)
		}
		id = fresh[0]
		return nil
	})
	if err != nil {
		t.Fatalf("%s: its id: %v", name, err)
	}
	return r, id
}

// fleet is the ids in the fleet's set of live replicas.
func fleet(rdb *redis.Client) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return fleetstate.Replicas(ctx, rdb)
}

func fleetHas(rdb *redis.Client, id string) (bool, error) {
	members, err := fleet(rdb)
	return slices.Contains(members, id), err
}

// leasesOf counts the leases in Redis that replica id took.
func leasesOf(rdb *redis.Client, id string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return fleetstate.LeasesOf(ctx, rdb, id)
}

// TestDrainCutShortReturnsPermits: a replica whose drain runs out of time
// (LLMPROXY_SHUTDOWN_TIMEOUT 1s, answers that take 20s) answers what is
// still under way with 503 and exits; the permits those requests held are
// gone from Redis as soon as it has exited, not a lease TTL (60s) later.
func TestDrainCutShortReturnsPermits(t *testing.T) {
	rs := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{Latency: 20 * time.Second})
	env := append(redisEnv(rs.URL()), "LLMPROXY_REDIS_LEASE_TTL="+rollingLeaseTTL.String(), "LLMPROXY_SHUTDOWN_TIMEOUT=1s")
	r, id := startKnownReplica(t, rdb, "replica", bin, mock.URL(), env)
	waitRedisOK(t, []*replica{r})

	load := chatLoad{targets: []*replica{r}, perReplica: 4, concurrency: 4, timeout: 30 * time.Second}
	run := load.start(t, loadClient(t))
	var held int
	err := pollAdmin(10*time.Second, func() error {
		var err error
		if held, err = leasesOf(rdb, id); err == nil && (held == 0 || mock.Stats().Requests == 0) {
			err = fmt.Errorf("%d leases in Redis, %d requests at the upstream", held, mock.Stats().Requests)
		}
		return err
	})
	if err != nil {
		t.Fatalf("no request at the upstream with its permit in Redis: %v", err)
	}
	clean, err := r.stop(20 * time.Second)
	if err != nil || !clean {
		t.Fatalf("the replica did not exit within 20s of SIGTERM (killed: %v)", err)
	}
	if r.exitErr != nil {
		t.Errorf("exit after SIGTERM: %v, want status 0", r.exitErr)
	}
	left, err := leasesOf(rdb, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held %d permits in Redis as SIGTERM came; %d left once it exited", held, left)
	if left > 0 {
		t.Errorf("the replica exited with %d of its permits still counted in Redis (lease TTL %v)", left, rollingLeaseTTL)
	}
	for _, o := range run.wait()[0] {
		if o.status != 503 {
			t.Errorf("a request cut by the drain's end got %d (%v), want 503 shutting_down", o.status, o.err)
		}
	}
}
