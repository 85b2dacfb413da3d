package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/internal/buildinfo"
	"github.com/llmproxy/llmproxy/internal/setting"
	"github.com/llmproxy/llmproxy/proxy"
)

const envPrefix = "LLMPROXY_"

// config is read from LLMPROXY_* variables. Each field's help tag is what
// `llmproxy -h` prints; its envDefault is the default (also in
// config.example.env and docs/configuration.md).
type config struct {
	Addr                      string        `env:"ADDR" envDefault:"127.0.0.1:8080" help:"proxy listener"`
	AdminAddr                 string        `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9090" help:"admin listener: /healthz /readyz /metrics /lanes /ui /admin/; empty = off"`
	AdminToken                string        `env:"ADMIN_TOKEN" help:"at least 16 characters; set: /metrics /lanes /ui /admin/ need Authorization: Bearer <token> (a browser opens /ui?token=<token> once); /healthz /readyz stay open; unset: they answer only requests to localhost, and take changes only on a loopback ADMIN_ADDR"`
	AdminTokenFile            string        `env:"ADMIN_TOKEN_FILE" help:"a file holding the admin token (a mounted secret), read at start, instead of ADMIN_TOKEN"`
	Upstream                  string        `env:"UPSTREAM" envDefault:"https://api.openai.com" help:"default upstream; the request path is appended"`
	Routes                    string        `env:"ROUTES" envDefault:"anthropic=https://api.anthropic.com" help:"comma list name=url; /name/rest goes to url/rest; empty = no routes"`
	MaxRetries                int           `env:"MAX_RETRIES" envDefault:"10" help:"retries of failures (408, 5xx, connection errors) per request; rate and concurrency 429s absorbed by waiting do not count, the request's deadline (MAX_WAIT) bounds them"`
	MaxWait                   time.Duration `env:"MAX_WAIT" envDefault:"10m" help:"a request's deadline: queue + retries (X-Stainless-Timeout or x-llmproxy-max-wait can shorten it); at least 1s"`
	MaxRetryAfter             time.Duration `env:"MAX_RETRY_AFTER" envDefault:"2m" help:"a longer upstream wait hint is not waited for: the answer goes to the client; at least 1s"`
	MaxQueue                  int           `env:"MAX_QUEUE" envDefault:"10000" help:"waiting requests per lane before new ones get 429"`
	MaxBodyBytes              int64         `env:"MAX_BODY_BYTES" envDefault:"536870912" help:"larger request bodies get 413"`
	MemoryBodyBytes           int64         `env:"MEMORY_BODY_BYTES" envDefault:"1048576" help:"larger request bodies are spooled to a file in LLMPROXY_SPOOL_DIR, not held in memory"`
	SpoolDir                  string        `env:"SPOOL_DIR" help:"where large request bodies are spooled; empty = the system's temporary directory"`
	MaxSpoolBytes             int64         `env:"MAX_SPOOL_BYTES" envDefault:"2147483648" help:"all spooled request bodies at once; past it new requests get 429 queue_full"`
	MaxBufferedBytes          int64         `env:"MAX_BUFFERED_BYTES" envDefault:"268435456" help:"all request bodies held at once (queued, retried, in flight); past it new requests get 429 queue_full"`
	BodyTimeout               time.Duration `env:"BODY_TIMEOUT" envDefault:"60s" help:"a request's whole body must arrive within this, else 400 body_read_error; at least 1s"`
	MinBodyRate               int64         `env:"MIN_BODY_RATE" envDefault:"16384" help:"bytes per second a request's body must average after its first 5s, else 408 body_too_slow; 0 = no such bound"`
	IdleTimeout               time.Duration `env:"IDLE_TIMEOUT" envDefault:"120s" help:"a client's keep-alive connection idle this long is closed (both listeners)"`
	LaneConcurrency           int           `env:"LANE_CONCURRENCY" envDefault:"8" help:"a new pool's concurrency limit, moved into [MIN, MAX]; it grows by half each answer time until the upstream refuses for concurrency"`
	LaneMinConcurrency        int           `env:"LANE_MIN_CONCURRENCY" envDefault:"1" help:"lowest concurrency limit of a lane"`
	LaneMaxConcurrency        int           `env:"LANE_MAX_CONCURRENCY" envDefault:"1024" help:"highest concurrency limit of a lane"`
	MaxLanes                  int           `env:"MAX_LANES" envDefault:"10000" help:"lanes kept; the least recently used goes first"`
	LaneIdleTTL               time.Duration `env:"LANE_IDLE_TTL" envDefault:"10m" help:"a lane idle this long is dropped"`
	ClientRateLimitHdr        string        `env:"CLIENT_RATELIMIT_HEADERS" envDefault:"strip" help:"strip: clients do not see the upstream's x-ratelimit-* headers (their own throttling would slow the run); pass: forward them"`
	RedisURL                  string        `env:"REDIS_URL" help:"redis:// or rediss:// URL: replicas share their lanes' limits through it (unset: this process only)"`
	RedisMode                 string        `env:"REDIS_MODE" envDefault:"auto" help:"with Redis: standalone, cluster (the URL's hosts are seeds), sentinel (they are Sentinels), or auto: sentinel when REDIS_SENTINEL_MASTER is set, else cluster when the server is a cluster node"`
	RedisSentinelMaster       string        `env:"REDIS_SENTINEL_MASTER" help:"with Sentinels: the name they know the primary by"`
	RedisPasswordFile         string        `env:"REDIS_PASSWORD_FILE" help:"a file holding Redis' password (a mounted secret), read at every new connection; replaces the URL's"`
	RedisSentinelPasswordFile string        `env:"REDIS_SENTINEL_PASSWORD_FILE" help:"a file holding the Sentinels' own password, when they ask for one"`
	RedisCA                   string        `env:"REDIS_CA" help:"with rediss://: a PEM file of the certificates the server's must chain to (unset: the system's)"`
	RedisCert                 string        `env:"REDIS_CERT" help:"with rediss://: a PEM client certificate, for a server that asks for one (with REDIS_KEY)"`
	RedisKey                  string        `env:"REDIS_KEY" help:"with rediss://: the client certificate's PEM private key"`
	RedisLeaseTTL             time.Duration `env:"REDIS_LEASE_TTL" envDefault:"15s" help:"with Redis: how long a concurrency slot of a replica that died stays counted; at least 1s"`
	RedisSlow                 time.Duration `env:"REDIS_SLOW" envDefault:"50ms" help:"with Redis: a replica whose recent calls take longer than this (99th percentile) uses its share of the limits locally until Redis is fast again; 0 = never"`
	LogLevel                  string        `env:"LOG_LEVEL" envDefault:"info" help:"debug, info, warn or error"`
	LogFormat                 string        `env:"LOG_FORMAT" envDefault:"text" help:"text or json"`
	GlobalConcurrency         int           `env:"GLOBAL_CONCURRENCY" envDefault:"0" help:"upstream calls in flight over all lanes together, taken as a lane dispatches (a paused or paced lane holds none); 0 = no cap"`
	Pprof                     bool          `env:"PPROF" envDefault:"false" help:"true: the admin listener serves Go's runtime profiles under /debug/pprof/ (behind LLMPROXY_ADMIN_TOKEN; without it, only on a loopback ADMIN_ADDR), mutex and block profiles included; they cost some speed"`
	ShutdownTimeout           time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s" help:"SIGTERM/SIGINT: how long queued and in-flight requests may finish; then (or at a second signal) the rest get 503 shutting_down"`
	Prices                    string        `env:"PRICES" help:"a JSON price table (US dollars per million tokens, by model and tier; see cost/prices.json) that replaces the one built in; answers are priced by it (x-llmproxy-cost-usd) and budgets bounded"`
	State                     string        `env:"STATE" help:"a file (made if missing, mode 0600) that keeps what the lanes learned (without Redis) and the journal across restarts, in an embedded store; one process at a time; empty = none"`
	Journal                   string        `env:"JOURNAL" envDefault:"off" help:"record, replay, strict or off: what the journal does with requests that do not say (x-llmproxy-journal); record keeps complete answers by run (x-llmproxy-run) and occurrence, replay serves them again and records a miss, strict answers a miss 404 journal_miss; needs STATE"`
	JournalTTL                time.Duration `env:"JOURNAL_TTL" envDefault:"720h" help:"how long a recorded answer is served and kept; 0 = for ever"`
	JournalMaxBytes           int64         `env:"JOURNAL_MAX_BYTES" envDefault:"1073741824" help:"the most bytes of recorded answers the state file keeps; past it the oldest go; 0 = no bound"`
	JournalPassGap            time.Duration `env:"JOURNAL_PASS_GAP" envDefault:"30s" help:"how long a run rests, with none of its requests at the proxy, before its next request counts the occurrences of its requests from 1 again (a run whose clients all leave at once starts again at once)"`
	BudgetUSD                 string        `env:"BUDGET_USD" help:"a cap on each API key's spend, in US dollars, through this proxy (shared by the replicas through Redis); at the cap its requests get 429 budget_exhausted; empty = none"`

	upstreamURL *url.URL
	routes      []proxy.Route
	// defaultRoute is LLMPROXY_ROUTE_DEFAULT_*.
	defaultRoute proxy.RouteSettings
	// prices is the price table (PRICES, or the one built in); budget
	// BUDGET_USD.
	prices *cost.Table
	budget cost.Amount
	// laneConcurrencyGiven is LANE_CONCURRENCY as set, when validate moved
	// it into [MIN, MAX]; zero otherwise.
	laneConcurrencyGiven int
}

