package redisstate

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// slowRedis stands between the stores of a test and its redis-server,
// holding every reply back for its delay (0: none): a Redis as slow as
// the test says, and never faster, however loaded the machine is. (A
// DEBUG SLEEP was found asleep by a ping's timeout, which a loaded machine
// also gives, and ended when the server woke, whatever the test was
// doing then.)
type slowRedis struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	delay   time.Duration
	changed chan struct{}         // closed when the delay changes
	clients map[net.Conn]struct{} // nil once the test ended
}

func startSlowRedis(t *testing.T, srv *server) *slowRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowRedis{ln: ln, target: fmt.Sprintf("127.0.0.1:%d", srv.port), changed: make(chan struct{}),
		clients: map[net.Conn]struct{}{}}
	// The test's end closes every connection, those of a store the test
	// left open too (a failed New), so that no forward is left waiting.
	t.Cleanup(func() {
		p.hold(0)
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for c := range p.clients {
			c.Close()
		}
		p.clients = nil
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.clients == nil {
				c.Close()
			} else {
				p.clients[c] = struct{}{}
			}
			p.mu.Unlock()
			go p.forward(c)
		}
	}()
	return p
}

func (p *slowRedis) url() string { return "redis://" + p.ln.Addr().String() + "/0" }

// hold makes every reply wait d from its arrival before it goes on,
// those already waiting included.
func (p *slowRedis) hold(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
	close(p.changed)
	p.changed = make(chan struct{})
}

// wait holds a reply that came at since for the delay.
func (p *slowRedis) wait(since time.Time) {
	for {
		p.mu.Lock()
		left, changed := time.Until(since.Add(p.delay)), p.changed
		p.mu.Unlock()
		if left <= 0 {
			return
		}
		select {
		case <-time.After(left):
		case <-changed:
		}
	}
}

