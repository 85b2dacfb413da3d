package main

// The fleet mode (-fleet 10,30): how far one Redis carries. For each
// replica count N it starts, in front of one unlimited mock upstream (no
// limits, no latency: every request is admitted at once, so what is
// measured is the proxy and Redis), N replicas on one fresh redis-server
// and N more without LLMPROXY_REDIS_URL, all with
// LLMPROXY_LANE_CONCURRENCY=-fleet-concurrency so that no group's
// concurrency limit holds requests back, and after a warm-up of a second
// on each fleet runs:
//
//	closed loop  on each fleet in turn: -fleet-in-flight requests at a
//	             time, each to the next replica, for -fleet-duration;
//	             admissions per second, and Redis' work per request:
//	             commands (INFO commandstats, the commands scripts call
//	             included), script runs, the time Redis spent in them,
//	             round trips (the replicas' llmproxy_redis_commands_total)
//	             and CPU (INFO cpu, used_cpu_user + used_cpu_sys)
//	paced        on both fleets at once, -fleet-rate requests a second to
//	             each, alternately, sent on schedule whatever is in flight,
//	             for -fleet-duration: each request's time, from sending to
//	             the end of its answer
//
// The p99 Redis adds is the paced p99 with Redis minus that without it:
// the paced rate stays well under what the machine serves, so it is the
// time of a request, not of a queue, and the two fleets share each
// moment's noise. The proxy has no histogram of its Redis calls; its
// llmproxy_queue_wait_seconds (arrival to the first upstream attempt, the
// admission on Redis included) is shown beside, at its buckets'
// resolution.
//
// With -cluster the fleet with Redis is on a Redis Cluster of three
// primaries with a replica each (internal/redistest); Redis' figures are
// the primaries' together, and the notes split the CPU by node: one
// key's group lives in one slot, so one primary does its work.
//
// Each group's Redis round trips (admit, learn, settle) run one at a
// time on a replica, so with one key a replica admits at most one
// request per three round trips; -fleet-keys spreads the load over more
// groups. A replica whose Redis calls' p99 passes LLMPROXY_REDIS_SLOW
// (50 ms) goes local for a while, as on a loaded machine it may: the
// notes count those calls, and -replica-env LLMPROXY_REDIS_SLOW=0 keeps
// every request on Redis.
//
// Everything runs on this machine: the replicas, redis-server, the mock
// and the load share its CPUs. Admissions per second are what the machine
// serves, not what Redis could; Redis' CPU per request and its share of a
// core are the figures that carry over, and the notes give every party's
// CPU during the closed loops.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/e2e/internal/benchcells"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/internal/redistest"
)

// fleetOptions are the -fleet flags.
type fleetOptions struct {
	counts   []int
	duration time.Duration
	inFlight int
	rate     float64
	keys     int
	// concurrency is the replicas' LLMPROXY_LANE_CONCURRENCY, 0 = theirs.
	concurrency int
	// cluster: the shared fleet is on a Redis Cluster of three primaries
	// with a replica each, not on one redis-server.
	cluster bool
}

// fleetFlags registers the -fleet flags on fs.
func fleetFlags(fs *flag.FlagSet) *fleetOptions {
	fo := &fleetOptions{duration: 5 * time.Second, inFlight: 64, rate: 100, keys: 1, concurrency: 1024}
	fs.Func("fleet", "instead of the rows, how far one Redis carries: these replica counts (e.g. 10,30) on one redis-server, short chats against an unlimited upstream", func(v string) error {
		fo.counts = nil
		for _, item := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(item))
			if err != nil || n < 1 {
				return errors.New("want replica counts of at least 1, e.g. 10,30")
			}
			fo.counts = append(fo.counts, n)
		}
		return nil
	})
	fs.DurationVar(&fo.duration, "fleet-duration", fo.duration, "-fleet: length of each measured phase (the closed loop, the paced load), with and without Redis")
	fs.IntVar(&fo.inFlight, "fleet-in-flight", fo.inFlight, "-fleet: requests in flight over all replicas in the closed loop")
	fs.Float64Var(&fo.rate, "fleet-rate", fo.rate, "-fleet: requests per second of the paced load (the latencies)")
	fs.IntVar(&fo.keys, "fleet-keys", fo.keys, "-fleet: API keys (limit groups) the requests are spread over")
	fs.BoolVar(&fo.cluster, "cluster", false, "-fleet: the replicas with Redis are on a Redis Cluster of three primaries with a replica each (redis-cli --cluster create) instead of one redis-server")
	fs.IntVar(&fo.concurrency, "fleet-concurrency", fo.concurrency, "-fleet: LLMPROXY_LANE_CONCURRENCY of every replica, with Redis and without (0: the default, 8, which a fleet on Redis grows slowly: the closed loop then measures that limit, not Redis)")
	return fo
}

