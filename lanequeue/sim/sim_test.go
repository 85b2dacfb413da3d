package sim

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/proxy"
)

// speech is how the model upstream explains its refusals.
type speech string

const (
	headers   speech = "headers"    // limit headers, Retry-After, a hint, concurrency in words
	hint      speech = "hint"       // only "try again in …" in the body
	silent    speech = "silent"     // a bare refusal
	silent503 speech = "silent-503" // a bare 503, as nginx's limit_req sends
)

// cell is one shape spoken one way, with its load and targets.
type cell struct {
	name   string
	mock   mockupstream.Config
	rate   float64 // what the limit allows, requests a second
	n, c   int
	stream bool
	// path and anthropic: /v1/messages in Anthropic's form.
	anthropic bool
	// models are the models requests name in turn; nil: one.
	models []string
	// ideal is the time the limit allows for the n requests; zero: n ÷
	// rate.
	ideal time.Duration
	// targets: makespan ÷ ideal and the upstream's refusals as a share of
	// its requests.
	ratio, refusals float64
	// start is how far past a whole second of the bubble's clock the run
	// starts; zero: startOffset.
	start time.Duration
}

// speak makes cfg explain itself as sp. Concurrency-only upstreams with
// headers send Retry-After only; with a hint, the hint without words.
func speak(cfg mockupstream.Config, sp speech, concurrencyOnly bool) mockupstream.Config {
	switch sp {
	case headers:
		if concurrencyOnly {
			cfg.NoHint, cfg.ConcurrencyUnnamed = true, true
		}
	case hint:
		cfg.NoLimitHeaders, cfg.NoRetryAfter = true, true
		cfg.ConcurrencyUnnamed = concurrencyOnly
	case silent, silent503:
		cfg.NoLimitHeaders, cfg.NoRetryAfter, cfg.NoHint, cfg.ConcurrencyUnnamed = true, true, true, true
		if sp == silent503 {
			cfg.RefusalStatus = http.StatusServiceUnavailable
		}
	case retryAfter: // Retry-After alone, in whole seconds
		cfg.NoLimitHeaders, cfg.NoHint, cfg.ConcurrencyUnnamed, cfg.RetryAfterSeconds = true, true, true, true
	case gemini: // RetryInfo in the body alone
		cfg.NoLimitHeaders, cfg.NoRetryAfter, cfg.HintForm, cfg.ConcurrencyUnnamed = true, true, "gemini", true
	case azure: // "retry after N seconds" and Retry-After, no limit headers
		cfg.NoLimitHeaders, cfg.HintForm, cfg.ConcurrencyUnnamed = true, "azure", true
	case ietf: // RateLimit-* and Retry-After in whole seconds, no words
		cfg.HeaderForm, cfg.NoHint, cfg.ConcurrencyUnnamed, cfg.RetryAfterSeconds = "ietf", true, true, true
	}
	return cfg
}

// The speeches of the shapes of limits (issue 31): what window upstreams
// say.
const (
	retryAfter speech = "retry-after" // Retry-After alone
	gemini     speech = "gemini"      // Gemini's RetryInfo retryDelay in the body alone
	azure      speech = "azure"       // Azure's "retry after N seconds", Retry-After
	ietf       speech = "ietf"        // the IETF draft's RateLimit-* fields, Retry-After
)

