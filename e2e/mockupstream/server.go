package mockupstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config shapes the fake upstream. The zero value is an upstream with no
// limits that answers at once.
type Config struct {
	// RPM refills each key's request bucket, in requests per minute.
	// 0 = unlimited.
	RPM int
	// RequestBurst is the request bucket's capacity, reported as
	// x-ratelimit-limit-requests unless QuantizedHeaders.
	// 0 = max(1, RPM/60), one second's worth.
	RequestBurst int
	// TPM refills each key's token bucket, in tokens per minute. 0 = unlimited.
	TPM int64
	// TokenBurst is the token bucket's capacity. 0 = max(1, TPM/60).
	TokenBurst int64
	// QuantizedHeaders makes the limit headers state the per-minute figures,
	// as OpenAI does for limits it enforces in shorter slices: RPM as
	// x-ratelimit-limit-requests (anthropic-ratelimit-requests-limit) and TPM
	// as the token limits. What is enforced does not change: the buckets
	// still hold RequestBurst and TokenBurst, one second's worth by default,
	// and remaining and reset still describe them. A 1,200 RPM key thus says
	// "limit 1200" but refuses the 21st request of a burst. 429 bodies and
	// Retry-After are unchanged.
	QuantizedHeaders bool
	// Latency is how long each admitted request takes before it answers.
	Latency time.Duration
	// NoHeaders is NoLimitHeaders and NoRetryAfter together: no rate-limit
	// headers, no Retry-After or retry-after-ms. The try-again hint stays in
	// refusal bodies unless NoHint.
	NoHeaders bool
	// NoLimitHeaders sends no x-ratelimit-* or anthropic-ratelimit-*
	// headers on any answer. Retry-After and bodies are unchanged.
	NoLimitHeaders bool
	// NoRetryAfter sends no Retry-After and no retry-after-ms on any 429
	// (the buckets', the concurrency cap's and injected ones). Limit
	// headers and bodies are unchanged.
	NoRetryAfter bool
	// RetryAfterSeconds sends Retry-After alone, in whole seconds rounded
	// up, as most servers do: no retry-after-ms.
	RetryAfterSeconds bool
	// NoHint leaves the wait out of every 429 body that names one ("Please
	// try again in …"): the buckets', the concurrency cap's and injected
	// ones. Headers are unchanged.
	NoHint bool
	// ConcurrencyUnnamed makes the concurrency cap's refusal read like a
	// generic request-rate refusal ("Rate limit reached for requests."),
	// with no word that names concurrency or parallel requests. Its status,
	// headers and hint are unchanged.
	ConcurrencyUnnamed bool
	// HeaderForm picks the names and formats of the rate-limit headers:
	// "" = by path (OpenAI's x-ratelimit-* everywhere but /v1/messages,
	// which gets Anthropic's anthropic-ratelimit-*); "openai" or
	// "anthropic" forces that form on every path; "ietf" sends the IETF
	// draft's RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset
	// (seconds to full, rounded up) and RateLimit-Policy (limit;w=span)
	// for the request limit, as Kong does. Bodies keep the path's
	// dialect. Other values panic in New.
	HeaderForm string
	// RefusalStatus is how the buckets and the concurrency cap refuse:
	// 0 or 429 = the provider's 429 described above; 503 = the way nginx's
	// limit_req and limit_conn refuse by default, a 503 with nginx's HTML
	// error page and no rate-limit headers, Retry-After, hint or words,
	// whatever the other switches say. A request larger than the token
	// bucket still gets its 429 "Request too large" (no limiter in front of
	// an upstream could know it), and hard-quota and injected failures are
	// unchanged. Other values panic in New.
	RefusalStatus int
	// HardQuotaKeys always get a non-retryable quota 429: OpenAI
	// insufficient_quota, or on /v1/messages Anthropic's spend-cap
	// rate_limit_error (details.error_code enforced_spend_limit_reached).
	// Neither carries a retry-after.
	HardQuotaKeys []string
	// QuotaForm is how HardQuotaKeys' quota answers read, a switch of its
	// own: "" = by path, as above; "gemini-day" = Gemini's 429
	// RESOURCE_EXHAUSTED whose QuotaFailure names the day's quota
	// (GenerateRequestsPerDayPerProjectPerModel-FreeTier), with a RetryInfo
	// of 60s that is not its renewal, and no Retry-After; "groq-day" =
	// Groq's 429 "on requests per day (RPD)" with the day's
	// x-ratelimit-*-requests headers (remaining 0, reset at the renewal)
	// and Retry-After in seconds; "apim" = Azure API Management's 403
	// {"statusCode":403,"message":"Out of call volume quota. Quota will be
	// replenished in hh:mm:ss."} with Retry-After in seconds. The waits
	// the last two state run to QuotaUntil (a day when it is zero). Other
	// values panic in New.
	QuotaForm string
	// QuotaUntil is when HardQuotaKeys' quota renews, on Now: from then on
	// they are served as any key is. The zero time: never.
	QuotaUntil time.Time
	// MaxInFlight caps each key's concurrent requests, counted from admission
	// to the end of the response. Requests over it get a 429 that mentions
	// concurrency, with Retry-After 1. 0 = unlimited.
	MaxInFlight int
	// CompletionTokens is the completion size reported in usage, capped by
	// the request's max tokens. 0 = 8.
	CompletionTokens int
	// StreamChunks is the number of content chunks in a streamed answer
	// (and of "tok N " pieces in any answer). 0 = 5.
	StreamChunks int
	// ChunkDelay is the pause between streamed content chunks.
	ChunkDelay time.Duration
	// StreamHold, if non-nil, stops every stream after its first content
	// chunk until the channel is closed, the client goes away or the server
	// is closed.
	StreamHold <-chan struct{}
	// Now is the clock the buckets refill from. nil = time.Now.
	Now func() time.Time
	// ModelLoad, when positive, makes the server a local model server
	// that holds one model at a time (Ollama, LM Studio, a single-GPU
	// vLLM): admitted requests wait in one line in arrival order; the
	// head is served when its model (the body's "model"; "" is a model
	// too) is loaded and a parallel place is free; a head for another
	// model waits until nothing is being served, then its model loads,
	// which takes ModelLoad (the first load too), and then it is served.
	// Latency runs once served. Requests behind the head wait, whatever
	// model they want, as Ollama's scheduler makes them wait. Waiting is
	// never refused: 429s come only from the other limits. ModelStats
	// tells the loads, swaps, most models in flight and arrival times.
	ModelLoad time.Duration
	// LocalParallel is how many requests of the loaded model are served
	// at once (OLLAMA_NUM_PARALLEL); 0 = any number. Requests over it
	// wait in the line. Only with ModelLoad.
	LocalParallel int

	// The shape of the limits (see the package doc, Shapes). Each is a
	// switch of its own, independent of the others and of what refusals
	// say.

	// Window, when positive, makes RPM and TPM fixed windows of this
	// length instead of token buckets: RPM×Window/60 requests and
	// TPM×Window/60 tokens a window (RequestBurst and TokenBurst, when
	// set, instead), the count starting again at each boundary. Resets and
	// waits point at the boundary.
	Window time.Duration
	// WindowAligned starts windows at the multiples of Window on the
	// clock (Kong's rate limiting); otherwise a window starts with the
	// first request after the last one ended (a Redis INCR + EXPIRE
	// limiter).
	WindowAligned bool
	// CountRefused counts refused requests against the limits too, as
	// Azure OpenAI and Kong's sliding window do: a refusal takes its
	// request (and its tokens) from the bucket, which may go below
	// empty, or from the window. A client that keeps knocking stays
	// refused.
	CountRefused bool
	// PerModel gives each (key, model) limits of its own, as OpenAI and
	// Anthropic count them; otherwise a key's limits are one, shared by
	// every model it calls (a gateway's virtual key, a model family with
	// a shared limit). MaxInFlight follows the same choice.
	PerModel bool
	// ModelRPM, with PerModel, gives the models it names limits of other
	// sizes than RPM: limits of their own that fill at different rates.
	ModelRPM map[string]int
	// ResetRoundDown states Anthropic's RFC 3339 resets rounded down to
	// the whole second instead of up: a reset up to a second in the past.
	ResetRoundDown bool
	// ClockAhead is how far the upstream's clock is ahead of the caller's
	// (negative: behind): every absolute time it states (Anthropic's
	// resets) is off by it. What it enforces is not.
	ClockAhead time.Duration
	// LatencyJitter adds a random wait in [0, LatencyJitter) to each
	// answer's Latency, drawn from Seed: answer times that vary.
	LatencyJitter time.Duration
	// ArrivalJitter holds each request a random wait in [0,
	// ArrivalJitter), drawn from Seed, before its limits count it: requests
	// sent in one order are counted in another, as a network and a loaded
	// machine reorder them.
	ArrivalJitter time.Duration
	// Seed seeds LatencyJitter's and ArrivalJitter's draws; 0 = 1.
	Seed uint64
	// HintForm is how a refusal's body names its wait (unless NoHint):
	// "" = OpenAI's "Please try again in 1.5s."; "azure" = Azure
	// OpenAI's "Please retry after N seconds." (whole seconds, rounded
	// up); "gemini" = Gemini's error body, status RESOURCE_EXHAUSTED,
	// with a google.rpc.RetryInfo detail whose retryDelay is whole
	// seconds, rounded up ("7s"). Other values panic in New.
	HintForm string

	// Flex processing (see the package doc, Flex processing and the
	// ledger). A request asks for it with a top-level "service_tier":
	// "flex" on /v1/chat/completions or /v1/responses.

	// FlexRefuseShare is the share, from 0 to 1, of flex requests refused
	// with a 429 "Resource Unavailable" (code resource_unavailable),
	// drawn per request from Seed. The refusal comes before admission:
	// the key's limits never see it, and it carries no rate-limit
	// headers and no Retry-After. Values outside [0, 1] panic in New.
	FlexRefuseShare float64
	// FlexSlowdown multiplies a flex answer's wait before it starts
	// (Latency and its LatencyJitter draw). 0 or 1 = as fast as standard;
	// negative values panic in New.
	FlexSlowdown float64
	// FlexModels are the models that offer flex; a flex request for
	// another gets a 400 invalid_request_error (param service_tier, code
	// unsupported_value) before admission. nil = every model offers flex.
	FlexModels []string
	// Prices are what the ledger bills, by tier: "standard" and "flex".
	// A missing "flex" is half of "standard", OpenAI's flex (Batch)
	// price; a missing "standard" is free. nil = the ledger counts
	// requests and tokens but no cost.
	Prices map[string]TierPrice
}