// loadConfig reads the environment given as a map. The error is one line
// naming the variable and what is wrong.
func loadConfig(environ map[string]string) (config, error) {
	var c config
	opts := env.Options{Prefix: envPrefix, Environment: environ}
	if err := env.ParseWithOptions(&c, opts); err != nil {
		return c, describeEnvError(err)
	}
	// The env package gives a variable set empty its default; for these
	// two, empty is a setting of its own (no admin listener, no routes).
	for name, field := range map[string]*string{"ADMIN_ADDR": &c.AdminAddr, "ROUTES": &c.Routes} {
		if v, set := environ[envPrefix+name]; set && v == "" {
			*field = ""
		}
	}
	if err := c.validate(); err != nil {
		return c, err
	}
	return c, c.parseRouteSettings(environ)
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

// validate checks every setting, first problem first, and fills in what
// is parsed from them (the upstream, the routes, the concurrency start).
func (c *config) validate() error {
	for _, check := range []func() error{c.checkListeners, c.checkUpstreams, c.checkCounts, c.checkDurations, c.checkChoices, c.checkOwned, c.checkCost, c.checkJournal} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// bad is the error for setting LLMPROXY_<name>.
func bad(name, format string, a ...any) error {
	return fmt.Errorf("%s%s: %s", envPrefix, name, fmt.Sprintf(format, a...))
}

// checkListeners checks the listeners' addresses and the admin token.
func (c *config) checkListeners() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return bad("ADDR", "%q is not host:port", c.Addr)
	}
	if c.AdminAddr != "" {
		if _, _, err := net.SplitHostPort(c.AdminAddr); err != nil {
			return bad("ADMIN_ADDR", "%q is not host:port", c.AdminAddr)
		}
	}
	name := "ADMIN_TOKEN"
	if c.AdminTokenFile != "" {
		name = "ADMIN_TOKEN_FILE"
		if c.AdminToken != "" {
			return bad(name, "set this or LLMPROXY_ADMIN_TOKEN, not both")
		}
		tok, err := readTokenFile(c.AdminTokenFile)
		if err != nil {
			return bad(name, "%v", err)
		}
		c.AdminToken = tok
	}
	for _, r := range c.AdminToken {
		// Anything else is mangled on its way through a header or a URL.
		if r <= ' ' || r > '~' {
			return bad(name, "use visible ASCII characters only, no spaces (the value is not shown)")
		}
	}
	if c.AdminToken != "" && len(c.AdminToken) < minAdminToken {
		return bad(name, "too short: use at least %d characters, random ones (openssl rand -hex 32); the value is not shown", minAdminToken)
	}
	return nil
}