// target is the bar for a shape spoken one way.
func target(shape string, sp speech) (ratio, refusals float64) {
	if sp == silent503 {
		sp = silent
	}
	type k struct {
		shape string
		sp    speech
	}
	t := map[k][2]float64{
		{"short", headers}: {1.05, 1}, {"short", hint}: {1.05, 5}, {"short", silent}: {1.15, 10},
		{"tpm", headers}: {1.05, 1}, {"tpm", hint}: {1.05, 5}, {"tpm", silent}: {1.15, 10},
		{"streams", headers}: {1.1, 3}, {"streams", hint}: {1.1, 10}, {"streams", silent}: {1.2, 15},
		{"concurrency", headers}: {1.1, 5}, {"concurrency", hint}: {1.1, 5}, {"concurrency", silent}: {1.15, 10},
		{"quantized", headers}: {1.05, 1}, {"quantized", hint}: {1.05, 5}, {"quantized", silent}: {1.15, 10},
		{"quantized-anthropic", headers}: {1.05, 1}, {"streams-anthropic", headers}: {1.1, 3},
		// Issue 31's shapes.
		{"window", retryAfter}: {1.1, 5}, {"window", gemini}: {1.1, 5}, {"window-reordered", silent}: {1.3, 10}, {"window-reordered", retryAfter}: {1.1, 5},
		// The 1.3x, kept at what a refused knock's retry held by
		// the window's knocks gives (1.04x; waiting its own backoff past
		// the window's opening, 1.14-1.19x).
		{"window", silent}: {1.1, 10},
		// The "keep" for IETF headers: no worse than the engine
		// before it on this mock (1.09-1.10x, 0.3 %: it waited out each
		// whole-second Retry-After).
		{"window", ietf}: {1.1, 1}, {"window-aligned", retryAfter}: {1.1, 5},
		{"window-1s", azure}: {1.1, 5}, {"window-60s", retryAfter}: {1.1, 5},
		{"shared-models", headers}: {1.05, 2}, {"shared-models", silent}: {1.15, 10},
		{"own-models", headers}: {1.05, 1}, {"own-models", silent}: {1.15, 10},
		{"own-models-uneven", silent}: {1.15, 10},
		// Not the issue's: what joining limits on trial costs when they
		// turn out to be limits of their own (see lanequeue/together.go).
		{"own-models-sizes", silent}:        {1.15, 15},
		{"anthropic-rounded-down", headers}: {1.05, 1}, {"anthropic-clock-ahead", headers}: {1.05, 1},
		{"anthropic-clock-behind", headers}: {1.05, 1},
		{"counted", silent}:                 {1.15, 5}, {"tpm-quantized", headers}: {1.05, 1},
		{"streams-jitter", silent}: {1.15, 5},
	}[k{shape, sp}]
	return t[0], t[1]
}

const maxTokens = 100

// costPerRequest is what the mock charges a request of the simulation.
func costPerRequest() int64 { return int64((len(prompt(0))+3)/4+3) + maxTokens }

func prompt(i int) string { return fmt.Sprintf("question %06d", i) }

// windowIdeal is the time fixed windows of allowance allow for n
// requests answered in latency: each window's allowance sent at its
// start, the last window's answers after it began.
func windowIdeal(n, allowance int, length, latency time.Duration) time.Duration {
	return time.Duration((n+allowance-1)/allowance-1)*length + latency
}

// cells is the matrix of e2e/loadbench, with its figures.
func cells() []cell {
	const rps = 20
	latency := 200 * time.Millisecond
	short := mockupstream.Config{RPM: rps * 60, Latency: latency}
	tpm := mockupstream.Config{TPM: rps * 60 * costPerRequest(), RPM: rps * 600, Latency: latency}
	quantized := mockupstream.Config{RPM: rps * 60, Latency: latency, QuantizedHeaders: true}
	streams := mockupstream.Config{RPM: 240, Latency: latency, StreamChunks: 10, ChunkDelay: 200 * time.Millisecond}
	capped := mockupstream.Config{MaxInFlight: 8, Latency: 500 * time.Millisecond}
	var cs []cell
	add := func(shape string, cfg mockupstream.Config, rate float64, n, c int, stream, anthropic bool, sps ...speech) {
		for _, sp := range sps {
			ratio, ref := target(shape, sp)
			cs = append(cs, cell{name: shape + "/" + string(sp), mock: speak(cfg, sp, shape == "concurrency"),
				rate: rate, n: n, c: c, stream: stream, anthropic: anthropic, ratio: ratio, refusals: ref})
		}
	}
	all := []speech{headers, hint, silent}
	add("short", short, rps, 400, 50, false, false, append(all, silent503)...)
	add("streams", streams, 4, 120, 30, true, false, all...)
	add("concurrency", capped, 16, 200, 50, false, false, append(all, silent503)...)
	add("quantized", quantized, rps, 400, 50, false, false, all...)
	add("tpm", tpm, rps, 400, 50, false, false, all...)
	add("quantized-anthropic", quantized, rps, 400, 50, false, true, headers)
	add("streams-anthropic", streams, 4, 120, 30, true, true, headers)
	return append(cs, shapeCells()...)
}