// Stats is a snapshot of what the server has seen.
type Stats struct {
	// Requests counts requests that reached admission: a known endpoint, an
	// API key and a well-formed JSON body. The other totals are subsets.
	Requests int64
	// OK counts admitted requests (answered, or being answered, with 200).
	OK int64
	// RateLimited counts every refusal of the buckets, the concurrency limit
	// and requests larger than the token bucket, whatever status it was sent
	// with (429, or 503 under RefusalStatus). Not hard-quota or injected
	// failures.
	RateLimited int64
	// HardQuota counts 429s sent to HardQuotaKeys.
	HardQuota int64
	// Injected counts responses scripted with InjectFailures.
	Injected int64
	// MaxInFlightSeen is the peak of admitted requests in flight, all keys
	// together.
	MaxInFlightSeen int64
	// ByKey holds per-key counts, by raw API key.
	ByKey map[string]KeyStats
	// AdmittedAt and RefusedAt hold when the first maxEventTimes
	// admissions (OK) and refusals (RateLimited) came, in order:
	// benchmarks show the pace the upstream saw and when its limits bit.
	AdmittedAt, RefusedAt []time.Time
}

// maxEventTimes bounds Stats.AdmittedAt and RefusedAt.
const maxEventTimes = 10000

// KeyStats is the part of Stats about one API key.
type KeyStats struct {
	Requests, OK, RateLimited int64
	// MaxInFlightSeen is the peak of this key's admitted requests in flight.
	MaxInFlightSeen int64
}