// forward joins the client c to the server, holding each reply back.
func (p *slowRedis) forward(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	go func() { _, _ = io.Copy(s, c); s.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			p.wait(time.Now())
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Giving a permit back does not wait for Redis: a request that ended is
// not held up by a slow Redis; the writer sends the return once Redis
// answers (issue 18, item 3).
func TestAReturnDoesNotWaitForRedis(t *testing.T) {
	slow := startSlowRedis(t, startServer(t))
	a, err := New(Config{URL: slow.url(), Timeout: time.Minute}) // a slow Redis, not a gone one
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	sa := a.Shared("g", groupCfg)
	tk, _, ok := admit(t, sa)
	if !ok {
		t.Fatal("admit")
	}
	slow.hold(time.Minute)
	returned := make(chan struct{})
	go func() {
		sa.Return(&tk, time.Now())
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("Return waited for Redis")
	}
	if n := counterValue(a, "return"); n != 0 {
		t.Fatalf("%v returns answered while Redis holds its replies", n)
	}
	slow.hold(0)
	a.flush()
	if n, err := a.rdb().ZCard(context.Background(), sa.(*shared).leases).Result(); err != nil || n != 0 {
		t.Fatalf("%d leases in Redis after the return was sent (%v), want 0", n, err)
	}
}

// A Redis whose recent calls are slower than Config.Slow at the 99th
// percentile sends the replica local, where its requests do not wait on
// Redis; it shares again once a ping answers within the bound (item 3).
// That fast calls keep it shared, whatever their number, is
// TestTookGoesLocalOnlyPastSlow's: here a loaded machine could make one
// of them slow.
func TestASlowRedisSendsTheReplicaLocal(t *testing.T) {
	slow := startSlowRedis(t, startServer(t))
	a, err := New(Config{URL: slow.url(), Timeout: 10 * time.Second, Slow: DefaultSlow}) // below the cutoff: only slow
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	sa := a.Shared("g", limit.Config{Concurrency: 64, MaxConcurrency: 64})
	// The first call takes 300 ms, the 32nd tells the p99.
	slow.hold(300 * time.Millisecond)
	var last limit.Ticket
	for i := 0; a.Status() == "ok" && i < 40; i++ {
		if i == 1 {
			slow.hold(0)
		}
		if i > 0 {
			sa.Return(&last, time.Now())
		}
		var ok bool
		if last, _, ok = admit(t, sa); !ok {
			t.Fatal("admit")
		}
	}
	if a.Status() != "degraded" {
		t.Fatal("a replica whose call took 300ms (bound 50ms) still waits on Redis")
	}
	before := counterValue(a, "admit")
	tk, _, ok := admit(t, sa)
	if !ok || tk.Lease != "" {
		t.Fatalf("degraded for slowness, the admit went to Redis (ok %v, lease %q)", ok, tk.Lease)
	}
	if after := counterValue(a, "admit"); after != before {
		t.Fatalf("%v admissions through Redis while local", after-before)
	}
	sa.Return(&tk, time.Now())
	sa.Return(&last, time.Now())
	waitUp(t, a) // pings answer fast again
}

// heartbeatAll has every store say it is alive and busy, then read how
// many are.
func heartbeatAll(stores ...*Store) {
	for range 2 {
		for _, st := range stores {
			st.ask(time.Now())
			st.heartbeat(time.Now())
		}
	}
}

// While Redis is away each of three replicas uses a third of the last
// shared limits, so that together they send about what one proxy would:
// a concurrency of 6 is 2 each, and a request pace of r a second is one
// every 3/r seconds each (issue 18, item 4).
func TestDegradedReplicasTakeTheirShare(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	stores := fakeStores(t, srv.url(), fc, 3)
	for range 2 { // every store says it is alive and busy, then reads how many are
		for _, st := range stores {
			st.ask(fc.Now())
			st.heartbeat(fc.Now())
		}
	}
	conc := limit.Config{Concurrency: 6, MaxConcurrency: 6}
	var perm, paced []limit.Shared
	for _, st := range stores {
		if st.Replicas() != 3 {
			t.Fatalf("a replica counts %d replicas, want 3", st.Replicas())
		}
		c, p := st.Shared("conc", conc), st.Shared("paced", conc)
		perm, paced = append(perm, c), append(paced, p)
		tk := admitOn(t, fc, c, 1) // each has seen the shared limits
		c.Return(&tk, fc.Now())
		tk = admitOn(t, fc, p, 1)
		p.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: reqLimits(fc.Now(), 60, 50)}, fc.Now())
		p.Return(&tk, fc.Now())
		st.flush()
	}
	for i, p := range paced { // the shared limits as each last saw them
		tk := admitOn(t, fc, p, 1)
		p.Return(&tk, fc.Now())
		stores[i].flush()
	}
	rate, err := strconv.ParseFloat(hget(t, stores[0], paced[0].(*shared).state, "r_rate"), 64)
	if err != nil || rate <= 0 {
		t.Fatalf("no shared request pace (%v)", err)
	}
	// The rate as the replies carry it (in thousandths).
	want := time.Duration(3 / (math.Floor(rate*replyScale) / replyScale) * float64(time.Second))
	srv.stop()
	for i, c := range perm {
		n := 0
		for range 6 {
			if _, _, ok := c.Admit(fc.Now(), 1, false); ok {
				n++
			}
		}
		if stores[i].Status() != "degraded" {
			t.Fatal("not degraded with Redis gone")
		}
		if n != 2 {
			t.Fatalf("replica %d took %d permits of the shared 6 while degraded, want its share of 2", i, n)
		}
	}
	for i, p := range paced {
		now := fc.Now()
		if _, _, ok := p.Admit(now, 1, false); !ok {
			t.Fatalf("replica %d: no request at all while degraded", i)
		}
		_, at, ok := p.Admit(now, 1, false)
		if ok {
			t.Fatalf("replica %d sent two requests at once at a shared 1/s", i)
		}
		if gap := at.Sub(now); gap < want-time.Millisecond || gap > want+time.Millisecond {
			t.Fatalf("replica %d's next request at +%v, want +%v (a third of the shared %.3f/s)", i, gap, want, rate)
		}
	}
}

