// Command loadbench measures how close llmproxy gets to the time an
// upstream's limits allow, for every way an upstream may (or may not)
// explain its limits.
//
// It runs a matrix of cells named shape/speech. The shape is what the
// upstream (the project's mock, e2e/mockupstream, on loopback) enforces and
// the load sent to it:
//
//	short        chats; a 20 req/s bucket with a one-second burst, 200 ms
//	             answers; 400 requests at client concurrency 50
//	streams      4 req/s, 200 ms to the first chunk, 10 chunks 200 ms apart
//	             (about 1.8 s a stream); 120 at 30
//	concurrency  no rate limit, at most 8 answers in flight, 0.5 s answers;
//	             200 at 50 (ideal rate 16/s)
//	quantized    as short, but the limit headers state the per-minute figure
//	             while a burst over one second's worth is refused
//	tpm          a tokens limit worth 20 requests a second, requests 10×
//	             less limited; 400 at 50
//	configured   the proxy's route configured at 600 RPM (a ceiling) in
//	             front of an upstream that allows 6,000 (with headers: and
//	             says so); 300 at 50, ideal rate 10/s
//	local        a local model server: one model at a time, 2 s to load
//	             one, 4 served at once, 200 ms answers, behind a route
//	             marked local; 300 requests interleaving three models, all
//	             at once (speech "interleaved"); ideal: three loads and
//	             the answers, 21 s
//
// The speech is what the upstream tells about them:
//
//	headers      limit headers, Retry-After and retry-after-ms, "try again
//	             in …" in refusal bodies, concurrency refusals that say so;
//	             for the concurrency shape only Retry-After (no words that
//	             name concurrency, no hint in the body)
//	hint         no limit headers, no Retry-After; the hint in the body (for
//	             the concurrency shape: the hint, no words)
//	silent       no limit headers, no Retry-After, no hint, concurrency not
//	             named
//	silent-503   silent, and every refusal is nginx's default limit_req /
//	             limit_conn answer: 503 with an HTML page
//
// Every shape runs with headers, hint and silent; short and concurrency also
// with silent-503; and streams-anthropic/headers and
// quantized-anthropic/headers drive the streams and quantized shapes on
// /v1/messages with the Anthropic Go SDK (Anthropic's header form). The
// other cells use the OpenAI Go SDK on /v1/chat/completions. Both SDKs are
// unmodified, with their default retries, and read streams to the end.
//
// Each cell runs through the proxy (-runs times, a fresh mock and proxy
// each time), then once straight to a fresh mock for comparison unless
// -direct=false. -n and -c, when given, override every cell's N and C.
//
//	go run ./e2e/loadbench                            # every cell
//	go run ./e2e/loadbench -scenario 'short/*,*/silent' -runs 3
//	go run ./e2e/loadbench -scenario concurrency/ -direct=false -markdown
//
// -scenario takes a comma-separated list of cell names, prefixes ending in
// "/" (short/) and globs (short/*, */silent; "*" alone is every cell).
//
// The universe/* cells are issue 48's rows, upstreams of e2e/universe
// written apart from the mock (which shares the proxy's token rule):
// one bucket shared by four models behind OpenAI's quantized headers,
// prompts counted 3× what tokens.Estimate says, long silent streams whose
// answer times vary, and a silent bucket that charges refusals into debt.
// -universe SEEDS adds a cell draw/<seed> for each e2e/universe draw
// (alone, it runs just those): a seed that TestUniverse in lanequeue/sim
// names replays here on real sockets. Their ideal is the omniscient
// sender's makespan; -bin runs them through a built llmproxy binary
// instead of a proxy in process.
//
//	go run ./e2e/loadbench -scenario 'universe/*'
//	go build -o /tmp/llmproxy ./cmd/llmproxy && go run ./e2e/loadbench -universe 152,26 -bin /tmp/llmproxy
//
// makespan/ideal compares the wall time with N ÷ the allowed rate (requests
// per second, or tokens per second ÷ tokens per request for tpm, or the
// concurrency cap ÷ the answer time for concurrency). "429s" are the
// upstream's refusals whatever their status (the 503s of silent-503
// included). Each proxy row ends with the target for the cell
// (makespan/ideal, refusals as a share of upstream requests, and no client
// failure) and whether every run met it; targets are reported only, the exit
// status does not depend on them. A client failure through the proxy does:
// the command then names the cells and exits 1 (every request through
// the proxy is to succeed; the direct rows' failures fail nothing).
// -markdown also prints the proxy rows as a Markdown table. Each run is
// bounded by -timeout and stops by itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
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

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/internal/benchcells"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/e2e/universe"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/upstream"
)

