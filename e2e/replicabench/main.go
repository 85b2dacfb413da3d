// Command replicabench measures three llmproxy replicas sharing their lane
// state through Redis against one proxy alone, on the same loads, and what
// Redis or a replica going wrong in the middle of a run costs.
//
// It builds ./cmd/llmproxy once, starts the mock upstream (e2e/mockupstream)
// in process and, for each run, a fresh mock, a fresh redis-server (Debian's
// redis-server, no persistence) and fresh llmproxy processes, all on
// 127.0.0.1. The client (the OpenAI Go SDK, or the Anthropic one for the
// Anthropic cells, with its retries off, streams read to the end) sends each request to the next replica in turn; a
// request is lost if it gets anything but a whole 200 answer.
//
//	short           chats; the upstream allows 20 req/s (one second's
//	                burst) and 8 in flight, answers in 100 ms, and says so in
//	                limit headers and Retry-After; 450 at client concurrency 50
//	silent          short chats against a silent upstream: 20 req/s and 8
//	                in flight, refused with a bare 429 (no limit headers, no
//	                Retry-After, no hint); 300 at 50
//	shape/speech    every cell of e2e/loadbench (its shapes and speeches,
//	                e2e/internal/benchcells, at loadbench's default -rps and
//	                -latency), the same upstream and load: short/headers …
//	                short/silent-503, streams/*, streams-anthropic/headers,
//	                concurrency/*, quantized/*, quantized-anthropic/headers,
//	                tpm/*, and issue 31's window/*, window-aligned,
//	                window-1s, window-60s, shared-models, own-models*,
//	                anthropic-*, counted, tpm-quantized and streams-jitter;
//	                the Anthropic cells on /anthropic/v1/messages with the
//	                Anthropic Go SDK. All but configured/* and local/*,
//	                which are routes configured in the proxy rather than
//	                what an upstream says
//	redis-slow      short, while Redis stalls (DEBUG SLEEP 0.2) every 600 ms
//	redis-killed    short with 360 requests; redis-server is SIGKILLed a
//	                third of the way through and started again, empty, on
//	                the same port two thirds of the way through
//	replica-killed  streams/headers; one replica (lease TTL -lease-ttl) is
//	                SIGKILLed a third of the way through and gets no new
//	                requests; its cut requests are counted apart, and the
//	                time until Redis stops counting its permits (its leases
//	                expire) is shown
//	cluster-keys    short chats over six API keys (20 req/s and 8 in flight
//	                each), 450 at 50, through three replicas on a Redis
//	                Cluster whose primary holding a group is SIGKILLed a
//	                third of the way through, against the same load on a
//	                standalone Redis
//	universe/*      issue 48's rows (e2e/universe): upstreams written apart
//	                from the mock; -universe SEEDS adds a row draw/<seed>
//	                for each e2e/universe draw (alone: only those), so a
//	                sample of TestUniverse's draws runs through one proxy
//	                and three replicas
//	rolling-restart short, through a front (e2e/front: round robin over the
//	                ready replicas, the next on a refused connection), once
//	                as it is ("/steady") and once while the replicas are
//	                restarted one after another (SIGTERM, drain, a new
//	                process on the same ports and Redis); see rolling.go
//
// short, silent and the loadbench cells run through one proxy (no Redis)
// and through three replicas; the others through three replicas only,
// compared with the one-proxy row of their load (short or streams/headers)
// when that ran. -scenario takes names, prefixes ending in "/" and globs as
// loadbench's does ('*/*' is every loadbench cell).
//
//	go run ./e2e/replicabench                                  # every row
//	go run ./e2e/replicabench -scenario short,redis-killed     # the CI subset
//	go run ./e2e/replicabench -scenario '*/*' -markdown        # every loadbench cell
//	go run ./e2e/replicabench -scenario 'streams/headers' -runs 3 -v
//	go run ./e2e/replicabench -fleet 10,30                     # how far one Redis carries
//	go run ./e2e/replicabench -fleet 10,30 -cluster            # the same on a Redis Cluster
//
// -fleet replaces the rows with another measure, described in fleet.go:
// that many replicas on one redis-server (-cluster: a Redis Cluster of
// three primaries) against an unlimited upstream, and the same without
// Redis: admissions per second, Redis' commands, round trips and CPU per
// request, and the p99 Redis adds to a request.
//
// makespan/ideal compares the wall time of the load with N ÷ the rate the
// upstream allows (replica-killed: the answers the upstream admitted ÷ the
// rate, as the requests queued on the dead replica never reach it). 429s
// are the upstream's refusals (from the mock's counters) as a share of the
// requests that reached it; Δ pts is that share minus the one-proxy row's.
// Each row shows its target and whether it was met: streams/headers
// through three replicas within 1.1× the ideal, as one proxy, no request
// lost; redis-killed at most 10 % refused, none lost; replica-killed none
// lost on the survivors, the dead replica's permits free within the lease
// TTL, and 2 points; rolling-restart at most 1.05× the time of its run
// without restarts, 2 points over that run's refusals, none lost; the
// others as good as one proxy (no more lost,
// makespan/ideal at most 0.05 more, 2 points). -markdown also prints a line
// a row with one proxy's figures and the replicas' side by side. Targets
// are reported only: the exit status is non-zero only when the harness
// fails (a build, redis-server or a replica that will not start) or is
// interrupted. Under the table, notes give each run's events and what the
// replicas showed: in flight over all of them and their concurrency limits
// (/lanes every 250 ms), live leases in Redis, Redis calls that failed.
// Each run's line goes to stderr as it ends, with the first failures; -v
// adds the replicas' Redis log lines and their /lanes after each run. Each
// run is bounded by -timeout and each request by -request-timeout; every
// child is killed at exit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/e2e/front"
	"github.com/llmproxy/llmproxy/e2e/internal/benchcells"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/e2e/universe"
)