// minAdminToken is the shortest admin token taken: the token is the whole
// of the admin listener's guard.
const minAdminToken = 16

// readTokenFile reads a token from path: the file's contents without the
// line end an editor or `echo` leaves. Empty is an error: a secret that
// was not mounted must not turn the token off.
func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4097))
	switch {
	case err != nil:
		return "", err
	case len(b) > 4096:
		return "", fmt.Errorf("%s: larger than 4096 bytes, not a token", path)
	}
	tok := strings.TrimRight(string(b), "\r\n")
	if tok == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return tok, nil
}

// checkUpstreams parses the default upstream and the routes.
func (c *config) checkUpstreams() error {
	u, err := parseUpstream(c.Upstream)
	if err != nil {
		return bad("UPSTREAM", "%v", err)
	}
	c.upstreamURL = u
	if err := c.parseRoutes(); err != nil {
		return bad("ROUTES", "%v", err)
	}
	return nil
}

// checkCounts checks the counts and sizes against their minimums.
func (c *config) checkCounts() error {
	for _, v := range []struct {
		name string
		val  int64
		min  int64
	}{
		{"MAX_QUEUE", int64(c.MaxQueue), 1},
		{"MAX_BODY_BYTES", c.MaxBodyBytes, 1},
		{"MAX_BUFFERED_BYTES", c.MaxBufferedBytes, 1},
		{"MEMORY_BODY_BYTES", c.MemoryBodyBytes, 1},
		{"MAX_SPOOL_BYTES", c.MaxSpoolBytes, 1},
		{"LANE_CONCURRENCY", int64(c.LaneConcurrency), 1},
		{"LANE_MIN_CONCURRENCY", int64(c.LaneMinConcurrency), 1},
		{"LANE_MAX_CONCURRENCY", int64(c.LaneMaxConcurrency), 1},
		{"MAX_LANES", int64(c.MaxLanes), 1},
		{"GLOBAL_CONCURRENCY", int64(c.GlobalConcurrency), 0},
		{"MIN_BODY_RATE", c.MinBodyRate, 0},
	} {
		if v.val < v.min {
			return bad(v.name, "%d is below the minimum %d", v.val, v.min)
		}
	}
	return nil
}

