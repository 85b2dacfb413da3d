// Command fairbench measures fair turns (x-llmproxy-client): how long a
// small run on a key takes while a big run on the same key has the lane's
// queue full, through the real llmproxy binary, against the project's mock
// upstream (e2e/mockupstream) limited to -rate requests a second.
//
// It runs three variants, each with a fresh mock and a fresh llmproxy:
//
//	named     the big run (-n requests at client concurrency -c) and, -start
//	          after it began, the small run (-small at -small-c), each
//	          naming its client: x-llmproxy-client: big, small
//	unnamed   the same two runs, naming none: the lane is one FIFO
//	alone     the small run alone, against an upstream limited to half the
//	          rate: the time the small run should take with its fair share
//
// It prints the small run's time in each variant against alone's (the
// target: within -slack of it), and the big run's against its ideal, -n ÷
// -rate (the target: no more than the small run's share more, (-n + -small)
// ÷ -rate). Targets are reported only; the exit status says only whether
// every variant ran. Each variant is bounded by -timeout.
//
//	go run ./e2e/fairbench                               # the figures, about 5 minutes
//	go run ./e2e/fairbench -n 300 -start 2s -variants named,alone
//
// The llmproxy binary is built from this module unless -bin names one.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/internal/benchcells"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/lanequeue"
)

// options are the command's flags.
type options struct {
	n, c, small, smallC int
	rate                float64
	start, latency      time.Duration
	slack, timeout      time.Duration
	bin                 string
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 3000, "requests of the big run")
	flag.IntVar(&o.c, "c", 500, "client concurrency of the big run")
	flag.IntVar(&o.small, "small", 10, "requests of the small run")
	flag.IntVar(&o.smallC, "small-c", 2, "client concurrency of the small run")
	flag.Float64Var(&o.rate, "rate", 20, "the upstream's limit, requests a second, for the key (alone: half of it)")
	flag.DurationVar(&o.start, "start", 5*time.Second, "when the small run starts, after the big run began")
	flag.DurationVar(&o.latency, "latency", benchcells.DefaultLatency, "the upstream's answer time")
	flag.DurationVar(&o.slack, "slack", 2*time.Second, "how much longer than alone the small run may take (the target)")
	flag.DurationVar(&o.timeout, "timeout", 6*time.Minute, "bound on each variant")
	flag.StringVar(&o.bin, "bin", "", "the llmproxy binary (default: built from this module into a temporary directory)")
	variants := flag.String("variants", "named,unnamed,alone", "comma-separated variants to run: named, unnamed, alone")
	flag.Parse()
	if err := run(o, strings.Split(*variants, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "fairbench:", err)
		os.Exit(1)
	}
}

