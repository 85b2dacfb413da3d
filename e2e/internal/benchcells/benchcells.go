// Package benchcells holds e2e/loadbench's matrix: every upstream (the
// mock's switches, e2e/mockupstream), the load sent to it and how the
// client sends and reads one request. e2e/replicabench runs the same cells
// through one proxy and through replicas sharing Redis, so that a cell
// there is the same upstream and load as here.
package benchcells

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
)

// Shape is an upstream's limits and the load sent to it.
type Shape struct {
	Name string
	Mock mockupstream.Config
	// Rate is what the upstream allows, in requests per second.
	Rate float64
	// N and C are the default requests and client concurrency.
	N, C int
	// Stream makes the client ask for streamed answers and read them to
	// the end.
	Stream bool
	// Anthropic drives /v1/messages with the Anthropic SDK instead of
	// /v1/chat/completions with the OpenAI one.
	Anthropic bool
	// Concurrency marks the shape bound by requests in flight, where
	// headers speech is Retry-After alone.
	Concurrency bool
	// Speeches are the speeches the shape runs with.
	Speeches []string
	// Configure, when set, changes the proxy's configuration: the shapes
	// of routes that know their limits (configured, local), which are
	// about the route rather than about what the upstream says.
	Configure func(*proxy.Config)
	// Model names request i's model; nil: one model for all.
	Model func(i int) string
	// Ideal, when set, is the time the upstream allows for n requests
	// (else n ÷ Rate).
	Ideal func(n int) time.Duration
}

// Cell is a shape with a speech: one row of the matrix.
type Cell struct {
	Shape
	Name string // shape/speech
}

// MaxTokens is every request's max_tokens.
const MaxTokens = 100

// The figures of the short, quantized, tpm and issue 31's shapes unless
// told otherwise (loadbench's -rps and -latency).
const (
	DefaultRPS     = 20
	DefaultLatency = 200 * time.Millisecond
)

// Prompt is the same size for every request, so each costs the same tokens.
func Prompt(i int) string { return fmt.Sprintf("question %06d", i) }

// CostPerRequest is what the mock charges a request against TPM: its
// prompt-token rule (ceil(chars/4) + 3 per message) plus max_tokens.
func CostPerRequest() int64 {
	return int64((len(Prompt(0))+3)/4+3) + MaxTokens
}

// shapes lists every shape. latency and rps shape short, quantized and tpm;
// streams and concurrency have fixed figures, chosen so that the limit that
// binds is the one they are named after.
func shapes(latency time.Duration, rps float64) []Shape {
	rpm := int(rps * 60)
	tpm := int64(rps * 60 * float64(CostPerRequest()))
	all := []string{"headers", "hint", "silent"}
	with503 := []string{"headers", "hint", "silent", "silent-503"}
	only := []string{"headers"}

	// 4 requests a second, each streamed over about 1.8 s: the answers
	// outlast the refill, so several are always in flight.
	streams := mockupstream.Config{RPM: 240, Latency: 200 * time.Millisecond, StreamChunks: 10, ChunkDelay: 200 * time.Millisecond}
	// No rate limit, only a cap of 8 answers in flight per key: at most
	// the cap ÷ one answer's time = 16 requests a second.
	capped := mockupstream.Config{MaxInFlight: 8, Latency: 500 * time.Millisecond}
	// The headers say rps×60 a minute, but a burst over one second's worth
	// is refused.
	quantized := mockupstream.Config{RPM: rpm, Latency: latency, QuantizedHeaders: true}

	return append([]Shape{
		{Name: "short", Mock: mockupstream.Config{RPM: rpm, Latency: latency}, Rate: rps, N: 400, C: 50, Speeches: with503},
		{Name: "streams", Mock: streams, Rate: 4, N: 120, C: 30, Stream: true, Speeches: all},
		{Name: "streams-anthropic", Mock: streams, Rate: 4, N: 120, C: 30, Stream: true, Anthropic: true, Speeches: only},
		{Name: "concurrency", Mock: capped, Rate: float64(capped.MaxInFlight) / capped.Latency.Seconds(),
			N: 200, C: 50, Concurrency: true, Speeches: with503},
		{Name: "quantized", Mock: quantized, Rate: rps, N: 400, C: 50, Speeches: all},
		{Name: "quantized-anthropic", Mock: quantized, Rate: rps, N: 400, C: 50, Anthropic: true, Speeches: only},
		{Name: "tpm", Mock: mockupstream.Config{TPM: tpm, RPM: rpm * 10, Latency: latency}, Rate: rps, N: 400, C: 50, Speeches: all},
		// A route configured at 600 RPM (LLMPROXY_ROUTE_DEFAULT_RPM=600) in
		// front of an upstream that allows 6,000 and, with headers, says
		// so.
		{Name: "configured", Mock: mockupstream.Config{RPM: 6000, Latency: latency}, Rate: 10, N: 300, C: 50,
			Speeches: []string{"headers", "silent"}, Configure: func(c *proxy.Config) {
				c.Default.Limits = limit.Limits{RPM: 600}
			}},
		// A local model server (one model at a time, 2 s to load one, 4
		// served at once, 200 ms answers) behind a route marked local
		// (LLMPROXY_ROUTE_DEFAULT_LOCAL=true, _CONCURRENCY=4), and an eval
		// interleaving three models, all queued at once.
		{Name: "local", Mock: mockupstream.Config{ModelLoad: 2 * time.Second, LocalParallel: 4, Latency: latency},
			N: 300, C: 300, Speeches: []string{"interleaved"},
			Configure: func(c *proxy.Config) {
				c.Default = proxy.RouteSettings{Local: true, Limits: limit.Limits{Concurrency: 4}}
			},
			Model: func(i int) string { return []string{"llama", "qwen", "mistral"}[i%3] },
			Ideal: func(n int) time.Duration { return 3*2*time.Second + time.Duration(n)*latency/4 }},
	}, issue31Shapes(latency, rps)...)
}