// Server is a running fake upstream. Its methods are safe for concurrent use.
type Server struct {
	cfg       Config
	now       func() time.Time
	ts        *httptest.Server // nil for an in-process server
	done      chan struct{}    // closed by Close, to end waits early
	closeOnce sync.Once
	nextID    atomic.Int64
	hardQuota map[string]bool
	handler   http.Handler // nil: the mock's own (NewInProcessHandler)

	// live guards closed; handlers counts the handlers Transport started.
	live     sync.Mutex
	closed   bool
	handlers sync.WaitGroup

	models *models // nil unless Config.ModelLoad > 0

	mu         sync.Mutex
	keys       map[string]*keyState   // by API key
	limits     map[string]*limitState // by limitKey
	totals     Stats                  // ByKey unused; built by Stats
	inFlight   int64
	retryAfter time.Duration
	jitter     *rand.Rand
	flexDraw   *rand.Rand // FlexRefuseShare's draws
	ledger     book
}

// keyState is everything tracked per API key; Server.mu guards it.
type keyState struct {
	inFlight int64
	injected []int // statuses still to send, in order
	stats    KeyStats
}

// limitState is one limit's count: a key's, or a key and model's
// (Config.PerModel). Server.mu guards it.
type limitState struct {
	requests limiter // nil = unlimited
	tokens   limiter // nil = unlimited
	inFlight int64
}

