// Package mockupstream is a fake LLM provider for llmproxy's end-to-end tests
// and benchmarks.
//
// It imitates, over real HTTP on 127.0.0.1 (New) or in process with no
// socket (NewInProcess, Server.Transport), the parts of the OpenAI and
// Anthropic APIs that a rate-limit-aware proxy cares about:
//
//   - OpenAI Chat Completions (POST /v1/chat/completions, including SSE
//     streaming and stream_options.include_usage), the Responses API
//     (POST /v1/responses) and embeddings (POST /v1/embeddings);
//   - Anthropic Messages (POST /v1/messages, including its named SSE events);
//   - per-key (or per key and model) limits for requests and tokens, kept
//     as token buckets or fixed windows (see Shapes), with OpenAI's
//     x-ratelimit-* headers (Go duration resets) or Anthropic's
//     anthropic-ratelimit-* headers (RFC 3339 resets), Retry-After and
//     retry-after-ms on 429, and each provider's 429 and error bodies,
//     optionally with quantized limit headers (see below);
//   - hard-quota keys (OpenAI insufficient_quota, Anthropic spend cap, or
//     as QuotaForm picks: Gemini's per-day quota, Groq's requests per day,
//     Azure API Management's quota 403), renewed at QuotaUntil, a per-key
//     concurrency limit, scripted failures, slow and held streams;
//   - a local model server that holds one model at a time (see below);
//   - OpenAI's flex service tier, and a ledger of what was served and
//     what it cost, by tier (see below).
//
// It does not imitate model output (answers are "tok 1 tok 2 …"), real
// tokenisation, organisations or projects, or any endpoint not listed above.
//
// # Token accounting
//
// A request's prompt size is ceil(R/4) + 3·N tokens, where R counts the runes
// of all text in it and N counts its items. Text is every string found in
// "content" and "text" fields (recursively) of chat messages, Responses input
// items, Anthropic messages and the Anthropic system prompt or Responses
// instructions, and the strings of an embeddings input. Items are the
// messages (chat, Anthropic), input items (Responses; a string input is one
// item), embeddings inputs, plus one for a non-empty system prompt or
// instructions. Token-id arrays count as empty text.
//
// Admission charges the token bucket with the prompt tokens plus the first
// positive of max_tokens, max_completion_tokens and max_output_tokens
// (default 16), like providers that reserve the requested output. Embeddings
// are charged their prompt tokens only. Usage reports the prompt tokens and
// min(Config.CompletionTokens, that maximum) completion tokens.
//
// # Quantized limits
//
// OpenAI documents that a per-minute limit may be enforced in shorter
// slices: a 1,200 RPM limit may refuse a burst of more than 20 requests in
// one second. By default the mock's headers tell the truth about what it
// enforces: the limit header is the bucket's capacity (RequestBurst,
// TokenBurst). With Config.QuantizedHeaders they state the per-minute
// figures instead (the limit headers report RPM and TPM), while remaining
// and reset still describe the short buckets, which enforce exactly what
// they do without it. A client that takes the limit header for the burst it
// may send is refused.
//
// # Shapes
//
// How the count is kept is a switch of its own, apart from what refusals
// say (PROVIDERS.md §11). By default each key has token buckets, one for
// requests and one for tokens. Config.Window makes them fixed windows
// (N per window, the count starting again at each boundary), counted from
// each window's first request or, with WindowAligned, aligned to the
// clock; every wait and reset a window states points at its boundary.
// CountRefused counts refused requests against the limits too (Azure,
// Kong's sliding window): a bucket may go below empty, so a client that
// keeps knocking stays out. PerModel gives each (key, model) limits of
// its own (ModelRPM sizes some models' apart); without it a key's limits
// are one across all its models.
// ResetRoundDown and ClockAhead state Anthropic's reset times rounded
// down, or on a clock ahead of or behind the caller's. LatencyJitter
// varies answer times; ArrivalJitter counts requests in another order
// than they were sent.
//
// # What refusals say
//
// By default the mock explains itself as fully as the providers do: limit
// headers on every answer, Retry-After and retry-after-ms on refusals, "Please
// try again in …" in their bodies, and a concurrency refusal that says it is
// about concurrent requests. Real upstreams often say less, and each part can
// be silenced on its own:
//
//   - NoLimitHeaders: no x-ratelimit-* / anthropic-ratelimit-* headers;
//   - NoRetryAfter: no Retry-After or retry-after-ms;
//   - RetryAfterSeconds: Retry-After in whole seconds, no retry-after-ms;
//   - NoHint: no wait named in refusal bodies;
//   - ConcurrencyUnnamed: the concurrency refusal reads like a request-rate
//     refusal, with no word about concurrency;
//   - NoHeaders: NoLimitHeaders and NoRetryAfter together.
//
// HeaderForm forces one provider's header names on every path, or the IETF
// draft's RateLimit-* fields. HintForm names the wait in a refusal's body
// as OpenAI does ("Please try again in 1.5s."), as Azure OpenAI does
// ("Please retry after 2 seconds."), or as Gemini does (a
// google.rpc.RetryInfo detail with a retryDelay). RefusalStatus
// 503 replaces the buckets' and the concurrency cap's refusals with what an
// nginx limit_req or limit_conn in front of the upstream sends by default: a
// 503 with nginx's HTML error page and nothing else that explains it.
//
// # Local model server
//
// With Config.ModelLoad the mock behaves like Ollama, LM Studio or a
// single-GPU vLLM, which hold one model in memory at a time. Admitted
// requests wait in one line in arrival order. The head is served when its
// model (the body's "model", "" included) is loaded and fewer than
// LocalParallel requests are being served (any number when 0); a head for
// another model waits until the loaded model's requests have all ended,
// then its model loads for ModelLoad, during which nothing is served; the
// first load takes ModelLoad too. Everyone behind the head waits, so A, B,
// A sent together load three times. Waiting is never refused. ModelStats
// counts loads and swaps (loads after the first), the most requests served
// at once, the most distinct models among the requests in the handler at
// once (served or waiting: 1 means the client never had two models in
// flight) and the arrival time of every request in the line.
//
// # Flex processing and the ledger
//
// A request to /v1/chat/completions or /v1/responses with a top-level
// "service_tier": "flex" asks for OpenAI's flex tier; any other value, or
// none, is served at the standard tier, and other paths ignore the field.
// Before admission, a flex request for a model outside Config.FlexModels
// gets a 400 invalid_request_error (param service_tier, code
// unsupported_value), and a FlexRefuseShare of the others, drawn from
// Seed, a 429 "Resource Unavailable" (type server_error, code
// resource_unavailable) with no rate-limit headers and no retry-after:
// neither touches the key's limits, is counted in Stats, or is billed. An
// admitted flex request waits FlexSlowdown times longer before it
// answers. Chat and Responses answers name the tier that served them in a
// top-level "service_tier", "flex" or "default": on every chunk of a chat
// stream, and in the response object of a Responses stream. Anthropic's
// answers are unchanged.
//
// Server.Ledger tells, by tier served (TierStandard, TierFlex) and by
// key, the answers billed, their prompt and completion tokens as their
// usage reports them (a stream's whether or not its usage chunk is sent)
// and their cost at Config.Prices in nano-dollars, each answer rounded
// to the nano-dollar. An answer is billed when its handler has written
// all of it with status 200: a stream the client abandons is not. The
// ledger also counts the flex requests refused for capacity and for an
// unsupported model.
//
// # Time
//
// Buckets refill continuously from Config.Now, so tests can step a fake clock.
// Latency, ChunkDelay and StreamHold are waits on timers; they end early when
// the client goes away or the server is closed. On a listening server they
// are wall-clock waits. An in-process server built inside a testing/synctest
// bubble runs every request on goroutines of the bubble and reads time.Now,
// so the bubble's fake clock drives both its buckets and its waits.
package mockupstream