func (fo *fleetOptions) check() error {
	if fo.duration < 100*time.Millisecond || fo.inFlight < 1 || fo.rate <= 0 || fo.keys < 1 || fo.concurrency < 0 {
		return errors.New("-fleet-duration must be at least 100ms, -fleet-in-flight, -fleet-rate and -fleet-keys positive, -fleet-concurrency not negative")
	}
	return nil
}

// fleetRow is one replica count: the fleet on Redis and the same fleet
// without it.
type fleetRow struct {
	n             int
	shared, local fleetRun
}

// fleetRun is one fleet's phases and what Redis, the replicas and this
// process did in each.
type fleetRun struct {
	through, paced         phase
	throughCost, pacedCost snapDelta
	notes                  []string
}

// phase is one load: its answers' times and its failures.
type phase struct {
	ok, failed, skipped int
	wall                time.Duration
	lat                 []time.Duration // of the answered requests, sorted
	firstErr            string
}

func (p phase) perSecond() float64 {
	if p.wall <= 0 {
		return 0
	}
	return float64(p.ok) / p.wall.Seconds()
}

// quantile is the q-th quantile of the answered requests' times; 0 if
// none.
func (p phase) quantile(q float64) time.Duration {
	if len(p.lat) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(p.lat)))) - 1
	return p.lat[min(max(k, 0), len(p.lat)-1)]
}

