// Command llmproxy runs the proxy: configuration from LLMPROXY_* variables,
// a proxy listener and an admin listener, and a graceful stop on SIGTERM or
// SIGINT.
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

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/redisstate"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], environ(), os.Stdout, os.Stderr, nil))
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

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer, up listening) int {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			printUsage(stdout)
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
			return status(ctx, args[1:], cfg.AdminAddr, stdout, stderr)
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

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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
	var draining atomic.Bool
	health := proxy.Health{Ready: func(context.Context) error {
		if draining.Load() {
			return errors.New("draining: finishing queued and in-flight requests")
		}
		return nil
	}}
	if cfg.RedisURL != "" {
		store, err := redisstate.New(redisstate.Config{
			URL: cfg.RedisURL, LeaseTTL: cfg.RedisLeaseTTL, KeyTTL: cfg.LaneIdleTTL,
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
		MaxRetries:           retries,
		MaxWait:              cfg.MaxWait,
		MaxRetryAfter:        cfg.MaxRetryAfter,
		MaxBodyBytes:         cfg.MaxBodyBytes,
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
	servers := []*http.Server{{Handler: p, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
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
		servers = append(servers, &http.Server{Handler: p.AdminHandler(health), ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, adminLn)
	}

	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() { errc <- s.Serve(listeners[i]) }()
	}
	log.Info("llmproxy listening", "addr", proxyLn.Addr().String(), "admin", adminAddr,
		"upstream", cfg.upstreamURL.Redacted(), "routes", cfg.Routes)
	if up != nil {
		up(proxyLn.Addr().String(), adminAddr)
	}

	select {
	case <-ctx.Done():
		draining.Store(true) // load balancers stop sending first
		log.Info("stopping: finishing queued and in-flight requests", "timeout", cfg.ShutdownTimeout)
	case err := <-errc:
		log.Error("listener failed", "err", err)
		for _, s := range servers {
			s.Close()
		}
		return 1
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	// The proxy listener first, so the admin endpoints keep answering while
	// the last requests drain.
	code := 0
	if err := servers[0].Shutdown(sctx); err != nil {
		log.Warn("shutdown timeout passed; closing the remaining connections", "err", err)
		servers[0].Close()
	}
	for _, s := range servers[1:] {
		if err := s.Shutdown(sctx); err != nil {
			s.Close()
		}
	}
	for range servers {
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("listener failed", "err", err)
			code = 1
		}
	}
	log.Info("stopped")
	return code
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
