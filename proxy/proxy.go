// Package proxy is llmproxy's HTTP side: it routes a request to its
// upstream, keys it into a lane, buffers its body, waits in the lane's
// queue, forwards it with retries that keep the slot, and streams the answer
// back. It also serves the admin endpoints.
//
// It does not parse rate-limit headers (headerparse), choose retry delays
// (backoff), make upstream attempts (upstream) or decide queue order
// (lanequeue).
package proxy

import (
	"context"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/backoff"
	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/internal/setting"
	"github.com/llmproxy/llmproxy/internal/tracing"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/state"
	"github.com/llmproxy/llmproxy/upstream"
)

// Route sends requests under /Name/ to URL, with the prefix removed.
type Route struct {
	Name     string
	URL      *url.URL
	Settings RouteSettings
}

// RouteSettings are what the configuration says of a route beyond its URL
// (LLMPROXY_ROUTE_<NAME>_*).
type RouteSettings struct {
	// Limits are the route's configured limits per pool.
	Limits limit.Limits
	// Priority is the priority of a request that does not send
	// x-llmproxy-priority.
	Priority lanequeue.Priority
	// Local marks a local model server that holds one model at a time:
	// requests for the loaded model go first (see lanequeue.TableConfig.LocalRoutes).
	Local bool
	// LocalFairness bounds how long a request for another model waits
	// while the loaded one keeps being asked for; zero = 30s.
	LocalFairness time.Duration
	// ServiceTier is the tier a request asks for when it does not say
	// (x-llmproxy-tier): cost.Flex, or "" for the upstream's default.
	ServiceTier cost.Tier
	// FlexNever keeps a flex request on flex until its deadline, never
	// at standard (FLEX_FALLBACK=never).
	FlexNever bool
	// Budget caps the route's spend, every credential's together; 0 =
	// none.
	Budget cost.Amount
}

// Config is everything the proxy needs. Zero fields take the documented
// defaults.
type Config struct {
	Upstream *url.URL // default upstream; nil = https://api.openai.com
	Routes   []Route  // named prefix routes
	// Default is the settings of the default upstream's route.
	Default RouteSettings
	// GlobalConcurrency caps the upstream calls in flight over all lanes,
	// taken just before each call; zero = no cap.
	GlobalConcurrency int
	MaxRetries        int           // retries of failures (5xx, 408, connection errors), not of absorbed 429s; zero = none, as LLMPROXY_MAX_RETRIES=0 (DefaultMaxRetries is cmd's default)
	MaxWait           time.Duration // a request's whole wait, its deadline (queue + retries); zero = 10m
	MaxRetryAfter     time.Duration // longer upstream hints are not waited for; zero = 2m
	MaxBodyBytes      int64         // larger bodies get 413; zero = 512 MiB
	// MemoryBodyBytes is the largest body held in memory; a larger one
	// is spooled to a file in SpoolDir. Zero = 1 MiB.
	MemoryBodyBytes int64
	// SpoolDir holds the spooled bodies; "" = the system's temporary
	// directory. Spools left there by a crash are removed by New.
	SpoolDir string
	// MaxSpoolBytes bounds the bodies all requests spooled together; a
	// body past it gets 429 queue_full. Zero = 2 GiB.
	MaxSpoolBytes int64
	// MaxBufferedBytes bounds the request bodies all requests hold
	// together (queued, retried, in flight); a body past it gets 429
	// queue_full. Zero = 256 MiB.
	MaxBufferedBytes int64
	// BodyTimeout is the most a request's whole body may take to
	// arrive, from its headers; past it, 400 body_read_error. Zero =
	// 60s.
	BodyTimeout time.Duration
	// MinBodyRate is the least bytes per second a request's body must
	// average, from its headers, once BodyRateGrace has passed; under
	// it, 408 body_too_slow. Zero = DefaultMinBodyRate; below zero, no
	// such bound.
	MinBodyRate int64
	// BodyRateGrace is how long a body may take before MinBodyRate
	// applies; zero = 5s.
	BodyRateGrace time.Duration
	Lanes         lanequeue.TableConfig
	Transport     http.RoundTripper     // nil = upstream.NewTransport()
	Logger        *slog.Logger          // nil = discard
	Registry      prometheus.Registerer // nil = a private registry
	Gatherer      prometheus.Gatherer   // what /metrics serves; nil = the private registry
	Clock         clock.Clock           // nil = wall clock; also set into Lanes
	Backoff       backoff.Policy
	// PassRateLimitHeaders forwards the upstream's rate-limit window headers
	// to clients. By default they are removed: the proxy does the pacing,
	// and client-side schedulers that throttle themselves on
	// x-ratelimit-remaining-* would only slow a run the proxy already keeps
	// under the limit.
	PassRateLimitHeaders bool
	Rand                 func() float64 // jitter source; nil = math/rand/v2
	// Tracer makes each request's trace (see internal/tracing); nil = no
	// traces, and an incoming traceparent passes upstream untouched.
	Tracer *tracing.Tracer
	// Prices prices answers (x-llmproxy-cost-usd, spend by lane and run)
	// and bounds budgets; nil = no prices, and no budget can be set.
	Prices *cost.Table
	// Budget caps each credential's spend (LLMPROXY_BUDGET_USD); 0 =
	// none.
	Budget cost.Amount
	// Ledger keeps the budgets' spend and holds; nil = in this process.
	// Replicas share one through Redis.
	Ledger cost.Ledger
	// Fleet shares the operators' changes (the admin endpoints') with
	// the other replicas of the proxy; nil: this process only.
	Fleet Fleet
	// Journal keeps complete answers by run and occurrence (the state
	// file's); nil = no journal, and x-llmproxy-journal is refused.
	// JournalMode is the mode of requests that do not say one: "" or
	// off, record, replay, strict. JournalPassGap is how long a run
	// rests before its next request starts a new pass; zero = 30s.
	Journal        *state.Journal
	JournalMode    string
	JournalPassGap time.Duration
}