// runFleet measures each replica count of fo, on Redis and without it,
// and writes the tables to w; progress goes to stderr.
func runFleet(ctx context.Context, o options, fo *fleetOptions, w io.Writer) error {
	if err := fo.check(); err != nil {
		return err
	}
	fmt.Fprintf(w, "replicabench -fleet %s: -fleet-duration %v, -fleet-in-flight %d, -fleet-rate %g, -fleet-keys %d, -fleet-concurrency %d, -cluster=%t; %s/%s, %d CPUs\n",
		joinInts(fo.counts), fo.duration, fo.inFlight, fo.rate, fo.keys, fo.concurrency, fo.cluster, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	var rows []fleetRow
	defer func() { printFleet(w, fo, rows) }()
	for _, n := range fo.counts {
		began := time.Now()
		row, err := fleetRowOnce(ctx, o, fo, n)
		if err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		for _, f := range []struct {
			name string
			fr   fleetRun
		}{{"with Redis", row.shared}, {"without Redis", row.local}} {
			fmt.Fprintf(os.Stderr, "fleet ×%d %s: %.0f admissions/s (%d answered, %d failed), paced p99 %v\n",
				n, f.name, f.fr.through.perSecond(), f.fr.through.ok, f.fr.through.failed, f.fr.paced.quantile(0.99).Round(10*time.Microsecond))
		}
		fmt.Fprintf(os.Stderr, "fleet ×%d took %.1fs\n", n, time.Since(began).Seconds())
		rows = append(rows, row)
	}
	return nil
}

func redisOrNot(shared bool) string {
	if shared {
		return "with Redis"
	}
	return "without Redis"
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// fleet is one set of running replicas and the load that drives them.
type fleet struct {
	shared bool
	redis  *redisNodes // nil without Redis
	reps   []*replica
	load   *fleetLoad
	run    fleetRun
}

// fleetRowOnce starts, in front of one fresh unlimited mock, n replicas
// on a fresh redis-server and n more without Redis; warms both up; runs
// the closed loop on each in turn, then the paced load on both at once,
// each request to the other fleet than the last, so that both see the
// same moments of a machine they share with everything else.
func fleetRowOnce(ctx context.Context, o options, fo *fleetOptions, n int) (fleetRow, error) {
	row := fleetRow{n: n}
	mock := mockupstream.New(mockupstream.Config{}) // no limits, answers at once
	defer mock.Close()
	var env []string
	if fo.concurrency > 0 {
		env = append(env, "LLMPROXY_LANE_CONCURRENCY="+strconv.Itoa(fo.concurrency))
	}
	sc := &scenario{env: env}
	var cluster *redistest.Cluster
	if fo.cluster {
		var err error
		if cluster, err = redistest.StartCluster(redistest.Options{}); err != nil {
			return row, err
		}
		defer cluster.Stop()
		sc.redisURL = cluster.URL()
	}
	var fleets []*fleet
	for _, shared := range []bool{true, false} {
		var res result // startFleet notes the replicas' extra environment here
		rs, reps, stop, err := startFleet(o, sc, n, shared, mock.URL(), &res)
		defer stop()
		if err != nil {
			return row, fmt.Errorf("%s: %w", redisOrNot(shared), err)
		}
		f := &fleet{shared: shared, reps: reps, run: fleetRun{notes: res.notes}}
		switch {
		case shared && cluster != nil:
			f.redis, err = clusterNodes(cluster)
		case shared:
			f.redis = &redisNodes{primaries: []*redis.Client{nodeClient(rs.addr())}}
		}
		if err != nil {
			return row, err
		}
		defer f.redis.close()
		tr := &http.Transport{MaxIdleConnsPerHost: fo.inFlight} // no Proxy: loopback, never through one
		defer tr.CloseIdleConnections()
		f.load = &fleetLoad{client: &http.Client{Transport: tr, Timeout: o.reqTimeout}, keys: fo.keys}
		for _, r := range reps {
			f.load.addrs = append(f.load.addrs, r.addr)
		}
		fleets = append(fleets, f)
	}
	for _, f := range fleets {
		if warm := f.load.closed(ctx, fo.inFlight, min(time.Second, fo.duration)); warm.ok == 0 {
			return row, fmt.Errorf("%s: no request answered in the warm-up (%d failed): %s", redisOrNot(f.shared), warm.failed, warm.firstErr)
		}
	}
	for _, f := range fleets {
		before, err := takeSnap(ctx, f.redis, f.reps)
		if err != nil {
			return row, err
		}
		f.run.through = f.load.closed(ctx, fo.inFlight, fo.duration)
		after, err := takeSnap(ctx, f.redis, f.reps)
		if err != nil {
			return row, err
		}
		f.run.throughCost = after.minus(before)
		if s := limitsShown(f.reps); s != "" {
			f.run.notes = append(f.run.notes, s)
		}
	}
	befores := make([]snap, len(fleets))
	loads := make([]*fleetLoad, len(fleets))
	for i, f := range fleets {
		var err error
		if befores[i], err = takeSnap(ctx, f.redis, f.reps); err != nil {
			return row, err
		}
		loads[i] = f.load
	}
	paced := pacedLoad(ctx, loads, fo.rate, fo.duration, 4*fo.inFlight)
	for i, f := range fleets {
		after, err := takeSnap(ctx, f.redis, f.reps)
		if err != nil {
			return row, err
		}
		f.run.paced, f.run.pacedCost = paced[i], after.minus(befores[i])
		if f.shared {
			for k, r := range f.reps {
				if lv, err := r.lanes(); err == nil && lv.Redis != "ok" {
					f.run.notes = append(f.run.notes, fmt.Sprintf("replica %d says redis %q as the load ends", k, lv.Redis))
				}
			}
		}
	}
	row.shared, row.local = fleets[0].run, fleets[1].run
	return row, ctx.Err()
}

// limitsShown is the range of concurrency limits the replicas' lanes
// show, in a line ("" if none answered).
func limitsShown(reps []*replica) string {
	lo, hi := -1, -1
	for _, r := range reps {
		lv, err := r.lanes()
		if err != nil {
			continue
		}
		for _, l := range lv.Lanes {
			if lo < 0 || l.Concurrency < lo {
				lo = l.Concurrency
			}
			hi = max(hi, l.Concurrency)
		}
	}
	if hi < 0 {
		return ""
	}
	return fmt.Sprintf("concurrency limits the replicas' lanes show after the closed loop: %d–%d", lo, hi)
}

// ---- the load ----

// fleetLoad sends short chats to the replicas in turn.
type fleetLoad struct {
	client *http.Client
	addrs  []string
	keys   int
	next   atomic.Uint64
}

// fleetKey is the API key of limit group k; it is never printed.
func fleetKey(k int) string { return fmt.Sprintf("sk-fleetbench-%d", k) }

// one sends the next request and reads its answer to the end: its time,
// or why it failed (anything but a 200).
func (l *fleetLoad) one(ctx context.Context) (time.Duration, error) {
	i := l.next.Add(1) - 1
	n := uint64(len(l.addrs))
	body := fmt.Appendf(nil, `{"model":"gpt-bench","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, benchcells.Prompt(int(i%1e6)), benchcells.MaxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.addrs[i%n]+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+fleetKey(int((i/n)%uint64(l.keys))))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return took, err
}

// tally collects a phase's answers from several goroutines.
type tally struct {
	mu sync.Mutex
	p  phase
}

func (t *tally) add(d time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.p.failed++
		if t.p.firstErr == "" {
			t.p.firstErr = err.Error()
		}
		return
	}
	t.p.ok++
	t.p.lat = append(t.p.lat, d)
}

func (t *tally) done(start time.Time) phase {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.p.wall = time.Since(start)
	slices.Sort(t.p.lat)
	return t.p
}

// closed keeps inFlight requests going until d has passed; those under
// way then are waited for.
func (l *fleetLoad) closed(ctx context.Context, inFlight int, d time.Duration) phase {
	var t tally
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				t.add(l.one(ctx))
			}
		})
	}
	wg.Wait()
	return t.done(start)
}

// pacedLoad sends rate requests a second to each of loads for d, in
// turn, each at its time whatever is in flight; one that would make more
// than most in flight (all loads together) is not sent (counted as
// skipped). It returns each load's phase.
func pacedLoad(ctx context.Context, loads []*fleetLoad, rate float64, d time.Duration, most int) []phase {
	ts := make([]tally, len(loads))
	skipped := make([]int, len(loads))
	sem := make(chan struct{}, most)
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	every := time.Duration(float64(time.Second) / (rate * float64(len(loads))))
	n := int(rate*d.Seconds()) * len(loads)
	for k := 0; k < n && ctx.Err() == nil; k++ {
		if wait := time.Until(start.Add(time.Duration(k) * every)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				continue
			}
		}
		i := k % len(loads)
		select {
		case sem <- struct{}{}:
		default:
			skipped[i]++
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			ts[i].add(loads[i].one(ctx))
		})
	}
	wg.Wait()
	phases := make([]phase, len(loads))
	for i := range ts {
		phases[i] = ts[i].done(start)
		phases[i].skipped = skipped[i]
	}
	return phases
}

// ---- what Redis, the replicas and this process did ----

// snap is what a moment's counters said.
type snap struct {
	at              time.Time
	redisCPU        float64          // s, used_cpu_user + used_cpu_sys, all primaries
	nodeCPU         []float64        // s, each primary's
	replicaCPU      float64          // s, a cluster's replicas'
	calls, usec     map[string]int64 // INFO commandstats, by command
	trips           map[string]float64
	failures        float64
	wait            map[string]float64 // llmproxy_queue_wait_seconds buckets, by le, all replicas
	repCPU, selfCPU float64            // s, from /proc
}

// snapDelta is what happened between two snaps.
type snapDelta snap

var (
	cmdstatRE = regexp.MustCompile(`^cmdstat_([^:]+):calls=(\d+),usec=(\d+)`)
	leRE      = regexp.MustCompile(`le="([^"]+)"`)
	opRE      = regexp.MustCompile(`op="([^"]+)"`)
)

// redisNodes are the Redis servers a fleet shares: one, or a cluster's
// primaries (which serve the requests) and replicas (which copy them).
type redisNodes struct {
	primaries, replicas []*redis.Client
}

func nodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, MaxRetries: -1, PoolSize: 2})
}