type options struct {
	replicas   int
	runs       int
	verbose    bool
	timeout    time.Duration
	reqTimeout time.Duration
	bin        string
	redisBin   string
	tmp        string
	// env is more environment for every replica of the shared rows.
	env []string
}

func main() { os.Exit(realMain()) }

func realMain() int {
	var o options
	only := flag.String("scenario", "", "comma-separated rows: names, prefixes ending in / and globs as loadbench's -scenario ('*/*' is every loadbench cell; default all)")
	markdown := flag.Bool("markdown", false, "also print one line a row, one proxy and the replicas side by side, as a Markdown table")
	flag.IntVar(&o.runs, "runs", 1, "runs of each row; the table shows each run and the median")
	flag.BoolVar(&o.verbose, "v", false, "print progress, the replicas' Redis and lane-change log lines and the first failures of each run")
	flag.IntVar(&o.replicas, "replicas", 3, "replicas in the shared rows")
	leaseTTL := flag.Duration("lease-ttl", 3*time.Second, "LLMPROXY_REDIS_LEASE_TTL of replica-killed (the other rows keep the default)")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on each run's load")
	flag.DurationVar(&o.reqTimeout, "request-timeout", 90*time.Second, "bound on each request (window-60s/retry-after queues some for a minute)")
	deadline := flag.Duration("deadline", 2*time.Hour, "bound on the whole command")
	flag.StringVar(&o.bin, "bin", "", "an llmproxy binary to use instead of building ./cmd/llmproxy")
	flag.Func("replica-env", "NAME=value for every replica of the shared rows (repeatable), e.g. LLMPROXY_REDIS_SLOW=0", func(v string) error {
		if !strings.HasPrefix(v, "LLMPROXY_") || !strings.Contains(v, "=") {
			return errors.New("want LLMPROXY_NAME=value")
		}
		o.env = append(o.env, v)
		return nil
	})
	flag.StringVar(&o.redisBin, "redis-server", "", "redis-server binary (default: redis-server on PATH, else /usr/bin/redis-server)")
	seeds := flag.String("universe", "", "comma-separated seeds of e2e/universe draws to add as rows draw/<seed> (alone: just those)")
	fleet := fleetFlags(flag.CommandLine)
	flag.Parse()
	if fleet.cluster && len(fleet.counts) == 0 {
		fmt.Fprintln(os.Stderr, "replicabench: -cluster goes with -fleet")
		return 2
	}
	if o.runs < 1 || o.replicas < 2 {
		fmt.Fprintln(os.Stderr, "replicabench: -runs must be at least 1 and -replicas at least 2")
		return 2
	}
	if *leaseTTL < time.Second {
		fmt.Fprintln(os.Stderr, "replicabench: -lease-ttl must be at least 1s")
		return 2
	}
	urows, err := universeRows(*seeds)
	if err != nil {
		fmt.Fprintln(os.Stderr, "replicabench:", err)
		return 2
	}
	all := append(scenarios(*leaseTTL), urows...)
	if *seeds != "" && *only == "" {
		// -universe alone: just the draws it names.
		all = slices.DeleteFunc(urows, func(sc *scenario) bool { return !strings.HasPrefix(sc.name, "draw/") })
	}
	picked, err := pick(all, *only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "replicabench:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *deadline)
	defer cancel()
	defer killAll()
	redis.SetLogger(quiet{})

	if o.redisBin == "" {
		if o.redisBin, err = exec.LookPath("redis-server"); err != nil {
			o.redisBin = "/usr/bin/redis-server"
		}
	}
	if _, err := os.Stat(o.redisBin); err != nil {
		fmt.Fprintf(os.Stderr, "replicabench: redis-server not found (%v); install it, e.g. apt-get install -y redis-server\n", err)
		return 1
	}
	if o.tmp, err = os.MkdirTemp("", "replicabench-"); err != nil {
		fmt.Fprintln(os.Stderr, "replicabench:", err)
		return 1
	}
	defer os.RemoveAll(o.tmp)
	if o.bin == "" {
		began := time.Now()
		if o.bin, err = buildLLMProxy(ctx, o.tmp); err != nil {
			fmt.Fprintln(os.Stderr, "replicabench:", err)
			return 1
		}
		o.logf("built llmproxy in %v", time.Since(began).Round(10*time.Millisecond))
	}
	if len(fleet.counts) > 0 {
		if err := runFleet(ctx, o, fleet, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "replicabench -fleet:", err)
			return 1
		}
		return 0
	}

	fmt.Printf("replicabench: %d row(s), %d run(s) each, %d replicas; %s/%s, %d CPUs\n",
		len(picked), o.runs, o.replicas, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	var groups []group
	failed := false
	for _, sc := range picked {
		for _, g := range variants(sc, o.replicas) {
			n := g.replicas
			for run := 1; run <= o.runs && !failed && ctx.Err() == nil; run++ {
				r, err := runOnce(ctx, o, sc, n, run, g.steady)
				if err != nil {
					fmt.Fprintf(os.Stderr, "replicabench: %s ×%d run %d: %v\n", sc.name, n, run, err)
					failed = true
					break
				}
				g.runs = append(g.runs, r)
				fmt.Fprintf(os.Stderr, "%-30s ×%d run %d: %d/%d ok, %d lost, %d cut, makespan %.2fs, upstream %d requests %d 429s; took %.1fs\n",
					g.label(), n, run, r.ok, r.n, r.lost, r.cut, r.makespan.Seconds(), r.upReq, r.up429, r.took.Seconds())
			}
			if len(g.runs) > 0 {
				groups = append(groups, g)
			}
		}
		if failed || ctx.Err() != nil {
			break
		}
	}
	fmt.Println()
	printTable(os.Stdout, groups)
	if *markdown {
		fmt.Println()
		printMarkdown(os.Stdout, groups)
	}
	switch {
	case failed:
		return 1
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "replicabench: interrupted or past -deadline; the figures above are partial")
		return 1
	}
	return 0
}

