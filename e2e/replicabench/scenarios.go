package main

// The rows: what the mock upstream enforces, the load, and what happens to
// Redis or a replica while the load runs.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/e2e/internal/benchcells"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/e2e/universe"
)

// scenario is one row of the table.
type scenario struct {
	name string
	// base names the load whose 1-proxy row this one is compared with.
	base string
	mock mockupstream.Config
	// rate is what the upstream allows, in requests per second: the ideal
	// makespan is n ÷ rate, unless ideal is set.
	rate float64
	// ideal, when set, is the time the upstream's limits allow for the n
	// requests (fixed windows: each window's allowance at its start).
	ideal  time.Duration
	n, c   int
	stream bool
	// anthropic sends /v1/messages with the Anthropic SDK (through the
	// replicas' /anthropic route) instead of chat completions.
	anthropic bool
	// model names request i's model; nil: "gpt-bench" for all.
	model func(i int) string
	// solo: also run through one proxy without Redis.
	solo bool
	// leaseTTL, when set, is the replicas' LLMPROXY_REDIS_LEASE_TTL.
	leaseTTL time.Duration
	// env is more environment for every replica, shared or alone.
	env []string
	// redisURL, when set, is the Redis the shared replicas use instead of
	// a fresh redis-server of their own.
	redisURL string
	// killsReplica: the row kills a replica and shows its cut requests
	// and when its permits came back.
	killsReplica bool
	// setup runs before the load, during while it runs (3 replicas only).
	setup  func(*runEnv) error
	during func(*runEnv) error
	target target
	// draw, when set, is the upstream and the load instead of mock, n, c,
	// rate and model: an e2e/universe draw, its ideal the omniscient
	// sender's (universe.go).
	draw *universe.Draw
	// keys spreads the requests over that many API keys (request i on key
	// i mod keys), each limited apart by the mock; 0: one.
	keys int
	// killAt, for a failover row, is when the node is killed after the
	// load starts; 0: a third of the way through.
	killAt time.Duration
	// rolling: the load goes through a front (rolling.go), and runs
	// without during too, the row's baseline.
	rolling bool
	// failover: the replicas share through a Redis Cluster or Sentinels
	// (failover.go) whose node holding the group is killed; the row's
	// baseline is the same load on a standalone Redis.
	failover string
}

// runEnv is what setup and during work with.
type runEnv struct {
	ctx   context.Context
	sc    *scenario
	redis *redisServer
	rdb   *redis.Client
	mu    sync.Mutex // guards reps, which a restart changes (rolling.go)
	reps  []*replica
	ts    *targets
	load  *loadRun
	start time.Time // of the load
	res   *result
	// victimID is the replica id the killed replica's leases start with.
	victimID string
}

func (e *runEnv) note(format string, args ...any) {
	e.res.notes = append(e.res.notes, fmt.Sprintf(format, args...))
}

func (e *runEnv) since() string {
	return fmt.Sprintf("%.1fs", time.Since(e.start).Seconds())
}

// The upstreams of the rows that are not loadbench's. short: a 20 req/s
// bucket with a one-second burst and 8 in flight, 100 ms answers, limit
// headers and Retry-After (the mock's default speech). silent: the same
// limits, refused with a bare 429.
var (
	shortMock  = mockupstream.Config{RPM: 1200, MaxInFlight: 8, Latency: 100 * time.Millisecond}
	silentMock = mockupstream.Config{RPM: 1200, MaxInFlight: 8, Latency: 100 * time.Millisecond,
		NoLimitHeaders: true, NoRetryAfter: true, NoHint: true, ConcurrencyUnnamed: true}
)

