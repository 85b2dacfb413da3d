package redisstate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// server is a redis-server of the test's own on a free loopback port.
type server struct {
	t       testing.TB
	port    int
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
	started bool          // it answered once on port: a restart keeps the port
	args    []string      // more redis-server options
}

func startServer(t testing.TB, args ...string) *server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("LLMPROXY_E2E_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server not found (apt-get install -y redis-server)")
		}
		t.Skip("redis-server not found; apt-get install -y redis-server")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &server{t: t, port: port, args: args}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *server) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.port) }

// client is a plain client of the server, closed when the test ends.
func (s *server) client(t testing.TB) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", s.port)})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func (s *server) start() {
	s.t.Helper()
	for try := 0; ; try++ {
		err := s.startOnce()
		if err == nil {
			return
		}
		// Another test's server took the port between the search for a
		// free one and this bind: a first start moves to another port; a
		// restart must have its own.
		if s.started || try == 4 {
			s.t.Fatal(err)
		}
		ln, lerr := net.Listen("tcp", "127.0.0.1:0")
		if lerr != nil {
			s.t.Fatal(lerr)
		}
		s.port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
}

// startOnce starts redis-server on s.port and waits until it answers,
// making sure the server answering is this one: a test must never talk
// to another test's server that holds the port.
func (s *server) startOnce() error {
	s.cmd = exec.Command("redis-server", append([]string{"--port", fmt.Sprint(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no"}, s.args...)...)
	s.cmd.Dir = s.t.TempDir() // a cluster node writes nodes.conf here
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	cmd := s.cmd
	go func() { _ = cmd.Wait(); close(exited) }()
	s.exited = exited
	mine := fmt.Sprintf("process_id:%d\r\n", cmd.Process.Pid)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("redis-server on port %d exited at start (port taken?)", s.port)
		default:
		}
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.port), 100*time.Millisecond); err == nil {
			fmt.Fprint(c, "INFO server\r\n")
			c.SetReadDeadline(time.Now().Add(time.Second))
			br := bufio.NewReader(c)
			head, _ := br.ReadString('\n') // $<length>
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
			info := make([]byte, max(n, 0))
			_, _ = io.ReadFull(br, info)
			c.Close()
			if strings.Contains(string(info), mine) {
				s.started = true
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatal("redis-server did not answer")
	return nil
}

func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.exited
	s.cmd = nil
}

// newStore is a store on url with lease TTL lease that never goes local
// for slowness (Slow zero) nor for a call cut off (a cutoff of 10 s): on a
// loaded machine (CI runs every package at once, under -race) calls can
// pass the 50 ms bound, or the 250 ms cutoff, and send a test's replica
// local when what it tests is the shared path. The tests of slowness set
// Slow themselves; those of a Redis gone for a moment take a
// newPausableStore.
func newStore(t *testing.T, url string, lease time.Duration) *Store {
	t.Helper()
	return storeOn(t, Config{URL: url, LeaseTTL: lease, Timeout: 10 * time.Second})
}

// newPausableStore is a store as newStore, but for the default cutoff
// (250 ms): a blip of a second sends it local at its next call.
func newPausableStore(t *testing.T, url string, lease time.Duration) *Store {
	t.Helper()
	return storeOn(t, Config{URL: url, LeaseTTL: lease})
}

// storeOn is a store of cfg, closed when the test ends.
func storeOn(t *testing.T, cfg Config) *Store {
	t.Helper()
	st, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// newFakeStore is a store on url, as newStore, whose clock is replica
// and whose scripts run on redis instead of Redis' own clock
// (Config.redisClock): the test moves time for the replica and for the
// shared state itself, to the millisecond, and no load on the machine
// moves either. Most tests give the same fake clock for both.
func newFakeStore(t *testing.T, url string, replica, redis *clock.Fake) *Store {
	t.Helper()
	return storeOn(t, Config{URL: url, LeaseTTL: time.Minute, Timeout: 10 * time.Second, Clock: replica, redisClock: redis})
}

// fakeStores are n stores on url on the one fake clock fc (see
// newFakeStore).
func fakeStores(t *testing.T, url string, fc *clock.Fake, n int) []*Store {
	t.Helper()
	stores := make([]*Store, n)
	for i := range stores {
		stores[i] = newFakeStore(t, url, fc, fc)
	}
	return stores
}

// fakeStart is where the tests' fake clocks start: a fixed day, so that a
// failure reads the same on every run, and years from the wall clock, so
// that a time read from the wall clock by mistake shows.
var fakeStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// admitOn admits one request of cost 1 on sh at fc's now, moving fc to
// each time the group says to ask again, at most tries times; the clock
// moves only as far as the limits make it wait.
func admitOn(t *testing.T, fc *clock.Fake, sh limit.Shared, tries int) limit.Ticket {
	t.Helper()
	for range tries {
		tk, at, ok := sh.Admit(fc.Now(), 1, false)
		if ok {
			return tk
		}
		if at.IsZero() {
			t.Fatalf("refused at %v with no time to ask again", fc.Now().Sub(fakeStart))
		}
		fc.Set(at)
	}
	t.Fatalf("not admitted after %d tries, at %v", tries, fc.Now().Sub(fakeStart))
	return limit.Ticket{}
}

var groupCfg = limit.Config{Concurrency: 2, MinConcurrency: 1, MaxConcurrency: 2}

func admit(t *testing.T, sh limit.Shared) (limit.Ticket, time.Time, bool) {
	t.Helper()
	return sh.Admit(time.Now(), 1, false)
}

func TestReplicasShareThePermits(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a, b := newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)
	sa, sb := a.Shared("g", groupCfg), b.Shared("g", groupCfg)
	t1, _, ok1 := admit(t, sa)
	_, _, ok2 := admit(t, sa)
	if !ok1 || !ok2 {
		t.Fatal("replica a could not take the group's two permits")
	}
	_, at, ok := admit(t, sb)
	if ok || at.IsZero() {
		t.Fatalf("replica b got a third permit (ok %v), or no time to ask again (%v)", ok, at)
	}
	sa.Return(&t1, time.Now())
	a.flush() // the writer has removed the lease from Redis
	if _, _, ok := admit(t, sb); !ok {
		t.Fatal("replica b could not take the permit a gave back")
	}
	if n := a.Held(); n != 1 {
		t.Fatalf("a holds %d leases, want 1", n)
	}
}

func TestABudgetLearnedByOneReplicaBindsTheOther(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a, b := newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)
	cfg := limit.Config{Concurrency: 64, MaxConcurrency: 64}
	sa, sb := a.Shared("g", cfg), b.Shared("g", cfg)
	tk, _, ok := admit(t, sa)
	if !ok {
		t.Fatal("first admit refused")
	}
	now := time.Now()
	// 10 a minute, 1 left after this request.
	sa.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: headerparse.Limits{
		Requests: headerparse.Window{Limit: 10, Remaining: 1, HasRemaining: true, Reset: now.Add(54 * time.Second)}}}, now)
	if _, _, ok := admit(t, sb); !ok {
		t.Fatal("replica b could not send the one request left")
	}
	_, at, ok := admit(t, sb)
	if ok || at.Before(now.Add(time.Second)) {
		t.Fatalf("replica b sent past the shared budget (ok %v, at %v)", ok, at.Sub(now))
	}
	if _, _, ok := admit(t, sa); ok {
		t.Fatal("replica a sent past the shared budget")
	}
}