// target is what a cell should reach through the proxy: makespan at most
// ratio × ideal, upstream refusals at most pct % of upstream requests, and
// no client failure.
type target struct {
	ratio, pct float64
}

// targets holds the target for every cell. quantized/hint and
// quantized/silent have none of their own: without limit headers the
// quantized upstream is the short one, so they take short's.
var targets = map[string]target{
	"short/headers":               {1.05, 1},
	"short/hint":                  {1.05, 5},
	"short/silent":                {1.15, 10},
	"short/silent-503":            {1.15, 10},
	"streams/headers":             {1.1, 3},
	"streams/hint":                {1.1, 10},
	"streams/silent":              {1.2, 15},
	"streams-anthropic/headers":   {1.1, 3},
	"concurrency/headers":         {1.1, 5},
	"concurrency/hint":            {1.1, 5},
	"concurrency/silent":          {1.15, 10},
	"concurrency/silent-503":      {1.15, 10},
	"quantized/headers":           {1.05, 1},
	"quantized/hint":              {1.05, 5},
	"quantized/silent":            {1.15, 10},
	"quantized-anthropic/headers": {1.05, 1},
	"tpm/headers":                 {1.05, 1},
	"tpm/hint":                    {1.05, 5},
	"tpm/silent":                  {1.15, 10},
	// A configured 600 RPM holds within 2 % of the ceiling, with no
	// refusals, whatever the upstream allows or claims.
	"configured/silent":  {1.02, 0},
	"configured/headers": {1.02, 0},
	// A local route interleaving three models: within 1.2× of three loads
	// and the answers.
	"local/interleaved": {1.2, 0},
	// The shapes of issue 31: fixed windows, one limit shared by four
	// models, resets rounded down or on another clock, refusals that
	// count, token headers stating per minute what is enforced per
	// second, silent streams whose answer times vary.
	"window/retry-after":             {1.1, 5},
	"window/gemini":                  {1.1, 5},
	"window/silent":                  {1.3, 10},
	"window/ietf":                    {1.1, 1}, // "keep": the engine before it did 1.09-1.10x here
	"window-aligned/retry-after":     {1.1, 5},
	"window-1s/azure":                {1.1, 5},
	"window-60s/retry-after":         {1.1, 5},
	"shared-models/headers":          {1.05, 2},
	"shared-models/silent":           {1.15, 10},
	"own-models/headers":             {1.05, 1},
	"own-models/silent":              {1.15, 10},
	"own-models-uneven/silent":       {1.15, 10},
	"own-models-sizes/silent":        {1.15, 15}, // not the issue's: what a trial costs limits of their own
	"anthropic-rounded-down/headers": {1.05, 1},
	"anthropic-clock-ahead/headers":  {1.05, 1},
	"anthropic-clock-behind/headers": {1.05, 1},
	"counted/silent":                 {1.15, 5},
	"tpm-quantized/headers":          {1.05, 1},
	"streams-jitter/silent":          {1.15, 5},
}

func (t target) String() string {
	return fmt.Sprintf("≤%g× / ≤%g %%", t.ratio, t.pct)
}

var (
	showFailures int
	traceLanes   bool
)

