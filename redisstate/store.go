// Package redisstate lets several llmproxy replicas share their lanes'
// limits through Redis: the learned budgets, the pause after a 429, and the
// concurrency limit as a semaphore of expiring leases. It implements
// limit.Shared; the proxy does not know it is there.
//
// Each replica still learns from its own answers with the in-process
// state, and pushes what it learned to Redis; admission (pause, permits,
// budgets) is one Lua script, so replicas cannot both take the last unit.
// When Redis is unreachable or slow, every group falls back to its
// in-process state at once (fail-open), and rejoins when Redis answers
// again. It does not give strict FIFO across replicas, only that a
// replica's oldest waiter is not passed over by newer ones elsewhere.
package redisstate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/internal/setting"
	"github.com/llmproxy/llmproxy/limit"
)

// Config shapes a Store. Zero fields take the documented defaults.
type Config struct {
	// URL is a redis:// or rediss:// URL (required):
	// redis[s]://[user[:password]@]host[:port][/db], with more cluster
	// seeds or Sentinels as repeated addr=host:port parameters.
	URL string
	// Mode is how the URL's servers are reached: "standalone", "cluster"
	// (a Redis Cluster; its hosts are seeds), "sentinel" (its hosts are
	// Sentinels, which name the primary SentinelMaster), or "" or "auto":
	// sentinel when SentinelMaster is set, else cluster when the server
	// says it is a cluster node, else standalone.
	Mode string
	// SentinelMaster is the name the Sentinels know the primary by.
	SentinelMaster string
	// PasswordFile, when set, holds the password (it replaces the URL's),
	// read again at every new connection: a rotated secret is picked up.
	// SentinelPasswordFile holds the Sentinels' own, when they ask for one.
	PasswordFile, SentinelPasswordFile string
	// CAFile holds the PEM certificates a rediss:// server's must chain
	// to (zero: the system's); CertFile and KeyFile, both or neither, a
	// client certificate for a server that asks for one.
	CAFile, CertFile, KeyFile string
	// Prefix starts every key; zero = "llmproxy:v2:". The version changes
	// when the keys' layout does.
	Prefix string
	// LeaseTTL is how long a permit stays counted without its replica
	// renewing it: how long a replica that died holds its permits. Zero =
	// 15s, else at least MinLeaseTTL.
	LeaseTTL time.Duration
	// KeyTTL is how long a group's keys live unused; zero = 10m.
	KeyTTL time.Duration
	// Timeout bounds one Redis call; past it the replica falls back to
	// local limits. Zero = 250ms.
	Timeout time.Duration
	// Poll is how soon a group asks again when Redis says no and nothing
	// says when: a permit may free on another replica. Zero = 20ms.
	Poll time.Duration
	// Slow is the 99th percentile of recent calls past which Redis counts
	// as too slow to share through: the replica uses its share of the
	// limits locally until a ping answers within it again, rather than
	// making its requests wait on Redis. Zero = never, as
	// LLMPROXY_REDIS_SLOW=0 (DefaultSlow is cmd's default).
	Slow time.Duration
	// ChangesEvery is how often the replica reads the fleet's run-time
	// changes (see WatchChanges); zero = DefaultChangesEvery.
	ChangesEvery time.Duration
	// ChangesToken is the admin token every replica holds: the fleet's
	// changes are signed with a key derived from it, and a change not
	// signed with it is ignored (see changes.go). Empty: this replica
	// shares no changes: PutChange refuses them, WatchChanges hands none.
	ChangesToken string
	// Logger gets one line per change between shared and local; nil =
	// discard.
	Logger *slog.Logger
	// Registerer gets the store's metrics; nil = none.
	Registerer prometheus.Registerer
	// Clock is the replica's clock, the one its lanes run on; nil = the
	// wall clock. The times the store writes or compares with its lanes'
	// (lease expiries, heartbeats, Redis' clock offset) are read from it,
	// and the renewal and the heartbeat run on its timers; the rejoin
	// pings' timers, and the latency of its calls, are the wall clock's.
	Clock clock.Clock
	// redisClock, tests only, stands in for Redis' clock: the scripts run
	// at its time instead of reading TIME, so a test on a fake clock
	// drives the shared state as it drives its lanes, and no load on the
	// machine moves either. nil = Redis' TIME.
	redisClock clock.Clock
}