func TestAPauseIsShared(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	sa, sb := st[0].Shared("g", groupCfg), st[1].Shared("g", groupCfg)
	tk := admitOn(t, fc, sa, 1)
	until := fc.Now().Add(time.Hour)
	sa.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: until}, fc.Now())
	// The pause travels as a length on Redis' clock: its end on b is the
	// same instant.
	fc.Advance(10 * time.Millisecond)
	_, at, ok := sb.Admit(fc.Now(), 1, false)
	if ok || !at.Equal(until) {
		t.Fatalf("replica b: ok %v, ask again at %v; want the pause's end %v", ok, at, until)
	}
	if p := sb.PausedUntil(); !p.Equal(until) {
		t.Fatalf("b's PausedUntil %v, want %v", p, until)
	}
}

// die stops s as a replica that was killed does: no more renewals or
// heartbeats, and nothing handed back.
func (s *Store) die() {
	s.closing.Do(func() {
		close(s.stop)
		<-s.done
		_ = s.rdb().Close()
	})
}

// TestACleanCloseHandsItsPermitsAndShareBack: a replica closed while it
// holds permits (requests cut at the end of a drain) removes their leases
// at once, not a lease TTL later, and leaves the fleet: the others count
// it gone at their next heartbeat, not a minute later.
func TestACleanCloseHandsItsPermitsAndShareBack(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	two := limit.Config{Concurrency: 2, MaxConcurrency: 2}
	sa, sb := st[0].Shared("g", two), st[1].Shared("g", two)
	admitOn(t, fc, sa, 1)
	admitOn(t, fc, sa, 1)
	if _, _, ok := sb.Admit(fc.Now(), 1, false); ok {
		t.Fatal("b took a third permit of two")
	}
	if n := st[1].Replicas(); n != 2 {
		t.Fatalf("b counts %d replicas before a closes, want 2", n)
	}
	st[0].Close()
	if n, err := st[1].rdb().ZCard(context.Background(), sa.(*shared).leases).Result(); err != nil || n != 0 {
		t.Fatalf("%d leases (%v) left in Redis by a clean close", n, err)
	}
	if _, _, ok := sb.Admit(fc.Now(), 1, false); !ok {
		t.Fatal("b waits for permits a handed back at its close")
	}
	st[1].heartbeat(fc.Now())
	if n := st[1].Replicas(); n != 1 {
		t.Errorf("b counts %d replicas after a left, want 1", n)
	}
}