// Permits taken while Redis was away and still out are counted in Redis
// once it is back: the other replicas do not fill the limit beside them
// (issue 18, item 4).
func TestPermitsTakenWhileAwayAreCountedAtRejoin(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a, b := newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)
	heartbeatAll(a, b)
	four := limit.Config{Concurrency: 4, MaxConcurrency: 4}
	sa, sb := a.Shared("g", four), b.Shared("g", four)
	tk, _, ok := admit(t, sa)
	if !ok {
		t.Fatal("admit")
	}
	sa.Return(&tk, time.Now())
	srv.stop()
	var away []limit.Ticket
	for range 2 {
		tk, _, ok := admit(t, sa)
		if !ok || tk.Lease != "" {
			t.Fatalf("degraded admit: ok %v lease %q", ok, tk.Lease)
		}
		away = append(away, tk)
	}
	srv.start()
	waitUp(t, a)
	waitUp(t, b)
	if _, _, ok := admit(t, sa); !ok { // its 2 from while away are counted beside it
		t.Fatal("admit after rejoin")
	}
	n := 0
	for range 4 {
		if _, _, ok := admit(t, sb); ok {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("b took %d permits beside a's 3 (2 from while Redis was away), want 1 of 4", n)
	}
	for i := range away {
		sa.Return(&away[i], time.Now())
	}
	a.flush()
	if _, _, ok := admit(t, sb); !ok {
		t.Fatal("a gave its permits from while Redis was away back; b still cannot take one")
	}
	if a.Held() != 1 {
		t.Fatalf("a holds %d leases, want the 1 it took after the rejoin", a.Held())
	}
}

// Until some replica has learned from an answer, only one replica's first
// request goes; the others go once an answer is learned, without waiting
// for one of their own (issue 18, item 5).
func TestOneReplicaSendsFirst(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a, b := newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	sa, sb := a.Shared("g", cfg), b.Shared("g", cfg)
	first, _, ok := sa.Admit(time.Now(), 1, true)
	if !ok {
		t.Fatal("the first request was refused")
	}
	if _, _, ok := sb.Admit(time.Now(), 1, true); ok {
		t.Fatal("a second replica sent beside the first, before any answer")
	}
	if sb.(*shared).AnsweredElsewhere() {
		t.Fatal("answered elsewhere before any answer")
	}
	sa.Learn(&first, limit.Report{Status: 200, Verdict: limit.Accepted}, time.Now())
	// The slow start may hold it for a part of the first answer's time,
	// no longer.
	_, at, ok := sb.Admit(time.Now(), 1, true)
	for end := time.Now().Add(time.Second); !ok && !at.IsZero() && time.Now().Before(end); {
		time.Sleep(time.Until(at))
		_, at, ok = sb.Admit(time.Now(), 1, true)
	}
	if !ok {
		t.Fatal("after an answer was learned the other replica still waits")
	}
	if !sb.(*shared).AnsweredElsewhere() {
		t.Fatal("b does not know an answer was learned")
	}
}

// learnWindow pushes a requests window (size, rate per second; syn for a
// pace learned from refusals) from replica, as Learn does for an answer
// the upstream accepted.
func learnWindow(t *testing.T, st *Store, sh *shared, replica string, syn bool, size, rate float64) learnReply {
	t.Helper()
	return learnWindowAfter(t, st, sh, replica, syn, false, size, rate)
}