// traceStates prints each lane's state every 250 ms until stop.
func traceStates(p *proxy.Proxy, mock *mockupstream.Server, stop <-chan struct{}) {
	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		st := mock.Stats()
		for _, v := range p.States() {
			fmt.Fprintf(os.Stderr, "%6.2fs %s queued %3d in flight %2d/%2d pace %6.1f/s admitted %6.1f/s from %-15q bound %-11q paused %-12s %s refused %d/%d\n",
				time.Since(start).Seconds(), v.Model, v.GroupQueued, v.InFlight, v.Concurrency, v.RequestsPerSecond, v.AdmittedRate,
				v.RateFrom, v.Bound, v.PauseReason, v.Shape, st.RateLimited, st.Requests)
		}
	}
}

// result is one run of one cell.
type result struct {
	cell, mode       string
	n, c             int
	makespan, ideal  time.Duration
	failures         int
	upstreamRequests int64
	upstream429      int64 // refusals of the mock's limits, whatever status
	queueP50         time.Duration
	queueP99         time.Duration
	hasQueue         bool
}

func (r result) ratio() float64 { return r.makespan.Seconds() / r.ideal.Seconds() }

// pct429 is the refusals as a share of upstream requests, in percent.
func (r result) pct429() float64 {
	if r.upstreamRequests == 0 {
		return 0
	}
	return 100 * float64(r.upstream429) / float64(r.upstreamRequests)
}

func main() {
	n := flag.Int("n", 0, "requests per run, for every cell (default: each cell's own)")
	c := flag.Int("c", 0, "client concurrency, for every cell (default: each cell's own)")
	rps := flag.Float64("rps", benchcells.DefaultRPS, "upstream limit of the short, quantized and tpm shapes, requests per second (tpm: the same rate in tokens)")
	latency := flag.Duration("latency", benchcells.DefaultLatency, "upstream latency per request of the short, quantized and tpm shapes")
	only := flag.String("scenario", "", "comma-separated cells to run: names, prefixes ending in / and globs such as short/* or */silent (default all)")
	direct := flag.Bool("direct", true, "also send the load straight to the upstream with the SDK's default retries, once per cell")
	runs := flag.Int("runs", 1, "runs of each cell through the proxy, each with a fresh mock and proxy; the table shows the range")
	markdown := flag.Bool("markdown", false, "also print the proxy rows as a Markdown table")
	timeout := flag.Duration("timeout", 3*time.Minute, "bound on each run")
	flag.IntVar(&showFailures, "show-failures", 0, "print the first this many client failures of each run")
	flag.BoolVar(&traceLanes, "trace", false, "print every lane's state every 250 ms to stderr (proxy runs)")
	seeds := flag.String("universe", "", "comma-separated seeds of e2e/universe draws to run as cells draw/<seed> (with the rows universe/*)")
	bin := flag.String("bin", "", "run universe cells through this llmproxy binary instead of a proxy in process")
	flag.Parse()
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "loadbench: -runs must be at least 1")
		os.Exit(2)
	}

	ucells, err := universeCells(*seeds)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(2)
	}
	picked, upicked, err := pickCells(benchcells.Cells(*latency, *rps), ucells, *only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(2)
	}
	if *seeds != "" && *only == "" {
		// -universe alone: just the draws it names.
		picked, upicked = nil, ucells[len(universe.Rows()):]
	}
	// A flag counts as given only if it was on the command line, so that
	// its zero default cannot be mistaken for a choice.
	flag.Visit(func(f *flag.Flag) {
		for i := range picked {
			switch f.Name {
			case "n":
				picked[i].N = *n
			case "c":
				picked[i].C = *c
			}
		}
	})

	fmt.Printf("loadbench: %d cells, %d run(s) each through the proxy; short/quantized/tpm %.0f req/s, latency %v; %s/%s, %d CPUs\n",
		len(picked)+len(upicked), *runs, *rps, *latency, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	var rows []row
	for _, sc := range picked {
		var proxied []result
		for range *runs {
			proxied = append(proxied, run(sc, "proxy", *timeout))
		}
		rows = append(rows, row{cell: sc.Name, mode: "proxy", runs: proxied})
		if *direct {
			rows = append(rows, row{cell: sc.Name, mode: "direct", runs: []result{run(sc, "direct", *timeout)}})
		}
	}
	for _, uc := range upicked {
		var proxied []result
		for range *runs {
			proxied = append(proxied, runUniverse(uc, *bin, *timeout))
		}
		rows = append(rows, row{cell: uc.name, mode: "proxy", runs: proxied})
	}
	printTable(os.Stdout, rows)
	if *markdown {
		fmt.Println()
		printMarkdown(os.Stdout, rows)
	}
	if failedThroughTheProxy(os.Stderr, rows) {
		os.Exit(1)
	}
}