// shapeCells are issue 31's shapes: fixed windows, one limit shared by
// several models, resets on another clock, refusals that count, quantized
// token headers and streams whose answer times vary.
func shapeCells() []cell {
	const rps = 20
	latency := 200 * time.Millisecond
	var cs []cell
	add := func(shape string, cfg mockupstream.Config, c cell, sps ...speech) {
		for _, sp := range sps {
			x := c
			x.name, x.mock = shape+"/"+string(sp), speak(cfg, sp, false)
			x.ratio, x.refusals = target(shape, sp)
			cs = append(cs, x)
		}
	}
	// 10 s windows of 200 (1,200 RPM), counted from each window's first
	// request: 600 chats are three windows.
	window := mockupstream.Config{RPM: rps * 60, Window: 10 * time.Second, Latency: latency}
	windowLoad := cell{n: 600, c: 50, rate: rps, ideal: windowIdeal(600, 200, 10*time.Second, latency)}
	add("window", window, windowLoad, retryAfter, gemini, silent, ietf)
	// The same, each request reaching the upstream up to 20 ms after it was
	// sent: counted in another order (one sent a moment after a refused one
	// admitted before it). Read as a pace, not a window, this cost 3.2×
	// silent; behind Retry-After, the window's allowance learned short of
	// those admitted, 1.52× (its last requests waited a window).
	arriving := window
	arriving.ArrivalJitter, arriving.Seed = 20*time.Millisecond, 3
	add("window-reordered", arriving, windowLoad, silent, retryAfter)
	aligned := window
	aligned.WindowAligned = true
	add("window-aligned", aligned, windowLoad, retryAfter)
	// Azure's 1 s windows (1,200 RPM = 20 a second), aligned to the
	// clock, refusals counted.
	azureCfg := mockupstream.Config{RPM: rps * 60, Window: time.Second, WindowAligned: true, CountRefused: true, Latency: latency}
	add("window-1s", azureCfg, cell{n: 400, c: 50, rate: rps, ideal: windowIdeal(400, 20, time.Second, latency)}, azure)
	// 60 s windows of 300, over two windows.
	minute := mockupstream.Config{RPM: 300, Window: time.Minute, Latency: latency}
	add("window-60s", minute, cell{n: 600, c: 50, rate: 5, ideal: windowIdeal(600, 300, time.Minute, latency)}, retryAfter)

	// One limit for the key across four models, requests in turn.
	four := []string{"gpt-a", "gpt-b", "gpt-c", "gpt-d"}
	add("shared-models", short(latency), cell{n: 400, c: 50, rate: rps, models: four}, headers, silent)
	// Each model its own 20 req/s: four run side by side.
	own := short(latency)
	own.PerModel = true
	add("own-models", own, cell{n: 400, c: 50, rate: 4 * rps, models: four}, headers, silent)
	// Two models with limits of their own, 20 and 5 a second, asked in
	// that proportion (both bound, 16 s each), or asked alike (the
	// smaller bound: 40 s).
	sizes := own
	sizes.ModelRPM = map[string]int{"gpt-b": 5 * 60}
	add("own-models-uneven", sizes, cell{n: 400, c: 50, rate: rps + 5,
		models: []string{"gpt-a", "gpt-a", "gpt-a", "gpt-a", "gpt-b"}}, silent)
	add("own-models-sizes", sizes, cell{n: 400, c: 50, rate: 10, models: []string{"gpt-a", "gpt-b"}}, silent)

	// Anthropic's headers, 1,200 RPM stated, 20 a second enforced, resets
	// rounded down, or on a clock a second ahead or behind.
	quantized := mockupstream.Config{RPM: rps * 60, Latency: latency, QuantizedHeaders: true}
	anthropicLoad := cell{n: 400, c: 50, rate: rps, anthropic: true}
	down := quantized
	down.ResetRoundDown = true
	add("anthropic-rounded-down", down, anthropicLoad, headers)
	ahead := quantized
	ahead.ClockAhead = time.Second
	add("anthropic-clock-ahead", ahead, anthropicLoad, headers)
	behind := quantized
	behind.ClockAhead, behind.ResetRoundDown = -time.Second, true
	add("anthropic-clock-behind", behind, anthropicLoad, headers)

	// A bucket that counts refused requests too (Azure, Kong's sliding
	// window).
	counted := short(latency)
	counted.CountRefused = true
	add("counted", counted, cell{n: 400, c: 50, rate: rps}, silent)
	// Token headers stating per minute what is enforced per second.
	tpmQ := mockupstream.Config{TPM: rps * 60 * costPerRequest(), RPM: rps * 600, Latency: latency, QuantizedHeaders: true}
	add("tpm-quantized", tpmQ, cell{n: 400, c: 50, rate: rps}, headers)
	// Silent streams whose answers take 0–50 ms more or less.
	jitter := mockupstream.Config{RPM: 240, Latency: latency, StreamChunks: 10, ChunkDelay: 200 * time.Millisecond,
		LatencyJitter: 50 * time.Millisecond}
	add("streams-jitter", jitter, cell{n: 120, c: 30, rate: 4, stream: true}, silent)
	return cs
}