// learnWindowAfter is learnWindow for a refusal when refused is set.
func learnWindowAfter(t *testing.T, st *Store, sh *shared, replica string, syn, refused bool, size, rate float64) learnReply {
	t.Helper()
	args := learnArgs{KeyTTL: st.cfg.KeyTTL.Milliseconds(), Climit: 8, Replica: replica,
		Req: budgetArgs{Known: true, Syn: syn, Size: size, Rate: rate}, Kind: answerUncounted, Refusal: refused}
	res, err := learnScript.Run(context.Background(), st.rdb(), []string{sh.state, sh.leases, sh.climits, sh.raise, sh.levels}, argv(args)...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := decodeLearn(res, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// A window's figures are the lowest a replica holds, not the last
// written: a replica whose refusals corrected the window is not undone by
// one that only read the headers; a pace learned from refusals is raised
// by one replica at a time, the one holding the raise lease, and lowered
// only by a refusal (item 5).
func TestAWindowIsTheLowestAReplicaHolds(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("headers", groupCfg).(*shared)
	learnWindow(t, st, sh, "a", false, 100, 100.0/60)
	learnWindow(t, st, sh, "b", false, 50, 50.0/60) // b's refusals corrected it
	learnWindow(t, st, sh, "a", false, 100, 100.0/60)
	if size := hget(t, st, sh.state, "r_size"); size != "50" {
		t.Fatalf("window %s after a replica that saw no refusal wrote its headers' 100 over b's corrected 50", size)
	}
	paced := st.Shared("paced", groupCfg).(*shared)
	learnWindow(t, st, paced, "a", true, 10, 10)
	learnWindow(t, st, paced, "b", true, 10, 10)
	if rep := learnWindow(t, st, paced, "a", true, 12, 12); !rep.raiser { // a probes up: it takes the lease
		t.Fatal("a's raise was taken, but the reply says another replica holds the lease")
	}
	if rep := learnWindow(t, st, paced, "b", true, 14, 14); rep.raiser { // b may not probe beside it
		t.Fatal("b's reply says it holds the raise lease that a holds")
	}
	if rate := hget(t, st, paced.state, "r_rate"); rate != "12" {
		t.Fatalf("pace %s, want a's 12: b raised it while a held the raise lease", rate)
	}
	learnWindow(t, st, paced, "b", true, 9, 9) // lower, but with no refusal: b's own older figure
	if rate := hget(t, st, paced.state, "r_rate"); rate != "12" {
		t.Fatalf("pace %s, want a's 12: b lowered it without a refusal", rate)
	}
	learnWindowAfter(t, st, paced, "b", true, true, 9, 9) // lowering by a refusal needs no lease
	if rate := hget(t, st, paced.state, "r_rate"); rate != "9" {
		t.Fatalf("pace %s, want b's 9: a refusal's lowering was refused", rate)
	}
}

// A refusal's wait that the replica declined (an upstream without headers
// that admits other requests: the learned pace holds the group) does not
// pause the other replicas either (one it took does: TestAPauseIsShared).
func TestADeclinedPauseIsNotShared(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	a, b := newFakeStore(t, srv.url(), fc, fc), newFakeStore(t, srv.url(), fc, fc)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	sa, sb := a.Shared("g", cfg), b.Shared("g", cfg)
	answer := func(r limit.Report) {
		tk := admitOn(t, fc, sa, 100) // the slow start may spread them
		sa.Learn(&tk, r, fc.Now())
		sa.Return(&tk, fc.Now())
	}
	for range 3 {
		answer(limit.Report{Status: 200, Verdict: limit.Accepted})
	}
	answer(limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: fc.Now().Add(time.Second)})
	if p := sa.PausedUntil(); p.After(fc.Now()) {
		t.Fatalf("the replica took the pause (%v) of a refusal by an upstream that admits", p.Sub(fc.Now()))
	}
	// (b may still wait for the pace the refusal taught: not a pause.)
	sb.Admit(fc.Now(), 1, false)
	if p := sb.PausedUntil(); p.After(fc.Now()) {
		t.Fatalf("another replica is paused (%v) by a wait the refused one declined", p.Sub(fc.Now()))
	}
}

// Each replica sees only its share of the refusals: two replicas each
// refused once at 9 and 10 in flight (all replicas together), after many
// admissions at 8 and below, judge a concurrency limit at 9 from the
// answers of both, as one proxy would from the two refusals (item 10: the
// upstream must not tell how many replicas there are).
func TestReplicasJudgeTheBoundFromEveryonesAnswers(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	a, b := newFakeStore(t, srv.url(), fc, fc), newFakeStore(t, srv.url(), fc, fc)
	cfg := limit.Config{Concurrency: 16, MinConcurrency: 1, MaxConcurrency: 16}
	sa, sb := a.Shared("g", cfg), b.Shared("g", cfg)
	ok200 := limit.Report{Status: 200, Verdict: limit.Accepted}
	refused := limit.Report{Status: 429, Verdict: limit.RateRefused}
	// Rounds of 8 in flight, all replicas together, alternating replicas,
	// all admitted; then one of 10, whose ninth (on a) and tenth (on b)
	// are refused.
	for round := range 6 {
		n := 8
		if round == 5 {
			n = 10
		}
		var held []limit.Ticket
		var from []limit.Shared
		for i := range n {
			sh := []limit.Shared{sa, sb}[i%2]
			// Until a refusal the slow start may spread them a few ms.
			tk := admitOn(t, fc, sh, 100)
			held, from = append(held, tk), append(from, sh)
		}
		// The refusals come back first, then the admissions: a learns of
		// b's refusal with its next answer, as a replica would.
		for i := len(held) - 1; i >= 0; i-- {
			r := ok200
			if i >= 8 {
				r = refused
			}
			from[i].Learn(&held[i], r, fc.Now())
		}
		for i := range held {
			from[i].Return(&held[i], fc.Now())
		}
		a.flush()
		b.flush()
	}
	for name, sh := range map[string]limit.Shared{"a": sa, "b": sb} {
		v := sh.(*shared).local.View(fc.Now())
		if v.Bound != limit.BoundConcurrency || v.ConcurrencyFrom.String() != "refusals at 9 in flight" {
			t.Errorf("replica %s judges bound %q (%q) from one refusal of its own; want concurrency at 9 from both", name, v.Bound, v.ConcurrencyFrom)
		}
	}
}

// A refusal that names the number in flight, of a permit a degraded
// replica took on its share, teaches the level the fleet went at (each
// replica sends about what this one does), not this replica's alone: one
// permit out of three replicas' is a limit of three, not one.
func TestADegradedRefusalTeachesTheFleetsLevel(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	stores := []*Store{newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute), newStore(t, srv.url(), time.Minute)}
	heartbeatAll(stores...)
	cfg := limit.Config{Concurrency: 6, MinConcurrency: 1, MaxConcurrency: 6}
	sh := stores[0].Shared("g", cfg)
	tk, _, ok := admit(t, sh) // the shared limits, once
	if !ok {
		t.Fatal("admit")
	}
	sh.Return(&tk, time.Now())
	stores[0].flush()
	srv.stop()
	now := time.Now()
	tk, _, ok = sh.Admit(now, 1, false)
	if !ok || stores[0].Status() != "degraded" {
		t.Fatalf("admit with Redis gone: ok %v, status %s", ok, stores[0].Status())
	}
	sh.Learn(&tk, limit.Report{Status: 429, Verdict: limit.ConcurrencyRefused}, now)
	sh.Return(&tk, now)
	if got := sh.(*shared).local.View(now).Concurrency; got != 3 {
		t.Fatalf("concurrency after a named refusal at one local permit of three replicas: %d, want 3", got)
	}
}

// A replica whose own first answer is a refusal, while the upstream admits
// the other replicas' requests, does not take the upstream for down: it
// declines the refusal's wait as one proxy would, and the fleet does not
// pause. (Three replicas lost a second each run to such a pause.)
func TestAReplicasFirstRefusalIsNotAnOutageWhenOthersAreAdmitted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		othersAdmit bool
		paused      bool
	}{{"others admitted", true, false}, {"nothing admitted anywhere", false, true}} {
		srv := startServer(t)
		fc := clock.NewFake(fakeStart)
		a, b := newFakeStore(t, srv.url(), fc, fc), newFakeStore(t, srv.url(), fc, fc)
		cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
		sa, sb := a.Shared("g", cfg), b.Shared("g", cfg)
		if c.othersAdmit {
			for range 3 {
				tk := admitOn(t, fc, sa, 100) // the slow start may spread them
				sa.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, fc.Now())
				sa.Return(&tk, fc.Now())
			}
		}
		tk := admitOn(t, fc, sb, 100)
		sb.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: fc.Now().Add(time.Second)}, fc.Now())
		sb.Return(&tk, fc.Now())
		sa.Admit(fc.Now(), 1, false) // reads the shared pause
		if p := sa.PausedUntil(); p.After(fc.Now()) != c.paused {
			t.Errorf("%s: the fleet paused %v by b's first answer, a refusal; want paused: %v", c.name, p.Sub(fc.Now()).Round(time.Millisecond), c.paused)
		}
	}
}

