package e2e

// Redis as production runs it, from outside: replicas of the binary on a
// Redis Cluster and on a primary under Sentinels, the node holding their
// group killed mid-run.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/fleetstate"
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
		holds, err := fleetstate.HoldsGroups(ctx, cl)
		cl.Close()
		if err == nil && holds {
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

// documentedACL is the ACL line docs/replicas.md gives operators, with
// password in place of PASSWORD.
func documentedACL(t *testing.T, password string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/replicas.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "user llmproxy on >PASSWORD ") {
			return strings.Replace(line, "PASSWORD", password, 1)
		}
	}
	t.Fatal("docs/replicas.md gives no line `user llmproxy on >PASSWORD …`")
	return ""
}

// TestTLSAndTheDocumentedACLFromOutside: replicas of the binary reach a
// Redis that speaks TLS only and asks for a client certificate, as the
// user docs/replicas.md's ACL line makes, its password in a file (a
// mounted secret). They share, and the server's ACL log stays empty. A
// replica given a wrong password stays up on local limits, and /readyz
// says why. Neither password is in any replica's log, /lanes, /readyz,
// /metrics or `llmproxy status`.
func TestTLSAndTheDocumentedACLFromOutside(t *testing.T) {
	redistest.Need(t, "redis-server")
	const password, wrongPassword = "Sekr1t-acl-7d41e", "Wr0ng-acl-22c9a"
	dir := t.TempDir()
	tl, err := redistest.NewTLS(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redistest.Start(redistest.Options{TLS: tl, ClientCerts: true, Password: "admin-" + password,
		ACL: []string{documentedACL(t, password)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	pwFile, wrongFile := filepath.Join(dir, "password"), filepath.Join(dir, "wrong")
	for f, pw := range map[string]string{pwFile: password + "\n", wrongFile: wrongPassword + "\n"} {
		if err := os.WriteFile(f, []byte(pw), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := func(file string) []string {
		return []string{"LLMPROXY_REDIS_URL=rediss://llmproxy@" + srv.Addr(), "LLMPROXY_REDIS_PASSWORD_FILE=" + file,
			"LLMPROXY_REDIS_CA=" + tl.CA, "LLMPROXY_REDIS_CERT=" + tl.ClientCert, "LLMPROXY_REDIS_KEY=" + tl.ClientKey}
	}
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{RPM: 6000})
	reps := startReplicas(t, 2, bin, mock.URL(), env(pwFile)...)
	waitRedisOK(t, reps)
	load := chatLoad{targets: reps, perReplica: 20, concurrency: 5, timeout: time.Minute}
	for i, outs := range load.start(t, loadClient(t)).wait() {
		if sent, failed, first := failures(outs); failed > 0 {
			t.Errorf("%s: %d of %d requests failed; first: %q", reps[i].name, failed, sent, first)
		}
	}
	wrong := startReplica(t, "wrong password", bin, mock.URL(), env(wrongFile)...)
	// /readyz says Redis is unreachable, not where it is or what it
	// said: the log says that.
	err = pollAdmin(10*time.Second, func() error {
		code, body, err := wrong.adminGet("/readyz")
		if err == nil && (code != 200 || !strings.Contains(string(body), "degraded") || !strings.Contains(string(body), "redis unreachable") ||
			strings.Contains(string(body), "WRONGPASS") || strings.Contains(string(body), srv.Addr())) {
			err = fmt.Errorf("/readyz %d %s", code, body)
		}
		if err == nil && !strings.Contains(wrong.stderr.String(), "WRONGPASS") {
			err = errors.New("the log does not say WRONGPASS")
		}
		return err
	})
	if err != nil {
		t.Errorf("a replica with a wrong password: %v; want 200, degraded, redis unreachable as the reason, and WRONGPASS in the log", err)
	}
	cl := srv.Client()
	defer cl.Close()
	// The wrong password's failed logins are in the server's ACL log; a
	// command or key the documented user may not use would be too.
	log, err := cl.Do(context.Background(), "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range log {
		if entry := fmt.Sprint(e); !strings.Contains(entry, "reason auth ") {
			t.Errorf("the server refused the documented user: %s", lastChars(entry, 300))
		}
	}
	for _, r := range append(reps, wrong) {
		seen := []string{"stderr: " + r.stderr.String()}
		for _, path := range []string{"/lanes", "/readyz", "/metrics"} {
			_, body, err := r.adminGet(path)
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, path+": "+string(body))
		}
		out, err := exec.Command(bin, "status", "-admin", r.admin).CombinedOutput()
		if err != nil {
			t.Errorf("%s: llmproxy status: %v: %s", r.name, err, out)
		}
		seen = append(seen, "llmproxy status: "+string(out))
		for _, s := range seen {
			for _, pw := range []string{password, wrongPassword} {
				if strings.Contains(s, pw) {
					t.Errorf("%s: a password in %s", r.name, lastChars(s, 400))
				}
			}
		}
	}
}