// New starts a Server on a free port of 127.0.0.1. Close it when done.
func New(cfg Config) *Server {
	s := newServer(cfg)
	s.ts = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	return s
}

// newServer is a Server that does not listen yet.
func newServer(cfg Config) *Server {
	switch cfg.HeaderForm {
	case "", "openai", "anthropic", "ietf":
	default:
		panic(fmt.Sprintf("mockupstream: unknown HeaderForm %q", cfg.HeaderForm))
	}
	switch cfg.RefusalStatus {
	case 0, http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		panic(fmt.Sprintf("mockupstream: unsupported RefusalStatus %d", cfg.RefusalStatus))
	}
	switch cfg.HintForm {
	case "", "azure", "gemini":
	default:
		panic(fmt.Sprintf("mockupstream: unknown HintForm %q", cfg.HintForm))
	}
	switch cfg.QuotaForm {
	case "", "gemini-day", "groq-day", "apim":
	default:
		panic(fmt.Sprintf("mockupstream: unknown QuotaForm %q", cfg.QuotaForm))
	}
	if cfg.FlexRefuseShare < 0 || cfg.FlexRefuseShare > 1 || cfg.FlexSlowdown < 0 {
		panic(fmt.Sprintf("mockupstream: FlexRefuseShare %v or FlexSlowdown %v out of range",
			cfg.FlexRefuseShare, cfg.FlexSlowdown))
	}
	if cfg.CompletionTokens <= 0 {
		cfg.CompletionTokens = 8
	}
	if cfg.StreamChunks <= 0 {
		cfg.StreamChunks = 5
	}
	s := &Server{
		cfg:       cfg,
		now:       cfg.Now,
		done:      make(chan struct{}),
		hardQuota: make(map[string]bool),
		keys:      make(map[string]*keyState),
		limits:    make(map[string]*limitState),
		jitter:    rand.New(rand.NewPCG(max(cfg.Seed, 1), 0)),
		flexDraw:  rand.New(rand.NewPCG(max(cfg.Seed, 1), 1)),
		ledger:    book{byKey: make(map[string]*Ledger)},
	}
	if s.now == nil {
		s.now = time.Now
	}
	if cfg.ModelLoad > 0 {
		s.models = newModels(cfg, s.done)
	}
	for _, k := range cfg.HardQuotaKeys {
		s.hardQuota[k] = true
	}
	return s
}

// URL is the server's base URL, such as http://127.0.0.1:41234, without /v1.
// An in-process server's is InProcessURL, where nothing listens.
func (s *Server) URL() string {
	if s.ts == nil {
		return InProcessURL
	}
	return s.ts.URL
}

