package e2e

// Several llmproxy processes ("replicas") in front of one upstream key,
// sharing their lane state through one Redis. The binary is built from this
// tree and run as separate processes; redis-server runs on a loopback port
// with no persistence. Without redis-server on PATH the tests that need it
// skip, unless LLMPROXY_E2E_REQUIRE_REDIS=1 makes that a failure (for CI).
// Plumbing is in replicas_helpers_test.go.

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

// waitRedisOK waits (up to 5s) until every replica reports Redis as "ok".
func waitRedisOK(t *testing.T, reps []*replica) {
	t.Helper()
	for _, r := range reps {
		err := pollAdmin(5*time.Second, func() error {
			got, err := r.lanesRedis()
			if err == nil && got != "ok" {
				err = fmt.Errorf(`/lanes says "redis":%q`, got)
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: Redis not ok 5s after start: %v", r.name, err)
		}
	}
}

// TestReplicasShareOneLimit: three replicas in front of one key that allows
// 20 req/s and 8 in flight, 150 requests each at client concurrency 30, all
// at once. Every request succeeds, and the replicas, pacing together,
// provoke almost no 429s at the upstream.
func TestReplicasShareOneLimit(t *testing.T) {
	rs := startRedis(t)
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{RPM: 1200, MaxInFlight: 8, Latency: 200 * time.Millisecond})
	reps := startReplicas(t, 3, bin, mock.URL(), redisEnv(rs.URL())...)
	waitRedisOK(t, reps)

	const perReplica, conc = 150, 30
	load := chatLoad{targets: reps, perReplica: perReplica, concurrency: conc, timeout: 2 * time.Minute}
	start := time.Now()
	results := load.start(t, loadClient(t)).wait()
	makespan := time.Since(start)

	for i, outs := range results {
		sent, failed, first := failures(outs)
		if failed > 0 {
			t.Errorf("%s: %d of %d requests failed; first: %q", reps[i].name, failed, sent, first)
		}
	}
	st := mock.Stats()
	total := len(reps) * perReplica
	ideal := time.Duration(float64(total) / 20 * float64(time.Second))
	t.Logf("%d requests in %v; ideal at 20 req/s %v; ratio %.2f", total, makespan.Round(time.Millisecond),
		ideal, makespan.Seconds()/ideal.Seconds())
	t.Logf("upstream: %d requests, %d ok, %d rate-limited, peak in flight %d",
		st.Requests, st.OK, st.RateLimited, st.MaxInFlightSeen)
	if st.RateLimited*50 > st.Requests {
		t.Errorf("upstream refused %d of %d requests (%.1f%%), want at most 2%%",
			st.RateLimited, st.Requests, 100*float64(st.RateLimited)/float64(st.Requests))
	}
	// Together the replicas use the limit: in the run's middle seconds
	// (the first and last two left out: the start's learning, the tail's
	// few), the median second completes at least half of what the upstream
	// allows. Pacing each replica at a third of it (or slower) shows here
	// whatever the machine's speed; only the upstream's limit sets it.
	if perSec := completionsPerSecond(results, start); len(perSec) > 4 {
		mid := slices.Clone(perSec[2 : len(perSec)-2])
		slices.Sort(mid)
		if median := mid[len(mid)/2]; median < 10 {
			t.Errorf("the replicas completed a median %d requests a second (by second: %v), want at least half of the upstream's 20",
				median, perSec)
		}
	}
	for _, r := range reps {
		got, err := r.lanesRedis()
		if err != nil || got != "ok" {
			t.Errorf(`%s after the run: /lanes "redis" = %q, %v; want "ok"`, r.name, got, err)
		}
		page, err := r.metricsText()
		if v, ok := metricValue(page, "llmproxy_redis_up"); err != nil || !ok || v != 1 {
			t.Errorf("%s: llmproxy_redis_up = %v (present %v, err %v), want 1", r.name, v, ok, err)
		}
		// Each notes itself alive at least every 10 s: by now all see 3.
		if v, ok := metricValue(page, "llmproxy_redis_replicas"); !ok || v != 3 {
			t.Errorf("%s: llmproxy_redis_replicas = %v (present %v), want 3", r.name, v, ok)
		}
	}
}

// TestReplicaKilledMidRunLeasesExpire: one of three replicas is SIGKILLed
// with requests in flight. The concurrency permits it held are counted
// only until their lease TTL (2s) runs out, so the two survivors keep
// going: all their requests succeed and their completions never pause for
// longer than the TTL plus 3s.
func TestReplicaKilledMidRunLeasesExpire(t *testing.T) {
	rs := startRedis(t)
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{RPM: 1200, MaxInFlight: 8, Latency: 200 * time.Millisecond})
	reps := startReplicas(t, 3, bin, mock.URL(), redisEnv(rs.URL())...)
	waitRedisOK(t, reps)

	const perReplica, conc, victim = 60, 10, 0
	const leaseTTL, slack = 2 * time.Second, 3 * time.Second
	total := int64(len(reps) * perReplica)
	var succeeded atomic.Int64
	var killed atomic.Bool
	killNow := make(chan struct{})
	load := chatLoad{
		targets: reps, perReplica: perReplica, concurrency: conc,
		// The whole run takes about 10s; a survivor stuck behind leases
		// that never expire fails here instead of after minutes.
		timeout: 30 * time.Second,
		// Once the victim is dead, nothing more is sent to it.
		skip: func(r int) bool { return r == victim && killed.Load() },
		onDone: func(o chatOutcome) {
			if o.err == nil && succeeded.Add(1) == total/3 {
				close(killNow)
			}
		},
	}
	run := load.start(t, loadClient(t))
	select {
	case <-killNow:
	case <-run.done:
		t.Fatalf("the load ended before a third of it succeeded (%d of %d)", succeeded.Load(), total)
	case <-time.After(60 * time.Second):
		t.Fatalf("a third of the requests did not succeed within 60s (%d of %d)", succeeded.Load(), total)
	}
	killed.Store(true)
	killAt := time.Now()
	if err := reps[victim].kill(); err != nil {
		t.Fatal(err)
	}
	results := run.wait()

	// The victim's requests that ended before the kill must have succeeded;
	// those cut off by it are not counted.
	cut, skipped := 0, 0
	for _, o := range results[victim] {
		switch {
		case o.skipped:
			skipped++
		case o.err != nil && o.end.Before(killAt):
			t.Errorf("%s failed before it was killed: %v", reps[victim].name, o.err)
		case o.err != nil:
			cut++
		}
	}
	t.Logf("%s killed after %d successes in all: %d of its requests cut off, %d never sent",
		reps[victim].name, total/3, cut, skipped)

	var after []time.Time // survivors' successful completions after the kill
	for i, outs := range results {
		if i == victim {
			continue
		}
		sent, failed, first := failures(outs)
		if failed > 0 {
			t.Errorf("survivor %s: %d of %d requests failed; first: %q", reps[i].name, failed, sent, first)
		}
		for _, o := range outs {
			if o.err == nil && !o.skipped && o.end.After(killAt) {
				after = append(after, o.end)
			}
		}
	}
	slices.SortFunc(after, func(a, b time.Time) int { return a.Compare(b) })
	// The gaps are measured from the kill itself: the first survivor
	// completion after it counts too.
	var maxGap time.Duration
	prev := killAt
	for _, at := range after {
		maxGap = max(maxGap, at.Sub(prev))
		prev = at
	}
	st := mock.Stats()
	t.Logf("survivors: %d completions after the kill, longest gap %v (limit %v); upstream %d requests, %d rate-limited",
		len(after), maxGap.Round(time.Millisecond), leaseTTL+slack, st.Requests, st.RateLimited)
	if len(after) == 0 {
		t.Error("no survivor request completed after the kill")
	}
	if maxGap > leaseTTL+slack {
		t.Errorf("survivors went %v without a completion after the kill, want at most the lease TTL %v + %v",
			maxGap.Round(time.Millisecond), leaseTTL, slack)
	}
}