func (o options) logf(format string, args ...any) {
	if o.verbose {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

// quiet drops go-redis's own log lines (its client here only reads leases).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// pick returns the rows list names (names, prefixes ending in "/" and
// globs, as loadbench's -scenario; "all" or "" is every row), in the list's
// order.
func pick(all []*scenario, list string) ([]*scenario, error) {
	if strings.TrimSpace(list) == "all" {
		list = ""
	}
	return benchcells.Pick(all, func(s *scenario) string { return s.name }, list, "row")
}

// result is one run of one row.
type result struct {
	sc                  *scenario
	replicas, run       int
	n, c                int
	ok, lost, cut       int
	makespan, ideal     time.Duration
	took                time.Duration
	upReq, up429        int64
	killAt              time.Time
	victim              int
	permitsBack         time.Duration
	permitsKnown        bool
	notes, lostExamples []string
}

// runOnce runs sc once through n proxies (one: no Redis); steady: without
// its during.
func runOnce(ctx context.Context, o options, sc *scenario, n, run int, steady bool) (result, error) {
	began := time.Now()
	res := result{sc: sc, replicas: n, run: run, n: sc.n, c: sc.c, victim: -1,
		ideal: time.Duration(float64(sc.n) / sc.rate * float64(time.Second))}
	if sc.ideal > 0 {
		res.ideal = sc.ideal
	}
	shared := n > 1
	if shared && sc.failover != "" && !steady {
		rig, err := startFailoverRig(sc.failover)
		if err != nil {
			return res, err
		}
		defer rig.stop()
		c := *sc
		c.redisURL, c.env, c.during = rig.url, append(slices.Clip(sc.env), rig.env...), killHolder(rig)
		sc, res.sc = &c, &c
	}
	up := startUpstream(sc)
	defer up.Close()
	rs, reps, stop, err := startFleet(o, sc, n, shared, up.URL(), &res)
	defer stop()
	if err != nil {
		return res, err
	}

	tr := &http.Transport{MaxIdleConnsPerHost: 2 * sc.c} // no Proxy: loopback, never through one
	defer tr.CloseIdleConnections()
	addrs := make([]string, n)
	for i, r := range reps {
		addrs[i] = r.addr
	}
	var fr *front.Server
	if sc.rolling {
		if fr, err = startFront(reps); err != nil {
			return res, err
		}
		defer fr.Close()
		addrs = []string{fr.Addr()}
	}
	env := &runEnv{sc: sc, redis: rs, reps: reps, ts: newTargets(&http.Client{Transport: tr}, addrs, sc.keys), res: &res}
	defer func() { // the processes that replaced some of reps
		for _, r := range env.replicas() {
			r.kill()
		}
	}()
	runCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	env.ctx = runCtx
	if shared && rs != nil {
		env.rdb = redis.NewClient(&redis.Options{Addr: rs.addr(), DialTimeout: time.Second,
			ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1})
		defer env.rdb.Close()
		if sc.setup != nil {
			if err := sc.setup(env); err != nil {
				return res, err
			}
		}
	}

	if w := sc.mock.Window; w > 0 && sc.mock.WindowAligned {
		// Windows aligned to the clock: the load starts just after a
		// boundary, where the ideal puts it, so that one proxy and the
		// replicas meet the same phase; from another, the first window is
		// part of one and the makespan moves by up to a window.
		select {
		case <-time.After(time.Until(time.Now().Truncate(w).Add(w + 20*time.Millisecond))):
		case <-runCtx.Done():
		}
	}
	reqBefore, refBefore := up.counts()
	var before mockupstream.Stats
	if m, ok := up.(mockUpstream); ok {
		before = m.Stats()
	}
	env.load = &loadRun{n: sc.n, done: make(chan struct{})}
	duringDone := make(chan error, 1)
	env.start = time.Now()
	if sc.draw != nil {
		res.ideal = universe.Ideal(*sc.draw, env.start)
	}
	if shared && sc.during != nil && !steady {
		go func() { duringDone <- sc.during(env) }()
	} else {
		duringDone <- nil
	}
	sampled := make(chan string, 1)
	go func() { sampled <- sampleLanes(runCtx, env.load.done, env.replicas, env.rdb) }()
	outs := runLoad(runCtx, env.load, env.ts, sc, o.reqTimeout)
	res.makespan = time.Since(env.start)
	duringErr := <-duringDone
	if s := <-sampled; s != "" {
		res.notes = append(res.notes, s)
	}
	reqAfter, refAfter := up.counts()
	res.upReq, res.up429 = reqAfter-reqBefore, refAfter-refBefore
	var after mockupstream.Stats
	if m, ok := up.(mockUpstream); ok {
		after = m.Stats()
	}
	if sc.killsReplica && !res.killAt.IsZero() && sc.draw == nil {
		// The cut requests queued on the victim never reached the
		// upstream: the ideal is that of the answers it admitted.
		res.ideal = time.Duration(float64(after.OK-before.OK) / sc.rate * float64(time.Second))
	}
	res.tally(outs, env.start)
	if fr != nil {
		res.noteFront(fr)
	}
	if runCtx.Err() != nil && ctx.Err() == nil {
		res.notes = append(res.notes, fmt.Sprintf("the run hit -timeout %v", o.timeout))
	}
	if shared {
		res.noteRedis(env.replicas())
	}
	for _, ex := range res.lostExamples {
		fmt.Fprintf(os.Stderr, "  %s ×%d run %d lost: %s\n", sc.name, n, run, ex)
	}
	if o.verbose {
		printReplicas(env.replicas(), shared, env.start)
		if sc.draw == nil {
			printUpstream(before, after, env.start)
		}
	}
	res.took = time.Since(began)
	return res, duringErr
}

// startFleet starts Redis (when shared, unless sc names one) and n
// replicas of the proxy in front of upstream, ready; stop kills what it
// started, and is to be called whether or not err is nil.
func startFleet(o options, sc *scenario, n int, shared bool, upstream string, res *result) (rs *redisServer, reps []*replica, stop func(), err error) {
	var extra []string
	var kills []func()
	stop = func() {
		for i := len(kills) - 1; i >= 0; i-- {
			kills[i]()
		}
	}
	if shared {
		url := sc.redisURL
		if url == "" {
			dir, err := os.MkdirTemp(o.tmp, "redis-")
			if err != nil {
				return nil, nil, stop, err
			}
			if rs, err = startRedis(o.redisBin, dir); err != nil {
				return nil, nil, stop, err
			}
			kills = append(kills, rs.kill)
			url = rs.url()
		}
		extra = append(extra, "LLMPROXY_REDIS_URL="+url)
		extra = append(extra, o.env...)
		res.notes = append(res.notes, o.env...)
		if sc.leaseTTL > 0 {
			extra = append(extra, "LLMPROXY_REDIS_LEASE_TTL="+sc.leaseTTL.String())
			res.notes = append(res.notes, "LLMPROXY_REDIS_LEASE_TTL="+sc.leaseTTL.String())
		}
		if sc.rolling {
			// The binary's default, as Kubernetes' grace period: a drain
			// under this load can take longer than the 5s the other rows
			// set.
			extra = append(extra, "LLMPROXY_SHUTDOWN_TIMEOUT=30s")
		}
	}
	extra = append(extra, sc.env...)
	reps = make([]*replica, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			reps[i], errs[i] = startReplica(fmt.Sprintf("replica %d", i), o.bin, upstream, extra)
			if errs[i] == nil {
				errs[i] = reps[i].waitReady(shared, 15*time.Second)
			}
		})
	}
	wg.Wait()
	for _, r := range reps {
		if r != nil {
			kills = append(kills, r.kill)
		}
	}
	return rs, reps, stop, errors.Join(errs...)
}