// Close ends held and delayed responses, then shuts the server down and
// waits for its handlers to return, those Transport started included.
// Responses that Transport returned and whose handlers ended are still
// delivered to whoever reads them.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.done) })
	s.live.Lock()
	s.closed = true
	s.live.Unlock()
	if s.ts != nil {
		s.ts.Close()
	}
	s.handlers.Wait()
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.totals
	st.AdmittedAt, st.RefusedAt = slices.Clone(st.AdmittedAt), slices.Clone(st.RefusedAt)
	st.ByKey = make(map[string]KeyStats, len(s.keys))
	for k, ks := range s.keys {
		st.ByKey[k] = ks.stats
	}
	return st
}

// ModelStats is what the local model server saw; zero unless
// Config.ModelLoad is set.
func (s *Server) ModelStats() ModelStats {
	if s.models == nil {
		return ModelStats{}
	}
	return s.models.stats()
}

// InjectFailures makes the next len(statuses) requests with key fail with
// these statuses, in order, before hard-quota, concurrency or bucket checks
// and without touching the buckets. 500, 502, 503, 504, 529 and 408 get the
// provider's error body for that status; 429 gets a rate_limit_exceeded
// (Anthropic: rate_limit_error) body with Retry-After 1 (or SetRetryAfter's
// value) unless NoHeaders or NoRetryAfter, and its body's hint unless
// NoHint. Injected responses carry no rate-limit headers.
// Calls append to the script.
func (s *Server) InjectFailures(key string, statuses ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keyState(key)
	ks.injected = append(ks.injected, statuses...)
}

// SetRetryAfter makes every 429 that advertises a wait advertise d instead:
// Retry-After in whole seconds and retry-after-ms, both rounded up.
// 0 restores the computed waits. It does not change the buckets.
func (s *Server) SetRetryAfter(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retryAfter = d
}

// keyState returns key's state, creating it. Requires s.mu held.
func (s *Server) keyState(key string) *keyState {
	ks, ok := s.keys[key]
	if !ok {
		ks = &keyState{}
		s.keys[key] = ks
	}
	return ks
}

// limitKey names the limit a request of key for model draws on.
func (s *Server) limitKey(key, model string) string {
	if s.cfg.PerModel {
		return key + "\x00" + model
	}
	return key
}

// limitState returns the state of the limit lk, for model, creating it
// full. Requires s.mu held.
func (s *Server) limitState(lk, model string, now time.Time) *limitState {
	ls, ok := s.limits[lk]
	if !ok {
		rpm := s.cfg.RPM
		if r, ok := s.cfg.ModelRPM[model]; ok && s.cfg.PerModel {
			rpm = r
		}
		ls = &limitState{
			requests: newLimiter(s.cfg, int64(rpm), int64(s.cfg.RequestBurst), now),
			tokens:   newLimiter(s.cfg, s.cfg.TPM, s.cfg.TokenBurst, now),
		}
		s.limits[lk] = ls
	}
	return ls
}

// verdict is what admission decided for a request.
type verdict int

const (
	admitted verdict = iota
	injectedFailure
	overHardQuota
	overConcurrency
	rateLimited
	tooLarge // needs more tokens than the token bucket can ever hold
)

// admission is a verdict with what the response needs to report it.
type admission struct {
	verdict   verdict
	status    int           // injectedFailure: the status to send
	dimension string        // rateLimited, tooLarge: "requests" or "tokens"
	limit     int64         // rateLimited, tooLarge: the dimension's capacity
	remaining int64         // rateLimited: whole units left in it
	wait      time.Duration // 429s: what to advertise in Retry-After; 0 = none
	levels    levels        // rate-limit headers; empty when none apply
}

// levels is the state of a key's buckets as the rate-limit headers report it.
type levels struct {
	at       time.Time
	requests *level // nil = unlimited or not reported
	tokens   *level
}

type level struct {
	limit, remaining int64
	untilFull        time.Duration
	span             time.Duration // the window the limit counts over
}

// levelsOf is what the headers report about ls's limits at now.
func (s *Server) levelsOf(ls *limitState, now time.Time) levels {
	return levels{
		at:       now,
		requests: s.levelOf(ls.requests, int64(s.cfg.RPM), now),
		tokens:   s.levelOf(ls.tokens, s.cfg.TPM, now),
	}
}