// checkDurations checks the durations against their minimums.
func (c *config) checkDurations() error {
	for _, v := range []struct {
		name string
		val  time.Duration
		min  time.Duration // 0: any positive value
	}{
		// Shorter waits and bounds fail requests before any upstream
		// could answer, and Retry-After hints come in whole seconds.
		{"MAX_WAIT", c.MaxWait, time.Second}, {"MAX_RETRY_AFTER", c.MaxRetryAfter, time.Second},
		{"BODY_TIMEOUT", c.BodyTimeout, time.Second},
		{"IDLE_TIMEOUT", c.IdleTimeout, 0}, {"LANE_IDLE_TTL", c.LaneIdleTTL, 0},
		{"SHUTDOWN_TIMEOUT", c.ShutdownTimeout, 0}, {"REDIS_LEASE_TTL", c.RedisLeaseTTL, 0},
	} {
		switch {
		case v.val <= 0:
			return bad(v.name, "%v must be positive", v.val)
		case v.val < v.min:
			return bad(v.name, "%v is below the minimum %v", v.val, v.min)
		}
	}
	return nil
}

// checkChoices checks the settings that take one of a few words.
func (c *config) checkChoices() error {
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
	return nil
}

// ownedBy maps the package Config fields set from the environment to
// their variables, so that a package's Validate error names the variable.
var ownedBy = map[string]string{
	"proxy.MaxRetries": "MAX_RETRIES", "proxy.Upstream": "UPSTREAM", "proxy.Routes": "ROUTES",
	"lanequeue.Concurrency": "LANE_CONCURRENCY", "lanequeue.MinConcurrency": "LANE_MIN_CONCURRENCY",
	"lanequeue.MaxConcurrency": "LANE_MAX_CONCURRENCY", "lanequeue.MaxQueue": "MAX_QUEUE",
	"redisstate.URL": "REDIS_URL", "redisstate.LeaseTTL": "REDIS_LEASE_TTL", "redisstate.Slow": "REDIS_SLOW",
	"redisstate.Mode": "REDIS_MODE", "redisstate.SentinelMaster": "REDIS_SENTINEL_MASTER",
	"redisstate.PasswordFile": "REDIS_PASSWORD_FILE", "redisstate.SentinelPasswordFile": "REDIS_SENTINEL_PASSWORD_FILE",
	"redisstate.CAFile": "REDIS_CA", "redisstate.CertFile": "REDIS_CERT", "redisstate.KeyFile": "REDIS_KEY",
}

