package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func stopAtEnd(t *testing.T, stop func() error) {
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
}

func TestAServerAnswersAndStopRemovesItsDirectory(t *testing.T) {
	t.Parallel()
	Need(t, "redis-server")
	s, err := Start(Options{Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, s.Stop)
	ctx := context.Background()
	anon := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("a client without the password: %v, want NOAUTH", err)
	}
	cl := s.Client()
	defer cl.Close()
	if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	dir := s.dir
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if s.Alive() {
		t.Fatal("alive after Stop")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatalf("%s left after Stop", dir)
	}
}

func TestATLSServerAnswersAClientThatTrustsTheCA(t *testing.T) {
	t.Parallel()
	Need(t, "redis-server")
	tl, err := NewTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Options{TLS: tl, ClientCerts: true})
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, s.Stop)
	ctx := context.Background()
	ping := func(cfg *redis.Options) error {
		cfg.Addr, cfg.MaxRetries = s.Addr(), -1
		cl := redis.NewClient(cfg)
		defer cl.Close()
		return cl.Ping(ctx).Err()
	}
	if err := ping(&redis.Options{TLSConfig: tl.ClientConfig(true)}); err != nil {
		t.Fatalf("with the CA and a client certificate: %v", err)
	}
	if err := ping(&redis.Options{TLSConfig: tl.ClientConfig(false)}); err == nil {
		t.Fatal("a client without a certificate was let in (tls-auth-clients yes)")
	}
	if err := ping(&redis.Options{TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}); err == nil {
		t.Fatal("a client that does not trust the CA connected")
	}
	if err := ping(&redis.Options{}); err == nil {
		t.Fatal("a plain-text client got an answer from the TLS port")
	}
	if !strings.HasPrefix(s.URL(), "rediss://") {
		t.Fatalf("URL %s", s.URL())
	}
}

func TestTheClusterSpreadsSlotsAndFailsOverAKilledPrimary(t *testing.T) {
	t.Parallel()
	Need(t, "redis-server", "redis-cli")
	start := time.Now()
	c, err := StartCluster(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the cluster started in %v", time.Since(start).Round(time.Millisecond))
	stopAtEnd(t, c.Stop)
	prim, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	if len(prim) != 3 {
		t.Fatalf("%d primaries, want 3", len(prim))
	}
	owners := map[*Server]bool{}
	for i := range 30 {
		o, err := c.Owner(fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		owners[o] = true
	}
	if len(owners) != 3 {
		t.Fatalf("30 keys on %d primaries", len(owners))
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{c.Nodes[3].Addr()}})
	defer cl.Close()
	ctx := context.Background()
	victim, err := c.Owner("k0")
	if err != nil {
		t.Fatal(err)
	}
	// Written on the primary, and on its replica before it dies (WAIT on
	// the same connection).
	direct := victim.Client()
	defer direct.Close()
	pipe := direct.Pipeline()
	pipe.Set(ctx, "k0", "v", 0)
	acks := pipe.Do(ctx, "WAIT", 1, 5000)
	if _, err := pipe.Exec(ctx); err != nil || acks.Val() != int64(1) {
		t.Fatalf("write and WAIT on the primary: %v, %v replicas", err, acks.Val())
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := c.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("failed over in %v", time.Since(start).Round(time.Millisecond))
	now, err := c.Owner("k0")
	if err != nil {
		t.Fatal(err)
	}
	if now == victim || !now.Alive() {
		t.Fatalf("k0 still served by the killed node %s", victim.Addr())
	}
	// go-redis reloads its slot map on MOVED, not on a dial error: it
	// would try the dead node until its reload interval (a minute). The
	// reload is asynchronous: poll.
	cl.ReloadState(ctx)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		v, err := cl.Get(ctx, "k0").Result()
		if err == nil && v == "v" {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("after the failover k0 = %q, %v", v, err)
		}
	}
}

func TestSentinelsFailOverAKilledPrimary(t *testing.T) {
	t.Parallel()
	Need(t, "redis-server", "redis-sentinel")
	s, err := StartSentinel("main", Options{Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, s.Stop)
	old, err := s.PrimaryAddr()
	if err != nil || old != s.Primary.Addr() {
		t.Fatalf("the Sentinels name %s (%v), want %s", old, err, s.Primary.Addr())
	}
	if err := s.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	addr, err := s.WaitFailover(old, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failed over in %v", time.Since(start).Round(time.Millisecond))
	if addr != s.Replica.Addr() || s.Node(addr) != s.Replica {
		t.Fatalf("new primary %s, want the replica %s", addr, s.Replica.Addr())
	}
	cl := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "main", Password: "pw",
		SentinelAddrs: []string{s.Sentinels[1].Addr(), s.Sentinels[2].Addr()}})
	defer cl.Close()
	if err := cl.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("a write through the Sentinels after the failover: %v", err)
	}
}
