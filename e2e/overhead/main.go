// Command overhead measures what the proxy costs when nothing is limited,
// against nginx doing the same job: small JSON chats and SSE streams sent
// straight to the project's mock upstream (no limits, answers at once),
// through llmproxy, through go-floor (the standard library's
// httputil.ReverseProxy with llmproxy's transport: what any proxy on
// net/http costs) and through nginx (proxy_pass with a keep-alive pool,
// one worker), interleaved in every round so that the machine's drift
// falls on all alike.
//
//	go run ./e2e/overhead                 # 3 rounds of 5 s per load
//	go run ./e2e/overhead -rounds 1 -duration 2s
//
// Loads: chats by wrk at 32 and 256 connections (throughput), chats by
// hey at 8 connections (latency), and SSE streams of 20 chunks 2 ms apart
// at 8 connections from a Go client (time to first and last byte). For
// each it prints requests a second, p50 and p99 latency and what each
// adds to a direct call, the CPU seconds each process under test spent
// per 1,000 requests (from /proc; the mock and the load generators are
// shared by all three), and the ratios to nginx; then each process's
// peak RSS. Medians over the rounds. wrk, hey and nginx come from
// Debian's packages (apt-get install -y wrk hey nginx).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

const (
	chatPath = "/v1/chat/completions"
	apiKey   = "sk-overhead-bench"
	chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	sseBody  = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`
)

// target is one way to the mock: direct, or through a process under test.
type target struct {
	name string
	base string // http://host:port
	pid  int    // 0: the mock itself (its CPU is the driver's)
}

// sample is one load's figures against one target in one round.
type sample struct {
	rps       float64
	p50, p99  time.Duration
	last50    time.Duration // SSE: time to the last byte
	cpuPer1k  float64       // CPU seconds per 1,000 requests; -1 unknown
	userShare float64       // the share of that CPU spent in user space
	requests  int
	failed    int
	p99Last   time.Duration
}

type load struct {
	name string
	run  func(ctx context.Context, t target, d time.Duration) (sample, error)
}

func main() {
	if serveFloor() {
		return
	}
	os.Exit(realMain())
}

func realMain() int {
	rounds := flag.Int("rounds", 3, "rounds; each runs every load against every target, in a rotating order")
	duration := flag.Duration("duration", 5*time.Second, "how long each load runs against each target")
	bin := flag.String("bin", "", "an llmproxy binary to use instead of building ./cmd/llmproxy")
	profile := flag.String("profile", "", "a directory: instead of measuring, profile llmproxy under wrk at 32 connections for -duration and write its CPU, allocation, heap, mutex and block profiles there")
	flag.Parse()
	tools := []string{"wrk", "hey", "nginx"}
	if *profile != "" {
		tools = tools[:1] // only wrk loads it
	}
	for _, tool := range tools {
		if _, err := lookTool(tool); err != nil {
			fmt.Fprintf(os.Stderr, "overhead: %s not found (apt-get install -y wrk hey nginx)\n", tool)
			return 2
		}
	}
	tmp, err := os.MkdirTemp("", "overhead-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if *bin == "" {
		*bin = filepath.Join(tmp, "llmproxy")
		build := exec.Command("go", "build", "-o", *bin, "./cmd/llmproxy")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "overhead: build:", err)
			return 1
		}
	}
	mock := mockupstream.New(mockupstream.Config{StreamChunks: 20, ChunkDelay: 2 * time.Millisecond})
	defer mock.Close()
	proxy, err := startProxy(*bin, mock.URL(), *profile != "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		return 1
	}
	defer proxy.stop()
	script := filepath.Join(tmp, "post.lua")
	if err := os.WriteFile(script, []byte(wrkScript()), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		return 1
	}
	if *profile != "" {
		if err := profileUnderLoad(proxy, script, *duration, *profile); err != nil {
			fmt.Fprintln(os.Stderr, "overhead:", err)
			return 1
		}
		return 0
	}
	ngx, err := startNginx(tmp, mock.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		return 1
	}
	defer ngx.stop()
	floor, err := startFloor(mock.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		return 1
	}
	defer floor.stop()
	// nginx last: the ratios are to it.
	targets := []target{{"direct", mock.URL(), 0}, {"llmproxy", proxy.base, proxy.pid()},
		{"go-floor", floor.base, floor.pid()}, {"nginx", ngx.base, ngx.pid()}}
	loads := []load{
		{"chat, wrk 32 connections", wrkLoad(script, 32)},
		{"chat, wrk 256 connections", wrkLoad(script, 256)},
		{"chat, hey 8 connections", heyLoad(8)},
		{"SSE, 8 connections", sseLoad(8)},
	}
	fmt.Fprintf(os.Stderr, "overhead: %d rounds of %v per load and target; mock %s, llmproxy %s, nginx %s\n",
		*rounds, *duration, mock.URL(), proxy.base, ngx.base)
	results := measure(loads, targets, *rounds, *duration)
	printTable(loads, targets, results)
	fmt.Printf("\npeak RSS: llmproxy %s, go-floor %s, nginx %s\n", peakRSS(proxy.pid()), peakRSS(floor.pid()), peakRSS(ngx.pid()))
	return 0
}

// measure runs every load against every target, rounds times, rotating
// which target goes first; results[load][target] holds each round's.
func measure(loads []load, targets []target, rounds int, d time.Duration) [][][]sample {
	results := make([][][]sample, len(loads))
	for li := range loads {
		results[li] = make([][]sample, len(targets))
	}
	for round := range rounds {
		for li, l := range loads {
			for k := range targets {
				ti := (k + round) % len(targets)
				ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
				s, err := l.run(ctx, targets[ti], d)
				cancel()
				if err != nil {
					fmt.Fprintf(os.Stderr, "  round %d, %s, %s: %v\n", round+1, l.name, targets[ti].name, err)
					continue
				}
				fmt.Fprintf(os.Stderr, "  round %d, %-26s %-8s %8.0f req/s  p50 %-9v p99 %-9v cpu/1k %.3fs (%.0f %% user)  failed %d\n",
					round+1, l.name, targets[ti].name, s.rps, s.p50, s.p99, s.cpuPer1k, 100*s.userShare, s.failed)
				results[li][ti] = append(results[li][ti], s)
			}
		}
	}
	return results
}

// withCPU runs f and adds the CPU seconds t's process spent per 1,000 of
// the requests f made.
func withCPU(t target, f func() (sample, error)) (sample, error) {
	u0, s0 := cpuSplit(t.pid)
	s, err := f()
	u1, s1 := cpuSplit(t.pid)
	s.cpuPer1k = -1
	if t.pid > 0 && u0 >= 0 && u1 >= 0 && s.requests > 0 {
		spent := u1 - u0 + s1 - s0
		s.cpuPer1k = spent / float64(s.requests) * 1000
		if spent > 0 {
			s.userShare = (u1 - u0) / spent
		}
	}
	return s, err
}

func wrkScript() string {
	return fmt.Sprintf(`wrk.method = "POST"
wrk.body = %q
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
`, chatBody, apiKey)
}

var (
	wrkRPS      = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkTotal    = regexp.MustCompile(`(\d+) requests in`)
	wrkNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkErrors   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkPercent  = regexp.MustCompile(`(?m)^\s+(50|99)(?:\.000)?%\s+([0-9.]+)(us|ms|s)\s*$`)
	heyRPS      = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	heyPercent  = regexp.MustCompile(`(?m)^\s+(50|99)%+ in ([0-9.]+) secs`)
	heyStatuses = regexp.MustCompile(`(?m)^\s+\[(\d+)\]\s+(\d+) responses`)
)

// wrkLoad is chats by wrk at c connections (2 threads).
func wrkLoad(script string, c int) func(context.Context, target, time.Duration) (sample, error) {
	return func(ctx context.Context, t target, d time.Duration) (sample, error) {
		return withCPU(t, func() (sample, error) {
			secs := strconv.Itoa(max(1, int(d.Seconds())))
			out, err := exec.CommandContext(ctx, "wrk", "-t2", "-c"+strconv.Itoa(c), "-d"+secs+"s", "--latency",
				"-s", script, t.base+chatPath).CombinedOutput()
			if err != nil {
				return sample{}, fmt.Errorf("wrk: %v: %s", err, out)
			}
			return parseWrk(string(out))
		})
	}
}

func parseWrk(out string) (sample, error) {
	var s sample
	m := wrkRPS.FindStringSubmatch(out)
	n := wrkTotal.FindStringSubmatch(out)
	if m == nil || n == nil {
		return s, fmt.Errorf("wrk printed no rate: %q", out)
	}
	s.rps, _ = strconv.ParseFloat(m[1], 64)
	s.requests, _ = strconv.Atoi(n[1])
	if m := wrkNon2xx.FindStringSubmatch(out); m != nil {
		s.failed, _ = strconv.Atoi(m[1])
	}
	if m := wrkErrors.FindStringSubmatch(out); m != nil {
		for _, v := range m[1:] {
			k, _ := strconv.Atoi(v)
			s.failed += k
		}
	}
	for _, m := range wrkPercent.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[m[3]]
		if m[1] == "50" {
			s.p50 = time.Duration(v * float64(unit))
		} else {
			s.p99 = time.Duration(v * float64(unit))
		}
	}
	return s, nil
}

// heyLoad is chats by hey at c connections.
func heyLoad(c int) func(context.Context, target, time.Duration) (sample, error) {
	return func(ctx context.Context, t target, d time.Duration) (sample, error) {
		return withCPU(t, func() (sample, error) {
			out, err := exec.CommandContext(ctx, "hey", "-z", d.String(), "-c", strconv.Itoa(c), "-m", "POST",
				"-T", "application/json", "-H", "Authorization: Bearer "+apiKey, "-d", chatBody, t.base+chatPath).CombinedOutput()
			if err != nil {
				return sample{}, fmt.Errorf("hey: %v: %s", err, out)
			}
			return parseHey(string(out))
		})
	}
}

func parseHey(out string) (sample, error) {
	var s sample
	m := heyRPS.FindStringSubmatch(out)
	if m == nil {
		return s, fmt.Errorf("hey printed no rate: %q", out)
	}
	s.rps, _ = strconv.ParseFloat(m[1], 64)
	for _, m := range heyPercent.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		if m[1] == "50" {
			s.p50 = time.Duration(v * float64(time.Second))
		} else {
			s.p99 = time.Duration(v * float64(time.Second))
		}
	}
	for _, m := range heyStatuses.FindAllStringSubmatch(out, -1) {
		k, _ := strconv.Atoi(m[2])
		s.requests += k
		if m[1] != "200" {
			s.failed += k
		}
	}
	if strings.Contains(out, "Error distribution") {
		s.failed++ // at least one; hey lists them below
	}
	return s, nil
}

// sseLoad streams chats at c connections for d: p50 and p99 of the time
// to the first data line (p50, p99) and to the stream's end (last50,
// p99Last).
func sseLoad(c int) func(context.Context, target, time.Duration) (sample, error) {
	return func(ctx context.Context, t target, d time.Duration) (sample, error) {
		return withCPU(t, func() (sample, error) { return streamFor(ctx, t, c, d) })
	}
}

func streamFor(ctx context.Context, t target, c int, d time.Duration) (sample, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c, Proxy: nil}}
	defer client.CloseIdleConnections()
	type timing struct{ first, last time.Duration }
	got := make(chan []timing, c)
	failed := make(chan int, c)
	end := time.Now().Add(d)
	for range c {
		go func() {
			var mine []timing
			bad := 0
			for time.Now().Before(end) && ctx.Err() == nil {
				first, last, err := oneStream(ctx, client, t.base+chatPath)
				if err != nil {
					bad++
					continue
				}
				mine = append(mine, timing{first, last})
			}
			got <- mine
			failed <- bad
		}()
	}
	var firsts, lasts []time.Duration
	s := sample{}
	for range c {
		for _, tm := range <-got {
			firsts, lasts = append(firsts, tm.first), append(lasts, tm.last)
		}
		s.failed += <-failed
	}
	s.requests = len(firsts) + s.failed
	if len(firsts) == 0 {
		return s, errors.New("no stream completed")
	}
	s.rps = float64(len(firsts)) / d.Seconds()
	s.p50, s.p99 = percentile(firsts, 50), percentile(firsts, 99)
	s.last50, s.p99Last = percentile(lasts, 50), percentile(lasts, 99)
	return s, nil
}

// oneStream sends one streamed chat and times its first data line and
// its end.
func oneStream(ctx context.Context, client *http.Client, url string) (first, last time.Duration, err error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(sseBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if first == 0 && strings.HasPrefix(line, "data:") {
			first = time.Since(start)
		}
		if line == "data: [DONE]" {
			break
		}
	}
	if first == 0 {
		return 0, 0, errors.New("no data line")
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return first, time.Since(start), sc.Err()
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)]
}

// cpuSeconds is the user plus system CPU time of process pid, from
// /proc/pid/stat; -1 when not known.
func cpuSeconds(pid int) float64 {
	user, sys := cpuSplit(pid)
	if user < 0 {
		return -1
	}
	return user + sys
}

// cpuSplit is process pid's user and system CPU seconds, from
// /proc/pid/stat; -1, -1 when not known.
func cpuSplit(pid int) (user, sys float64) {
	if pid <= 0 {
		return -1, -1
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1, -1
	}
	// Fields after the command (in parentheses, which may hold spaces).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return -1, -1
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return utime / 100, stime / 100 // USER_HZ is 100 on Linux
}

// peakRSS is process pid's VmHWM.
func peakRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.Fields(v)[0])
			return fmt.Sprintf("%.1f MiB", float64(kb)/1024)
		}
	}
	return "?"
}

// freePort is a loopback port nobody listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// process is a started process under test and where it listens.
type process struct {
	cmd   *exec.Cmd
	base  string
	admin string // host:port of llmproxy's admin listener; "" when off
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// startProxy starts llmproxy in front of upstream with its defaults, on
// a free loopback port, and waits until it answers. With profiling its
// admin listener serves /debug/pprof/ on another free port.
func startProxy(bin, upstream string, profiling bool) (*process, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	admin := ""
	if profiling {
		ap, err := freePort()
		if err != nil {
			return nil, err
		}
		admin = "127.0.0.1:" + strconv.Itoa(ap)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(cleanEnv(), "LLMPROXY_ADDR=127.0.0.1:"+strconv.Itoa(port), "LLMPROXY_ADMIN_ADDR="+admin,
		"LLMPROXY_UPSTREAM="+upstream, "LLMPROXY_ROUTES=", "LLMPROXY_PPROF="+strconv.FormatBool(profiling))
	p := &process{cmd: cmd, base: "http://127.0.0.1:" + strconv.Itoa(port), admin: admin}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return p, p.waitUp()
}

// startNginx starts nginx (one process, no master) as a reverse proxy to
// upstream with a keep-alive pool, and waits until it answers.
func startNginx(dir, upstream string) (*process, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	host := strings.TrimPrefix(upstream, "http://")
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream mock { server %[2]s; keepalive 256; }
  server {
    listen 127.0.0.1:%[3]d;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, dir, host, port)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	bin, _ := lookTool("nginx")
	cmd := exec.Command(bin, "-p", dir, "-c", path)
	cmd.Stderr = os.Stderr
	p := &process{cmd: cmd, base: "http://127.0.0.1:" + strconv.Itoa(port)}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return p, p.waitUp()
}

// waitUp waits until a chat through p answers 200.
func (p *process) waitUp() error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest("POST", p.base+chatPath, strings.NewReader(chatBody))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	return fmt.Errorf("%s did not answer within 15 s", p.cmd.Path)
}

// cleanEnv is the environment without LLMPROXY_* and proxy settings.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		up := strings.ToUpper(name)
		if !strings.HasPrefix(up, "LLMPROXY_") && !strings.HasSuffix(up, "_PROXY") {
			env = append(env, kv)
		}
	}
	return env
}

// printTable prints, per load, each target's medians and the ratios to
// nginx.
func printTable(loads []load, targets []target, results [][][]sample) {
	fmt.Println("| load | target | req/s | p50 | p99 | added p50 / p99 | CPU s per 1k req | vs nginx: req/s, CPU |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for li, l := range loads {
		med := make([]sample, len(targets))
		for ti := range targets {
			med[ti] = median(results[li][ti])
		}
		direct, ngx := med[0], med[len(targets)-1]
		for ti, t := range targets {
			m := med[ti]
			added, vs, cpu := "–", "–", "–"
			if ti > 0 {
				added = fmt.Sprintf("%+v / %+v", (m.p50 - direct.p50).Round(time.Microsecond*10), (m.p99 - direct.p99).Round(time.Microsecond*10))
			}
			if m.cpuPer1k >= 0 {
				cpu = fmt.Sprintf("%.3f", m.cpuPer1k)
			}
			if t.name != "nginx" && ngx.rps > 0 && t.pid > 0 {
				vs = fmt.Sprintf("%.2f×, %.2f×", m.rps/ngx.rps, m.cpuPer1k/ngx.cpuPer1k)
			}
			p50, p99 := m.p50.Round(time.Microsecond*10).String(), m.p99.Round(time.Microsecond*10).String()
			if m.last50 > 0 {
				p50 += fmt.Sprintf(" (last byte %v)", m.last50.Round(time.Microsecond*10))
				p99 += fmt.Sprintf(" (last byte %v)", m.p99Last.Round(time.Microsecond*10))
			}
			fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %s | %s |\n", l.name, t.name, m.rps, p50, p99, added, cpu, vs)
		}
	}
}

// median is the sample at the median request rate of ss, its latencies
// and CPU the medians of their own.
func median(ss []sample) sample {
	if len(ss) == 0 {
		return sample{cpuPer1k: -1}
	}
	pick := func(f func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return sample{
		rps:      pick(func(s sample) float64 { return s.rps }),
		p50:      time.Duration(pick(func(s sample) float64 { return float64(s.p50) })),
		p99:      time.Duration(pick(func(s sample) float64 { return float64(s.p99) })),
		last50:   time.Duration(pick(func(s sample) float64 { return float64(s.last50) })),
		p99Last:  time.Duration(pick(func(s sample) float64 { return float64(s.p99Last) })),
		cpuPer1k: pick(func(s sample) float64 { return s.cpuPer1k }),
		failed:   int(pick(func(s sample) float64 { return float64(s.failed) })),
	}
}