// scenarios lists every row in the order they run: short and silent, every
// dialect cell of loadbench, then what goes wrong with Redis or a replica.
func scenarios(leaseTTL time.Duration) []*scenario {
	asOne := target{kind: asOneProxy}
	rows := []*scenario{
		{name: "short", base: "short", mock: shortMock, rate: 20, n: 450, c: 50, solo: true, target: asOne},
		{name: "silent", base: "silent", mock: silentMock, rate: 20, n: 300, c: 50, solo: true, target: asOne},
	}
	dialects := dialectRows()
	rows = append(rows, dialects...)
	streams := *dialects[slices.IndexFunc(dialects, func(s *scenario) bool { return s.name == "streams/headers" })]
	return append(rows,
		&scenario{name: "redis-slow", base: "short", mock: shortMock, rate: 20, n: 450, c: 50, during: slowRedis, target: asOne},
		&scenario{name: "redis-killed", base: "short", mock: shortMock, rate: 20, n: 360, c: 50, during: killRedis,
			target: target{kind: refusedTarget, pct: 10}},
		&scenario{name: "replica-killed", base: streams.name, mock: streams.mock, rate: streams.rate, n: streams.n, c: streams.c,
			stream: true, leaseTTL: leaseTTL, killsReplica: true, setup: findVictim, during: killReplica,
			target: target{kind: replicaKilledTarget, points: 2}},
		&scenario{name: "cluster-killed", base: "cluster-killed", mock: shortMock, rate: 20, n: 360, c: 50, failover: clusterFailover},
		// Issue 48's Cluster row: six keys, each 20 req/s and 8 in flight,
		// spread over the cluster's slots, the primary holding a group
		// killed a third of the way through (the 3 s in is at the
		// end of this load, which the mock's one-second bursts finish in
		// about 3 s).
		&scenario{name: "cluster-keys", base: "cluster-keys", mock: shortMock, rate: 120, n: 450, c: 50, keys: 6,
			failover: clusterFailover},
		&scenario{name: "sentinel-failover", base: "sentinel-failover", mock: shortMock, rate: 20, n: 360, c: 50, failover: sentinelFailover},
		&scenario{name: "rolling-restart", base: "rolling-restart", mock: shortMock, rate: 20, n: 450, c: 50, rolling: true, during: rollReplicas,
			target: target{kind: rollingTarget}},
	)
}

// dialectRows are loadbench's cells (e2e/internal/benchcells) at its
// default figures, each the same upstream and load as there, through one
// proxy and through the replicas, as good as one proxy; all but the cells
// of routes configured in the proxy (configured, local), which are about
// the route, not what the upstream says. streams/headers also keeps the
// streams target it had as the row "streams".
func dialectRows() []*scenario {
	var rows []*scenario
	for _, cell := range benchcells.Cells(benchcells.DefaultLatency, benchcells.DefaultRPS) {
		if cell.Configure != nil {
			continue
		}
		sc := &scenario{name: cell.Name, base: cell.Name, mock: cell.Mock, rate: cell.Rate, ideal: cell.IdealOf(cell.N),
			n: cell.N, c: cell.C, stream: cell.Stream, anthropic: cell.Anthropic, model: cell.Model, solo: true,
			target: target{kind: asOneProxy}}
		if sc.name == "streams/headers" {
			sc.target = target{kind: streamsTarget, ratio: 1.1, points: 2}
		}
		rows = append(rows, sc)
	}
	return rows
}

// victim is the replica replica-killed kills.
const victim = 0

