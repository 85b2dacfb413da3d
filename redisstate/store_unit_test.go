package redisstate

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/internal/setting"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/prometheus/client_golang/prometheus"
)

// TestLatenciesTellTheP99EveryEighthCallFromTheThirtySecond: add says
// nothing (0) before 32 calls, then gives the 99th percentile of the
// recent calls on every 8th call only; a reset starts the count again.
func TestLatenciesTellTheP99EveryEighthCallFromTheThirtySecond(t *testing.T) {
	t.Parallel()
	var l latencies
	for i := 1; i <= 200; i++ {
		d := time.Duration(i) * time.Millisecond
		got := l.add(d)
		var want time.Duration
		if i >= 32 && i%8 == 0 {
			k := min(i, 128)
			// the calls kept are the last k: i-k+1 .. i ms, whose p99 is
			// the ceil(0.99k)-th of them
			want = time.Duration(i-k+(k*99+99)/100) * time.Millisecond
		}
		if got != want {
			t.Fatalf("call %d: add = %v, want %v", i, got, want)
		}
	}
	l.reset()
	for i := 1; i < 32; i++ {
		if got := l.add(time.Second); got != 0 {
			t.Fatalf("call %d after a reset: add = %v, want 0", i, got)
		}
	}
	if got := l.add(time.Second); got != time.Second {
		t.Fatalf("32nd call after a reset: add = %v, want 1s", got)
	}
}

// TestTookGoesLocalOnlyPastSlow: calls faster than Slow keep the replica
// shared however many there are; one slower among the recent ones sends
// it local (for slowness) when the next 8th call tells the p99, not
// before; a failed call is not timed (failed takes it local itself). The
// calls' times are set, not waited for: a fast one is microseconds
// against a bound of an hour, a slow one two hours.
func TestTookGoesLocalOnlyPastSlow(t *testing.T) {
	t.Parallel()
	st, err := unstarted(Config{Slow: time.Hour}.withDefaults(), nil)
	if err != nil {
		t.Fatal(err)
	}
	st.setUp(true)
	fast, slow := func() time.Time { return time.Now() }, func() time.Time { return time.Now().Add(-2 * time.Hour) }
	for i := 1; i <= 40; i++ {
		st.took(fast(), nil)
	}
	st.took(slow(), errors.New("failed")) // not timed
	if st.Status() != "ok" {
		t.Fatal("40 fast calls and a failed one sent the replica local")
	}
	st.took(slow(), nil) // the 41st timed call
	for i := 42; i < 48; i++ {
		st.took(fast(), nil)
		if st.Status() != "ok" {
			t.Fatalf("local at call %d; the p99 is told at the 48th", i)
		}
	}
	st.took(fast(), nil)
	if st.Status() != "degraded" || !st.slow.Load() {
		t.Fatalf("a call of two hours among 48 left the replica %s (slow %v); want local for slowness", st.Status(), st.slow.Load())
	}
}

// TestTakeReturnsTakesOneKeysLeasesAtMost64: an admission takes the
// returns of its own group only, at most 64 at a time; the others stay.
func TestTakeReturnsTakesOneKeysLeasesAtMost64(t *testing.T) {
	t.Parallel()
	st := &Store{returns: map[string]string{}}
	for i := range 70 {
		st.returns[fmt.Sprint("a", i)] = "ka"
	}
	st.returns["b"] = "kb"
	got := st.takeReturns("ka")
	if len(got) != 64 {
		t.Fatalf("took %d leases of ka, want 64", len(got))
	}
	for _, l := range got {
		if l[0] != 'a' {
			t.Fatalf("took %q, a lease of another key", l)
		}
		if _, ok := st.returns[l]; ok {
			t.Fatalf("%q taken but still waiting", l)
		}
	}
	if got := st.takeReturns("ka"); len(got) != 6 {
		t.Fatalf("took %d leases of ka the second time, want the 6 left", len(got))
	}
	if got := st.takeReturns("kb"); len(got) != 1 || got[0] != "b" {
		t.Fatalf("took %q for kb, want [b]", got)
	}
	if len(st.returns) != 0 {
		t.Fatalf("%d returns left", len(st.returns))
	}
}

// TestGiveBacksWaitingAreBounded: past maxGives waiting, a give-back is
// dropped.
func TestGiveBacksWaitingAreBounded(t *testing.T) {
	t.Parallel()
	st := &Store{kick: make(chan struct{}, 1)}
	for range maxGives + 10 {
		st.giveLater(give{op: "refund", state: "s", requests: 1})
	}
	if len(st.gives) != maxGives {
		t.Fatalf("%d give-backs waiting, want %d", len(st.gives), maxGives)
	}
}