// TestKilledReplicaHoldingEveryPermit is the sharp form of the test above.
// There, the victim holds only its share of the 8 permits when it dies, and
// the survivors' share is enough for 20 req/s: they would not stall even if
// the dead replica's permits were never released. Here the victim holds all
// 8 (it is the only one with load, 16 requests of 1s each) when it is
// killed, so a request on the survivor can only run once those permits'
// leases have expired: it must complete within the lease TTL, the 1s the
// upstream takes and 3s of slack.
func TestKilledReplicaHoldingEveryPermit(t *testing.T) {
	rs := startRedis(t)
	bin := llmproxyBinary(t)
	const latency, leaseTTL, slack = time.Second, 2 * time.Second, 3 * time.Second
	mock := startMockUpstream(t, mockupstream.Config{Latency: latency})
	reps := startReplicas(t, 2, bin, mock.URL(), redisEnv(rs.URL())...)
	waitRedisOK(t, reps)
	victim, survivor := reps[0], reps[1]

	hog := chatLoad{targets: []*replica{victim}, perReplica: 16, concurrency: 16, timeout: 30 * time.Second}
	run := hog.start(t, loadClient(t))
	err := pollAdmin(10*time.Second, func() error {
		if n := mock.Stats().ByKey["sk-shared"].MaxInFlightSeen; n < 8 {
			return fmt.Errorf("the upstream saw at most %d in flight", n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the victim never held all 8 permits: %v", err)
	}
	// With 16 waiting and each answer taking 1s, the victim is still at 8:
	// a permit it gives back is taken again by its own queue.
	if err := victim.kill(); err != nil {
		t.Fatal(err)
	}
	killAt := time.Now()
	run.wait() // the victim's requests all end with the kill

	late := chatLoad{targets: []*replica{survivor}, perReplica: 4, concurrency: 4, timeout: 20 * time.Second}
	outs := late.start(t, loadClient(t)).wait()[0]
	_, failed, first := failures(outs)
	if failed > 0 {
		t.Fatalf("survivor: %d of %d requests failed after the kill (permits never released?); first: %q", failed, len(outs), first)
	}
	var last time.Time
	for _, o := range outs {
		if o.end.After(last) {
			last = o.end
		}
	}
	took := last.Sub(killAt)
	t.Logf("survivor's %d requests done %v after the kill (limit %v)", len(outs), took.Round(time.Millisecond), leaseTTL+latency+slack)
	if took > leaseTTL+latency+slack {
		t.Errorf("the survivor needed %v after the kill, want at most the lease TTL %v + the upstream's %v + %v",
			took.Round(time.Millisecond), leaseTTL, latency, slack)
	}
}

// TestRedisStopAndRestart: under steady load on two replicas, Redis goes
// away and comes back on the same port. No client sees an error at any
// point; the replicas report "degraded" within 5s of the stop and "ready"
// with Redis "ok" within 10s of the restart.
func TestRedisStopAndRestart(t *testing.T) {
	rs := startRedis(t)
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{RPM: 1200, Latency: 50 * time.Millisecond})
	reps := startReplicas(t, 2, bin, mock.URL(), redisEnv(rs.URL())...)
	waitRedisOK(t, reps)

	const perReplica, conc = 200, 10
	total := int64(len(reps) * perReplica)
	var completed atomic.Int64
	stopNow := make(chan struct{})
	load := chatLoad{
		targets: reps, perReplica: perReplica, concurrency: conc, timeout: 2 * time.Minute,
		onDone: func(chatOutcome) {
			if completed.Add(1) == total/5 {
				close(stopNow)
			}
		},
	}
	start := time.Now()
	run := load.start(t, loadClient(t))
	select {
	case <-stopNow:
	case <-run.done:
		t.Fatal("the load ended before a fifth of it completed")
	case <-time.After(60 * time.Second):
		t.Fatalf("a fifth of the requests did not complete within 60s (%d of %d)", completed.Load(), total)
	}

	rs.stop()
	stoppedAt := time.Now()
	t.Logf("redis-server stopped %v into the run, after %d of %d requests", stoppedAt.Sub(start).Round(time.Millisecond), completed.Load(), total)
	for _, r := range reps {
		err := pollAdmin(5*time.Second-time.Since(stoppedAt), func() error {
			code, status, err := r.readyz()
			switch {
			case err != nil:
				return err
			case code != 200:
				return fmt.Errorf("/readyz answered %d (%q), want 200 while degraded", code, status)
			case status != "degraded":
				return fmt.Errorf("/readyz status %q", status)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: not degraded within 5s of the Redis stop: %v", r.name, err)
		}
		t.Logf("%s degraded %v after the stop", r.name, time.Since(stoppedAt).Round(time.Millisecond))
		if got, err := r.lanesRedis(); err != nil || got != "degraded" {
			t.Errorf(`%s while Redis is down: /lanes "redis" = %q, %v; want "degraded"`, r.name, got, err)
		}
		page, err := r.metricsText()
		if v, ok := metricValue(page, "llmproxy_redis_up"); err != nil || !ok || v != 0 {
			t.Errorf("%s while Redis is down: llmproxy_redis_up = %v (present %v, err %v), want 0", r.name, v, ok, err)
		}
	}

	// Some requests go through on local limits alone before Redis returns.
	time.Sleep(time.Second)
	rs.restart()
	restartedAt := time.Now()
	for _, r := range reps {
		err := pollAdmin(10*time.Second-time.Since(restartedAt), func() error {
			code, status, err := r.readyz()
			if err != nil {
				return err
			}
			if code != 200 || status != "ready" {
				return fmt.Errorf("/readyz answered %d %q", code, status)
			}
			got, err := r.lanesRedis()
			if err == nil && got != "ok" {
				err = fmt.Errorf(`/lanes says "redis":%q`, got)
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: not back on Redis within 10s of the restart: %v", r.name, err)
		}
		t.Logf("%s rejoined %v after the restart", r.name, time.Since(restartedAt).Round(time.Millisecond))
	}
	select {
	case <-run.done:
		t.Logf("note: the load had already ended when both replicas were back on Redis")
	default:
	}

	results := run.wait()
	for i, outs := range results {
		sent, failed, first := failures(outs)
		if failed > 0 {
			t.Errorf("%s: %d of %d requests failed across the Redis outage; first: %q", reps[i].name, failed, sent, first)
		}
	}
	st := mock.Stats()
	t.Logf("%d requests in %v; upstream %d requests, %d ok, %d rate-limited",
		total, time.Since(start).Round(time.Millisecond), st.Requests, st.OK, st.RateLimited)
	for _, r := range reps {
		page, err := r.metricsText()
		if v, ok := metricValue(page, "llmproxy_redis_up"); err != nil || !ok || v != 1 {
			t.Errorf("%s after the restart: llmproxy_redis_up = %v (present %v, err %v), want 1", r.name, v, ok, err)
		}
	}
}

// TestRedisBadURLStopsAtStart: an LLMPROXY_REDIS_URL that is not a Redis
// URL stops the program before it listens, with one line on stderr that
// names the variable.
func TestRedisBadURLStopsAtStart(t *testing.T) {
	bin := llmproxyBinary(t)
	for _, bad := range []string{"http://x", "redis://127.0.0.1:notaport/0"} {
		t.Run(bad, func(t *testing.T) {
			// Port 1 on loopback: an upstream nothing will ever reach.
			env := replicaEnv("http://127.0.0.1:1", "LLMPROXY_REDIS_URL="+bad)
			c, listening := launchLLMProxy(t, "llmproxy", bin, env)
			select {
			case <-c.done:
			case <-listening:
				t.Fatalf("LLMPROXY_REDIS_URL=%s: the program started listening instead of stopping", bad)
			case <-time.After(10 * time.Second):
				t.Fatalf("LLMPROXY_REDIS_URL=%s: still running after 10s", bad)
			}
			var exit *exec.ExitError
			if c.exitErr == nil {
				t.Errorf("exit status 0, want non-zero")
			} else if !errors.As(c.exitErr, &exit) {
				t.Errorf("exit: %v", c.exitErr)
			}
			var lines []string
			for _, l := range strings.Split(c.stderr.String(), "\n") {
				if strings.TrimSpace(l) != "" {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 || !strings.Contains(lines[0], "LLMPROXY_REDIS_URL") {
				t.Errorf("stderr has %d lines, want one naming LLMPROXY_REDIS_URL:\n%s", len(lines), strings.Join(lines, "\n"))
			} else {
				t.Logf("stderr: %s", lines[0])
			}
		})
	}
}

// TestRedisUnreachableStartsDegraded: a well-formed URL to a port where
// nothing listens does not stop the program. It starts degraded (/readyz
// 200, "degraded") and still proxies.
func TestRedisUnreachableStartsDegraded(t *testing.T) {
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{})
	closed := fmt.Sprintf("redis://127.0.0.1:%d/0", freeLoopbackPort(t))
	r := startReplica(t, "replica", bin, mock.URL(), redisEnv(closed)...)

	err := pollAdmin(5*time.Second, func() error {
		code, status, err := r.readyz()
		switch {
		case err != nil:
			return err
		case code != 200:
			return fmt.Errorf("/readyz answered %d (%q), want 200", code, status)
		case status != "degraded":
			return fmt.Errorf("/readyz status %q, want degraded", status)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Redis at %s: %v", closed, err)
	}
	if got, err := r.lanesRedis(); err != nil || got != "degraded" {
		t.Errorf(`/lanes "redis" = %q, %v; want "degraded"`, got, err)
	}
	page, err := r.metricsText()
	if v, ok := metricValue(page, "llmproxy_redis_up"); err != nil || !ok || v != 0 {
		t.Errorf("llmproxy_redis_up = %v (present %v, err %v), want 0", v, ok, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := sendChat(ctx, loadClient(t), r.addr); err != nil {
		t.Fatalf("request through a replica without Redis: %v", err)
	}
	if ok := mock.Stats().OK; ok != 1 {
		t.Errorf("upstream answered %d requests OK, want 1", ok)
	}
}

// TestNoRedisConfiguredLanesSayOff: without LLMPROXY_REDIS_URL the replica
// stands alone: /lanes says "redis":"off" and /metrics has no
// llmproxy_redis_up.
func TestNoRedisConfiguredLanesSayOff(t *testing.T) {
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{})
	r := startReplica(t, "replica", bin, mock.URL())

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := sendChat(ctx, loadClient(t), r.addr); err != nil {
		t.Fatalf("request: %v", err)
	}
	if code, status, err := r.readyz(); err != nil || code != 200 || status != "ready" {
		t.Errorf("/readyz = %d %q, %v; want 200 ready", code, status, err)
	}
	if got, err := r.lanesRedis(); err != nil || got != "off" {
		t.Errorf(`/lanes "redis" = %q, %v; want "off"`, got, err)
	}
	page, err := r.metricsText()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page, "llmproxy_redis_up") {
		t.Error("/metrics has llmproxy_redis_up without Redis configured")
	}
}

// completionsPerSecond counts the 200s of a load by the second after start
// they completed in.
func completionsPerSecond(results [][]chatOutcome, start time.Time) []int {
	var perSec []int
	for _, outs := range results {
		for _, o := range outs {
			if o.skipped || o.err != nil {
				continue
			}
			sec := int(o.end.Sub(start) / time.Second)
			for len(perSec) <= sec {
				perSec = append(perSec, 0)
			}
			perSec[sec]++
		}
	}
	return perSec
}