// checkOwned asks each package that owns settings whether it can use
// them (their checks are the package's, not repeated here), and moves the
// lanes' start concurrency into its range as the lanes will.
func (c *config) checkOwned() error {
	if err := proxyConfig(*c, laneConfig(*c), nil, nil).Validate(); err != nil {
		return named(err)
	}
	if err := storeConfig(*c).Validate(); err != nil {
		return named(err)
	}
	// A ceiling below the default start (MAX=4) means "at most 4", not a
	// second variable to change: the start moves into the range.
	if v := laneConfig(*c).Lane.WithDefaults().Concurrency; v != c.LaneConcurrency {
		c.laneConcurrencyGiven, c.LaneConcurrency = c.LaneConcurrency, v
	}
	return nil
}

// named is a package's *setting.Error with its field, and the fields its
// problem names with their values (Field=value), as LLMPROXY_* variables;
// other words, quoted names among them, stay as they are.
func named(err error) error {
	var se *setting.Error
	if !errors.As(err, &se) || ownedBy[se.Pkg+"."+se.Field] == "" {
		return err
	}
	problem := fieldName.ReplaceAllStringFunc(se.Problem, func(f string) string {
		if v := ownedBy[se.Pkg+"."+strings.TrimSuffix(f, "=")]; v != "" {
			return envPrefix + v + "="
		}
		return f
	})
	return bad(ownedBy[se.Pkg+"."+se.Field], "%s", problem)
}

// fieldName matches what may be a Go field name given with its value.
var fieldName = regexp.MustCompile(`\b[A-Z][A-Za-z]+=`)

// apiVersionSegments start the paths of the APIs the default upstream
// serves (/v1/chat/completions, /v1/messages, /v1beta/models/...): a route
// of that name would take all of their traffic away from it.
var apiVersionSegments = []string{"v1", "v1beta", "v2", "v3"}

func (c *config) parseRoutes() error {
	c.routes = nil
	for _, item := range strings.Split(c.Routes, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, raw, ok := strings.Cut(item, "=")
		name = strings.Trim(strings.TrimSpace(name), "/")
		if !ok || !proxy.ValidRouteName(name) {
			return fmt.Errorf("%q is not name=url with a name of letters, digits, '.', '_' and '-'", shownURL(item))
		}
		for _, seg := range apiVersionSegments {
			if strings.EqualFold(name, seg) {
				return fmt.Errorf("route %q would take every /%s/... request from LLMPROXY_UPSTREAM, whose API paths start with it; name the route after its provider", name, name)
			}
		}
		ru, err := parseUpstream(strings.TrimSpace(raw))
		if err != nil {
			return fmt.Errorf("route %q: %v", name, err)
		}
		c.routes = append(c.routes, proxy.Route{Name: name, URL: ru})
	}
	// The rest (a route given twice) is the proxy's to say: checkOwned.
	return nil
}

