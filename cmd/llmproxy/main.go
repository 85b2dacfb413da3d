// Command llmproxy runs the proxy: configuration from LLMPROXY_* variables,
// a proxy listener and an admin listener, and a graceful stop on SIGTERM or
// SIGINT (a second one, or LLMPROXY_SHUTDOWN_TIMEOUT, ends the wait).
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
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmproxy/llmproxy/internal/buildinfo"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/redisstate"
)

func main() {
	first, again := stopSignals()
	os.Exit(run(first, again, os.Args[1:], environ(), os.Stdout, os.Stderr, nil))
}

// stopSignals ends the context at the first SIGTERM or SIGINT (drain) and
// delivers the later ones on the channel (stop now).
func stopSignals() (context.Context, <-chan os.Signal) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-sigs
		cancel()
	}()
	return ctx, sigs
}

func environ() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// listening is told the bound addresses once both listeners are up (tests
// use port 0).
type listening func(proxyAddr, adminAddr string)

// stopGrace is how long the handlers get, once the proxy is stopped, to
// write their 503 shutting_down answers before the connections close.
const stopGrace = 2 * time.Second

// run is main without the process: it returns the exit code. ctx ends at
// the first stop signal; again delivers the later ones.
func run(ctx context.Context, again <-chan os.Signal, args []string, environ map[string]string, stdout, stderr io.Writer, up listening) int {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			printUsage(stdout)
			return 0
		case "version", "-version", "--version":
			fmt.Fprint(stdout, buildinfo.Read().Describe())
			return 0
		case "healthcheck":
			cfg, err := loadConfig(environ)
			if err != nil {
				fmt.Fprintln(stderr, "llmproxy:", err)
				return 2
			}
			return healthcheck(cfg.AdminAddr, stderr)
		case "status":
			cfg, err := loadConfig(environ)
			if err != nil {
				fmt.Fprintln(stderr, "llmproxy:", err)
				return 2
			}
			return status(ctx, args[1:], cfg.AdminAddr, cfg.AdminToken, stdout, stderr)
		default:
			fmt.Fprintf(stderr, "llmproxy: unknown argument %q (try -h)\n", args[0])
			return 2
		}
	}
	cfg, err := loadConfig(environ)
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy:", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	cfg.logNotes(log, environ)
	cfg.logRoutes(log)

	reg := prometheus.NewRegistry()
	build := buildinfo.Read()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoGauge(build))
	lanes := lanequeue.TableConfig{
		Lane: lanequeue.Config{
			Concurrency:    cfg.LaneConcurrency,
			MinConcurrency: cfg.LaneMinConcurrency,
			MaxConcurrency: cfg.LaneMaxConcurrency,
			MaxQueue:       cfg.MaxQueue,
		},
		MaxLanes: cfg.MaxLanes,
		IdleTTL:  cfg.LaneIdleTTL,
	}
	// Load balancers must stop sending the moment the signal comes, before
	// anything else happens.
	var draining atomic.Bool
	defer context.AfterFunc(ctx, func() { draining.Store(true) })()
	health := proxy.Health{Build: build, Ready: func(context.Context) error {
		if draining.Load() {
			return errors.New("draining: finishing queued and in-flight requests")
		}
		return nil
	}}
	if cfg.RedisURL != "" {
		store, err := redisstate.New(redisstate.Config{
			URL: cfg.RedisURL, LeaseTTL: cfg.RedisLeaseTTL, KeyTTL: cfg.LaneIdleTTL, Slow: redisSlow(cfg.RedisSlow),
			Logger: log, Registerer: reg,
		})
		if err != nil {
			fmt.Fprintln(stderr, "llmproxy: LLMPROXY_REDIS_URL: not usable (the value is not shown: it may hold a password)")
			return 2
		}
		defer store.Close()
		lanes.Shared = store.Shared
		health.Degraded = store.Ready
		health.Shared = store.Status
	}
	retries := cfg.MaxRetries
	if retries == 0 {
		retries = -1 // proxy.Config's zero means its default; 0 here means none
	}
	p, err := proxy.New(proxy.Config{
		Upstream:             cfg.upstreamURL,
		Routes:               cfg.routes,
		Default:              cfg.defaultRoute,
		GlobalConcurrency:    cfg.GlobalConcurrency,
		MaxRetries:           retries,
		MaxWait:              cfg.MaxWait,
		MaxRetryAfter:        cfg.MaxRetryAfter,
		MaxBodyBytes:         cfg.MaxBodyBytes,
		MaxBufferedBytes:     cfg.MaxBufferedBytes,
		MemoryBodyBytes:      cfg.MemoryBodyBytes,
		SpoolDir:             cfg.SpoolDir,
		MaxSpoolBytes:        cfg.MaxSpoolBytes,
		PassRateLimitHeaders: strings.EqualFold(cfg.ClientRateLimitHdr, "pass"),
		Lanes:                lanes,
		Logger:               log,
		Registry:             reg,
		Gatherer:             reg,
	})
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy:", err)
		return 2
	}

	proxyLn, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		fmt.Fprintf(stderr, "llmproxy: LLMPROXY_ADDR: %v\n", err)
		return 1
	}
	// No ReadTimeout or WriteTimeout: answers stream for up to MAX_WAIT.
	// The body has its own bound (bodyDeadline); idle keep-alive
	// connections theirs.
	servers := []*http.Server{{
		Handler: bodyDeadline(p, cfg.BodyTimeout), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}
	listeners := []net.Listener{proxyLn}
	adminAddr := ""
	if cfg.AdminAddr != "" {
		adminLn, err := net.Listen("tcp", cfg.AdminAddr)
		if err != nil {
			proxyLn.Close()
			fmt.Fprintf(stderr, "llmproxy: LLMPROXY_ADMIN_ADDR: %v\n", err)
			return 1
		}
		adminAddr = adminLn.Addr().String()
		servers = append(servers, &http.Server{
			Handler:           p.AdminHandler(health, proxy.RequireToken(cfg.AdminToken)),
			ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.IdleTimeout,
		})
		listeners = append(listeners, adminLn)
	}

	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() { errc <- s.Serve(listeners[i]) }()
	}
	log.Info("llmproxy listening", "addr", proxyLn.Addr().String(), "admin", adminAddr,
		"upstream", cfg.upstreamURL.Redacted(), "routes", cfg.Routes,
		"version", build.Version, "revision", build.Revision, "go", build.GoVersion)
	if up != nil {
		up(proxyLn.Addr().String(), adminAddr)
	}

	select {
	case <-ctx.Done():
		draining.Store(true) // in case the AfterFunc has not run yet: before Shutdown
		log.Info("stopping: finishing queued and in-flight requests", "timeout", cfg.ShutdownTimeout)
	case err := <-errc:
		log.Error("listener failed", "err", err)
		for _, s := range servers {
			s.Close()
		}
		return 1
	}
	// The proxy listener first, so the admin endpoints keep answering while
	// the last requests drain.
	drain(servers[0], p, cfg.ShutdownTimeout, again, log)
	// WebSocket sessions are not requests the drain waits for: once it is
	// over, each gets a close frame (1001, going away) at both ends.
	// Always: a session may be between its 101 and being counted.
	if n := p.Sessions(); n > 0 {
		log.Info("closing WebSocket sessions", "sessions", n)
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	p.CloseSessions(sctx)
	cancel()
	for _, s := range servers[1:] {
		sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
		if err := s.Shutdown(sctx); err != nil {
			s.Close()
		}
		cancel()
	}
	code := 0
	for range servers {
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

func newLogger(cfg config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(cfg.LogFormat, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// healthcheck asks the admin listener's /healthz; it is the container's
// HEALTHCHECK, since the image has no shell or curl.
func healthcheck(adminAddr string, stderr io.Writer) int {
	if adminAddr == "" {
		fmt.Fprintln(stderr, "llmproxy: healthcheck: LLMPROXY_ADMIN_ADDR is empty")
		return 1
	}
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(adminURL(adminAddr) + "/healthz")
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy: healthcheck:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(stderr, "llmproxy: healthcheck: status", resp.StatusCode)
		return 1
	}
	return 0
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

// redisSlow is LLMPROXY_REDIS_SLOW as redisstate takes it: 0 there is
// the default, and never is negative.
func redisSlow(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
