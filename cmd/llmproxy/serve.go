package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/internal/buildinfo"
	"github.com/llmproxy/llmproxy/internal/tracing"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/redisstate"
	"github.com/llmproxy/llmproxy/state"
)

// listening is told the bound addresses once both listeners are up (tests
// use port 0).
type listening func(proxyAddr, adminAddr string)

// stopGrace is how long the handlers get, once the proxy is stopped, to
// write their 503 shutting_down answers before the connections close.
const stopGrace = 2 * time.Second

// serve runs the proxy from the environment until ctx ends (then drains:
// see stop) or a listener fails, and returns the exit code.
func serve(ctx context.Context, again <-chan os.Signal, environ map[string]string, stderr io.Writer, up listening) int {
	cfg, err := loadConfig(environ)
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy:", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	cfg.logNotes(log, environ)
	cfg.logRoutes(log)
	// Load balancers must stop sending the moment the signal comes, before
	// anything else happens.
	var draining atomic.Bool
	defer context.AfterFunc(ctx, func() { draining.Store(true) })()
	build := buildinfo.Read()
	tracer, stopTraces, err := tracing.Setup(context.Background(), environ, build.Version, log)
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy:", err)
		return 2
	}
	defer flushTraces(stopTraces, log)
	p, health, closeStore, err := newProxy(cfg, build, log, &draining, tracer)
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy:", err)
		return 2
	}
	defer closeStore()
	l, err := listen(cfg, p, health, log)
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy:", err)
		return 1
	}
	errc := l.start()
	log.Info("llmproxy listening", "addr", l.addr, "admin", l.adminAddr,
		"upstream", cfg.upstreamURL.Redacted(), "routes", cfg.Routes,
		"version", build.Version, "revision", build.Revision, "go", build.GoVersion)
	if up != nil {
		up(l.addr, l.adminAddr)
	}
	select {
	case <-ctx.Done():
		draining.Store(true) // in case the AfterFunc has not run yet: before Shutdown
		log.Info("stopping: finishing queued and in-flight requests", "timeout", cfg.ShutdownTimeout)
	case err := <-errc:
		log.Error("listener failed", "err", err)
		for _, s := range l.servers {
			s.Close()
		}
		return 1
	}
	return l.stop(p, cfg.ShutdownTimeout, again, errc, log)
}

// newProxy builds the proxy from cfg, on the shared state in Redis when
// one is configured (closeStore closes it). Its error is the message to
// print.
func newProxy(cfg config, build buildinfo.Info, log *slog.Logger, draining *atomic.Bool, tracer *tracing.Tracer) (p *proxy.Proxy, health proxy.Health, closeStore func(), err error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoGauge(build))
	lanes := laneConfig(cfg)
	health = proxy.Health{Build: build, Ready: func(context.Context) error {
		if draining.Load() {
			return errors.New("draining: finishing queued and in-flight requests")
		}
		return nil
	}}
	closeStore = func() {}
	var fleet proxy.Fleet // the operators' changes reach the other replicas through Redis
	var ledger cost.Ledger
	if cfg.RedisURL != "" {
		sc := storeConfig(cfg)
		sc.Logger, sc.Registerer = log, reg
		store, err := redisstate.New(sc)
		if err != nil {
			return nil, health, closeStore, named(err)
		}
		closeStore = func() { store.Close() }
		lanes.Shared = store.Shared
		ledger = store.Ledger()
		health.Degraded = redisDegraded(store.Ready)
		health.Shared = store.Status
		// The replicas take only changes signed with the admin token:
		// without one, a change stays on the replica it was made on.
		if cfg.AdminToken != "" {
			fleet = store
		} else {
			log.Warn("LLMPROXY_ADMIN_TOKEN is unset: admin changes (limits, holds, clears) stay on the replica they are made on; the replicas share only changes signed with the admin token")
		}
	}
	pc := proxyConfig(cfg, lanes, log, reg)
	if cfg.State != "" {
		closeState, err := openState(cfg, &pc, log)
		if err != nil {
			closeStore()
			return nil, health, func() {}, err
		}
		closeRedis := closeStore
		closeStore = func() { closeState(); closeRedis() }
	}
	pc.Tracer = tracer
	pc.Fleet = fleet
	if ledger != nil {
		pc.Ledger = ledger // budgets hold across the replicas
	}
	p, err = proxy.New(pc)
	if err != nil {
		closeStore()
		return nil, health, func() {}, err
	}
	return p, health, closeStore, nil
}