// clusterNodes are c's nodes as its slots are served now.
func clusterNodes(c *redistest.Cluster) (*redisNodes, error) {
	primaries, err := c.Primaries()
	if err != nil {
		return nil, err
	}
	rn := &redisNodes{}
	for _, node := range c.Nodes {
		if slices.Contains(primaries, node) {
			rn.primaries = append(rn.primaries, nodeClient(node.Addr()))
		} else {
			rn.replicas = append(rn.replicas, nodeClient(node.Addr()))
		}
	}
	return rn, nil
}

func (rn *redisNodes) close() {
	if rn == nil {
		return
	}
	for _, c := range append(rn.primaries, rn.replicas...) {
		c.Close()
	}
}

// nodeInfo is what one node's INFO commandstats and cpu say: calls and
// time by command (without this INFO's own), and CPU seconds.
func nodeInfo(ctx context.Context, c *redis.Client) (calls, usec map[string]int64, cpu float64, err error) {
	info, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("INFO commandstats cpu of %s: %w", c.Options().Addr, err)
	}
	calls, usec = map[string]int64{}, map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if m := cmdstatRE.FindStringSubmatch(line); m != nil {
			calls[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
			usec[m[1]], _ = strconv.ParseInt(m[3], 10, 64)
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		}
	}
	for _, own := range []string{"info", "replconf"} { // this INFO, and a cluster's replication
		delete(calls, own)
		delete(usec, own)
	}
	return calls, usec, cpu, nil
}