// tally counts outs into res (answered, cut with a killed replica, lost)
// and notes when each replica's last answer came and which lost what.
func (res *result) tally(outs []outcome, start time.Time) {
	n := res.replicas
	lostBy := make([]int, n)
	for _, out := range outs {
		switch {
		case out.err == nil:
			res.ok++
		case out.target == res.victim && out.target >= 0 && !out.end.Before(res.killAt):
			res.cut++
		default:
			res.lost++
			where := "never sent"
			if out.target >= 0 {
				lostBy[out.target]++
				where = fmt.Sprintf("replica %d, %.2fs into the load", out.target, out.end.Sub(start).Seconds())
			}
			if len(res.lostExamples) < 3 {
				res.lostExamples = append(res.lostExamples, where+": "+describe(out.err))
			}
		}
	}
	if n > 1 && !res.sc.rolling { // through a front, the replica is not known
		// When each replica's last answer came: the round-robin gives
		// each its count, so the slowest replica sets the makespan.
		last := make([]float64, n)
		for _, out := range outs {
			if out.target >= 0 && out.target < n {
				last[out.target] = max(last[out.target], out.end.Sub(start).Seconds())
			}
		}
		parts := make([]string, n)
		for i, l := range last {
			parts[i] = fmt.Sprintf("%.1fs", l)
		}
		res.notes = append(res.notes, "last answer by replica: "+strings.Join(parts, ", "))
	}
	if res.lost > 0 && n > 1 && !res.sc.rolling && slices.ContainsFunc(lostBy, func(k int) bool { return k > 0 }) {
		res.notes = append(res.notes, fmt.Sprintf("lost by replica: %v", lostBy))
	}
}