// Proxy is the request handler plus its lane table and metrics.
type Proxy struct {
	// stopped is cancelled by Stop: every request still waiting or at the
	// upstream is answered 503 shutting_down at once.
	stopped context.Context
	stop    context.CancelFunc

	cfg      Config
	buffered bodyBound // request body bytes held in memory; see hold
	spooled  bodyBound // request body bytes spooled; see holdSpool
	// bodySeed hashes the clients' addresses and credentials for the
	// budgets' shares.
	bodySeed maphash.Seed
	// sessions are the open WebSocket sessions (see join).
	sessionsMu sync.Mutex
	sessions   map[*session]struct{}
	// sessionsClosed: CloseSessions ran; a session that opens after it
	// is closed at once.
	sessionsClosed bool
	lanes          *lanequeue.Table
	metrics        *metrics
	policy         retryPolicy
	log            *slog.Logger
	handler        http.Handler
	// settings are each route's, by name ("" for the default upstream).
	settings map[string]RouteSettings
	// providers are each route's gen_ai.provider.name for its traces
	// ("" when unknown), by name; nil without a Tracer.
	providers map[string]string
	// ops are the operators' changes in force (see operate.go).
	ops operations
	// tiers is what the proxy learned of flex by model; budgets the
	// budgets found spent; ledger keeps spend and holds; runs and
	// spends are the spend by run and lane.
	tiers   tierMemory
	budgets budgetMarks
	ledger  cost.Ledger
	spends  spendTable
	// keeping is the journal's and the joins' (see keepOn).
	keeping keeping
}

// Validate reports the first of cfg's settings the proxy cannot use, as
// a *setting.Error: a negative retry count, the lanes' settings (their
// Validate), an upstream URL, a route name.
func (cfg Config) Validate() error {
	if cfg.MaxRetries < 0 {
		return setting.Bad("proxy", "MaxRetries", fmt.Sprintf("%d is below the minimum 0", cfg.MaxRetries))
	}
	if err := cfg.Lanes.Lane.Validate(); err != nil {
		return err
	}
	if cfg.Upstream != nil {
		if err := CheckUpstream(cfg.Upstream); err != nil {
			return setting.Bad("proxy", "Upstream", err.Error())
		}
	}
	if _, ok := parseJournalMode(cfg.JournalMode); !ok {
		return setting.Bad("proxy", "JournalMode", fmt.Sprintf("%q: use record, replay, strict or off", cfg.JournalMode))
	}
	if m, _ := parseJournalMode(cfg.JournalMode); m != journalOff && cfg.Journal == nil {
		return setting.Bad("proxy", "JournalMode", "a journal mode needs a journal (LLMPROXY_STATE)")
	}
	seen := map[string]bool{}
	for _, r := range cfg.Routes {
		if !ValidRouteName(r.Name) {
			return setting.Bad("proxy", "Routes", fmt.Sprintf("route name %q: use letters, digits, '.', '_' and '-'", r.Name))
		}
		if seen[r.Name] {
			return setting.Bad("proxy", "Routes", fmt.Sprintf("route %q given twice", r.Name))
		}
		seen[r.Name] = true
		if err := CheckUpstream(r.URL); err != nil {
			return setting.Bad("proxy", "Routes", fmt.Sprintf("route %q: %v", r.Name, err))
		}
	}
	return nil
}