// takeSnap reads the Redis nodes' INFO (rn nil: no Redis) and every
// replica's /metrics and CPU time.
func takeSnap(ctx context.Context, rn *redisNodes, reps []*replica) (snap, error) {
	s := snap{at: time.Now(), calls: map[string]int64{}, usec: map[string]int64{}, trips: map[string]float64{}, wait: map[string]float64{}}
	if rn != nil {
		for _, c := range rn.primaries {
			calls, usec, cpu, err := nodeInfo(ctx, c)
			if err != nil {
				return s, err
			}
			for k, v := range calls {
				s.calls[k] += v
				s.usec[k] += usec[k]
			}
			s.redisCPU += cpu
			s.nodeCPU = append(s.nodeCPU, cpu)
		}
		for _, c := range rn.replicas {
			_, _, cpu, err := nodeInfo(ctx, c)
			if err != nil {
				return s, err
			}
			s.replicaCPU += cpu
		}
	}
	for i, r := range reps {
		series, ok := r.metricSeries("llmproxy_redis_commands_total")
		if !ok {
			return s, fmt.Errorf("replica %d: /metrics did not answer", i)
		}
		for labels, v := range series {
			op := "?"
			if m := opRE.FindStringSubmatch(labels); m != nil {
				op = m[1]
			}
			s.trips[op] += v
		}
		if v, ok := r.metric("llmproxy_redis_failures_total"); ok {
			s.failures += v
		}
		buckets, _ := r.metricSeries("llmproxy_queue_wait_seconds_bucket")
		for labels, v := range buckets {
			if m := leRE.FindStringSubmatch(labels); m != nil {
				s.wait[m[1]] += v
			}
		}
		s.repCPU += procCPU(strconv.Itoa(r.cmd.Process.Pid))
	}
	s.selfCPU = procCPU("self")
	return s, nil
}

func (s snap) minus(b snap) snapDelta {
	d := snapDelta{at: s.at, redisCPU: s.redisCPU - b.redisCPU, replicaCPU: s.replicaCPU - b.replicaCPU, failures: s.failures - b.failures,
		repCPU: s.repCPU - b.repCPU, selfCPU: s.selfCPU - b.selfCPU,
		calls: map[string]int64{}, usec: map[string]int64{}, trips: map[string]float64{}, wait: map[string]float64{}}
	for i, v := range s.nodeCPU {
		if i < len(b.nodeCPU) {
			d.nodeCPU = append(d.nodeCPU, v-b.nodeCPU[i])
		}
	}
	for k, v := range s.calls {
		if c := v - b.calls[k]; c > 0 {
			d.calls[k], d.usec[k] = c, s.usec[k]-b.usec[k]
		}
	}
	for k, v := range s.trips {
		if t := v - b.trips[k]; t > 0 {
			d.trips[k] = t
		}
	}
	for k, v := range s.wait {
		d.wait[k] = v - b.wait[k]
	}
	return d
}