// parseUpstream parses an upstream base URL. Its errors show the URL
// without what may hold a secret (userinfo, query, fragment): a provider
// key in ?key= must not reach a start-up log.
func parseUpstream(raw string) (*url.URL, error) {
	shown := shownURL(raw)
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%q is not a URL", shown)
	case u.User != nil:
		return nil, fmt.Errorf("%q: credentials in the URL are not supported (clients send their own keys)", shown)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("%q: a query or fragment is not supported", shown)
	}
	// Nothing secret is left in u, so CheckUpstream may quote it.
	return u, proxy.CheckUpstream(u)
}

// shownURL is raw as an error may show it: the query and fragment cut to
// "?…" and whatever precedes an '@' (userinfo) to "…@". It works on the
// raw string because it must also serve URLs that do not parse.
func shownURL(raw string) string {
	cut := ""
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw, cut = raw[:i], "?…"
	}
	if at := strings.LastIndexByte(raw, '@'); at >= 0 {
		from := 0
		if i := strings.Index(raw, "//"); i >= 0 && i < at {
			from = i + 2
		}
		raw = raw[:from] + "…" + raw[at:]
	}
	return raw + cut
}

// logNotes logs, once there is a logger, what the configuration accepted
// but its author may not have meant.
func (c config) logNotes(log *slog.Logger, environ map[string]string) {
	for _, u := range unknownVariables(environ) {
		// The name only: a misspelled LLMPROXY_ADMIN_TOKEN holds a secret.
		args := []any{"name", u.name}
		if u.closest != "" {
			args = append(args, "did_you_mean", u.closest)
		}
		log.Warn("unknown variable ignored", args...)
	}
	if c.laneConcurrencyGiven != 0 {
		log.Info("LLMPROXY_LANE_CONCURRENCY moved into [LLMPROXY_LANE_MIN_CONCURRENCY, LLMPROXY_LANE_MAX_CONCURRENCY]",
			"from", c.laneConcurrencyGiven, "to", c.LaneConcurrency)
	}
}

// unknownVariable is an LLMPROXY_* variable nothing reads, with the known
// name it most likely misspells ("" when none is close).
type unknownVariable struct{ name, closest string }