// openState opens LLMPROXY_STATE's file and sets its journal into pc;
// closeState stops its sweeps and closes it.
func openState(cfg config, pc *proxy.Config, log *slog.Logger) (closeState func(), err error) {
	st, err := state.Open(cfg.State)
	if err != nil {
		return nil, fmt.Errorf("LLMPROXY_STATE: %w", err)
	}
	j, err := st.Journal(cfg.JournalTTL, cfg.JournalMaxBytes)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("LLMPROXY_STATE: %w", err)
	}
	pc.Journal, pc.JournalMode, pc.JournalPassGap = j, cfg.Journal, cfg.JournalPassGap
	if pc.Lanes.Shared == nil { // with Redis, what the pools learned is Redis's
		book, err := st.Limits()
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("LLMPROXY_STATE: %w", err)
		}
		pc.Lanes.Shared = func(key string, c limit.Config) limit.Shared {
			return book.Shared(key, c, func(c limit.Config) limit.Shared { return limit.NewMemory(c) })
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // expired answers go once a minute
		defer close(done)
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			if n, err := j.Sweep(time.Now()); err != nil {
				log.Warn("journal sweep failed", "err", err)
			} else if n > 0 {
				log.Info("journal: expired answers removed", "entries", n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	st0 := j.Stats()
	log.Info("state file open", "path", cfg.State, "journal", cfg.Journal, "entries", st0.Entries, "bytes", st0.Bytes)
	return func() { close(stop); <-done; st.Close() }, nil
}

// errRedisUnreachable is /readyz's reason while Redis is not shared.
var errRedisUnreachable = errors.New("redis unreachable: lanes use local limits (the log says why)")

// redisDegraded is what /readyz says of the store's ready: that Redis is
// unreachable, not why. The client's error names addresses and what the
// server said, which are the log's (the store logs it as it happens), not
// every prober's.
func redisDegraded(ready func() error) func() error {
	return func() error {
		if ready() != nil {
			return errRedisUnreachable
		}
		return nil
	}
}

// laneConfig is the lanes' settings from cfg.
func laneConfig(cfg config) lanequeue.TableConfig {
	return lanequeue.TableConfig{
		Lane: lanequeue.Config{
			Concurrency:    cfg.LaneConcurrency,
			MinConcurrency: cfg.LaneMinConcurrency,
			MaxConcurrency: cfg.LaneMaxConcurrency,
			MaxQueue:       cfg.MaxQueue,
		},
		MaxLanes: cfg.MaxLanes,
		IdleTTL:  cfg.LaneIdleTTL,
	}
}

// storeConfig is the Redis store's settings from cfg (no logger or
// registry yet).
func storeConfig(cfg config) redisstate.Config {
	return redisstate.Config{URL: cfg.RedisURL, LeaseTTL: cfg.RedisLeaseTTL, KeyTTL: cfg.LaneIdleTTL, Slow: cfg.RedisSlow,
		Mode: cfg.RedisMode, SentinelMaster: cfg.RedisSentinelMaster,
		ChangesToken: cfg.AdminToken,
		PasswordFile: cfg.RedisPasswordFile, SentinelPasswordFile: cfg.RedisSentinelPasswordFile,
		CAFile: cfg.RedisCA, CertFile: cfg.RedisCert, KeyFile: cfg.RedisKey}
}

// proxyConfig is proxy.Config from cfg.
func proxyConfig(cfg config, lanes lanequeue.TableConfig, log *slog.Logger, reg *prometheus.Registry) proxy.Config {
	return proxy.Config{
		Upstream:             cfg.upstreamURL,
		Routes:               cfg.routes,
		Default:              cfg.defaultRoute,
		GlobalConcurrency:    cfg.GlobalConcurrency,
		MaxRetries:           cfg.MaxRetries,
		MaxWait:              cfg.MaxWait,
		MaxRetryAfter:        cfg.MaxRetryAfter,
		MaxBodyBytes:         cfg.MaxBodyBytes,
		MaxBufferedBytes:     cfg.MaxBufferedBytes,
		MemoryBodyBytes:      cfg.MemoryBodyBytes,
		SpoolDir:             cfg.SpoolDir,
		MaxSpoolBytes:        cfg.MaxSpoolBytes,
		BodyTimeout:          cfg.BodyTimeout,
		MinBodyRate:          minBodyRate(cfg.MinBodyRate),
		PassRateLimitHeaders: strings.EqualFold(cfg.ClientRateLimitHdr, "pass"),
		Lanes:                lanes,
		Logger:               log,
		Registry:             reg,
		Gatherer:             reg,
		Prices:               cfg.prices,
		Budget:               cfg.budget,
	}
}

// minBodyRate is proxy.Config.MinBodyRate for LLMPROXY_MIN_BODY_RATE:
// its 0, no bound, is the proxy's below zero.
func minBodyRate(rate int64) int64 {
	if rate == 0 {
		return -1
	}
	return rate
}

// servers are the proxy listener's server (first) and the admin
// listener's, when there is one, with their listeners.
type servers struct {
	servers         []*http.Server
	listeners       []net.Listener
	addr, adminAddr string
}

// listen binds the proxy listener and the admin listener (when
// LLMPROXY_ADMIN_ADDR is set). Its error is the message to print.
func listen(cfg config, p *proxy.Proxy, health proxy.Health, log *slog.Logger) (*servers, error) {
	proxyLn, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("LLMPROXY_ADDR: %w", err)
	}
	// No ReadTimeout or WriteTimeout: answers stream for up to MAX_WAIT.
	// The body has its own bounds (the proxy's BodyTimeout and
	// MinBodyRate); idle keep-alive connections theirs.
	l := &servers{servers: []*http.Server{{
		Handler: p, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}, listeners: []net.Listener{proxyLn}, addr: proxyLn.Addr().String()}
	if cfg.AdminAddr == "" {
		return l, nil
	}
	adminLn, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		proxyLn.Close()
		return nil, fmt.Errorf("LLMPROXY_ADMIN_ADDR: %w", err)
	}
	l.adminAddr = adminLn.Addr().String()
	opts := adminOptions(cfg, l.adminAddr, log)
	l.servers = append(l.servers, &http.Server{
		Handler:           p.AdminHandler(health, opts...),
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.IdleTimeout,
	})
	l.listeners = append(l.listeners, adminLn)
	return l, nil
}

// adminOptions are the admin handler's options for cfg on a listener
// bound to addr. Without a token, a listener not on loopback answers
// only requests addressed to localhost, takes no changes and serves no
// profiles: the log says so at start.
func adminOptions(cfg config, addr string, log *slog.Logger) []proxy.AdminOption {
	opts := []proxy.AdminOption{proxy.RequireToken(cfg.AdminToken), proxy.ListenerAddr(addr)}
	open := cfg.AdminToken == "" && !proxy.LoopbackHost(addr)
	if open {
		log.Warn("the admin listener is not on loopback and has no LLMPROXY_ADMIN_TOKEN: it answers only requests addressed to localhost or 127.0.0.1, takes no changes and serves no profiles; set the token to reach it from elsewhere",
			"admin", addr)
	}
	switch {
	case cfg.Pprof && open:
		log.Warn("LLMPROXY_PPROF=true but profiles are off: the admin listener is not on loopback and has no LLMPROXY_ADMIN_TOKEN",
			"admin", addr)
	case cfg.Pprof:
		// Sampled: one mutex contention in 100, and blocking about once per
		// 10 µs blocked.
		runtime.SetMutexProfileFraction(100)
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
		opts = append(opts, proxy.WithProfiling())
	}
	return opts
}

// start serves each listener; the channel gets each server's end.
func (l *servers) start() chan error {
	errc := make(chan error, len(l.servers))
	for i, s := range l.servers {
		go func() { errc <- s.Serve(l.listeners[i]) }()
	}
	return errc
}

// stop drains the proxy listener first, so the admin endpoints keep
// answering while the last requests finish, then closes the WebSocket
// sessions and the admin listener, and returns the exit code.
func (l *servers) stop(p *proxy.Proxy, timeout time.Duration, again <-chan os.Signal, errc chan error, log *slog.Logger) int {
	drain(l.servers[0], p, timeout, again, log)
	// WebSocket sessions are not requests the drain waits for: once it is
	// over, each gets a close frame (1001, going away) at both ends.
	// Always: a session may be between its 101 and being counted.
	if n := p.Sessions(); n > 0 {
		log.Info("closing WebSocket sessions", "sessions", n)
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	p.CloseSessions(sctx)
	cancel()
	for _, s := range l.servers[1:] {
		sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
		if err := s.Shutdown(sctx); err != nil {
			s.Close()
		}
		cancel()
	}
	code := 0
	for range l.servers {
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("listener failed", "err", err)
			code = 1
		}
	}
	log.Info("stopped")
	return code
}

var (
	errDrainTimeout = errors.New("timeout")
	errDrainSignal  = errors.New("signal")
)

// drain shuts srv down: no new connections, and the queued and in-flight
// requests finish, for up to timeout or until another signal comes. Then
// p.Stop answers what is left with 503 shutting_down, which the handlers
// get stopGrace to write before the last connections are closed: a client
// learns to retry elsewhere instead of seeing its connection drop.
func drain(srv *http.Server, p *proxy.Proxy, timeout time.Duration, again <-chan os.Signal, log *slog.Logger) {
	tctx, cancelTimeout := context.WithTimeoutCause(context.Background(), timeout, errDrainTimeout)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(tctx)
	defer cancel(nil)
	go func() {
		select {
		case <-again:
			cancel(errDrainSignal)
		case <-ctx.Done():
		}
	}()
	if err := srv.Shutdown(ctx); err == nil || ctx.Err() == nil {
		return // drained (an error without the context's is the listener's close)
	}
	log.Info("drain ended early: answering the requests still under way with 503 shutting_down",
		"by", context.Cause(ctx).Error(), "under_way", p.UnderWay())
	p.Stop()
	gctx, cancelGrace := context.WithTimeout(context.Background(), stopGrace)
	defer cancelGrace()
	if err := srv.Shutdown(gctx); err != nil {
		if gctx.Err() != nil {
			log.Warn("closing the connections still open after the stop", "grace", stopGrace)
		}
		srv.Close()
	}
}

// traceFlushTimeout bounds how long the exit waits for the last spans to
// be exported.
const traceFlushTimeout = 5 * time.Second

// flushTraces exports the spans not yet exported (the drain's last
// requests'), for up to traceFlushTimeout, with stop, tracing.Setup's
// shutdown.
func flushTraces(stop func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := stop(ctx); err != nil {
		log.Warn("traces: the last spans were not all exported", "err", err)
	}
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(cfg.LogFormat, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// buildInfoGauge is llmproxy_build_info: always 1, its labels name the
// build, so a dashboard can show which builds a fleet runs.
func buildInfoGauge(b buildinfo.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "llmproxy_build_info",
		Help:        "Always 1; the labels name the running build (llmproxy version).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