// procCPU is the user and system CPU time, in seconds, of process pid
// ("self": this one) from /proc/<pid>/stat, in the kernel's USER_HZ of
// 100 ticks a second; 0 where there is no /proc.
func procCPU(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: state is the first, utime the 12th, stime the 13th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

func sumInt(m map[string]int64) (t int64) {
	for _, v := range m {
		t += v
	}
	return t
}

func sumFloat(m map[string]float64) (t float64) {
	for _, v := range m {
		t += v
	}
	return t
}

// scriptRuns counts the calls that ran a script.
func (d snapDelta) scriptRuns() int64 {
	return d.calls["evalsha"] + d.calls["eval"] + d.calls["evalsha_ro"] + d.calls["eval_ro"] + d.calls["fcall"]
}

// scriptUsec is the time Redis spent running scripts, the commands they
// call included (commandstats counts those twice: in the script's time
// and in their own).
func (d snapDelta) scriptUsec() int64 {
	return d.usec["evalsha"] + d.usec["eval"] + d.usec["evalsha_ro"] + d.usec["eval_ro"] + d.usec["fcall"]
}

// waitP99 is the bucket of llmproxy_queue_wait_seconds that holds the
// 99th percentile ("≤ 5ms"), or "–" without samples.
func (d snapDelta) waitP99() string {
	total := d.wait["+Inf"]
	if total <= 0 {
		return "–"
	}
	type bucket struct {
		le    float64
		count float64
	}
	var bs []bucket
	for k, v := range d.wait {
		if le, err := strconv.ParseFloat(k, 64); err == nil && !math.IsInf(le, 1) {
			bs = append(bs, bucket{le, v})
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmpFloat(a.le, b.le) })
	for _, b := range bs {
		if b.count >= 0.99*total {
			return "≤ " + (time.Duration(b.le * float64(time.Second))).String()
		}
	}
	return "> " + (time.Duration(bs[len(bs)-1].le * float64(time.Second))).String()
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ---- the tables ----

// ms is d in milliseconds with two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// perRequest is x per answered request of p, "–" without any.
func perRequest(x float64, p phase, format string) string {
	if p.ok == 0 {
		return "–"
	}
	return fmt.Sprintf(format, x/float64(p.ok))
}

// printFleet writes the two tables and the notes.
func printFleet(w io.Writer, fo *fleetOptions, rows []fleetRow) {
	if len(rows) == 0 {
		return
	}
	where := "one redis-server"
	if fo.cluster {
		where = "a Redis Cluster of three primaries with a replica each (Redis' figures: the primaries' together)"
	}
	fmt.Fprintf(w, "\nClosed loop: %d requests in flight over all replicas, each to the next replica, for %v; %d key(s); an unlimited upstream answering at once; Redis: %s.\n\n",
		fo.inFlight, fo.duration, fo.keys, where)
	fmt.Fprintln(w, "| replicas | admissions/s without Redis | admissions/s with Redis | Redis commands/request (script runs) | round trips/request | Redis µs in scripts/request | Redis CPU ms/1,000 requests | Redis CPU, % of a core | requests/s one Redis core serves |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		th, c := r.shared.through, r.shared.throughCost
		perCore := "–"
		if c.redisCPU > 0 {
			perCore = fmt.Sprintf("%.0f", float64(th.ok)/c.redisCPU)
		}
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %s (%s) | %s | %s | %s | %.0f %% | %s |\n", r.n,
			r.local.through.perSecond(), th.perSecond(),
			perRequest(float64(sumInt(c.calls)), th, "%.2f"), perRequest(float64(c.scriptRuns()), th, "%.2f"),
			perRequest(sumFloat(c.trips), th, "%.2f"), perRequest(float64(c.scriptUsec()), th, "%.1f"),
			perRequest(c.redisCPU*1e6, th, "%.0f"), 100*c.redisCPU/th.wall.Seconds(), perCore)
	}
	fmt.Fprintf(w, "\nPaced: %g requests/s to each fleet, both at once, for %v; a request's time is from sending it to the end of its answer (ms).\n\n", fo.rate, fo.duration)
	fmt.Fprintln(w, "| replicas | p50 without Redis | p50 with Redis | p99 without Redis | p99 with Redis | p99 Redis adds | proxy queue wait p99 without / with Redis |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		l, s := r.local.paced, r.shared.paced
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %+.2f | %s / %s |\n", r.n,
			ms(l.quantile(0.5)), ms(s.quantile(0.5)), ms(l.quantile(0.99)), ms(s.quantile(0.99)),
			float64(s.quantile(0.99)-l.quantile(0.99))/float64(time.Millisecond),
			r.local.pacedCost.waitP99(), r.shared.pacedCost.waitP99())
	}
	fmt.Fprintf(w, "\nNotes (CPU shares are of one core; this machine has %d, so %d %% is all of it):\n", runtime.NumCPU(), 100*runtime.NumCPU())
	for _, r := range rows {
		for _, note := range fleetNotes(r) {
			fmt.Fprintf(w, "- %d replicas: %s\n", r.n, note)
		}
	}
}