// levelOf reports l. Its limit is l's size, or under QuantizedHeaders the
// per-minute figure, which the limit never holds at once.
func (s *Server) levelOf(l limiter, perMinute int64, now time.Time) *level {
	if l == nil {
		return nil
	}
	limit, span := int64(l.size()), l.span()
	if s.cfg.QuantizedHeaders {
		limit, span = perMinute, time.Minute
	}
	return &level{limit: limit, remaining: l.remaining(), untilFull: l.untilFull(now), span: span}
}

// admit decides, atomically for key and model, whether a request costing
// cost tokens runs now, and counts it. An admitted request holds an
// in-flight slot until release.
func (s *Server) admit(key, model string, cost int64) admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	ks := s.keyState(key)
	s.totals.Requests++
	ks.stats.Requests++

	if len(ks.injected) > 0 {
		a := admission{verdict: injectedFailure, status: ks.injected[0]}
		ks.injected = ks.injected[1:]
		if a.status == http.StatusTooManyRequests {
			a.wait = s.advertised(time.Second)
		}
		s.totals.Injected++
		return a
	}
	if s.hardQuota[key] && (s.cfg.QuotaUntil.IsZero() || now.Before(s.cfg.QuotaUntil)) {
		s.totals.HardQuota++
		return s.quotaSpent(now)
	}

	ls := s.limitState(s.limitKey(key, model), model, now)
	for _, l := range []limiter{ls.requests, ls.tokens} {
		if l != nil {
			l.advance(now)
		}
	}
	// count counts a refused request against the limits, when they count
	// refusals.
	count := func() {
		if s.cfg.CountRefused {
			take(ls.requests, 1, now)
			take(ls.tokens, float64(cost), now)
		}
	}
	reject := func(a admission) admission {
		a.levels = s.levelsOf(ls, now)
		s.totals.RateLimited++
		ks.stats.RateLimited++
		if len(s.totals.RefusedAt) < maxEventTimes {
			s.totals.RefusedAt = append(s.totals.RefusedAt, now)
		}
		return a
	}
	if s.cfg.MaxInFlight > 0 && ls.inFlight >= int64(s.cfg.MaxInFlight) {
		count()
		return reject(admission{verdict: overConcurrency, wait: s.advertised(time.Second)})
	}
	if ls.tokens != nil && float64(cost) > ls.tokens.size() {
		return reject(admission{verdict: tooLarge, dimension: "tokens", limit: int64(ls.tokens.size())})
	}
	reqWait, tokWait := waitFor(ls.requests, 1, now), waitFor(ls.tokens, float64(cost), now)
	if reqWait > 0 || tokWait > 0 {
		// A refusal that counts is in the wait it advertises.
		count()
		reqWait, tokWait = waitFor(ls.requests, 1, now), waitFor(ls.tokens, float64(cost), now)
	}
	switch {
	case reqWait > 0 && reqWait >= tokWait:
		return reject(admission{verdict: rateLimited, dimension: "requests", wait: s.advertised(reqWait),
			limit: int64(ls.requests.size()), remaining: ls.requests.remaining()})
	case tokWait > 0:
		return reject(admission{verdict: rateLimited, dimension: "tokens", wait: s.advertised(tokWait),
			limit: int64(ls.tokens.size()), remaining: ls.tokens.remaining()})
	}

	take(ls.requests, 1, now)
	take(ls.tokens, float64(cost), now)
	ls.inFlight++
	ks.inFlight++
	s.inFlight++
	ks.stats.MaxInFlightSeen = max(ks.stats.MaxInFlightSeen, ks.inFlight)
	s.totals.MaxInFlightSeen = max(s.totals.MaxInFlightSeen, s.inFlight)
	s.totals.OK++
	ks.stats.OK++
	if len(s.totals.AdmittedAt) < maxEventTimes {
		s.totals.AdmittedAt = append(s.totals.AdmittedAt, now)
	}
	return admission{verdict: admitted, levels: s.levelsOf(ls, now)}
}

// quotaDayLimit is the day's requests the groq-day form states.
const quotaDayLimit = 1000