func TestLeasesOfADeadReplicaExpire(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	one := limit.Config{Concurrency: 1, MaxConcurrency: 1}
	admitOn(t, fc, st[0].Shared("g", one), 1)
	st[0].die() // holding the permit: no return, no renewal
	sb := st[1].Shared("g", one)
	fc.Advance(st[0].cfg.LeaseTTL - time.Millisecond)
	if _, _, ok := sb.Admit(fc.Now(), 1, false); ok {
		t.Fatal("b took a permit still leased to a")
	}
	fc.Advance(time.Millisecond)
	if _, _, ok := sb.Admit(fc.Now(), 1, false); !ok {
		t.Fatal("a's lease did not expire at its TTL")
	}
}

func TestLeasesOfALiveReplicaAreRenewed(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	a, b := st[0], st[1]
	one := limit.Config{Concurrency: 1, MaxConcurrency: 1}
	admitOn(t, fc, a.Shared("g", one), 1)
	for range 7 { // a long answer, past two TTLs: a keeps renewing (every third of the TTL)
		renewAfter(t, fc, a, a.cfg.LeaseTTL/3)
	}
	if _, _, ok := b.Shared("g", one).Admit(fc.Now(), 1, false); ok {
		t.Fatal("b took the permit of an answer a still streams")
	}
}

// renewAfter moves fc on by d, a renewal period of st's, and waits (on
// the wall clock, for the store's loop) until st has renewed its leases.
func renewAfter(t *testing.T, fc *clock.Fake, st *Store, d time.Duration) {
	t.Helper()
	n := counterValue(st, "renew")
	fc.Advance(d)
	for deadline := time.Now().Add(10 * time.Second); counterValue(st, "renew") == n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no renewal %v on", d)
		}
	}
}

func TestAReplicasOlderWaiterGoesFirst(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 3)
	one := limit.Config{Concurrency: 1, MaxConcurrency: 1}
	sa, sb, sc := st[0].Shared("g", one), st[1].Shared("g", one), st[2].Shared("g", one)
	held := admitOn(t, fc, sa, 1)
	if _, _, ok := sb.Admit(fc.Now(), 1, false); ok { // b starts waiting
		t.Fatal("b admitted past the limit")
	}
	fc.Advance(time.Millisecond)
	if _, _, ok := sc.Admit(fc.Now(), 1, false); ok { // c starts waiting later
		t.Fatal("c admitted past the limit")
	}
	sa.Return(&held, fc.Now())
	st[0].flush()
	if _, _, ok := sc.Admit(fc.Now(), 1, false); ok {
		t.Fatal("c went before b, which has waited longer")
	}
	if _, _, ok := sb.Admit(fc.Now(), 1, false); !ok {
		t.Fatal("b, the oldest waiter, did not get the free permit")
	}
}

