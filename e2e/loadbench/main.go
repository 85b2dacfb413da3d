// Command loadbench measures how close llmproxy gets to the time an
// upstream's limits allow. It starts the project's mock upstream on
// loopback, drives N chat requests at client concurrency C through the proxy
// with the unmodified OpenAI Go SDK (default retries), then sends the same
// load straight to a fresh mock for comparison, and prints one table row per
// run. Each scenario has its own N and C; -n and -c, when given, override
// them all.
//
//	go run ./e2e/loadbench                       # every scenario
//	go run ./e2e/loadbench -scenario=headers -n=400 -c=50
//	go run ./e2e/loadbench -scenario=quantized,concurrency -direct=false
//
// makespan/ideal compares the wall time with N ÷ the allowed rate (requests
// per second, or tokens per second ÷ tokens per request for TPM-bound
// loads, or the concurrency cap ÷ the answer time for concurrency-bound
// ones). Each run is bounded by -timeout and stops by itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/upstream"
)

// scenario is one upstream shape and the load sent to it.
type scenario struct {
	name string
	mock mockupstream.Config
	// rate is what the upstream allows, in requests per second.
	rate float64
	// n and c are the default requests and client concurrency.
	n, c int
	// stream makes the client ask for streamed answers and read them to
	// the end.
	stream bool
}

const maxTokens = 100

var showFailures int

// prompt is the same size for every request, so each costs the same tokens.
func prompt(i int) string { return fmt.Sprintf("question %06d", i) }

// costPerRequest is what the mock charges a request against TPM: its
// prompt-token rule (ceil(chars/4) + 3 per message) plus max_tokens.
func costPerRequest() int64 {
	return int64((len(prompt(0))+3)/4+3) + maxTokens
}

// scenarios lists every scenario. latency and rps shape the ones about a
// request or token rate; long-streams and concurrency have fixed shapes,
// chosen so that the limit that binds is the one they are named after.
func scenarios(latency time.Duration, rps float64) []scenario {
	rpm := int(rps * 60)
	tpm := int64(rps * 60 * float64(costPerRequest()))
	scs := []scenario{
		{name: "headers", mock: mockupstream.Config{RPM: rpm, Latency: latency}, rate: rps},
		{name: "no-headers", mock: mockupstream.Config{RPM: rpm, Latency: latency, NoHeaders: true}, rate: rps},
		{name: "tpm", mock: mockupstream.Config{TPM: tpm, RPM: rpm * 10, Latency: latency}, rate: rps},
		{name: "tpm-no-headers", mock: mockupstream.Config{TPM: tpm, RPM: rpm * 10, Latency: latency, NoHeaders: true}, rate: rps},
		// The headers say rps×60 a minute, but a burst over one second's
		// worth is refused.
		{name: "quantized", mock: mockupstream.Config{RPM: rpm, Latency: latency, QuantizedHeaders: true}, rate: rps},
	}
	for i := range scs {
		scs[i].n, scs[i].c = 400, 50
	}

	// 4 requests a second, each streamed over about 1.8 s: the answers
	// outlast the refill, so several are always in flight.
	longStreams := mockupstream.Config{RPM: 240, Latency: 200 * time.Millisecond, StreamChunks: 10, ChunkDelay: 200 * time.Millisecond}
	quiet := longStreams
	quiet.NoHeaders = true
	scs = append(scs,
		scenario{name: "long-streams", mock: longStreams, rate: 4, n: 120, c: 30, stream: true},
		scenario{name: "long-streams-no-headers", mock: quiet, rate: 4, n: 120, c: 30, stream: true},
	)

	// No rate limit, only a cap of 8 answers in flight per key: at most
	// the cap ÷ one answer's time = 16 requests a second.
	capped := mockupstream.Config{MaxInFlight: 8, Latency: 500 * time.Millisecond}
	scs = append(scs, scenario{name: "concurrency", mock: capped,
		rate: float64(capped.MaxInFlight) / capped.Latency.Seconds(), n: 200, c: 50})
	return scs
}

// pick returns the scenarios named in list, a comma-separated list, in its
// order; an empty list picks them all.
func pick(all []scenario, list string) ([]scenario, error) {
	if list == "" {
		return all, nil
	}
	var picked []scenario
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(all, func(sc scenario) bool { return sc.name == name })
		if i < 0 {
			return nil, fmt.Errorf("unknown scenario %q; known: %s", name, strings.Join(names(all), ", "))
		}
		picked = append(picked, all[i])
	}
	return picked, nil
}

func names(scs []scenario) []string {
	var ns []string
	for _, sc := range scs {
		ns = append(ns, sc.name)
	}
	return ns
}

type result struct {
	scenario, mode   string
	n, c             int
	makespan, ideal  time.Duration
	failures         int
	upstreamRequests int64
	upstream429      int64
	queueP50         time.Duration
	queueP99         time.Duration
	hasQueue         bool
}