// noteRedis notes the live replicas' failed Redis calls and any replica
// not back on Redis as the load ends.
func (res *result) noteRedis(reps []*replica) {
	var failures float64
	for i, r := range reps {
		if r.exited() {
			continue
		}
		if v, ok := r.metric("llmproxy_redis_failures_total"); ok {
			failures += v
		}
		if lv, err := r.lanes(); err == nil && lv.Redis != "ok" {
			res.notes = append(res.notes, fmt.Sprintf("replica %d still says redis %q as the load ends", i, lv.Redis))
		}
	}
	if failures > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%.0f Redis calls failed or timed out (each sends its replica to local limits)", failures))
	}
}

// printUpstream prints (-v) what the upstream admitted and refused in each
// second of the load, and when each refusal came.
func printUpstream(before, after mockupstream.Stats, start time.Time) {
	admitted, refused := after.AdmittedAt[len(before.AdmittedAt):], after.RefusedAt[len(before.RefusedAt):]
	var perSec []string
	for sec := 0; ; sec++ {
		from, to := start.Add(time.Duration(sec)*time.Second), start.Add(time.Duration(sec+1)*time.Second)
		in := func(ts []time.Time) int {
			return len(slices.DeleteFunc(slices.Clone(ts), func(t time.Time) bool { return t.Before(from) || !t.Before(to) }))
		}
		a, r := in(admitted), in(refused)
		if a+r == 0 && (len(admitted) == 0 || !from.Before(admitted[len(admitted)-1])) {
			break
		}
		perSec = append(perSec, fmt.Sprintf("%d/%d", a, r))
	}
	fmt.Fprintf(os.Stderr, "  upstream admitted/refused by second: %s\n", strings.Join(perSec, " "))
	at := make([]string, len(refused))
	for i, t := range refused {
		at[i] = fmt.Sprintf("%.2f", t.Sub(start).Seconds())
	}
	fmt.Fprintf(os.Stderr, "  upstream refusals at (s): %s\n", strings.Join(at, " "))
	var first []string
	for i, j := 0, 0; (i < len(admitted) || j < len(refused)) && len(first) < 24; {
		if j >= len(refused) || i < len(admitted) && admitted[i].Before(refused[j]) {
			first = append(first, fmt.Sprintf("+%.3f", admitted[i].Sub(start).Seconds()))
			i++
		} else {
			first = append(first, fmt.Sprintf("x%.3f", refused[j].Sub(start).Seconds()))
			j++
		}
	}
	fmt.Fprintf(os.Stderr, "  upstream's first answers (+ admitted, x refused, s): %s\n", strings.Join(first, " "))
}