// TestEveryReplicasRefusalsAreCounted: a ticket carries the refusals every
// replica learned from before it went, so that a replica measuring the
// admitted rate between its own refusals does not count the others'
// refusals as admissions (a rate measured too high by the share refused).
func TestEveryReplicasRefusalsAreCounted(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	a, b := newFakeStore(t, srv.url(), fc, fc), newFakeStore(t, srv.url(), fc, fc)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	sa, sb := a.Shared("g", cfg), b.Shared("g", cfg)
	verdicts := []limit.Verdict{limit.Accepted, limit.RateRefused, limit.RateRefused, limit.Failed, limit.ConcurrencyRefused}
	for _, v := range verdicts {
		tk := admitOn(t, fc, sa, 100)
		sa.Learn(&tk, limit.Report{Status: 429, Verdict: v}, fc.Now())
		sa.Return(&tk, fc.Now())
	}
	if tk := admitOn(t, fc, sb, 100); tk.Refusals != 4 {
		t.Fatalf("b's ticket went after %d refusals (plus one), want 3 + 1", tk.Refusals)
	}
}

// TestAReplicasFirstGuessIsTheGroupsSendingRate: a replica that starts
// sending after the others and is refused at once guesses the pace from
// what the group sent in the last second, not from its own one request.
func TestAReplicasFirstGuessIsTheGroupsSendingRate(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	cfg := limit.Config{Concurrency: 16, MaxConcurrency: 16}
	sa, sb := st[0].Shared("g", cfg), st[1].Shared("g", cfg)
	for i := range 12 { // 12 in 0.55 s, then b's
		tk := admitOn(t, fc, sa, 1)
		if i == 0 {
			sa.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, fc.Now())
			sa.Return(&tk, fc.Now())
		}
		fc.Advance(50 * time.Millisecond)
	}
	tk := admitOn(t, fc, sb, 1)
	sb.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused}, fc.Now())
	v := sb.View(fc.Now())
	if !v.FromRefusals() || v.RateFrom.String() != "sending rate" || v.AdmittedRate != 13 {
		t.Fatalf("b learned %.1f/s from %q at its first refusal, want from refusals at the group's 13/s, from \"sending rate\"",
			v.AdmittedRate, v.RateFrom)
	}
}