// Store is one replica's connection to the shared state.
type Store struct {
	cfg    Config
	opts   *redis.UniversalOptions
	client atomic.Pointer[redis.UniversalClient]
	// undecided: Mode auto, and the server has not yet said whether it is
	// a cluster node (detect).
	undecided atomic.Bool
	replica   string
	log       *slog.Logger

	up  atomic.Bool
	seq atomic.Uint64
	// clockOffset is Redis' clock less this process' wall clock (ms), as
	// the latest script reply showed it.
	clockOffset atomic.Int64
	mu          sync.Mutex
	leases      map[string]string // lease -> leases key, renewed while held
	returns     map[string]string // lease -> leases key, to remove once Redis answers
	adds        map[string]string // lease -> leases key of a permit taken locally, to count in Redis
	removed     []removal         // leases removed from Redis lately, oldest first (see noteRemovedLocked)
	gives       []give            // budget give-backs waiting for the writer
	closing     sync.Once
	stop        chan struct{}
	done        chan struct{} // the loop and the writer ended
	kick        chan struct{} // wakes the writer
	flushes     chan chan struct{}
	// peers is the number of replicas that said they were alive in the
	// last minute, this one included, as Redis last told it.
	peers atomic.Int64
	// busyPeers is the number of other replicas that had requests to
	// admit lately (busyWindow), as Redis last told it; asked is when this
	// one last had (unix ns). A replica's share divides among the busy
	// ones: a replica whose clients are done leaves its part to the rest.
	busyPeers     atomic.Int64
	asked         atomic.Int64
	busySince     atomic.Int64 // when the current run of requests to admit began (unix ns)
	latency       latencies
	slow          atomic.Bool            // the last failure was slowness, not an error
	whyNot        atomic.Pointer[string] // the latest failure's reason
	upGauge       prometheus.Gauge
	replicasGauge prometheus.Gauge
	commands      *prometheus.CounterVec // op
	failures      prometheus.Counter
	// renewCopied and rejoinHook, tests only, run in renew once it
	// copied the held leases, and in rejoin just before the store is up.
	renewCopied, rejoinHook func()
	// changesSeen are the fleet's changes as this replica last read or
	// wrote them (see WatchChanges); changesMu guards them, and orders
	// the polls and the writes. watching counts the poller.
	changesMu   sync.Mutex
	changesSeen map[string]string
	// changesVersion is each field's version in force here: a change of
	// that version or below is a replay. signKey signs and checks them
	// (nil: no ChangesToken).
	changesVersion map[string]int64
	signKey        []byte
	// changesStray, changesOver: the last poll met fields no replica
	// writes, or changes past maxChangesSeen, logged once (see
	// pollChanges).
	changesStray, changesOver bool
	watching                  sync.WaitGroup
}

// MinLeaseTTL is the shortest lease: a replica renews its leases every
// third of the TTL with a call that may take Timeout, so a shorter one
// would let live permits lapse. Validate refuses a shorter Config.LeaseTTL.
const MinLeaseTTL = time.Second

// New connects to cfg.URL. No URL, or a Config Validate refuses, is an
// error; a server that does not answer is not: the store starts degraded
// and rejoins when it answers.
func New(cfg Config) (*Store, error) {
	if cfg.URL == "" {
		return nil, setting.Bad("redisstate", "URL", "missing")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opt, _ := cfg.options() // Validate built them
	cfg = cfg.withDefaults()
	// go-redis logs its own retries and dial failures (a dozen a second
	// while Redis is down) to stderr in a format of its own; they go
	// through slog at debug instead. The store's one line per change
	// between shared and local stays the warning. go-redis has one logger
	// for the process: the latest store's.
	redis.SetLogger(clientLog{cfg.Logger})
	opt.DialTimeout = cfg.Timeout
	opt.ReadTimeout = cfg.Timeout
	opt.WriteTimeout = cfg.Timeout
	opt.MaxRetries = -1 // a failed call falls back at once; the pinger retries
	// Each call's context (Timeout) bounds the whole call, its reads and
	// writes included, not only the wait for a connection.
	opt.ContextTimeoutEnabled = true
	// No CLIENT SETINFO at each connection: one command less for an ACL
	// to allow.
	opt.DisableIdentity = true
	mode := cfg.mode()
	s, err := unstarted(cfg, dial(opt, mode))
	if err != nil {
		return nil, err
	}
	s.opts = opt
	s.undecided.Store(mode == modeAuto)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	err = s.reachable(ctx)
	cancel()
	if err != nil {
		s.why(err)
		s.log.Warn("redis unreachable at start; lanes use local limits until it answers", "err", err.Error())
	} else {
		s.heartbeat(s.now())
		s.setUp(true)
	}
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); s.loop() }()
	go func() { defer both.Done(); s.writer() }()
	go func() { both.Wait(); close(s.done) }()
	return s, nil
}

// The default lease TTL, and the slowness bound cmd sets by default.
const (
	DefaultLeaseTTL = 15 * time.Second
	DefaultSlow     = 50 * time.Millisecond
)

// Validate reports, as a *setting.Error, a URL given that is not a
// redis:// or rediss:// one (its value never quoted: it may hold a
// password), a mode, password file or certificate that cannot be used, a
// lease TTL under MinLeaseTTL or a negative slowness bound.
func (cfg Config) Validate() error {
	if cfg.URL != "" {
		if _, err := cfg.options(); err != nil {
			return err
		}
	}
	switch {
	case cfg.LeaseTTL < 0 || cfg.LeaseTTL > 0 && cfg.LeaseTTL < MinLeaseTTL:
		return setting.Bad("redisstate", "LeaseTTL", fmt.Sprintf("%v is below the minimum %v", cfg.LeaseTTL, MinLeaseTTL))
	case cfg.Slow < 0:
		return setting.Bad("redisstate", "Slow", fmt.Sprintf("%v is negative (0 is never)", cfg.Slow))
	}
	return nil
}