// printReplicas prints (-v) each replica's logged lane events, with
// Redis, and its /lanes after the load.
func printReplicas(reps []*replica, shared bool, start time.Time) {
	for i, r := range reps {
		if shared {
			for _, ev := range r.logEvents() {
				fmt.Fprintf(os.Stderr, "  replica %d %+.2fs: %s\n", i, ev.at.Sub(start).Seconds(), ev.line)
			}
		}
		if !r.exited() {
			fmt.Fprintf(os.Stderr, "  replica %d /lanes after the load: %s\n", i, r.lanesSummary())
		}
	}
}

// sampleLanes reads every live replica's /lanes each 250 ms until done
// closes, and sums up what they had in flight and the concurrency limits
// they showed; with rdb, also the leases out in Redis.
func sampleLanes(ctx context.Context, done <-chan struct{}, reps func() []*replica, rdb *redis.Client) string {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var samples, sum, most int
	var leaseSamples, leaseSum, leaseMost int
	lo, hi := -1, -1
	for {
		select {
		case <-done:
			if samples == 0 {
				return ""
			}
			s := fmt.Sprintf("in flight over all proxies (/lanes every 250ms): mean %.1f, max %d; concurrency limit shown %d–%d",
				float64(sum)/float64(samples), most, lo, hi)
			if leaseSamples > 0 {
				s += fmt.Sprintf("; live leases in Redis: mean %.1f, max %d", float64(leaseSum)/float64(leaseSamples), leaseMost)
			}
			return s
		case <-tick.C:
		}
		if rdb != nil {
			if members, _, err := liveLeases(ctx, rdb); err == nil {
				leaseSamples++
				leaseSum += len(members)
				leaseMost = max(leaseMost, len(members))
			}
		}
		total, ok := 0, true
		for _, r := range reps() {
			if r.exited() {
				continue
			}
			lv, err := r.lanes()
			if err != nil {
				ok = false
				continue
			}
			for _, l := range lv.Lanes {
				total += l.InFlight
				if lo < 0 || l.Concurrency < lo {
					lo = l.Concurrency
				}
				hi = max(hi, l.Concurrency)
			}
		}
		if ok {
			samples++
			sum += total
			most = max(most, total)
		}
	}
}

// group is a row's runs through one number of proxies.
type group struct {
	sc       *scenario
	replicas int
	steady   bool // a rolling row's run without its restarts
	runs     []result
}

// label is the row's name as the table shows it.
func (g group) label() string {
	if g.steady {
		return g.sc.name + "/steady"
	}
	return g.sc.name
}

// vals is what a table line shows: one run's figures, or the medians.
type vals struct {
	ok, lost, cut, makespan, ideal, ratio, upReq, up429, pct, took float64
	permitsBack                                                    float64 // seconds; <0: not measured
}