// withDefaults is cfg with every unset field at its default. MaxRetries
// has none: zero retries is a setting, as in the environment.
func (cfg Config) withDefaults() Config {
	if cfg.Upstream == nil {
		cfg.Upstream, _ = url.Parse("https://api.openai.com")
	}
	cfg.MaxWait = orDefault(cfg.MaxWait, DefaultMaxWait)
	cfg.MaxRetryAfter = orDefault(cfg.MaxRetryAfter, DefaultMaxRetryAfter)
	cfg.MaxBodyBytes = orDefault(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.MemoryBodyBytes = orDefault(cfg.MemoryBodyBytes, DefaultMemoryBodyBytes)
	cfg.MaxSpoolBytes = orDefault(cfg.MaxSpoolBytes, DefaultMaxSpoolBytes)
	cfg.MaxBufferedBytes = orDefault(cfg.MaxBufferedBytes, DefaultMaxBufferedBytes)
	cfg.BodyTimeout = orDefault(cfg.BodyTimeout, DefaultBodyTimeout)
	cfg.BodyRateGrace = orDefault(cfg.BodyRateGrace, defaultBodyRateGrace)
	if cfg.MinBodyRate == 0 {
		cfg.MinBodyRate = DefaultMinBodyRate
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = os.TempDir()
	}
	if cfg.Transport == nil {
		cfg.Transport = upstream.NewTransport()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	// Every lane state change gets its log line.
	cfg.Lanes.Log = cfg.Logger
	if cfg.Lanes.Lane.Clock == nil {
		cfg.Lanes.Lane.Clock = cfg.Clock
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Registry == nil {
		reg := prometheus.NewRegistry()
		cfg.Registry = reg
		if cfg.Gatherer == nil {
			cfg.Gatherer = reg
		}
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.DefaultGatherer
	}
	return cfg
}

// orDefault is v, or def when v is not positive.
func orDefault[T int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// The defaults of Config's body bounds. The largest body is the Files
// API's largest upload (512 MB); the Batch API takes input files of up to
// 200 MB.
const (
	DefaultMaxBodyBytes    = 512 << 20
	DefaultMemoryBodyBytes = 1 << 20
	DefaultMaxSpoolBytes   = 2 << 30
)

// The defaults of Config's body time bounds. 16 KiB/s is a poor mobile
// link's pace, at which the largest body held in memory (1 MiB) takes a
// minute; a body that takes longer is not a request anyone waits for.
const (
	DefaultBodyTimeout   = 60 * time.Second
	DefaultMinBodyRate   = 16 << 10
	defaultBodyRateGrace = 5 * time.Second
)

// DefaultMaxBufferedBytes is Config.MaxBufferedBytes' default: a quarter
// of a 1 GiB container, room for 10,000 queued requests of 25 KiB.
const DefaultMaxBufferedBytes = 256 << 20

// The defaults of Config's retry bounds.
const (
	DefaultMaxRetries    = 10
	DefaultMaxWait       = 10 * time.Minute
	DefaultMaxRetryAfter = 2 * time.Minute
)

// ValidRouteName reports whether name can be a route prefix: a plain path
// segment of letters, digits, '.', '_' and '-' (no pattern characters).
func ValidRouteName(name string) bool {
	if name == "" || name == "." || name == ".." {
		return false
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// CheckUpstream reports what is wrong with u as an upstream base URL: it
// must be absolute http(s) with a host, and carry no credentials, query or
// fragment.
func CheckUpstream(u *url.URL) error {
	if u == nil {
		return fmt.Errorf("missing URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: scheme must be http or https", u.Redacted())
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", u.Redacted())
	}
	if u.User != nil {
		return fmt.Errorf("%q: credentials in the URL are not supported", u.Redacted())
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: a query or fragment is not supported", u.Redacted())
	}
	return nil
}

// Stop ends the work under way without waiting for it: requests still in
// a queue or waiting for the upstream's headers are answered at once with
// 503 shutting_down (Retry-After 1), answers being streamed are cut, and
// requests that arrive later get the same 503. Call it when a graceful
// shutdown runs out of time, after the listeners stopped accepting; the
// handlers return promptly after it. Safe to call more than once.
func (p *Proxy) Stop() { p.stop() }

// stopping reports whether Stop was called.
func (p *Proxy) stopping() bool { return p.stopped.Err() != nil }

// ServeHTTP handles a client request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.handler.ServeHTTP(w, r) }

// States is every lane's state, as /lanes shows it.
func (p *Proxy) States() []lanequeue.State { return p.lanes.States() }

// UnderWay is the number of requests queued or at the upstream.
func (p *Proxy) UnderWay() int {
	n := 0
	for _, s := range p.lanes.States() {
		n += s.Queued + s.InFlight
	}
	return n
}