func run(o options, variants []string) error {
	for _, v := range variants {
		if !slices.Contains([]string{"named", "unnamed", "alone"}, v) {
			return fmt.Errorf("unknown variant %q (named, unnamed, alone)", v)
		}
	}
	if o.n < 1 || o.c < 1 || o.small < 1 || o.smallC < 1 || o.rate <= 0 {
		return errors.New("-n, -c, -small, -small-c and -rate must be positive")
	}
	if o.bin == "" {
		dir, err := os.MkdirTemp("", "fairbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if o.bin, err = build(dir); err != nil {
			return err
		}
	}
	fmt.Printf("fairbench: big run %d at -j %d, small run %d at -j %d from %v on; upstream %.0f req/s for the key (alone: %.0f), answers in %v; %s/%s, %d CPUs\n",
		o.n, o.c, o.small, o.smallC, o.start, o.rate, o.rate/2, o.latency, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	results := map[string]outcome{}
	for _, v := range variants {
		r, err := o.variant(v)
		if err != nil {
			return fmt.Errorf("%s: %w", v, err)
		}
		results[v] = r
		fmt.Printf("%-8s %s\n", v, r.summary(o))
	}
	report(os.Stdout, o, variants, results)
	return nil
}

// outcome is what one variant measured.
type outcome struct {
	small, big     time.Duration // each run's time, first request to last answer; 0: not run
	failures       int           // client requests that failed, both runs
	upstream, r429 int64         // upstream requests and refusals
	clients        []lanequeue.ClientState
}

func (r outcome) summary(o options) string {
	s := fmt.Sprintf("small run %.2fs", r.small.Seconds())
	if r.big > 0 {
		s += fmt.Sprintf(", big run %.2fs (ideal %.2fs)", r.big.Seconds(), float64(o.n)/o.rate)
	}
	s += fmt.Sprintf("; %d client failures; upstream %d requests, %d refused", r.failures, r.upstream, r.r429)
	for _, c := range r.clients {
		s += fmt.Sprintf("; /lanes client %q dispatched %d", c.Name, c.Dispatched)
	}
	return s
}

// report prints the small run against alone and the big run against its
// ideal, with the targets and whether they were met.
func report(w io.Writer, o options, variants []string, results map[string]outcome) {
	alone, haveAlone := results["alone"]
	bigIdeal := float64(o.n) / o.rate
	bigAllowed := float64(o.n+o.small) / o.rate
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| variant | small run | alone at half the rate | small − alone | big run | big ideal | big allowed | big/ideal | client failures |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, v := range variants {
		r := results[v]
		if v == "alone" {
			continue
		}
		ref, diff := "—", "—"
		if haveAlone {
			ref = fmt.Sprintf("%.2fs", alone.small.Seconds())
			d := r.small - alone.small
			diff = fmt.Sprintf("%+.2fs (%s)", d.Seconds(), met(d <= o.slack))
		}
		fmt.Fprintf(w, "| %s | %.2fs | %s | %s | %.2fs (%s) | %.2fs | %.2fs | %.3f× | %d |\n",
			v, r.small.Seconds(), ref, diff, r.big.Seconds(), met(r.big.Seconds() <= bigAllowed),
			bigIdeal, bigAllowed, r.big.Seconds()/bigIdeal, r.failures)
	}
	fmt.Fprintf(w, "\ntargets: the small run within %v of alone; the big run within its ideal plus the small run's share, %.2fs\n", o.slack, bigAllowed)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// variant runs one variant with a fresh mock and llmproxy.
func (o options) variant(v string) (outcome, error) {
	rate := o.rate
	if v == "alone" {
		rate /= 2
	}
	mock := mockupstream.New(mockupstream.Config{RPM: int(rate * 60), Latency: o.latency})
	defer mock.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	p, err := startLLMProxy(ctx, o.bin, mock.URL())
	if err != nil {
		return outcome{}, err
	}
	defer p.stop()

	name := func(client string) string {
		if v == "named" {
			return client
		}
		return ""
	}
	var r outcome
	var big load
	bigDone := make(chan struct{})
	if v != "alone" {
		go func() {
			defer close(bigDone)
			big = p.load(ctx, "big", o.n, o.c, name("big"))
		}()
		select {
		case <-time.After(o.start):
		case <-ctx.Done():
		}
	} else {
		close(bigDone)
	}
	small := p.load(ctx, "small", o.small, o.smallC, name("small"))
	<-bigDone
	st := mock.Stats()
	r.small, r.big, r.failures = small.took, big.took, small.failures+big.failures
	r.upstream, r.r429 = st.Requests, st.RateLimited
	if v == "named" {
		r.clients = p.clients()
	}
	return r, ctx.Err()
}

// load is what one run measured.
type load struct {
	took     time.Duration
	failures int
}

// load sends n chats with the OpenAI SDK, c at a time, naming client when
// it is not "", and reads each answer whole.
func (p *llmproxy) load(ctx context.Context, label string, n, c int, client string) load {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c * 2}}
	defer hc.CloseIdleConnections()
	opts := []option.RequestOption{option.WithBaseURL("http://" + p.addr + "/v1"), option.WithAPIKey("sk-fairbench"), option.WithHTTPClient(hc)}
	if client != "" {
		opts = append(opts, option.WithHeader("X-Llmproxy-Client", client))
	}
	sdk := openai.NewClient(opts...)
	var mu sync.Mutex
	var l load
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := benchcells.Chat(ctx, sdk, i, "gpt-fair", false); err != nil {
				mu.Lock()
				if l.failures++; l.failures <= 3 {
					fmt.Fprintf(os.Stderr, "fairbench: %s request %d: %v\n", label, i, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	l.took = time.Since(start)
	return l
}

// llmproxy is a running llmproxy process and where it listens.
type llmproxy struct {
	cmd         *exec.Cmd
	addr, admin string
	exited      chan struct{}
}

// The start-up line's addresses.
var (
	addrRE  = regexp.MustCompile(`(?:^|\s)addr=([0-9.:]+)`)
	adminRE = regexp.MustCompile(`(?:^|\s)admin=([0-9.:]+)`)
)

// startLLMProxy starts bin in front of upstream, on loopback ports of its
// choosing, and waits for the line that says where it listens.
func startLLMProxy(ctx context.Context, bin, upstream string) (*llmproxy, error) {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if up := strings.ToUpper(name); !strings.HasPrefix(up, "LLMPROXY_") && !strings.HasSuffix(up, "_PROXY") {
			env = append(env, kv)
		}
	}
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(env, "LLMPROXY_ADDR=127.0.0.1:0", "LLMPROXY_ADMIN_ADDR=127.0.0.1:0", "LLMPROXY_UPSTREAM="+upstream,
		"LLMPROXY_ROUTES=", "LLMPROXY_LOG_LEVEL=info", "LLMPROXY_SHUTDOWN_TIMEOUT=2s")
	cmd.WaitDelay = 3 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &llmproxy{cmd: cmd, exited: make(chan struct{})}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if line := sc.Text(); strings.Contains(line, "llmproxy listening") {
				select {
				case listening <- line:
				default:
				}
			}
		}
	}()
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	select {
	case line := <-listening:
		a, b := addrRE.FindStringSubmatch(line), adminRE.FindStringSubmatch(line)
		if a == nil || b == nil {
			p.stop()
			return nil, fmt.Errorf("no addr= or admin= in %q", line)
		}
		p.addr, p.admin = a[1], b[1]
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("llmproxy exited at start: %v", cmd.ProcessState)
	case <-time.After(15 * time.Second):
		p.stop()
		return nil, errors.New("llmproxy did not say where it listens within 15s")
	}
}

// stop kills the process and waits for it.
func (p *llmproxy) stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// clients is the lane's clients as /lanes shows them (the one lane the
// runs share).
func (p *llmproxy) clients() []lanequeue.ClientState {
	resp, err := http.Get("http://" + p.admin + "/lanes")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct{ Lanes []lanequeue.State }
	if json.NewDecoder(resp.Body).Decode(&body) != nil || len(body.Lanes) != 1 {
		return nil
	}
	return body.Lanes[0].Clients
}

// build builds ./cmd/llmproxy of this module into dir.
func build(dir string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m: %w (run from inside the module)", err)
	}
	bin := filepath.Join(dir, "llmproxy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/llmproxy")
	cmd.Dir = strings.TrimSpace(string(out))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/llmproxy: %w\n%s", err, out)
	}
	return bin, nil
}