// TestAReplicaFirstRefusedStartsFromThePaceOthersLearned: a replica
// refused for the first time after another learned a pace from its own
// refusals starts from that pace, not from what the group was sending
// (faster: that is what the upstream refused).
func TestAReplicaFirstRefusedStartsFromThePaceOthersLearned(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	cfg := limit.Config{Concurrency: 32, MaxConcurrency: 32}
	sa, sb := st[0].Shared("g", cfg), st[1].Shared("g", cfg)
	var last limit.Ticket
	for i := range 20 { // 20 in 0.95 s: the group's last second holds them all
		last = admitOn(t, fc, sa, 1)
		if i < 19 { // admitted one at a time: a refusal at one in flight is about the rate
			sa.Learn(&last, limit.Report{Status: 200, Verdict: limit.Accepted}, fc.Now())
			sa.Return(&last, fc.Now())
			fc.Advance(50 * time.Millisecond)
		}
	}
	sa.Learn(&last, limit.Report{Status: 429, Verdict: limit.RateRefused}, fc.Now())
	fleet := sa.View(fc.Now()).Requests.PerSecond
	tk := admitOn(t, fc, sb, 100)
	sb.Learn(&tk, limit.Report{Status: 429, Verdict: limit.RateRefused}, fc.Now())
	v := sb.View(fc.Now())
	// (Refused at that pace, which b waited its turn for, it starts
	// below it, as one process refused again at a pace not yet measured.)
	if v.RateFrom.String() != "replicas" || v.AdmittedRate > fleet {
		t.Fatalf("b's first refusal set %.1f/s from %q; want at most a's %.1f/s, from \"replicas\"", v.AdmittedRate, v.RateFrom, fleet)
	}
}