// short is the short shape's upstream: 20 a second, one second's burst.
func short(latency time.Duration) mockupstream.Config {
	return mockupstream.Config{RPM: 20 * 60, Latency: latency}
}

type result struct {
	makespan  time.Duration
	ideal     time.Duration
	failures  int
	upstream  int64
	refused   int64
	firstFail string
	view      lanequeue.State
}

func (r result) ratio() float64 { return r.makespan.Seconds() / r.ideal.Seconds() }

func (r result) refusedPct() float64 {
	if r.upstream == 0 {
		return 0
	}
	return 100 * float64(r.refused) / float64(r.upstream)
}

// simulate runs c in a synctest bubble and returns what happened.
func simulate(t *testing.T, c cell) result {
	var res result
	synctest.Test(t, func(t *testing.T) {
		// A real clock is rarely on a whole second when a run starts: the
		// bubble's is, at midnight.
		offset := c.start
		if offset == 0 {
			offset = startOffset
		}
		time.Sleep(offset)
		mock := mockupstream.NewInProcess(c.mock)
		defer mock.Close()
		u, _ := url.Parse(mock.URL())
		p, err := proxy.New(proxy.Config{Upstream: u, Transport: mock.Transport(), MaxRetries: proxy.DefaultMaxRetries,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop()
		if *trace {
			defer traceLanes(t, p, func() (int64, int64) { st := mock.Stats(); return st.Requests, st.RateLimited })()
		}
		res.makespan, res.failures, res.firstFail = load(c.n, c.c, func(i int) error { return send(p, c, i) })
		res.ideal = c.ideal
		if res.ideal == 0 {
			res.ideal = time.Duration(float64(c.n) / c.rate * float64(time.Second))
		}
		st := mock.Stats()
		res.upstream, res.refused = st.Requests, st.RateLimited
		if ls := p.States(); len(ls) > 0 {
			res.view = ls[0]
		}
	})
	return res
}

// send makes request i of c through p and checks its answer came whole.
func send(p *proxy.Proxy, c cell, i int) error {
	var body, path string
	model := "gpt-sim"
	if len(c.models) > 0 {
		model = c.models[i%len(c.models)]
	}
	stream := ""
	if c.stream {
		stream = `,"stream":true`
	}
	if c.anthropic {
		path = "/v1/messages"
		body = fmt.Sprintf(`{"model":"claude-sim","max_tokens":%d,"messages":[{"role":"user","content":%q}]%s}`, maxTokens, prompt(i), stream)
	} else {
		path = "/v1/chat/completions"
		if c.stream {
			stream += `,"stream_options":{"include_usage":true}`
		}
		body = fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}]%s}`, model, maxTokens, prompt(i), stream)
	}
	req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-sim")
	req.Header.Set("x-api-key", "sk-sim")
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	p.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		return fmt.Errorf("status %d: %s", w.Code, bytes.TrimSpace(w.Body.Bytes()))
	}
	if c.stream {
		end := "[DONE]"
		if c.anthropic {
			end = "message_stop"
		}
		if !bytes.Contains(w.Body.Bytes(), []byte(end)) {
			return fmt.Errorf("stream without its end: %q", w.Body.String())
		}
	}
	return nil
}

// load sends n requests, at most c at a time, each by send, and returns
// how long they took, how many failed and the first failure's words.
func load(n, c int, send func(i int) error) (makespan time.Duration, failures int, firstFail string) {
	var mu sync.Mutex
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := send(i); err != nil {
				mu.Lock()
				failures++
				if firstFail == "" {
					firstFail = err.Error()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return time.Since(start), failures, firstFail
}

// traceLanes logs each of p's lanes every 250 ms of simulated time, with
// the upstream's requests and refusals so far, until the function it
// returns is called.
func traceLanes(t *testing.T, p *proxy.Proxy, counts func() (requests, refused int64)) (stop func()) {
	done := make(chan struct{})
	start := time.Now()
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
			requests, refused := counts()
			for _, v := range p.States() {
				t.Logf("%5.2fs %-6s %-16s queued %3d in flight %2d/%2d pace %5.1f/s admitted %5.1f/s from %-13q bound %-11q %q refused %d/%d"+
					" | req %.0f left %.1f | tok %.0f left %.0f at %.1f/s | paused %q",
					time.Since(start).Seconds(), v.Model, v.SharedBecause, v.Queued, v.InFlight, v.Concurrency, v.RequestsPerSecond,
					v.AdmittedRate, v.RateFrom, v.Bound, v.ConcurrencyFrom, refused, requests,
					v.RequestsLimit, v.RequestsAvailable, v.TokensLimit, v.TokensAvailable, v.TokensPerSecond, v.PauseReason)
			}
		}
	}()
	return func() { close(done) }
}

var trace = flag.Bool("trace", false, "log each lane's state every 250ms of simulated time")

// startOffset is how far past a whole second of the bubble's clock each
// run starts.
const startOffset = 370 * time.Millisecond

// runs is how many times each cell runs: goroutines that wake at one
// simulated instant run in any order, so runs differ a little, and the
// median is held to the target. Some cells sit near their target from
// run to run (streams-anthropic/headers took 1.05-1.16x over 120 runs,
// against 1.10x): a median of three crossed it in 3 sets of 40, which
// failed CI now and then; of five, it crosses far less often.
const runs = 5

// TestSim runs every cell of the matrix and holds each to its targets: no
// client failure in any run, and in the median run the makespan within the
// target ratio of the time the limit allows and the upstream's refusals
// within the target share.
func TestSim(t *testing.T) {
	for _, c := range cells() {
		t.Run(c.name, func(t *testing.T) {
			var rs []result
			for range runs {
				rs = append(rs, simulate(t, c))
			}
			ratios := make([]float64, runs)
			refused := make([]float64, runs)
			for i, r := range rs {
				ratios[i], refused[i] = r.ratio(), r.refusedPct()
				if r.failures > 0 {
					t.Errorf("%d client failures; first: %s", r.failures, r.firstFail)
				}
			}
			slices.Sort(ratios)
			slices.Sort(refused)
			v := rs[runs/2].view
			t.Logf("%-28s %.2f–%.2f× (target %.2f×)  %.1f–%.1f%% refused (target %g%%)  bound %q rate %.1f/s from %q conc %d %q",
				c.name, ratios[0], ratios[runs-1], c.ratio, refused[0], refused[runs-1], c.refusals,
				v.Bound, v.AdmittedRate, v.RateFrom, v.Concurrency, v.ConcurrencyFrom)
			if raceBuild {
				return // see raceBuild
			}
			if m := ratios[runs/2]; m > c.ratio {
				t.Errorf("median makespan %.2f× the ideal, target %.2f×", m, c.ratio)
			}
			if m := refused[runs/2]; m > c.refusals {
				t.Errorf("median %.1f%% of upstream requests refused, target %g%%", m, c.refusals)
			}
		})
	}
}

// TestSimClockPhases: a window aligned to the clock meets the run wherever
// in a window the run starts, and the phase decides what the group's first
// refusal says (a 100 ms wait to the end of a 1 s window read as a 10/s
// pace cost 1.15-1.8×; a first window that spanned a boundary, read as
// one, overdrew the next by its excess). Each aligned cell runs once at
// ten phases, 100 ms apart, each held to its targets.
func TestSimClockPhases(t *testing.T) {
	if raceBuild {
		t.Skip("see raceBuild")
	}
	for _, c := range cells() {
		if !c.mock.WindowAligned {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			for i := range 10 {
				c.start = 50*time.Millisecond + time.Duration(i)*100*time.Millisecond
				r := simulate(t, c)
				t.Logf("%-28s from %v past a second: %.2f×, %.1f%% refused", c.name, c.start, r.ratio(), r.refusedPct())
				if r.failures > 0 {
					t.Errorf("from %v: %d client failures; first: %s", c.start, r.failures, r.firstFail)
				}
				if r.ratio() > c.ratio || r.refusedPct() > c.refusals {
					t.Errorf("from %v past a second: %.2f× the ideal, %.1f%% refused; targets %.2f×, %g%%",
						c.start, r.ratio(), r.refusedPct(), c.ratio, c.refusals)
				}
			}
		})
	}
}