// quotaSpent is the admission of a request of a key whose quota is spent
// (HardQuotaKeys), at now: the forms that state their renewal wait until
// QuotaUntil, or a day.
func (s *Server) quotaSpent(now time.Time) admission {
	a := admission{verdict: overHardQuota}
	if s.cfg.QuotaForm != "groq-day" && s.cfg.QuotaForm != "apim" {
		return a
	}
	a.wait = 24 * time.Hour
	if !s.cfg.QuotaUntil.IsZero() {
		a.wait = s.cfg.QuotaUntil.Sub(now)
	}
	if s.cfg.QuotaForm == "groq-day" {
		a.dimension, a.limit = "requests", quotaDayLimit
		a.levels = levels{at: now, requests: &level{limit: quotaDayLimit, untilFull: a.wait, span: 24 * time.Hour}}
	}
	return a
}

// waitFor is l's wait for n units, 0 for an unlimited l.
func waitFor(l limiter, n float64, now time.Time) time.Duration {
	if l == nil {
		return 0
	}
	return l.waitFor(n, now)
}

// take takes n units from l, if it limits anything.
func take(l limiter, n float64, now time.Time) {
	if l != nil {
		l.take(n, now)
	}
}

// latency is an admitted answer's wait before it starts: Latency and a
// draw of LatencyJitter, times FlexSlowdown for a flex answer.
func (s *Server) latency(flex bool) time.Duration {
	d := s.cfg.Latency
	if s.cfg.LatencyJitter > 0 {
		s.mu.Lock()
		d += time.Duration(s.jitter.Int64N(int64(s.cfg.LatencyJitter)))
		s.mu.Unlock()
	}
	if flex && s.cfg.FlexSlowdown > 0 {
		d = time.Duration(float64(d) * s.cfg.FlexSlowdown)
	}
	return d
}

// arrive holds a request for its draw of ArrivalJitter; false: its
// caller left first.
func (s *Server) arrive(ctx context.Context) bool {
	if s.cfg.ArrivalJitter <= 0 {
		return true
	}
	s.mu.Lock()
	d := time.Duration(s.jitter.Int64N(int64(s.cfg.ArrivalJitter)))
	s.mu.Unlock()
	return s.sleep(ctx, d)
}

// advertised is the wait a 429 advertises: the SetRetryAfter override if
// any, else computed. Requires s.mu held.
func (s *Server) advertised(computed time.Duration) time.Duration {
	if s.retryAfter > 0 {
		return s.retryAfter
	}
	return computed
}

// release gives back the in-flight slot of an admitted request.
func (s *Server) release(key, model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[key].inFlight--
	s.limits[s.limitKey(key, model)].inFlight--
	s.inFlight--
}

// sleep waits d on the wall clock. It reports false if the client went away
// first. If the server is closed first it aborts the response, so that the
// client sees a broken connection rather than a short answer.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	return waitOn(ctx, s.done, t.C)
}

// hold waits for Config.StreamHold to close, like sleep.
func (s *Server) hold(ctx context.Context) bool {
	if s.cfg.StreamHold == nil {
		return true
	}
	return waitOn(ctx, s.done, s.cfg.StreamHold)
}

// waitOn waits for ready, for the client to go away (false) or for the
// server to close (abort).
func waitOn[T any](ctx context.Context, closing <-chan struct{}, ready <-chan T) bool {
	select {
	case <-ready:
		return true
	case <-ctx.Done():
		return false
	case <-closing:
		panic(http.ErrAbortHandler)
	}
}

// newID returns a fresh identifier such as "chatcmpl-mock-7".
func (s *Server) newID(prefix string) string {
	return fmt.Sprintf("%s%d", prefix, s.nextID.Add(1))
}

// apiKey reads the key the way the providers accept it: Authorization
// Bearer (OpenAI, Azure Entra), x-api-key (Anthropic), api-key (Azure).
func apiKey(r *http.Request) string {
	if auth := r.Header.Get("Authorization"); auth != "" {
		if scheme, token, ok := strings.Cut(auth, " "); ok && strings.EqualFold(scheme, "Bearer") {
			if token = strings.TrimSpace(token); token != "" {
				return token
			}
		}
	}
	if k := r.Header.Get("x-api-key"); k != "" {
		return k
	}
	return r.Header.Get("api-key")
}