func valsOf(r result) vals {
	v := vals{ok: float64(r.ok), lost: float64(r.lost), cut: float64(r.cut), makespan: r.makespan.Seconds(), ideal: r.ideal.Seconds(),
		ratio: r.makespan.Seconds() / r.ideal.Seconds(), upReq: float64(r.upReq), up429: float64(r.up429),
		took: r.took.Seconds(), permitsBack: -1}
	if r.upReq > 0 {
		v.pct = 100 * float64(r.up429) / float64(r.upReq)
	}
	if r.permitsKnown {
		v.permitsBack = r.permitsBack.Seconds()
	} else if !r.killAt.IsZero() {
		v.permitsBack = 1e9 // killed, never seen free
	}
	return v
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medians is the median of every figure over the group's runs, but
// requests lost: the most any run lost, so a row meets "nothing lost" only
// when no run lost any.
func (g group) medians() vals {
	field := func(f func(vals) float64) float64 {
		var xs []float64
		for _, r := range g.runs {
			xs = append(xs, f(valsOf(r)))
		}
		return median(xs)
	}
	most := func(f func(vals) float64) float64 {
		m := 0.0
		for _, r := range g.runs {
			m = max(m, f(valsOf(r)))
		}
		return m
	}
	return vals{
		ok: field(func(v vals) float64 { return v.ok }), lost: most(func(v vals) float64 { return v.lost }),
		cut: field(func(v vals) float64 { return v.cut }), makespan: field(func(v vals) float64 { return v.makespan }),
		ideal: field(func(v vals) float64 { return v.ideal }),
		ratio: field(func(v vals) float64 { return v.ratio }), upReq: field(func(v vals) float64 { return v.upReq }),
		up429: field(func(v vals) float64 { return v.up429 }), pct: field(func(v vals) float64 { return v.pct }),
		took: field(func(v vals) float64 { return v.took }), permitsBack: field(func(v vals) float64 { return v.permitsBack }),
	}
}

type targetKind int

const (
	asOneProxy targetKind = iota + 1
	streamsTarget
	refusedTarget
	replicaKilledTarget
	rollingTarget
)

// target is what a shared row should reach.
type target struct {
	kind   targetKind
	ratio  float64 // streams: makespan/ideal at most this
	points float64 // refusals at most this many points over one proxy's
	pct    float64 // refused: at most this % of upstream requests
}

// judge is the row's target and whether v meets it; base is the one-proxy
// medians of the same load, nil if that did not run.
func judge(sc *scenario, replicas int, v vals, base *vals) (text, met string) {
	if replicas == 1 {
		return "baseline", "-"
	}
	if sc.target.kind == rollingTarget {
		return judgeRolling(v, base)
	}
	if sc.failover != "" {
		return judgeFailover(v, base)
	}
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "no"
	}
	t := sc.target
	switch t.kind {
	case asOneProxy:
		text = "as 1 proxy: lost ≤, ×ideal ≤ +0.05, Δ ≤ +2 pts"
		if base == nil {
			return text, "? (no 1-proxy " + sc.base + " row)"
		}
		return text, yes(v.lost <= base.lost && v.ratio <= base.ratio+0.05 && v.pct <= base.pct+2)
	case streamsTarget:
		text = fmt.Sprintf("≤%g×, ×ideal ≤ +0.05, Δ ≤ +%g pts, 0 lost", t.ratio, t.points)
		ok := v.ratio <= t.ratio && v.lost == 0
		if base == nil {
			return text, yes(ok) + " (as 1 proxy unchecked: no 1-proxy " + sc.base + " row)"
		}
		return text, yes(ok && v.ratio <= base.ratio+0.05 && v.pct <= base.pct+t.points)
	case refusedTarget:
		return fmt.Sprintf("≤%g %% refused, 0 lost", t.pct), yes(v.pct <= t.pct && v.lost == 0)
	case replicaKilledTarget:
		ttl := sc.leaseTTL.Seconds()
		text = fmt.Sprintf("0 lost, permits back ≤ TTL %gs, Δ ≤ +%g pts", ttl, t.points)
		ok := v.lost == 0 && v.permitsBack >= 0 && v.permitsBack <= ttl+0.25
		if base == nil {
			return text, yes(ok) + " (Δ unchecked: no 1-proxy " + sc.base + " row)"
		}
		return text, yes(ok && v.pct <= base.pct+t.points)
	}
	return "-", "-"
}