// withDefaults is cfg with every unset field at its default.
func (cfg Config) withDefaults() Config {
	if cfg.Prefix == "" {
		cfg.Prefix = "llmproxy:v2:"
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.KeyTTL <= 0 {
		cfg.KeyTTL = 10 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 250 * time.Millisecond
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 20 * time.Millisecond
	}
	if cfg.ChangesEvery <= 0 {
		cfg.ChangesEvery = DefaultChangesEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return cfg
}

// now is the replica's time of day, from the injected clock (durations
// of calls, and the rejoin pings' timers, use the wall clock).
func (s *Store) now() time.Time { return s.cfg.Clock.Now() }

// scriptNow is the time a script is to run at (ms, its args' Now): 0,
// Redis' own clock, but in a test that stands a clock in for it.
func (s *Store) scriptNow() int64 {
	if s.cfg.redisClock == nil {
		return 0
	}
	return s.cfg.redisClock.Now().UnixMilli()
}

// unstarted is a store on rdb with its metrics registered, not yet
// started.
func unstarted(cfg Config, rdb redis.UniversalClient) (*Store, error) {
	var id [6]byte
	_, _ = rand.Read(id[:])
	s := &Store{
		cfg: cfg, replica: hex.EncodeToString(id[:]), log: cfg.Logger,
		leases: map[string]string{}, returns: map[string]string{}, adds: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{}),
		changesSeen: map[string]string{}, changesVersion: map[string]int64{}, signKey: changesKeyFrom(cfg.ChangesToken),
		kick: make(chan struct{}, 1), flushes: make(chan chan struct{}),
		upGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmproxy_redis_up", Help: "1 while the replica shares lane state through Redis, 0 while it uses local limits."}),
		replicasGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmproxy_redis_replicas", Help: "Replicas seen alive through Redis in the last minute, this one included."}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_redis_commands_total", Help: "Redis round trips, by operation."}, []string{"op"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmproxy_redis_failures_total", Help: "Redis calls that failed or timed out; each makes the replica use local limits until Redis answers again."}),
	}
	s.client.Store(&rdb)
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.upGauge, s.replicasGauge, s.commands, s.failures} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Status is "ok" while the replica shares state, "degraded" while it uses
// local limits.
func (s *Store) Status() string {
	if s.up.Load() {
		return "ok"
	}
	return "degraded"
}

// Ready reports nil while Redis is shared, else why not, with the latest
// failure's reason (a refused connection, WRONGPASS, a certificate not
// trusted); the proxy stays ready either way (fail-open).
func (s *Store) Ready() error {
	if s.up.Load() {
		return nil
	}
	if why := s.whyNot.Load(); why != nil {
		return errors.New("redis unreachable: lanes use local limits (" + *why + ")")
	}
	return errors.New("redis unreachable: lanes use local limits")
}

// Close stops the background work and the connection, once the permits
// given back and the budgets' give-backs still waiting have been sent.
// The leases still held are removed, and the replica leaves the fleet's
// counts: a clean shutdown hands its permits and its share to the other
// replicas at once, not after the lease TTL and the heartbeats' minute.
func (s *Store) Close() error {
	err := errors.New("redisstate: closed twice")
	s.closing.Do(func() {
		close(s.stop)
		<-s.done
		s.watching.Wait()
		s.leave()
		err = s.rdb().Close()
	})
	return err
}

// leave removes from Redis the leases this replica still holds or has
// yet to return, and the replica from the fleet's sets, in one round
// trip; a Redis that does not answer leaves them to expire.
func (s *Store) leave() {
	s.mu.Lock()
	gone := map[string]string{}
	for _, m := range []map[string]string{s.leases, s.returns} {
		for l, k := range m {
			gone[l] = k
		}
	}
	s.mu.Unlock()
	ctx, cancel := s.ctx()
	defer cancel()
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		for l, k := range gone {
			p.ZRem(ctx, k, l)
		}
		for _, k := range s.fleetKeys() {
			p.ZRem(ctx, k, s.replica)
		}
		return nil
	})
	s.commands.WithLabelValues("leave").Inc()
	if err != nil {
		s.log.Warn("redis did not take this replica's leave; its permits expire with their leases", "err", err.Error())
	}
}

// sawClock notes Redis' clock (ms) from a reply just received.
func (s *Store) sawClock(redisNow int64) {
	s.clockOffset.Store(redisNow - s.now().UnixMilli())
}

// ctx bounds one call.
func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.Timeout)
}

// Shared returns the shared state of the limit group; use it as
// lanequeue.TableConfig.Shared.
func (s *Store) Shared(group string, cfg limit.Config) limit.Shared {
	// A zero Config means the defaults here as everywhere: the scripts
	// would read a concurrency of 0 as "admit nothing".
	return newShared(s, group, cfg.WithDefaults())
}

// clientLog hands go-redis's log lines to slog at debug.
type clientLog struct{ log *slog.Logger }

func (c clientLog) Printf(ctx context.Context, format string, v ...any) {
	c.log.DebugContext(ctx, "redis client", "detail", fmt.Sprintf(format, v...))
}
