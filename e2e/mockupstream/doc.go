// Package mockupstream is a fake LLM provider for llmproxy's end-to-end tests
// and benchmarks.
//
// It imitates, over real HTTP on 127.0.0.1, the parts of the OpenAI and
// Anthropic APIs that a rate-limit-aware proxy cares about:
//
//   - OpenAI Chat Completions (POST /v1/chat/completions, including SSE
//     streaming and stream_options.include_usage), the Responses API
//     (POST /v1/responses) and embeddings (POST /v1/embeddings);
//   - Anthropic Messages (POST /v1/messages, including its named SSE events);
//   - per-key token buckets for requests and tokens, with OpenAI's
//     x-ratelimit-* headers (Go duration resets) or Anthropic's
//     anthropic-ratelimit-* headers (RFC 3339 resets), Retry-After and
//     retry-after-ms on 429, and each provider's 429 and error bodies,
//     optionally with quantized limit headers (see below);
//   - hard-quota keys (OpenAI insufficient_quota, Anthropic spend cap),
//     a per-key concurrency limit, scripted failures, slow and held streams.
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
// # Time
//
// Buckets refill continuously from Config.Now, so tests can step a fake clock.
// Latency, ChunkDelay and StreamHold are real waits on the wall clock; they
// end early when the client goes away or the server is closed.
package mockupstream