// slowRedis makes Redis stall for 200 ms every 600 ms while the load runs,
// from a connection of its own.
func slowRedis(e *runEnv) error {
	if !e.redis.debug {
		e.note("this redis-server has no enable-debug-command: DEBUG may be refused")
	}
	conn, err := net.DialTimeout("tcp", e.redis.addr(), time.Second)
	if err != nil {
		return fmt.Errorf("redis-slow: %w", err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	tick := time.NewTicker(600 * time.Millisecond)
	defer tick.Stop()
	sent, refused := 0, ""
	for {
		select {
		case <-e.load.done:
			e.note("DEBUG SLEEP 0.2 sent %d times, every 600ms", sent)
			if refused != "" {
				e.note("DEBUG refused: %s", refused)
			}
			return nil
		case <-e.ctx.Done():
			return nil
		case <-tick.C:
		}
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := conn.Write([]byte("*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$3\r\n0.2\r\n")); err != nil {
			return fmt.Errorf("redis-slow: DEBUG SLEEP: %w", err)
		}
		line, err := rd.ReadString('\n')
		if err != nil {
			return fmt.Errorf("redis-slow: DEBUG SLEEP: %w", err)
		}
		if !strings.HasPrefix(line, "+OK") {
			refused = strings.TrimSpace(line)
		}
		sent++
	}
}

// killRedis SIGKILLs redis-server a third of the way through the load and
// starts it again, empty, on the same port two thirds of the way through.
func killRedis(e *runEnv) error {
	if !e.load.waitCompleted(e.ctx, e.load.n/3) {
		e.note("the load ended before a third of it: Redis not killed")
		return nil
	}
	e.redis.kill()
	e.note("redis-server SIGKILLed at %s (%d done)", e.since(), e.load.completed.Load())
	if !e.load.waitCompleted(e.ctx, 2*e.load.n/3) && e.ctx.Err() != nil {
		return nil
	}
	if err := e.redis.launch(); err != nil {
		return fmt.Errorf("redis-killed: restart: %w", err)
	}
	e.note("restarted at %s (%d done)", e.since(), e.load.completed.Load())
	return nil
}

// findVictim learns the id the victim's leases carry: it holds one stream
// on the victim alone and reads the one lease out in Redis.
func findVictim(e *runEnv) error {
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	params := benchcells.ChatParams(0, "gpt-bench", true)
	s := e.ts.clients[victim].Chat.Completions.NewStreaming(ctx, params)
	defer s.Close()
	deadline := time.Now().Add(time.Second)
	for e.victimID == "" && time.Now().Before(deadline) {
		members, _, err := liveLeases(ctx, e.rdb)
		if err == nil && len(members) == 1 {
			e.victimID, _, _ = strings.Cut(members[0], "-")
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for s.Next() {
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("replica-killed: the stream that finds the victim's id: %w", err)
	}
	if e.victimID == "" {
		e.note("the victim's leases could not be told apart: permits counted as leases out minus the survivors' in flight")
	}
	return nil
}

// killReplica, a third of the way through the load, stops sending to the
// victim, SIGKILLs it, and watches Redis until the permits it held are
// free again.
func killReplica(e *runEnv) error {
	if !e.load.waitCompleted(e.ctx, e.load.n/3) {
		e.note("the load ended before a third of it: no replica killed")
		return nil
	}
	e.ts.drop(victim)
	// From here on the victim's failures are cuts: set before the signal,
	// as its clients may see their connections drop before it is reaped.
	e.res.killAt = time.Now()
	e.res.victim = victim
	e.reps[victim].kill()
	e.note("replica %d SIGKILLed at %s (%d done)", victim, e.since(), e.load.completed.Load())

	ttl := e.sc.leaseTTL
	deadline := e.res.killAt.Add(ttl + 10*time.Second)
	held, zeroes := -1, 0
	for time.Now().Before(deadline) && e.ctx.Err() == nil {
		n, err := victimPermits(e)
		if err == nil {
			if held < 0 {
				held = n
			}
			// The fallback count subtracts figures read at different
			// moments: it must hold twice in a row.
			if n <= 0 {
				zeroes++
			} else {
				zeroes = 0
			}
			if (zeroes >= 1 && e.victimID != "") || zeroes >= 2 {
				e.res.permitsBack = time.Since(e.res.killAt)
				e.res.permitsKnown = true
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if e.res.permitsKnown {
		e.note("it held %d permits; free again %.2fs after the kill (lease TTL %v)", held, e.res.permitsBack.Seconds(), ttl)
	} else {
		e.note("its %d permits still counted %v after the kill (lease TTL %v)", held, ttl+10*time.Second, ttl)
	}
	return nil
}

// victimPermits is how many permits the dead replica still holds.
func victimPermits(e *runEnv) (int, error) {
	members, _, err := liveLeases(e.ctx, e.rdb)
	if err != nil {
		return 0, err
	}
	if e.victimID != "" {
		n := 0
		for _, m := range members {
			if strings.HasPrefix(m, e.victimID+"-") {
				n++
			}
		}
		return n, nil
	}
	inFlight := 0
	for i, r := range e.reps {
		if i == victim {
			continue
		}
		lv, err := r.lanes()
		if err != nil {
			return 0, err
		}
		for _, l := range lv.Lanes {
			inFlight += l.InFlight
		}
	}
	return len(members) - inFlight, nil
}

// liveLeases lists the leases in Redis that have not expired (their score
// is their expiry, in ms on Redis' clock), over every limit group.
func liveLeases(ctx context.Context, rdb *redis.Client) ([]string, int, error) {
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return nil, 0, err
	}
	keys, err := rdb.Keys(ctx, "llmproxy:v2:*:leases").Result()
	if err != nil {
		return nil, 0, err
	}
	var members []string
	from := fmt.Sprintf("(%d", now.UnixMilli())
	for _, k := range keys {
		ms, err := rdb.ZRangeByScore(ctx, k, &redis.ZRangeBy{Min: from, Max: "+inf"}).Result()
		if err != nil {
			return nil, 0, err
		}
		members = append(members, ms...)
	}
	return members, len(keys), nil
}

// modelOf is request i's model.
func (sc *scenario) modelOf(i int) string {
	if sc.model != nil {
		return sc.model(i)
	}
	return "gpt-bench"
}
