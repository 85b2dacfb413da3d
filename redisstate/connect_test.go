package redisstate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/redistest"
	"github.com/llmproxy/llmproxy/internal/setting"
)

// TestTheURLAndFilesBecomeTheClientsOptions: the URL's hosts and addr
// parameters are the seeds or Sentinels, in order; its user and password
// the data nodes'; a password file replaces the URL's and is read again
// at each new connection (a rotated secret), its line end trimmed, and
// keeps the last one read while the file is away; the Sentinels' own
// comes from theirs; rediss:// trusts the CA file's certificates.
func TestTheURLAndFilesBecomeTheClientsOptions(t *testing.T) {
	dir := t.TempDir()
	pw, spw := filepath.Join(dir, "pw"), filepath.Join(dir, "spw")
	write := func(f, s string) {
		t.Helper()
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pw, "first\n")
	write(spw, "sentinels\r\n")
	tl, err := redistest.NewTLS(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca := tl.CA
	cfg := Config{URL: "rediss://proxy:inurl@10.0.0.1:26379/3?addr=10.0.0.2:26379&addr=[::1]:26380",
		SentinelMaster: "main", PasswordFile: pw, SentinelPasswordFile: spw, CAFile: ca}
	o, err := cfg.options()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.Addrs, ","); got != "10.0.0.1:26379,10.0.0.2:26379,[::1]:26380" {
		t.Errorf("addresses %s", got)
	}
	if o.DB != 3 || o.MasterName != "main" || o.Username != "proxy" || o.SentinelPassword != "sentinels" {
		t.Errorf("db %d, master %q, user %q, sentinels' password %q", o.DB, o.MasterName, o.Username, o.SentinelPassword)
	}
	if o.TLSConfig == nil || o.TLSConfig.RootCAs == nil || o.TLSConfig.ServerName != "10.0.0.1" {
		t.Fatalf("TLS %+v: want the CA file's pool and the URL's host", o.TLSConfig)
	}
	if u, p := o.CredentialsProvider(); u != "proxy" || p != "first" {
		t.Errorf("credentials %q %q, want the file's password, not the URL's", u, p)
	}
	write(pw, "second")
	if _, p := o.CredentialsProvider(); p != "second" {
		t.Errorf("after the secret's rotation: %q", p)
	}
	os.Remove(pw)
	if _, p := o.CredentialsProvider(); p != "second" {
		t.Errorf("with the file away: %q, want the last one read", p)
	}
	if cfg.mode() != modeSentinel {
		t.Errorf("auto with a Sentinel master is %s", cfg.mode())
	}
	plain, err := Config{URL: "redis://127.0.0.1"}.options()
	if err != nil || plain.Addrs[0] != "127.0.0.1:6379" || plain.TLSConfig != nil || plain.CredentialsProvider != nil {
		t.Errorf("redis://127.0.0.1: %+v, %v", plain, err)
	}
}

// TestAClusterRejoinsOnceEverySlotIsServed: a degraded replica on a
// cluster does not take a node's pong for the cluster's health: while
// some slot has no primary (one failed, its replica not yet promoted) it
// stays local, and it rejoins once every slot is served.
func TestAClusterRejoinsOnceEverySlotIsServed(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--cluster-enabled", "yes")
	st, err := New(Config{URL: srv.url(), Mode: modeCluster})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	node := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", srv.port)})
	defer node.Close()
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 9999).Err(); err != nil {
		t.Fatal(err)
	}
	cc := st.rdb().(*redis.ClusterClient)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// The node answers CLUSTER INFO (so the error is not the
		// client's), and says slots 10000-16383 are not served.
		_, infoErr := cc.ClusterInfo(ctx).Result()
		err := st.answers(ctx)
		if infoErr == nil && err != nil && strings.Contains(err.Error(), "every slot") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a cluster missing slots answers %v, want that it does not serve every slot", err)
		}
	}
	if st.Status() != "degraded" {
		t.Fatalf("status %s while slots are not served", st.Status())
	}
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 10000, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); st.Status() != "ok"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not shared 10 s after every slot was served: %v", st.answers(ctx))
		}
	}
}

// TestAnAutoStoreStartedBeforeRedisFindsItsModeAndShares: a store in auto
// mode whose Redis does not answer at start has not learned what kind of
// server it is; once Redis answers, its rejoin asks, and it shares.
func TestAnAutoStoreStartedBeforeRedisFindsItsModeAndShares(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	srv.stop()
	st, err := New(Config{URL: srv.url(), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.undecided.Load() || st.Status() != "degraded" {
		t.Fatalf("undecided %v, status %s with Redis away", st.undecided.Load(), st.Status())
	}
	if err := st.detect(context.Background()); err == nil || !st.undecided.Load() {
		t.Fatalf("detect with Redis away: %v, undecided %v; want the client's error and the mode unsettled", err, st.undecided.Load())
	}
	srv.start()
	for deadline := time.Now().Add(10 * time.Second); st.Status() != "ok"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not shared 10 s after Redis came up")
		}
	}
	if st.undecided.Load() {
		t.Error("shared, and the mode still undecided")
	}
}

// TestUnusableSecretsAndCertificatesAreNamed: an empty password file, a
// CA file without a certificate and a client certificate that does not
// load are each refused with the field named and the file, never its
// content.
func TestUnusableSecretsAndCertificatesAreNamed(t *testing.T) {
	dir := t.TempDir()
	empty, junk := filepath.Join(dir, "empty"), filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(junk, []byte("hunter2"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{URL: "redis://127.0.0.1:1", PasswordFile: empty}, "PasswordFile"},
		{Config{URL: "rediss://127.0.0.1:1", CAFile: junk}, "CAFile"},
		{Config{URL: "rediss://127.0.0.1:1", CertFile: junk, KeyFile: junk}, "CertFile"},
		{Config{URL: "redis://127.0.0.1:1", CertFile: junk, KeyFile: junk}, "CertFile"},
		{Config{URL: "redis://127.0.0.1:1", CAFile: junk}, "CAFile"},
		{Config{URL: "redis://"}, "URL"},
		{Config{URL: "redis:opaque"}, "URL"},
	} {
		err := c.cfg.Validate()
		var se *setting.Error
		if !errors.As(err, &se) || se.Field != c.field || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%+v: %v; want an error naming %s and not the file's content", c.cfg, err, c.field)
		}
	}
}

// TestAFailedRenewalTakesTheReplicaLocal: a renewal Redis does not take
// (it went away while permits are held) is a failed call like any: the
// replica goes local, and the renewal says so.
func TestAFailedRenewalTakesTheReplicaLocal(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	if _, _, ok := admit(t, st.Shared("g", groupCfg)); !ok || st.Status() != "ok" {
		t.Fatalf("admitted %v, status %s", ok, st.Status())
	}
	srv.stop()
	if err := st.renew(); err == nil {
		t.Fatal("a renewal with Redis away says it went through")
	}
	if st.Status() != "degraded" {
		t.Errorf("status %s after a failed renewal, want degraded", st.Status())
	}
}
