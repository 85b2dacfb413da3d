// Command loadbench measures how close llmproxy gets to the time an
// upstream's rate limits allow. It starts the project's mock upstream on
// loopback, drives N chat requests at client concurrency C through the proxy
// with the unmodified OpenAI Go SDK (default retries), then sends the same
// load straight to a fresh mock for comparison, and prints one table row per
// run.
//
//	go run ./e2e/loadbench                 # every scenario
//	go run ./e2e/loadbench -scenario=headers -n=400 -c=50
//
// makespan/ideal compares the wall time with N ÷ the allowed rate (requests
// per second, or tokens per second ÷ tokens per request for TPM-bound
// loads). Each run is bounded by -timeout and stops by itself.
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
	"sync"
	"text/tabwriter"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/upstream"
)

// scenario is one upstream shape.
type scenario struct {
	name string
	mock mockupstream.Config
	// rate is what the upstream allows, in requests per second.
	rate float64
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

func scenarios(latency time.Duration, rps float64) []scenario {
	rpm := int(rps * 60)
	tpm := int64(rps * 60 * float64(costPerRequest()))
	return []scenario{
		{name: "headers", mock: mockupstream.Config{RPM: rpm, Latency: latency}, rate: rps},
		{name: "no-headers", mock: mockupstream.Config{RPM: rpm, Latency: latency, NoHeaders: true}, rate: rps},
		{name: "tpm", mock: mockupstream.Config{TPM: tpm, RPM: rpm * 10, Latency: latency}, rate: rps},
		{name: "tpm-no-headers", mock: mockupstream.Config{TPM: tpm, RPM: rpm * 10, Latency: latency, NoHeaders: true}, rate: rps},
	}
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
	n := flag.Int("n", 400, "requests per run")
	c := flag.Int("c", 50, "client concurrency")
	rps := flag.Float64("rps", 20, "upstream limit, requests per second (TPM scenarios: the same rate in tokens)")
	latency := flag.Duration("latency", 200*time.Millisecond, "upstream latency per request")
	only := flag.String("scenario", "", "run only this scenario (headers, no-headers, tpm, tpm-no-headers)")
	direct := flag.Bool("direct", true, "also send the load straight to the upstream with the SDK's default retries")
	timeout := flag.Duration("timeout", 3*time.Minute, "bound on each run")
	flag.IntVar(&showFailures, "show-failures", 0, "print the first this many client failures")
	flag.Parse()

	fmt.Printf("loadbench: N=%d C=%d limit=%.0f req/s latency=%v; %s/%s, %d CPUs\n",
		*n, *c, *rps, *latency, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	var results []result
	for _, sc := range scenarios(*latency, *rps) {
		if *only != "" && sc.name != *only {
			continue
		}
		results = append(results, run(sc, "proxy", *n, *c, *timeout))
		if *direct {
			results = append(results, run(sc, "direct", *n, *c, *timeout))
		}
	}
	print(os.Stdout, results)
}

func run(sc scenario, mode string, n, c int, timeout time.Duration) result {
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
			var resp *http.Response
			_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:     "gpt-bench",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt(i))},
				MaxTokens: openai.Int(maxTokens),
			}, option.WithResponseInto(&resp))
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

func print(w io.Writer, rs []result) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tmode\tN\tC\tmakespan\tideal\tmakespan/ideal\tclient failures\tupstream 429s\t429 % of N\tqueue p50\tqueue p99\t")
	for _, r := range rs {
		q50, q99 := "-", "-"
		if r.hasQueue {
			q50, q99 = r.queueP50.Round(time.Millisecond).String(), r.queueP99.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2fs\t%.2fs\t%.2f×\t%d\t%d\t%.1f%%\t%s\t%s\t\n",
			r.scenario, r.mode, r.n, r.c, r.makespan.Seconds(), r.ideal.Seconds(),
			r.makespan.Seconds()/r.ideal.Seconds(), r.failures, r.upstream429,
			100*float64(r.upstream429)/float64(r.n), q50, q99)
	}
	tw.Flush()
}