// TestNewFillsTheDocumentedDefaults: zero Config fields take the
// documented defaults (Slow zero stays never), set ones are kept. Redis
// need not answer.
func TestNewFillsTheDocumentedDefaults(t *testing.T) {
	t.Parallel()
	url := "redis://127.0.0.1:1/0" // nobody listens: the store starts degraded
	zero, err := New(Config{URL: url, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer zero.Close()
	want := Config{Prefix: "llmproxy:v2:", LeaseTTL: 15 * time.Second, KeyTTL: 10 * time.Minute,
		Timeout: 50 * time.Millisecond, Poll: 20 * time.Millisecond, Slow: 0}
	if c := zero.cfg; c.Prefix != want.Prefix || c.LeaseTTL != want.LeaseTTL || c.KeyTTL != want.KeyTTL ||
		c.Timeout != want.Timeout || c.Poll != want.Poll || c.Slow != want.Slow {
		t.Errorf("zero config became %+v, want %+v", c, want)
	}
	set := Config{URL: url, Prefix: "x:", LeaseTTL: 3 * time.Second, KeyTTL: time.Minute, Timeout: 40 * time.Millisecond,
		Poll: 5 * time.Millisecond, Slow: 30 * time.Millisecond}
	st, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if c := st.cfg; c.Prefix != set.Prefix || c.LeaseTTL != set.LeaseTTL || c.KeyTTL != set.KeyTTL ||
		c.Timeout != set.Timeout || c.Poll != set.Poll || c.Slow != set.Slow {
		t.Errorf("config %+v became %+v", set, c)
	}
}

// TestValidateNamesTheFieldItRefuses: each setting New cannot use is a
// *setting.Error naming its field, the URL's value never shown; what it
// can use passes.
func TestValidateNamesTheFieldItRefuses(t *testing.T) {
	const secret = "hunter2"
	for _, tc := range []struct {
		cfg   Config
		field string // "" = valid
	}{
		{Config{URL: "redis://127.0.0.1:1/0"}, ""}, // nobody listens: New starts degraded
		{Config{URL: "rediss://u:" + secret + "@127.0.0.1:1/1", LeaseTTL: MinLeaseTTL, Slow: time.Millisecond}, ""},
		{Config{}, ""}, // New wants a URL; the settings beside it are valid
		{Config{URL: "http://u:" + secret + "@127.0.0.1/"}, "URL"},
		{Config{URL: "redis://127.0.0.1:1", LeaseTTL: MinLeaseTTL - time.Millisecond}, "LeaseTTL"},
		{Config{URL: "redis://127.0.0.1:1", LeaseTTL: -time.Second}, "LeaseTTL"},
		{Config{URL: "redis://127.0.0.1:1", Slow: -1}, "Slow"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1?addr=127.0.0.1:2", Mode: "cluster"}, ""},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1?addr=127.0.0.1:2", SentinelMaster: "m"}, ""},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1?addr=127.0.0.1:2", Mode: "standalone"}, "URL"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1?addr=nope", Mode: "cluster"}, "URL"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1?dial_timeout=3", Mode: "cluster"}, "URL"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1/2", Mode: "cluster"}, "URL"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1/x"}, "URL"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1", Mode: "Sentinel"}, "SentinelMaster"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1", Mode: "replicated"}, "Mode"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1", PasswordFile: "/nonexistent/" + secret}, "PasswordFile"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1", SentinelPasswordFile: "/nonexistent/pw", SentinelMaster: "m"}, "SentinelPasswordFile"},
		{Config{URL: "redis://u:" + secret + "@127.0.0.1:1", CAFile: "/nonexistent/ca.pem"}, "CAFile"},
		{Config{URL: "rediss://u:" + secret + "@127.0.0.1:1", CAFile: "/nonexistent/ca.pem"}, "CAFile"},
		{Config{URL: "rediss://u:" + secret + "@127.0.0.1:1", CertFile: "/nonexistent/c.pem"}, "CertFile"},
	} {
		err := tc.cfg.Validate()
		var se *setting.Error
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.cfg, err)
		case tc.field != "" && (!errors.As(err, &se) || se.Field != tc.field || se.Pkg != "redisstate"):
			t.Errorf("%+v: %v, want a setting error on %s", tc.cfg, err, tc.field)
		case err != nil && strings.Contains(err.Error(), secret) && tc.field != "PasswordFile":
			t.Errorf("the error shows the URL's password: %v", err)
		}
		tc.cfg.Timeout = 50 * time.Millisecond
		st, nerr := New(tc.cfg)
		if nerr == nil {
			st.Close()
		}
		if (tc.field != "" || tc.cfg.URL == "") && nerr == nil {
			t.Errorf("New(%+v) accepted what it cannot use", tc.cfg)
		}
	}
}