// TestTheSlowStartIsSpreadFleetWide: before any limit is known and before
// any refusal, the group's dispatches go 1/(2 × limit) of the first
// answer's time apart whichever replica sends them, as one process
// spreads its own: a replica that has no answer of its own yet does not
// send its share of the burst at once. A group whose limits are
// configured has no slow start.
func TestTheSlowStartIsSpreadFleetWide(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 3)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	sa, sb, sc := st[0].Shared("g", cfg), st[1].Shared("g", cfg), st[2].Shared("g", cfg)
	first := admitOn(t, fc, sa, 1)
	first.Dispatched = fc.Now().Add(-4 * time.Second) // its headers came 4 s after it went
	sa.Learn(&first, limit.Report{Status: 200, Verdict: limit.Accepted}, fc.Now())
	const gap = 4 * time.Second / (2 * 8)
	admitOn(t, fc, sb, 2) // a gap after a's
	if d := fc.Now().Sub(fakeStart); d != gap {
		t.Fatalf("b went %v after a, want %v", d, gap)
	}
	b := fc.Now()
	if _, at, ok := sc.Admit(b, 1, false); ok || !at.Equal(b.Add(gap)) {
		t.Fatalf("c admitted %v right after b, or told to wait %v; want %v", ok, at.Sub(b), gap)
	}
	fc.Advance(gap - time.Millisecond)
	if _, _, ok := sc.Admit(fc.Now(), 1, false); ok {
		t.Fatalf("c went %v after b, want %v", fc.Now().Sub(b), gap)
	}
	fc.Advance(time.Millisecond)
	if _, _, ok := sc.Admit(fc.Now(), 1, false); !ok {
		t.Fatalf("c held back %v after b", gap)
	}
	// One gap for every replica, whatever its own answers took: a's first
	// answer held its permit 8 s, twice its time to its headers, and a
	// still waits the first answer's gap, no more.
	sa.Return(&first, first.Dispatched.Add(8*time.Second))
	admitOn(t, fc, sa, 2)
	if _, at, ok := sa.Admit(fc.Now(), 1, false); ok || !at.Equal(fc.Now().Add(gap)) {
		t.Fatalf("a admitted %v, told to wait %v; want %v, the fleet's gap", ok, at.Sub(fc.Now()), gap)
	}

	// Configured limits: no slow start, the admissions go back to back.
	conf := limit.Config{Concurrency: 8, MaxConcurrency: 8, Limits: limit.Limits{Concurrency: 8, Start: true}}
	ca, cb := st[0].Shared("h", conf), st[1].Shared("h", conf)
	tk := admitOn(t, fc, ca, 1)
	tk.Dispatched = fc.Now().Add(-4 * time.Second)
	ca.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, fc.Now())
	for i := range 3 {
		if _, _, ok := cb.Admit(fc.Now(), 1, false); !ok {
			t.Fatalf("configured group: admission %d held back", i+1)
		}
	}
}