// windowIdeal is the time fixed windows of allowance allow for n requests
// answered in latency: each window's allowance sent at its start, the
// last window's answers after it began.
func windowIdeal(allowance int, length, latency time.Duration) func(n int) time.Duration {
	return func(n int) time.Duration {
		return time.Duration((n+allowance-1)/allowance-1)*length + latency
	}
}

// issue31Shapes are issue 31's shapes, in the rps and latency of short.
func issue31Shapes(latency time.Duration, rps float64) []Shape {
	rpm := int(rps * 60)
	window := mockupstream.Config{RPM: rpm, Window: 10 * time.Second, Latency: latency}
	perWindow := rpm / 6
	aligned := window
	aligned.WindowAligned = true
	own := mockupstream.Config{RPM: rpm, Latency: latency, PerModel: true}
	sizes := own
	sizes.ModelRPM = map[string]int{"gpt-b": 300}
	quantized := mockupstream.Config{RPM: rpm, Latency: latency, QuantizedHeaders: true}
	down, ahead, behind := quantized, quantized, quantized
	down.ResetRoundDown = true
	ahead.ClockAhead = time.Second
	behind.ClockAhead, behind.ResetRoundDown = -time.Second, true
	four := func(i int) string { return []string{"gpt-a", "gpt-b", "gpt-c", "gpt-d"}[i%4] }
	return []Shape{
		{Name: "window", Mock: window, Rate: rps, N: 600, C: 50, Ideal: windowIdeal(perWindow, 10*time.Second, latency),
			Speeches: []string{"retry-after", "gemini", "silent", "ietf"}},
		{Name: "window-aligned", Mock: aligned, Rate: rps, N: 600, C: 50, Ideal: windowIdeal(perWindow, 10*time.Second, latency),
			Speeches: []string{"retry-after"}},
		// Azure's 1 s windows, aligned to the clock, refusals counted.
		{Name: "window-1s", Mock: mockupstream.Config{RPM: rpm, Window: time.Second, WindowAligned: true, CountRefused: true, Latency: latency},
			Rate: rps, N: 400, C: 50, Ideal: windowIdeal(rpm/60, time.Second, latency), Speeches: []string{"azure"}},
		// 60 s windows of 300, over two windows.
		{Name: "window-60s", Mock: mockupstream.Config{RPM: 300, Window: time.Minute, Latency: latency}, Rate: 5, N: 600, C: 50,
			Ideal: windowIdeal(300, time.Minute, latency), Speeches: []string{"retry-after"}},
		{Name: "shared-models", Mock: mockupstream.Config{RPM: rpm, Latency: latency}, Rate: rps, N: 400, C: 50, Model: four,
			Speeches: []string{"headers", "silent"}},
		{Name: "own-models", Mock: own, Rate: 4 * rps, N: 400, C: 50, Model: four, Speeches: []string{"headers", "silent"}},
		// Two models with limits of their own, 20 and 5 a second, asked
		// in that proportion (both bound) or alike (the smaller bound).
		{Name: "own-models-uneven", Mock: sizes, Rate: rps + 5, N: 400, C: 50, Speeches: []string{"silent"},
			Model: func(i int) string { return []string{"gpt-a", "gpt-a", "gpt-a", "gpt-a", "gpt-b"}[i%5] }},
		{Name: "own-models-sizes", Mock: sizes, Rate: 10, N: 400, C: 50, Speeches: []string{"silent"},
			Model: func(i int) string { return []string{"gpt-a", "gpt-b"}[i%2] }},
		{Name: "anthropic-rounded-down", Mock: down, Rate: rps, N: 400, C: 50, Anthropic: true, Speeches: []string{"headers"}},
		{Name: "anthropic-clock-ahead", Mock: ahead, Rate: rps, N: 400, C: 50, Anthropic: true, Speeches: []string{"headers"}},
		{Name: "anthropic-clock-behind", Mock: behind, Rate: rps, N: 400, C: 50, Anthropic: true, Speeches: []string{"headers"}},
		{Name: "counted", Mock: mockupstream.Config{RPM: rpm, Latency: latency, CountRefused: true}, Rate: rps, N: 400, C: 50,
			Speeches: []string{"silent"}},
		{Name: "tpm-quantized", Mock: mockupstream.Config{TPM: int64(rps * 60 * float64(CostPerRequest())), RPM: rpm * 10, Latency: latency,
			QuantizedHeaders: true}, Rate: rps, N: 400, C: 50, Speeches: []string{"headers"}},
		{Name: "streams-jitter", Mock: mockupstream.Config{RPM: 240, Latency: 200 * time.Millisecond, StreamChunks: 10,
			ChunkDelay: 200 * time.Millisecond, LatencyJitter: 50 * time.Millisecond}, Rate: 4, N: 120, C: 30, Stream: true,
			Speeches: []string{"silent"}},
	}
}