// failedThroughTheProxy says, on w, which cells had a client fail through
// the proxy, and whether any did: every request through the proxy is to
// succeed, so such a run fails the benchmark, whatever its figures. A
// client that failed sending straight to the upstream is what the direct
// rows measure, and fails nothing.
func failedThroughTheProxy(w io.Writer, rows []row) bool {
	failed := false
	for _, r := range rows {
		if n := r.failures(); r.mode == "proxy" && n > 0 {
			fmt.Fprintf(w, "loadbench: %s: %d client failures through the proxy in %d run(s) (-show-failures N prints them)\n", r.cell, n, len(r.runs))
			failed = true
		}
	}
	return failed
}

func run(sc benchcells.Cell, mode string, timeout time.Duration) result {
	n, c := sc.N, sc.C
	mock := mockupstream.New(sc.Mock)
	defer mock.Close()
	openaiBase, anthropicBase := mock.URL()+"/v1", mock.URL()
	if mode == "proxy" {
		u, _ := url.Parse(mock.URL())
		tr := upstream.NewTransport()
		defer tr.CloseIdleConnections()
		cfg := proxy.Config{
			Upstream:   u,
			Routes:     []proxy.Route{{Name: "anthropic", URL: u}},
			MaxRetries: proxy.DefaultMaxRetries,
			Transport:  tr,
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		if sc.Configure != nil {
			sc.Configure(&cfg)
		}
		p, err := proxy.New(cfg)
		if err != nil {
			panic(err)
		}
		front := httptest.NewServer(p)
		defer front.Close()
		openaiBase, anthropicBase = front.URL+"/v1", front.URL+"/anthropic"
		if traceLanes {
			stop := make(chan struct{})
			defer close(stop)
			go traceStates(p, mock, stop)
		}
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c * 2}}
	defer hc.CloseIdleConnections()
	var ask func(ctx context.Context, i int) (*http.Response, error)
	if sc.Anthropic {
		client := anthropic.NewClient(aoption.WithBaseURL(anthropicBase), aoption.WithAPIKey("sk-ant-loadbench"), aoption.WithHTTPClient(hc))
		ask = func(ctx context.Context, i int) (*http.Response, error) {
			return benchcells.Message(ctx, client, i, sc.Stream)
		}
	} else {
		client := openai.NewClient(option.WithBaseURL(openaiBase), option.WithAPIKey("sk-loadbench"), option.WithHTTPClient(hc))
		model := func(int) string { return "gpt-bench" }
		if sc.Model != nil {
			model = sc.Model
		}
		ask = func(ctx context.Context, i int) (*http.Response, error) {
			return benchcells.Chat(ctx, client, i, model(i), sc.Stream)
		}
	}

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
			resp, err := ask(ctx, i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures++
				if failures <= showFailures {
					reportFailure(sc.Name, mode, err)
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
		cell: sc.Name, mode: mode, n: n, c: c, makespan: makespan,
		ideal:    sc.IdealOf(n),
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

// reportFailure prints one client failure with what the SDK kept of it.
func reportFailure(cell, mode string, err error) {
	var oErr *openai.Error
	var aErr *anthropic.Error
	switch {
	case errors.As(err, &oErr):
		fmt.Fprintln(os.Stderr, "failure:", cell, mode, oErr.StatusCode, oErr.Response.Header, oErr.RawJSON())
	case errors.As(err, &aErr):
		fmt.Fprintln(os.Stderr, "failure:", cell, mode, aErr.StatusCode, aErr.Response.Header, aErr.Error())
	default:
		fmt.Fprintln(os.Stderr, "failure:", cell, mode, err)
	}
}

// row is a cell's runs in one mode.
type row struct {
	cell, mode string
	runs       []result
}

// failures is the client failures of all runs together.
func (r row) failures() int {
	total := 0
	for _, x := range r.runs {
		total += x.failures
	}
	return total
}

// target is the cell's target and whether every run met it; has is false
// for direct rows and cells with no target.
func (r row) target() (t target, met, has bool) {
	t, has = targets[r.cell]
	if !has || r.mode != "proxy" {
		return target{}, false, false
	}
	met = true
	for _, x := range r.runs {
		met = met && x.failures == 0 && x.ratio() <= t.ratio && x.pct429() <= t.pct
	}
	return t, met, true
}

// span formats the range of f over the runs: one value if all format
// alike, else "min–max".
func (r row) span(f func(result) float64, format func(float64) string) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range r.runs {
		v := f(x)
		lo, hi = min(lo, v), max(hi, v)
	}
	if a, b := format(lo), format(hi); a != b {
		return a + "–" + b
	}
	return format(lo)
}

func seconds(v float64) string  { return fmt.Sprintf("%.2fs", v) }
func times(v float64) string    { return fmt.Sprintf("%.2f×", v) }
func percent(v float64) string  { return fmt.Sprintf("%.1f%%", v) }
func count(v float64) string    { return strconv.FormatFloat(v, 'f', 0, 64) }
func duration(v float64) string { return time.Duration(v).Round(time.Millisecond).String() }
func metString(met bool) string {
	if met {
		return "yes"
	}
	return "no"
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cell\tmode\truns\tN\tC\tmakespan\tideal\tmakespan/ideal\tclient failures\tupstream 429s\t429 % of N\t429 % of upstream\tqueue p50\tqueue p99\ttarget\tmet\t")
	for _, r := range rows {
		first := r.runs[0]
		q50, q99 := "-", "-"
		if first.hasQueue {
			q50 = r.span(func(x result) float64 { return float64(x.queueP50) }, duration)
			q99 = r.span(func(x result) float64 { return float64(x.queueP99) }, duration)
		}
		tgt, met := "-", "-"
		if t, m, has := r.target(); has {
			tgt, met = t.String(), metString(m)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%.2fs\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.cell, r.mode, len(r.runs), first.n, first.c,
			r.span(func(x result) float64 { return x.makespan.Seconds() }, seconds),
			first.ideal.Seconds(),
			r.span(result.ratio, times),
			r.failures(),
			r.span(func(x result) float64 { return float64(x.upstream429) }, count),
			r.span(func(x result) float64 { return 100 * float64(x.upstream429) / float64(x.n) }, percent),
			r.span(result.pct429, percent),
			q50, q99, tgt, met)
	}
	tw.Flush()
}

// printMarkdown prints the proxy rows for docs/benchmarks.md.
func printMarkdown(w io.Writer, rows []row) {
	fmt.Fprintln(w, "| cell | runs | makespan/ideal | 429 % of upstream | client failures | target | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		if r.mode != "proxy" {
			continue
		}
		tgt, met := "—", "—"
		if t, m, has := r.target(); has {
			tgt, met = t.String(), metString(m)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %d | %s | %s |\n",
			r.cell, len(r.runs), r.span(result.ratio, times),
			r.span(result.pct429, percent), r.failures(), tgt, met)
	}
}