func main() {
	n := flag.Int("n", 0, "requests per run, for every scenario (default: each scenario's own)")
	c := flag.Int("c", 0, "client concurrency, for every scenario (default: each scenario's own)")
	rps := flag.Float64("rps", 20, "upstream limit of the rate scenarios, requests per second (TPM scenarios: the same rate in tokens)")
	latency := flag.Duration("latency", 200*time.Millisecond, "upstream latency per request of the rate scenarios")
	only := flag.String("scenario", "", "comma-separated scenarios to run (default all)")
	direct := flag.Bool("direct", true, "also send the load straight to the upstream with the SDK's default retries")
	timeout := flag.Duration("timeout", 3*time.Minute, "bound on each run")
	flag.IntVar(&showFailures, "show-failures", 0, "print the first this many client failures")
	flag.Parse()

	all := scenarios(*latency, *rps)
	picked, err := pick(all, *only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(2)
	}
	// A flag counts as given only if it was on the command line, so that
	// its zero default cannot be mistaken for a choice.
	flag.Visit(func(f *flag.Flag) {
		for i := range picked {
			switch f.Name {
			case "n":
				picked[i].n = *n
			case "c":
				picked[i].c = *c
			}
		}
	})

	fmt.Printf("loadbench: rate scenarios %.0f req/s, latency %v; %s/%s, %d CPUs\n",
		*rps, *latency, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	var results []result
	for _, sc := range picked {
		results = append(results, run(sc, "proxy", *timeout))
		if *direct {
			results = append(results, run(sc, "direct", *timeout))
		}
	}
	print(os.Stdout, results)
}

func run(sc scenario, mode string, timeout time.Duration) result {
	n, c := sc.n, sc.c
	mock := mockupstream.New(sc.mock)
	defer mock.Close()
	base := mock.URL()
	if mode == "proxy" {
		u, _ := url.Parse(mock.URL())
		tr := upstream.NewTransport()
		defer tr.CloseIdleConnections()
		p, err := proxy.New(proxy.Config{
			Upstream:  u,
			Transport: tr,
			Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			panic(err)
		}
		front := httptest.NewServer(p)
		defer front.Close()
		base = front.URL
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c * 2}}
	defer hc.CloseIdleConnections()
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("sk-loadbench"), option.WithHTTPClient(hc))

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var mu sync.Mutex
	var failures int
	var waits []time.Duration
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := chat(ctx, client, i, sc.stream)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures++
				if failures <= showFailures {
					var apiErr *openai.Error
					if errors.As(err, &apiErr) {
						fmt.Fprintln(os.Stderr, "failure:", apiErr.StatusCode, apiErr.Response.Header, apiErr.RawJSON())
					} else {
						fmt.Fprintln(os.Stderr, "failure:", err)
					}
				}
				return
			}
			if ms, perr := strconv.ParseInt(resp.Header.Get("X-Llmproxy-Queue-Ms"), 10, 64); perr == nil {
				waits = append(waits, time.Duration(ms)*time.Millisecond)
			}
		}()
	}
	wg.Wait()
	makespan := time.Since(start)
	st := mock.Stats()
	r := result{
		scenario: sc.name, mode: mode, n: n, c: c, makespan: makespan,
		ideal:    time.Duration(float64(n) / sc.rate * float64(time.Second)),
		failures: failures, upstreamRequests: st.Requests, upstream429: st.RateLimited,
	}
	if len(waits) > 0 {
		slices.Sort(waits)
		r.hasQueue = true
		r.queueP50 = waits[len(waits)/2]
		r.queueP99 = waits[min(len(waits)-1, len(waits)*99/100)]
	}
	return r
}

// chat sends request i, reads the whole answer and returns the response
// whose headers carry the proxy's queue wait.
func chat(ctx context.Context, client openai.Client, i int, stream bool) (*http.Response, error) {
	params := openai.ChatCompletionNewParams{
		Model:     "gpt-bench",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt(i))},
		MaxTokens: openai.Int(maxTokens),
	}
	var resp *http.Response
	if !stream {
		_, err := client.Chat.Completions.New(ctx, params, option.WithResponseInto(&resp))
		return resp, err
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
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

func print(w io.Writer, rs []result) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tmode\tN\tC\tmakespan\tideal\tmakespan/ideal\tclient failures\tupstream 429s\t429 % of N\t429 % of upstream\tqueue p50\tqueue p99\t")
	for _, r := range rs {
		q50, q99 := "-", "-"
		if r.hasQueue {
			q50, q99 = r.queueP50.Round(time.Millisecond).String(), r.queueP99.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2fs\t%.2fs\t%.2f×\t%d\t%d\t%s\t%s\t%s\t%s\t\n",
			r.scenario, r.mode, r.n, r.c, r.makespan.Seconds(), r.ideal.Seconds(),
			r.makespan.Seconds()/r.ideal.Seconds(), r.failures, r.upstream429,
			percent(r.upstream429, int64(r.n)), percent(r.upstream429, r.upstreamRequests), q50, q99)
	}
	tw.Flush()
}

// percent is part ÷ whole as a percentage, or "-" when whole is 0.
func percent(part, whole int64) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(whole))
}