// speak sets the mock's switches for a speech.
func speak(cfg *mockupstream.Config, speech string, concurrency bool) {
	switch speech {
	case "headers":
		if concurrency {
			cfg.NoLimitHeaders, cfg.NoHint, cfg.ConcurrencyUnnamed = true, true, true
		}
	case "hint":
		cfg.NoLimitHeaders, cfg.NoRetryAfter, cfg.ConcurrencyUnnamed = true, true, true
	case "interleaved": // the local shape's only speech: it says nothing of limits
	case "silent", "silent-503":
		cfg.NoLimitHeaders, cfg.NoRetryAfter, cfg.NoHint, cfg.ConcurrencyUnnamed = true, true, true, true
		if speech == "silent-503" {
			cfg.RefusalStatus = http.StatusServiceUnavailable
		}
	case "retry-after": // Retry-After alone, in whole seconds
		cfg.NoLimitHeaders, cfg.NoHint, cfg.ConcurrencyUnnamed, cfg.RetryAfterSeconds = true, true, true, true
	case "gemini": // Gemini's RetryInfo retryDelay in the body alone
		cfg.NoLimitHeaders, cfg.NoRetryAfter, cfg.HintForm, cfg.ConcurrencyUnnamed = true, true, "gemini", true
	case "azure": // Azure's "retry after N seconds" in the body, Retry-After and retry-after-ms
		cfg.NoLimitHeaders, cfg.HintForm, cfg.ConcurrencyUnnamed = true, "azure", true
	case "ietf": // the IETF draft's RateLimit-* fields, Retry-After in whole seconds
		cfg.HeaderForm, cfg.NoHint, cfg.ConcurrencyUnnamed, cfg.RetryAfterSeconds = "ietf", true, true, true
	default:
		panic("benchcells: unknown speech " + speech)
	}
}

// Cells is the whole matrix, shape by shape.
func Cells(latency time.Duration, rps float64) []Cell {
	var cs []Cell
	for _, sh := range shapes(latency, rps) {
		for _, speech := range sh.Speeches {
			c := Cell{Shape: sh, Name: sh.Name + "/" + speech}
			speak(&c.Mock, speech, sh.Concurrency)
			cs = append(cs, c)
		}
	}
	return cs
}

