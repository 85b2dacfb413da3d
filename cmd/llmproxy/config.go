package main

import (
	"github.com/redis/go-redis/v9"

	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/llmproxy/llmproxy/proxy"
)

const envPrefix = "LLMPROXY_"

// config is read from LLMPROXY_* variables. Each field's help tag is what
// `llmproxy -h` prints; its envDefault is the default (also in
// config.example.env and the README).
type config struct {
	Addr               string        `env:"ADDR" envDefault:"127.0.0.1:8080" help:"proxy listener"`
	AdminAddr          string        `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9090" help:"admin listener: /healthz /readyz /metrics /lanes; empty = off"`
	Upstream           string        `env:"UPSTREAM" envDefault:"https://api.openai.com" help:"default upstream; the request path is appended"`
	Routes             string        `env:"ROUTES" envDefault:"anthropic=https://api.anthropic.com" help:"comma list name=url; /name/rest goes to url/rest"`
	MaxRetries         int           `env:"MAX_RETRIES" envDefault:"10" help:"upstream attempts after the first, per request"`
	MaxWait            time.Duration `env:"MAX_WAIT" envDefault:"10m" help:"a request's whole budget: queue + retries (X-Stainless-Timeout can shorten it)"`
	MaxRetryAfter      time.Duration `env:"MAX_RETRY_AFTER" envDefault:"2m" help:"a longer upstream wait hint is not waited for: the answer goes to the client"`
	MaxQueue           int           `env:"MAX_QUEUE" envDefault:"10000" help:"waiting requests per lane before new ones get 429"`
	MaxBodyBytes       int64         `env:"MAX_BODY_BYTES" envDefault:"33554432" help:"larger request bodies get 413"`
	LaneConcurrency    int           `env:"LANE_CONCURRENCY" envDefault:"8" help:"a new limit group's concurrency limit; it grows by half each answer time until the upstream refuses for concurrency"`
	LaneMinConcurrency int           `env:"LANE_MIN_CONCURRENCY" envDefault:"1" help:"lowest concurrency limit of a lane"`
	LaneMaxConcurrency int           `env:"LANE_MAX_CONCURRENCY" envDefault:"1024" help:"highest concurrency limit of a lane"`
	MaxLanes           int           `env:"MAX_LANES" envDefault:"10000" help:"lanes kept; the least recently used goes first"`
	LaneIdleTTL        time.Duration `env:"LANE_IDLE_TTL" envDefault:"10m" help:"a lane idle this long is dropped"`
	ClientRateLimitHdr string        `env:"CLIENT_RATELIMIT_HEADERS" envDefault:"strip" help:"strip: clients do not see the upstream's x-ratelimit-* headers (their own throttling would slow the run); pass: forward them"`
	RedisURL           string        `env:"REDIS_URL" help:"redis:// or rediss:// URL: replicas share their lanes' limits through it (unset: this process only)"`
	RedisLeaseTTL      time.Duration `env:"REDIS_LEASE_TTL" envDefault:"15s" help:"with Redis: how long a concurrency slot of a replica that died stays counted"`
	LogLevel           string        `env:"LOG_LEVEL" envDefault:"info" help:"debug, info, warn or error"`
	LogFormat          string        `env:"LOG_FORMAT" envDefault:"text" help:"text or json"`
	ShutdownTimeout    time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s" help:"how long SIGTERM waits for queued and in-flight requests"`

	upstreamURL *url.URL
	routes      []proxy.Route
}

// loadConfig reads the environment given as a map. The error is one line
// naming the variable and what is wrong.
func loadConfig(environ map[string]string) (config, error) {
	var c config
	opts := env.Options{Prefix: envPrefix, Environment: environ}
	if err := env.ParseWithOptions(&c, opts); err != nil {
		return c, describeEnvError(err)
	}
	return c, c.validate()
}

func describeEnvError(err error) error {
	var agg env.AggregateError
	if errors.As(err, &agg) && len(agg.Errors) > 0 {
		err = agg.Errors[0]
	}
	var pe env.ParseError
	if errors.As(err, &pe) {
		f, _ := reflect.TypeOf(config{}).FieldByName(pe.Name)
		return fmt.Errorf("%s%s: cannot parse as %s: %v", envPrefix, f.Tag.Get("env"), pe.Type, pe.Err)
	}
	return err
}