// fleetNotes are a row's CPU, breakdowns and anything that went wrong.
func fleetNotes(r fleetRow) []string {
	var notes []string
	cpu := func(fr fleetRun) string {
		secs := fr.through.wall.Seconds()
		s := fmt.Sprintf("llmproxy replicas %.0f %%, this process (load and mock upstream) %.0f %%",
			100*fr.throughCost.repCPU/secs, 100*fr.throughCost.selfCPU/secs)
		c := fr.throughCost
		switch {
		case len(c.nodeCPU) > 1:
			each := make([]string, len(c.nodeCPU))
			for i, v := range c.nodeCPU {
				each[i] = fmt.Sprintf("%.0f %%", 100*v/secs)
			}
			s = fmt.Sprintf("the cluster's primaries %.0f %% (each: %s), its Redis replicas %.0f %%, ",
				100*c.redisCPU/secs, strings.Join(each, ", "), 100*c.replicaCPU/secs) + s
		case c.redisCPU > 0:
			s = fmt.Sprintf("redis-server %.0f %%, ", 100*c.redisCPU/secs) + s
		}
		return s
	}
	notes = append(notes, fmt.Sprintf("CPU in the closed loop with Redis: %s; without: %s (the other fleet idle)", cpu(r.shared), cpu(r.local)))
	th, c := r.shared.through, r.shared.throughCost
	if th.ok > 0 {
		var ops, cmds []string
		for _, op := range sortedKeys(c.trips) {
			ops = append(ops, fmt.Sprintf("%s %.3f", op, c.trips[op]/float64(th.ok)))
		}
		for _, cmd := range sortedKeys(c.calls) {
			cmds = append(cmds, fmt.Sprintf("%s %.3f", cmd, float64(c.calls[cmd])/float64(th.ok)))
		}
		notes = append(notes, fmt.Sprintf("per request, round trips by op: %s; Redis commands: %s (%d requests)",
			strings.Join(ops, ", "), strings.Join(cmds, ", "), th.ok))
	}
	for _, f := range []struct {
		name string
		fr   fleetRun
	}{{"with Redis", r.shared}, {"without Redis", r.local}} {
		for _, p := range []struct {
			name string
			p    phase
		}{{"closed loop", f.fr.through}, {"paced", f.fr.paced}} {
			if p.p.failed > 0 {
				notes = append(notes, fmt.Sprintf("%s, %s: %d requests failed, the first: %s", f.name, p.name, p.p.failed, p.p.firstErr))
			}
			if p.p.skipped > 0 {
				notes = append(notes, fmt.Sprintf("%s, %s: %d requests not sent (too many in flight)", f.name, p.name, p.p.skipped))
			}
		}
		for _, n := range f.fr.notes {
			notes = append(notes, f.name+": "+n)
		}
	}
	if fails := r.shared.throughCost.failures + r.shared.pacedCost.failures; fails > 0 {
		notes = append(notes, fmt.Sprintf("%.0f Redis calls failed or were too slow (LLMPROXY_REDIS_SLOW): the replicas used local limits for a while, and the figures above understate Redis' work", fails))
	}
	return notes
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