// Pick returns the items of all that list names, a comma-separated list of
// names, prefixes ending in "/" (short/) and globs (short/*, */silent; "*"
// alone is every item), in the list's order without repeats; an empty list
// picks them all. name is an item's name; what is what the items are
// called in an error.
func Pick[T any](all []T, name func(T) string, list, what string) ([]T, error) {
	if strings.TrimSpace(list) == "" {
		return all, nil
	}
	var picked []T
	seen := make(map[string]bool)
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if _, err := path.Match(item, ""); err != nil {
			return nil, fmt.Errorf("bad pattern %q: %v", item, err)
		}
		found := false
		for _, x := range all {
			if !matches(item, name(x)) {
				continue
			}
			found = true
			if !seen[name(x)] {
				seen[name(x)] = true
				picked = append(picked, x)
			}
		}
		if !found {
			var names []string
			for _, x := range all {
				names = append(names, name(x))
			}
			return nil, fmt.Errorf("no %s matches %q; %ss: %s", what, item, what, strings.Join(names, ", "))
		}
	}
	return picked, nil
}

// matches reports whether pattern (a name, a prefix ending in "/", a glob,
// or "*") picks name.
func matches(pattern, name string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasSuffix(pattern, "/"):
		return strings.HasPrefix(name, pattern)
	}
	ok, _ := path.Match(pattern, name)
	return ok
}

// IdealOf is the time the cell's upstream allows for n requests.
func (c Cell) IdealOf(n int) time.Duration {
	if c.Ideal != nil {
		return c.Ideal(n)
	}
	return time.Duration(float64(n) / c.Rate * float64(time.Second))
}

// ChatParams is request i for model: the same prompt size for every i;
// streamed, it asks for the usage chunk.
func ChatParams(i int, model string, stream bool) openai.ChatCompletionNewParams {
	params := openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(Prompt(i))},
		MaxTokens: openai.Int(MaxTokens),
	}
	if stream {
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	}
	return params
}

// Chat sends request i with the OpenAI SDK and reads the whole answer; the
// error is nil only for a 200 that carries a choice (streamed: read to its
// usage chunk). The response's headers carry the proxy's queue wait.
func Chat(ctx context.Context, client openai.Client, i int, model string, stream bool) (*http.Response, error) {
	params := ChatParams(i, model, stream)
	var resp *http.Response
	if !stream {
		c, err := client.Chat.Completions.New(ctx, params, option.WithResponseInto(&resp))
		if err == nil && len(c.Choices) == 0 {
			err = errors.New("200 without a choice")
		}
		return resp, err
	}

	s := client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&resp))
	defer s.Close()
	var usage bool
	for s.Next() {
		usage = usage || s.Current().Usage.TotalTokens > 0
	}
	if err := s.Err(); err != nil {
		return resp, err
	}
	// The SDK ends a stream cut short without [DONE] quietly; the usage
	// chunk, the last before [DONE], shows the answer arrived whole.
	if !usage {
		return resp, errors.New("stream ended before its usage chunk")
	}
	return resp, nil
}

// Message sends request i to /v1/messages with the Anthropic SDK and reads
// the whole answer, like Chat.
func Message(ctx context.Context, client anthropic.Client, i int, stream bool) (*http.Response, error) {
	params := anthropic.MessageNewParams{
		Model:     "claude-bench",
		MaxTokens: MaxTokens,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(Prompt(i)))},
	}
	var resp *http.Response
	if !stream {
		msg, err := client.Messages.New(ctx, params, aoption.WithResponseInto(&resp))
		if err == nil && (len(msg.Content) == 0 || msg.Usage.OutputTokens == 0) {
			err = errors.New("message without content or usage")
		}
		return resp, err
	}

	s := client.Messages.NewStreaming(ctx, params, aoption.WithResponseInto(&resp))
	defer s.Close()
	var usage, stopped bool
	for s.Next() {
		switch ev := s.Current().AsAny().(type) {
		case anthropic.MessageDeltaEvent:
			usage = usage || ev.Usage.OutputTokens > 0
		case anthropic.MessageStopEvent:
			stopped = true
		}
	}
	if err := s.Err(); err != nil {
		return resp, err
	}
	// As with chat: a stream cut short may end without an error, and only
	// message_delta's usage and message_stop, the last events, show it
	// arrived whole.
	if !usage || !stopped {
		return resp, fmt.Errorf("stream ended early (message_delta usage %v, message_stop %v)", usage, stopped)
	}
	return resp, nil
}