func printTable(w io.Writer, groups []group) {
	bases := map[string]vals{}
	for _, g := range groups {
		if g.replicas == 1 || g.steady {
			bases[g.sc.name] = g.medians()
		}
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tproxies\trun\tN\tC\tok\tlost\tcut\tmakespan\tideal\t×ideal\tupstream\t429s\t429 %\tΔ pts vs 1\tpermits back\ttook\t target\tmet\t")
	line := func(g group, run string, v vals) {
		var base *vals
		if b, ok := bases[g.sc.base]; ok {
			base = &b
		}
		delta := "-"
		if base != nil && g.replicas > 1 && !g.steady {
			delta = fmt.Sprintf("%+.1f", v.pct-base.pct)
		}
		cut, back := "-", "-"
		if g.sc.killsReplica {
			cut = fmt.Sprintf("%g", v.cut)
			switch {
			case v.permitsBack >= 1e9:
				back = "never"
			case v.permitsBack >= 0:
				back = fmt.Sprintf("%.2fs", v.permitsBack)
			}
		}
		text, met := judge(g.sc, g.replicas, v, base)
		if g.steady {
			text, met = "baseline: no restarts", "-"
			if g.sc.failover != "" {
				text = "baseline: standalone Redis, nothing killed"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%g\t%g\t%s\t%.2fs\t%.2fs\t%.2f×\t%g\t%g\t%.1f%%\t%s\t%s\t%.1fs\t %s\t%s\t\n",
			g.label(), g.replicas, run, g.sc.n, g.sc.c, v.ok, v.lost, cut, v.makespan, v.ideal, v.ratio,
			v.upReq, v.up429, v.pct, delta, back, v.took, text, met)
	}
	for _, g := range groups {
		for _, r := range g.runs {
			line(g, fmt.Sprint(r.run), valsOf(r))
		}
		if len(g.runs) > 1 {
			line(g, "median", g.medians())
		}
	}
	tw.Flush()

	var notes []string
	for _, g := range groups {
		for _, r := range g.runs {
			if len(r.notes) > 0 {
				notes = append(notes, fmt.Sprintf("  %s ×%d run %d: %s", g.sc.name, g.replicas, r.run, strings.Join(r.notes, "; ")))
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnotes:")
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
}

// printMarkdown prints a line a row, its one-proxy figures (or "–"; a
// rolling row's run without restarts) and the replicas' side by side: ×ideal and 429 % (the median, and the range over the runs),
// requests lost, the target and whether the medians met it.
func printMarkdown(w io.Writer, groups []group) {
	solo, shared := map[string]group{}, map[string]group{}
	var order []*scenario
	for _, g := range groups {
		if g.replicas == 1 || g.steady {
			solo[g.sc.name] = g
			continue
		}
		shared[g.sc.name] = g
		order = append(order, g.sc)
	}
	replicas := "replicas"
	if len(order) > 0 {
		replicas = fmt.Sprintf("%d replicas", shared[order[0].name].replicas)
	}
	fmt.Fprintf(w, "| row | load | 1 proxy | %s | target | met |\n|---|---|---|---|---|---|\n", replicas)
	for _, sc := range order {
		g := shared[sc.name]
		one, oneText := (*vals)(nil), "–"
		if b, ok := solo[sc.base]; ok {
			m := b.medians()
			one = &m
			switch {
			case b.steady && sc.failover != "":
				oneText = "– (standalone Redis, nothing killed: " + b.figures() + ")"
			case b.steady:
				oneText = "– (without restarts: " + b.figures() + ")"
			case sc.base == sc.name:
				oneText = b.figures()
			}
		}
		text, met := judge(sc, g.replicas, g.medians(), one)
		fmt.Fprintf(w, "| %s | %d at C %d | %s | %s | %s | %s |\n", sc.name, sc.n, sc.c, oneText, g.figures(), text, met)
	}
}

// figures is the group's ×ideal and 429 % of upstream requests, with one
// run its figures, with more the median and, where the runs differ, their
// range in brackets; and the most requests any run lost.
func (g group) figures() string {
	m := g.medians()
	span := func(f func(vals) float64, format, unit string) string {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range g.runs {
			v := f(valsOf(r))
			lo, hi = min(lo, v), max(hi, v)
		}
		mid := fmt.Sprintf(format, f(m)) + unit
		if a, b := fmt.Sprintf(format, lo), fmt.Sprintf(format, hi); a != b {
			return mid + " (" + a + "–" + b + unit + ")"
		}
		return mid
	}
	return fmt.Sprintf("%s, %s, %g lost", span(func(v vals) float64 { return v.ratio }, "%.2f", "×"),
		span(func(v vals) float64 { return v.pct }, "%.1f", " %"), m.lost)
}