// unknownVariables lists, sorted, the LLMPROXY_* variables in environ that
// config does not read. The test suite's own (LLMPROXY_E2E_*,
// LLMPROXY_ARTIFACTS, LLMPROXY_CHROMIUM) are left out: CI exports them
// where it also starts the binary.
func unknownVariables(environ map[string]string) []unknownVariable {
	known := map[string]bool{}
	t := reflect.TypeOf(config{})
	for i := 0; i < t.NumField(); i++ {
		if name := t.Field(i).Tag.Get("env"); name != "" {
			known[envPrefix+name] = true
		}
	}
	var out []unknownVariable
	for name := range environ {
		if !strings.HasPrefix(name, envPrefix) || known[name] || strings.HasPrefix(name, routePrefix) ||
			strings.HasPrefix(name, envPrefix+"E2E_") || name == envPrefix+"ARTIFACTS" || name == envPrefix+"CHROMIUM" {
			continue
		}
		u := unknownVariable{name: name}
		// A slip or two, more in a long name; a tie goes to the first
		// name in order, so the suggestion does not change between runs.
		best := max(2, (len(name)-len(envPrefix))/4) + 1
		for k := range known {
			if d := editDistance(name, k); d < best || d == best && k < u.closest {
				best, u.closest = d, k
			}
		}
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// printUsage writes `llmproxy -h`: every variable with its default.
func printUsage(w io.Writer) {
	fmt.Fprintf(w, `llmproxy: an HTTP reverse proxy that queues LLM API requests per lane,
absorbs upstream 429s and paces itself under the learned rate limits.
This is llmproxy %s.

Usage:
  llmproxy              run the proxy (configured by the environment)
  llmproxy version      the build: module version, commit and its time, Go
  llmproxy healthcheck  exit 0 when the admin listener answers /healthz
  llmproxy status [-w] [-interval 2s] [-admin ADDR]
                        the lane table of a running proxy (from its admin
                        address, sending LLMPROXY_ADMIN_TOKEN when set); -w
                        refreshes it in place; exit 1 when the proxy cannot
                        be reached
  llmproxy limits [-admin ADDR] [ROUTE [reset | SETTING=VALUE ...]]
                        a running proxy's route limits, or change them
                        (rpm=600 concurrency=4 min_gap=200ms mode=ceiling;
                        =none clears one) until it stops
  llmproxy hold|release|clear [-admin ADDR] route ROUTE | lane LANE
                        hold a route's or a lane's requests (they wait,
                        none is refused), let them go, or forget what the
                        lanes learned; ROUTE default is LLMPROXY_UPSTREAM
  llmproxy journal ls | show [RUN] | export [RUN] | rm RUN | rm -all
                        the journal in LLMPROXY_STATE: its runs, an entry a
                        line, its entries as JSON lines (requests and
                        answers), or remove some; while a proxy holds the
                        file, through its admin address
  llmproxy -h           this help

Point a client at it: OPENAI_BASE_URL=http://127.0.0.1:8080/v1
                      ANTHROPIC_BASE_URL=http://127.0.0.1:8080/anthropic

Environment (default in brackets; other LLMPROXY_* names get a warning):
`, buildinfo.Read().Short())
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
	printRouteUsage(w)
	printTraceUsage(w)
}

// traceVariables are the OpenTelemetry variables -h, docs/traces.md and
// config.example.env name, with their defaults and what they do.
var traceVariables = []struct{ name, def, help string }{
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", "set: traces go there over OTLP (http://collector:4318; /v1/traces is added); unset: no traces"},
	{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "", "the same for traces alone, used as it is"},
	{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "or grpc (then the endpoint is the gRPC port, http://collector:4317)"},
	{"OTEL_SERVICE_NAME", "llmproxy", "the service the spans are of"},
	{"OTEL_TRACES_SAMPLER", "parentbased_always_on", "always_on, always_off, traceidratio, or their parentbased_ forms (ratio: OTEL_TRACES_SAMPLER_ARG)"},
	{"OTEL_SDK_DISABLED", "", "true: no traces whatever else is set, as OTEL_TRACES_EXPORTER=none"},
}

// printTraceUsage writes -h's part on traces.
func printTraceUsage(w io.Writer) {
	fmt.Fprintf(w, `
Traces (OpenTelemetry: a span per request, per wait in its lane and per
upstream attempt; the SDK reads the other standard OTEL_* variables:
headers, TLS, timeouts, compression, OTEL_BSP_*, OTEL_RESOURCE_ATTRIBUTES):
`)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	for _, v := range traceVariables {
		fmt.Fprintf(tw, "  %s	[%s]	%s\n", v.name, v.def, v.help)
	}
	tw.Flush()
}

// checkJournal checks the journal's settings: a mode it knows, that
// needs STATE when not off.
func (c *config) checkJournal() error {
	switch strings.ToLower(strings.TrimSpace(c.Journal)) {
	case "", "off":
	case "record", "replay", "strict":
		if c.State == "" {
			return bad("JOURNAL", "%s needs LLMPROXY_STATE, the file that keeps the journal", c.Journal)
		}
	default:
		return bad("JOURNAL", "%q: use record, replay, strict or off", c.Journal)
	}
	switch {
	case c.JournalTTL < 0:
		return bad("JOURNAL_TTL", "%v is below 0", c.JournalTTL)
	case c.JournalMaxBytes < 0:
		return bad("JOURNAL_MAX_BYTES", "%d is below 0", c.JournalMaxBytes)
	case c.JournalPassGap <= 0:
		return bad("JOURNAL_PASS_GAP", "%v is not above 0", c.JournalPassGap)
	}
	return nil
}

// checkCost reads the price table and the keys' budget.
func (c *config) checkCost() error {
	t, err := cost.Load(c.Prices)
	if err != nil {
		return bad("PRICES", "%v", err)
	}
	c.prices = t
	if c.BudgetUSD != "" {
		a, err := cost.ParseDollars(c.BudgetUSD)
		if err != nil || a <= 0 {
			return bad("BUDGET_USD", "%q is not a number of dollars above 0", c.BudgetUSD)
		}
		c.budget = a
	}
	return nil
}