// TestRejoinWaitsDoubleAfterQuickFailuresLessWhenOnlySlow: a replica that
// failed soon after its last rejoin waits twice as long each time, up to
// maxRejoinWait, or up to maxSlowRejoinWait when Redis was only slow; a
// failure long after the last rejoin starts again at minRejoinWait.
func TestRejoinWaitsDoubleAfterQuickFailuresLessWhenOnlySlow(t *testing.T) {
	t.Parallel()
	cases := []struct {
		wait, since time.Duration
		slow        bool
		want        time.Duration
	}{
		{minRejoinWait, time.Second, false, 2 * minRejoinWait},
		{minRejoinWait, time.Second, true, 2 * minRejoinWait},
		{4 * time.Second, time.Second, false, 8 * time.Second},
		{4 * time.Second, time.Second, true, maxSlowRejoinWait},
		{maxSlowRejoinWait, time.Second, true, maxSlowRejoinWait},
		{20 * time.Second, time.Second, false, maxRejoinWait},
		{maxRejoinWait, maxRejoinWait - time.Millisecond, false, maxRejoinWait},
		{maxRejoinWait, maxRejoinWait, false, minRejoinWait},
		{maxSlowRejoinWait, maxRejoinWait, true, minRejoinWait},
	}
	for _, c := range cases {
		if got := nextRejoinWait(c.wait, c.since, c.slow); got != c.want {
			t.Errorf("nextRejoinWait(%v, %v since the rejoin, slow %v) = %v, want %v", c.wait, c.since, c.slow, got, c.want)
		}
	}
}

// TestAFailureSaysWhetherRedisWasOnlySlow: the last failure's kind is
// kept for the rejoin's wait: slowness, or an error.
func TestAFailureSaysWhetherRedisWasOnlySlow(t *testing.T) {
	t.Parallel()
	st := &Store{log: slog.New(slog.DiscardHandler), failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "f"}), upGauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "u"})}
	st.failed("slow", fmt.Errorf("p99"))
	if !st.slow.Load() {
		t.Fatal("a slow failure is not kept as slow")
	}
	st.failed("admit", fmt.Errorf("refused"))
	if st.slow.Load() {
		t.Fatal("an error after a slow failure is kept as slow")
	}
}

// TestSawClockKeepsRedisClockLessOurs: the offset a reply leaves is Redis'
// clock less this process' wall clock, whichever is ahead.
func TestSawClockKeepsRedisClockLessOurs(t *testing.T) {
	t.Parallel()
	st := Store{cfg: Config{Clock: clock.Real{}}}
	for _, ahead := range []int64{5000, -5000} {
		st.sawClock(time.Now().UnixMilli() + ahead)
		if got := st.clockOffset.Load(); got < ahead-100 || got > ahead+100 {
			t.Errorf("Redis %d ms ahead: offset %d ms", ahead, got)
		}
	}
}

// TestAPermitTakenWhileRedisIsAwayComesBack: a replica that never reached
// Redis admits from its local state; the permit it gave comes back to
// that state when returned (no lease to drop: Redis never counted it).
func TestAPermitTakenWhileRedisIsAwayComesBack(t *testing.T) {
	t.Parallel()
	st, err := New(Config{URL: "redis://127.0.0.1:1/0", Timeout: 50 * time.Millisecond}) // nobody listens
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sh := st.Shared("g", limit.Config{Concurrency: 1, MaxConcurrency: 1})
	tk, _, ok := sh.Admit(time.Now(), 1, true)
	if !ok || tk.Lease != "" {
		t.Fatalf("admitted %v with lease %q while Redis is away; want a local permit", ok, tk.Lease)
	}
	if _, _, ok := sh.Admit(time.Now(), 1, true); ok {
		t.Fatal("a second permit beside the one local permit")
	}
	sh.Return(&tk, time.Now())
	if _, _, ok := sh.Admit(time.Now(), 1, true); !ok {
		t.Fatal("the permit did not come back")
	}
}