// TestALimitOneReplicaTakesOffATrialIsApartForEveryReplica: replica a
// notes gpt-b's limit apart from the trial both pace on; b's next
// admission there, admitted or not, tells it, and b's Apart says so for
// gpt-b alone. Redis keeps a hash of the name, not the name, and noting
// it twice counts it once.
func TestALimitOneReplicaTakesOffATrialIsApartForEveryReplica(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	a, b := newFakeStore(t, srv.url(), fc, fc), newFakeStore(t, srv.url(), fc, fc)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	const trialKey, member, other = "route\x00cred\x00refused together", "route\x00cred\x00gpt-b", "route\x00cred\x00gpt-a"
	sa, sb := a.Shared(trialKey, cfg).(*shared), b.Shared(trialKey, cfg).(*shared)
	tk := admitOn(t, fc, sb, 100)
	sb.Return(&tk, fc.Now())
	if sb.Apart(member) || sb.Apart(other) {
		t.Fatal("a limit is apart before any replica noted one")
	}
	sa.PutApart(member)
	sa.PutApart(member)
	if !sa.Apart(member) || sa.Apart(other) {
		t.Fatal("the replica that noted gpt-b apart does not see it so, or sees gpt-a apart too")
	}
	if sb.Apart(member) {
		t.Fatal("b saw the note before asking Redis")
	}
	tk = admitOn(t, fc, sb, 100)
	sb.Return(&tk, fc.Now())
	if !sb.Apart(member) || sb.Apart(other) {
		t.Fatalf("after its next admission b sees gpt-b apart %v, gpt-a apart %v; want true, false", sb.Apart(member), sb.Apart(other))
	}
	fields, err := a.rdb().HGetAll(context.Background(), sa.state).Result()
	if err != nil {
		t.Fatal(err)
	}
	if fields["apn"] != "1" || strings.Contains(fields["ap"], "gpt-b") || fields["ap"] != apartName(member)+"," {
		t.Fatalf("Redis keeps ap=%q apn=%q; want one hashed name, counted once", fields["ap"], fields["apn"])
	}
}

// TestALimitOneReplicaFoundSharedIsJoinedForEveryReplica: replica a
// notes gpt-b's limit joined to gpt-a's; b's next answer on gpt-b's state
// tells it, and b's Joined says so for gpt-a alone. Redis keeps a hash of
// the name, not the name.
func TestALimitOneReplicaFoundSharedIsJoinedForEveryReplica(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	a, b := newFakeStore(t, srv.url(), fc, fc), newFakeStore(t, srv.url(), fc, fc)
	cfg := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	const member, root, other = "route\x00cred\x00gpt-b", "route\x00cred\x00gpt-a", "route\x00cred\x00gpt-c"
	sa, sb := a.Shared(member, cfg).(*shared), b.Shared(member, cfg).(*shared)
	learn := func() {
		tk := admitOn(t, fc, sb, 100)
		sb.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, fc.Now())
		sb.Return(&tk, fc.Now())
	}
	learn()
	if sb.Joined(root) || sb.Joined(other) {
		t.Fatal("gpt-b is joined before any replica noted it")
	}
	sa.PutJoined(root)
	if sb.Joined(root) {
		t.Fatal("b saw the note before asking Redis")
	}
	learn()
	if !sb.Joined(root) || sb.Joined(other) {
		t.Fatalf("after its next answer b sees gpt-b joined to gpt-a %v, to gpt-c %v; want true, false", sb.Joined(root), sb.Joined(other))
	}
	fields, err := a.rdb().HGetAll(context.Background(), sa.state).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatInt(joinName(root), 10); fields["jn"] != want || joinName(root) >= 1<<48 || joinName(root) == joinName(other) {
		t.Fatalf("Redis keeps jn=%q; want %s, 48 bits of gpt-a's hash", fields["jn"], want)
	}
}