func (c *config) validate() error {
	bad := func(name, format string, a ...any) error {
		return fmt.Errorf("%s%s: %s", envPrefix, name, fmt.Sprintf(format, a...))
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return bad("ADDR", "%q is not host:port", c.Addr)
	}
	if c.AdminAddr != "" {
		if _, _, err := net.SplitHostPort(c.AdminAddr); err != nil {
			return bad("ADMIN_ADDR", "%q is not host:port", c.AdminAddr)
		}
	}
	u, err := parseUpstream(c.Upstream)
	if err != nil {
		return bad("UPSTREAM", "%v", err)
	}
	c.upstreamURL = u
	c.routes = nil
	seen := map[string]bool{}
	for _, item := range strings.Split(c.Routes, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, raw, ok := strings.Cut(item, "=")
		name = strings.Trim(strings.TrimSpace(name), "/")
		if !ok || !proxy.ValidRouteName(name) {
			return bad("ROUTES", "%q is not name=url with a name of letters, digits, '.', '_' and '-'", item)
		}
		if seen[name] {
			return bad("ROUTES", "route %q given twice", name)
		}
		seen[name] = true
		ru, err := parseUpstream(strings.TrimSpace(raw))
		if err != nil {
			return bad("ROUTES", "route %q: %v", name, err)
		}
		c.routes = append(c.routes, proxy.Route{Name: name, URL: ru})
	}
	for _, v := range []struct {
		name string
		val  int64
		min  int64
	}{
		{"MAX_RETRIES", int64(c.MaxRetries), 0},
		{"MAX_QUEUE", int64(c.MaxQueue), 1},
		{"MAX_BODY_BYTES", c.MaxBodyBytes, 1},
		{"LANE_CONCURRENCY", int64(c.LaneConcurrency), 1},
		{"LANE_MIN_CONCURRENCY", int64(c.LaneMinConcurrency), 1},
		{"LANE_MAX_CONCURRENCY", int64(c.LaneMaxConcurrency), 1},
		{"MAX_LANES", int64(c.MaxLanes), 1},
	} {
		if v.val < v.min {
			return bad(v.name, "%d is below the minimum %d", v.val, v.min)
		}
	}
	for _, v := range []struct {
		name string
		val  time.Duration
	}{
		{"MAX_WAIT", c.MaxWait}, {"MAX_RETRY_AFTER", c.MaxRetryAfter},
		{"LANE_IDLE_TTL", c.LaneIdleTTL}, {"SHUTDOWN_TIMEOUT", c.ShutdownTimeout},
		{"REDIS_LEASE_TTL", c.RedisLeaseTTL},
	} {
		if v.val <= 0 {
			return bad(v.name, "%v must be positive", v.val)
		}
	}
	if c.LaneMinConcurrency > c.LaneMaxConcurrency {
		return bad("LANE_MIN_CONCURRENCY", "%d is above LLMPROXY_LANE_MAX_CONCURRENCY=%d", c.LaneMinConcurrency, c.LaneMaxConcurrency)
	}
	if c.LaneConcurrency < c.LaneMinConcurrency || c.LaneConcurrency > c.LaneMaxConcurrency {
		return bad("LANE_CONCURRENCY", "%d is outside [%d, %d] (LLMPROXY_LANE_MIN_/MAX_CONCURRENCY)", c.LaneConcurrency, c.LaneMinConcurrency, c.LaneMaxConcurrency)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		return bad("LOG_LEVEL", "%q is not debug, info, warn or error", c.LogLevel)
	}
	switch strings.ToLower(c.ClientRateLimitHdr) {
	case "strip", "pass":
	default:
		return bad("CLIENT_RATELIMIT_HEADERS", "%q is not strip or pass", c.ClientRateLimitHdr)
	}
	switch strings.ToLower(c.LogFormat) {
	case "text", "json":
	default:
		return bad("LOG_FORMAT", "%q is not text or json", c.LogFormat)
	}
	if c.RedisURL != "" {
		// The URL may hold a password: the message names the problem only.
		if _, err := redis.ParseURL(c.RedisURL); err != nil {
			return bad("REDIS_URL", "not a usable redis:// or rediss:// URL (the value is not shown: it may hold a password)")
		}
	}
	return nil
}

func parseUpstream(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL", raw)
	}
	return u, proxy.CheckUpstream(u)
}

// printUsage writes `llmproxy -h`: every variable with its default.
func printUsage(w io.Writer) {
	fmt.Fprintf(w, `llmproxy: an HTTP reverse proxy that queues LLM API requests per lane,
absorbs upstream 429s and paces itself under the learned rate limits.

Usage:
  llmproxy              run the proxy (configured by the environment)
  llmproxy healthcheck  exit 0 when the admin listener answers /healthz
  llmproxy status [-w] [-interval 2s] [-admin ADDR]
                        the lane table of a running proxy (from its admin
                        address); -w refreshes it in place; exit 1 when the
                        proxy cannot be reached
  llmproxy -h           this help

Point a client at it: OPENAI_BASE_URL=http://127.0.0.1:8080/v1
                      ANTHROPIC_BASE_URL=http://127.0.0.1:8080/anthropic

Environment (default in brackets):
`)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	t := reflect.TypeOf(config{})
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := f.Tag.Get("env")
		if name == "" {
			continue
		}
		fmt.Fprintf(tw, "  %s%s\t[%s]\t%s\n", envPrefix, name, f.Tag.Get("envDefault"), f.Tag.Get("help"))
	}
	tw.Flush()
}