func TestRedisDownFallsBackAndRejoins(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a := newStore(t, srv.url(), time.Minute)
	sa := a.Shared("g", groupCfg)
	if _, _, ok := admit(t, sa); !ok || a.Status() != "ok" {
		t.Fatalf("admit with Redis up: ok %v status %s", ok, a.Status())
	}
	srv.stop()
	start := time.Now()
	tk, _, ok := admit(t, sa)
	if !ok || tk.Lease != "" {
		t.Fatalf("with Redis down: ok %v, lease %q; want a local permit", ok, tk.Lease)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("falling back took %v", d)
	}
	if a.Status() != "degraded" || a.Ready() == nil {
		t.Fatalf("status %s while Redis is down", a.Status())
	}
	sa.Return(&tk, time.Now())
	srv.start()
	deadline := time.Now().Add(5 * time.Second)
	for a.Status() != "ok" {
		if time.Now().After(deadline) {
			t.Fatal("the store did not rejoin Redis")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if tk, _, ok := admit(t, sa); !ok || tk.Lease == "" {
		t.Fatalf("after rejoining: ok %v lease %q; want a shared permit", ok, tk.Lease)
	}
}

func TestUnreachableAtStartIsDegradedNotAnError(t *testing.T) {
	t.Parallel()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	url := fmt.Sprintf("redis://%s/0", ln.Addr())
	ln.Close() // nothing listens there now
	st, err := New(Config{URL: url})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer st.Close()
	if st.Status() != "degraded" {
		t.Fatalf("status %s", st.Status())
	}
	if _, _, ok := st.Shared("g", groupCfg).Admit(time.Now(), 1, false); !ok {
		t.Fatal("a degraded store refused a request its local limits allow")
	}
	if _, err := New(Config{URL: "http://nope"}); err == nil {
		t.Fatal("a URL that is not redis:// was accepted")
	}
}

// TestAZeroConfigTakesTheDefaults: Shared with a zero limit.Config
// admits as a group with the default limits does (it admitted nothing,
// ever: the scripts read a concurrency of 0).
func TestAZeroConfigTakesTheDefaults(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), MinLeaseTTL)
	sh := st.Shared("g", limit.Config{})
	def := limit.Config{}.WithDefaults().Concurrency
	for i := range def {
		if _, _, ok := admit(t, sh); !ok {
			t.Fatalf("admit %d of a zero config refused", i+1)
		}
	}
	if _, _, ok := admit(t, sh); ok {
		t.Fatalf("admitted more than the default concurrency %d", def)
	}
}

// TestARenewedLeaseExpiresOnRedisClockWhateverTheReplicasClock: a replica
// whose injected clock is an hour behind renews its leases to Redis' now
// plus the lease TTL, not to an hour ago: the store reads its time from
// that one clock, for the offset it learns and the expiry it writes.
func TestARenewedLeaseExpiresOnRedisClockWhateverTheReplicasClock(t *testing.T) {
	srv := startServer(t)
	fc := clock.NewFake(time.Now().Add(-time.Hour))
	st := storeOn(t, Config{URL: srv.url(), LeaseTTL: 5 * time.Second, Timeout: 10 * time.Second, Clock: fc}) // never local for a loaded machine
	sh := st.Shared("g", limit.Config{Concurrency: 2, MaxConcurrency: 2}).(*shared)
	tk, _, ok := sh.Admit(fc.Now(), 1, false)
	if !ok {
		t.Fatal("admit")
	}
	if err := st.renew(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	score, err := st.rdb().ZScore(ctx, sh.leases, tk.Lease).Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := st.rdb().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := float64(now.UnixMilli() + 5000)
	if d := score - want; d < -2000 || d > 2000 {
		t.Fatalf("lease renewed to expire %.0f ms from Redis' now + TTL", d)
	}
}

// TestTheScriptsRunOnTheClockGivenForRedis: a store given a clock for
// Redis runs every script at that clock's time, not at Redis' TIME, and
// reads the times the scripts return on its own clock through the offset,
// to the millisecond: a replica an hour behind Redis learns the offset of
// an hour, writes its leases to expire a lease TTL on Redis' clock (at
// admission and at renewal), and a pause it takes ends on the other
// replica's clock when it asked.
func TestTheScriptsRunOnTheClockGivenForRedis(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	redisClock := clock.NewFake(fakeStart)
	behind := clock.NewFake(fakeStart.Add(-time.Hour))
	a, b := newFakeStore(t, srv.url(), behind, redisClock), newFakeStore(t, srv.url(), redisClock, redisClock)
	sa, sb := a.Shared("g", groupCfg).(*shared), b.Shared("g", groupCfg)
	tk, _, ok := sa.Admit(behind.Now(), 1, false)
	if !ok {
		t.Fatal("admit")
	}
	if off := a.clockOffset.Load(); off != time.Hour.Milliseconds() {
		t.Fatalf("a learned Redis' clock %d ms ahead of its own, want an hour", off)
	}
	expiry := func() int64 {
		t.Helper()
		score, err := a.rdb().ZScore(context.Background(), sa.leases, tk.Lease).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int64(score)
	}
	if got, want := expiry(), fakeStart.Add(time.Minute).UnixMilli(); got != want {
		t.Fatalf("the lease expires %d ms from Redis' now plus its TTL", got-want)
	}
	redisClock.Advance(10 * time.Second)
	behind.Advance(10 * time.Second)
	if err := a.renew(); err != nil {
		t.Fatal(err)
	}
	if got, want := expiry(), fakeStart.Add(10*time.Second+time.Minute).UnixMilli(); got != want {
		t.Fatalf("the renewed lease expires %d ms from Redis' now plus its TTL", got-want)
	}
	sa.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: behind.Now().Add(2 * time.Second)}, behind.Now())
	if _, at, ok := sb.Admit(redisClock.Now(), 1, false); ok || !at.Equal(redisClock.Now().Add(2*time.Second)) {
		t.Fatalf("b: admitted %v, asks again %v from now; want paused 2s", ok, at.Sub(redisClock.Now()))
	}
}

// TestAGroupsDispatchesAreCountedAcrossItsLimitsAndReplicas: every
// limit of one lanes' group (one route and credential, any model) keeps
// its keys in the group's hash slot, and each admission carries the
// count of that limit's dispatches and of the whole group's, every
// replica's: what lanequeue needs to tell, from one replica, that the
// upstream's count fell by what other models sent elsewhere. Another
// credential's group counts apart.
func TestAGroupsDispatchesAreCountedAcrossItsLimitsAndReplicas(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a, b := newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	const modelA, modelB, other = "r\x00cred\x00gpt-a", "r\x00cred\x00gpt-b", "r\x00cred2\x00gpt-a"
	steps := []struct {
		st            *Store
		key           string
		seq, groupSeq uint64
	}{
		{a, modelA, 1, 1}, {b, modelB, 1, 2}, {b, modelA, 2, 3}, {a, other, 1, 1}, {a, modelB, 2, 4},
	}
	for i, s := range steps {
		tk, _, ok := admit(t, s.st.Shared(s.key, cfg))
		if !ok || tk.Seq != s.seq || tk.GroupSeq != s.groupSeq {
			t.Fatalf("step %d (%q): ok %v, seq %d, group seq %d; want %d and %d", i, s.key, ok, tk.Seq, tk.GroupSeq, s.seq, s.groupSeq)
		}
	}
	// One hash tag, so one slot in a cluster (cluster_test.go runs the
	// keys on a real one).
	ka, kb := a.Shared(modelA, cfg).(*shared), a.Shared(modelB, cfg).(*shared)
	tag := ka.groupSent[:strings.Index(ka.groupSent, "}")+1]
	for _, k := range []string{ka.state, ka.leases, kb.state, kb.levels} {
		if !strings.HasPrefix(k, tag) {
			t.Errorf("%s is not under the group's tag %s", k, tag)
		}
	}
	if apart := a.Shared(other, cfg).(*shared); strings.HasPrefix(apart.state, tag) {
		t.Errorf("another credential's %s is under this group's tag %s", apart.state, tag)
	}
}
