package main

// Child processes: the llmproxy binary built from this tree, redis-server
// on a loopback port, and llmproxy replicas of that binary. Every child is
// registered so that killAll can SIGKILL whatever still runs when the
// command ends, whichever way it ends.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tail keeps the last part of what a child writes and hands each complete
// line, with the time it arrived, to onLine.
type tail struct {
	mu      sync.Mutex
	buf     []byte
	partial []byte
	onLine  func(at time.Time, line string) // called with mu held; must not block
}

const tailKeep = 64 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*tailKeep {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailKeep:]...)
	}
	if t.onLine != nil {
		t.partial = append(t.partial, p...)
		now := time.Now()
		for {
			i := bytes.IndexByte(t.partial, '\n')
			if i < 0 {
				break
			}
			t.onLine(now, string(t.partial[:i]))
			t.partial = t.partial[i+1:]
		}
	}
	return len(p), nil
}

// last is the end of what was written, at most n bytes.
func (t *tail) last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := string(t.buf)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// child is a started process; done closes once it has been reaped.
type child struct {
	name    string
	cmd     *exec.Cmd
	out     *tail // stdout and stderr together
	done    chan struct{}
	exitErr error
}

// children is every child still registered, for killAll.
var children = struct {
	sync.Mutex
	set map[*child]bool
}{set: map[*child]bool{}}

// startChild starts path with args and env; out may carry a line callback.
func startChild(name, path string, args, env []string, out *tail) (*child, error) {
	if out == nil {
		out = &tail{}
	}
	c := &child{name: name, out: out, done: make(chan struct{})}
	c.cmd = exec.Command(path, args...)
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = out, out
	c.cmd.WaitDelay = 3 * time.Second
	setDeathSignal(c.cmd)
	children.Lock()
	defer children.Unlock()
	if children.set == nil {
		return nil, errors.New("shutting down")
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	children.set[c] = true
	go func() {
		c.exitErr = c.cmd.Wait()
		close(c.done)
		children.Lock()
		if children.set != nil {
			delete(children.set, c)
		}
		children.Unlock()
	}()
	return c, nil
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits (up to ten seconds) for the process to be
// reaped.
func (c *child) kill() {
	if c == nil || c.exited() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		fmt.Fprintf(os.Stderr, "replicabench: %s (pid %d) not reaped 10s after SIGKILL\n", c.name, c.cmd.Process.Pid)
	}
}

// killAll kills every child still running and lets no new one start.
func killAll() {
	children.Lock()
	set := children.set
	children.set = nil
	children.Unlock()
	for c := range set {
		c.kill()
	}
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ---- the llmproxy binary ----

// buildLLMProxy builds ./cmd/llmproxy of the main module into dir.
func buildLLMProxy(ctx context.Context, dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("go tool not found on PATH: %w", err)
	}
	out, err := exec.CommandContext(ctx, goTool, "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m: %w (run from inside the module)", err)
	}
	root := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(root, "cmd", "llmproxy")); err != nil {
		return "", fmt.Errorf("module root %s has no cmd/llmproxy: %w", root, err)
	}
	bin := filepath.Join(dir, "llmproxy")
	cmd := exec.CommandContext(ctx, goTool, "build", "-buildvcs=false", "-o", bin, "./cmd/llmproxy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/llmproxy: %w\n%s", err, out)
	}
	return bin, nil
}

// ---- redis-server ----

// redisServer is a redis-server on a fixed loopback port, with nothing on
// disk, that can be killed and started again on the same port.
type redisServer struct {
	bin, dir string
	port     int
	debug    bool // --enable-debug-command local is accepted
	proc     *child
}

// startRedis starts a redis-server on a free loopback port.
func startRedis(bin, dir string) (*redisServer, error) {
	r := &redisServer{bin: bin, dir: dir, debug: true}
	var err error
	for range 3 { // the free port may be taken before redis binds it
		if r.port, err = freePort(); err != nil {
			return nil, err
		}
		if err = r.launch(); err == nil {
			return r, nil
		}
	}
	return nil, err
}

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// url is the LLMPROXY_REDIS_URL of the server.
func (r *redisServer) url() string { return "redis://" + r.addr() + "/0" }

// launch starts the server on r.port and waits (up to ten seconds) for it to
// answer PING.
func (r *redisServer) launch() error {
	args := []string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", r.dir, "--daemonize", "no",
	}
	if r.debug {
		// Redis 7 refuses DEBUG unless enabled; "local" allows it from
		// loopback only. Older servers do not know the directive.
		args = append(args, "--enable-debug-command", "local")
	}
	p, err := startChild(fmt.Sprintf("redis-server :%d", r.port), r.bin, args, nil, nil)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := redisPing(r.addr(), 500*time.Millisecond)
		if err == nil {
			r.proc = p
			return nil
		}
		if p.exited() {
			out := p.out.last(2000)
			if r.debug && strings.Contains(out, "enable-debug-command") {
				r.debug = false
				return r.launch()
			}
			return fmt.Errorf("redis-server on port %d exited: %v\n%s", r.port, p.exitErr, out)
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("redis-server on port %d does not answer PING after 10s: %v", r.port, err)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// kill SIGKILLs the server.
func (r *redisServer) kill() {
	if r.proc != nil {
		r.proc.kill()
		r.proc = nil
	}
}

// redisPing sends an inline PING and expects +PONG.
func redisPing(addr string, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// ---- llmproxy replicas ----

// replica is a running llmproxy process and the loopback addresses it
// bound.
type replica struct {
	*child
	addr, admin string
	// events are its log lines that mention Redis or are warnings, with
	// the time they arrived.
	mu     sync.Mutex
	events []logEvent
}

type logEvent struct {
	at   time.Time
	line string
}

var (
	listeningAddrRE  = regexp.MustCompile(`(?:^|\s)addr=([0-9.:]+)`)
	listeningAdminRE = regexp.MustCompile(`(?:^|\s)admin=([0-9.:]+)`)
)

// replicaEnv is the parent's environment without any LLMPROXY_* or *_PROXY
// variable, then loopback listeners on free ports, every route to
// upstream, then extra.
func replicaEnv(upstream string, extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		up := strings.ToUpper(name)
		if strings.HasPrefix(up, "LLMPROXY_") || strings.HasSuffix(up, "_PROXY") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"LLMPROXY_ADDR=127.0.0.1:0",
		"LLMPROXY_ADMIN_ADDR=127.0.0.1:0",
		"LLMPROXY_UPSTREAM="+upstream,
		"LLMPROXY_ROUTES=anthropic="+upstream,
		"LLMPROXY_LOG_LEVEL=info", // the "llmproxy listening" line is at info
		"LLMPROXY_SHUTDOWN_TIMEOUT=5s",
	)
	return append(env, extra...)
}

// startReplica starts the binary and waits (up to 15 s) for the line that
// says where it listens.
func startReplica(name, bin, upstream string, extra []string) (*replica, error) {
	listening := make(chan string, 1)
	r := &replica{}
	out := &tail{onLine: func(at time.Time, line string) {
		if strings.Contains(line, "llmproxy listening") {
			select {
			case listening <- line:
			default:
			}
			return
		}
		if strings.Contains(strings.ToLower(line), "redis") || strings.Contains(line, "level=WARN") || strings.Contains(line, "msg=\"lane ") || strings.Contains(line, "level=ERROR") {
			r.mu.Lock()
			if len(r.events) < 1000 {
				r.events = append(r.events, logEvent{at, line})
			}
			r.mu.Unlock()
		}
	}}
	c, err := startChild(name, bin, nil, replicaEnv(upstream, extra), out)
	if err != nil {
		return nil, err
	}
	r.child = c
	select {
	case line := <-listening:
		a, b := listeningAddrRE.FindStringSubmatch(line), listeningAdminRE.FindStringSubmatch(line)
		if a == nil || b == nil {
			c.kill()
			return nil, fmt.Errorf("%s: no addr= or admin= in %q", name, line)
		}
		r.addr, r.admin = a[1], b[1]
		for _, hp := range []string{r.addr, r.admin} {
			host, _, err := net.SplitHostPort(hp)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				c.kill()
				return nil, fmt.Errorf("%s: %q is not a loopback address", name, hp)
			}
		}
		return r, nil
	case <-c.done:
		return nil, fmt.Errorf("%s exited at start (%v):\n%s", name, c.exitErr, c.out.last(3000))
	case <-time.After(15 * time.Second):
		c.kill()
		return nil, fmt.Errorf("%s: no \"llmproxy listening\" line within 15s:\n%s", name, c.out.last(3000))
	}
}

// logEvents is a copy of the replica's Redis and warning lines.
func (r *replica) logEvents() []logEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]logEvent(nil), r.events...)
}

// adminClient fetches admin pages on connections it closes afterwards.
var adminClient = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}

func (r *replica) adminGet(path string) (int, []byte, error) {
	resp, err := adminClient.Get("http://" + r.admin + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, body, err
}

// lanesView is the part of /lanes this command reads.
type lanesView struct {
	Redis string `json:"redis"`
	Lanes []struct {
		InFlight    int `json:"in_flight"`
		Concurrency int `json:"concurrency_limit"`
	} `json:"lanes"`
}

func (r *replica) lanes() (lanesView, error) {
	var v lanesView
	code, body, err := r.adminGet("/lanes")
	if err != nil {
		return v, err
	}
	if code != http.StatusOK {
		return v, fmt.Errorf("/lanes answered %d", code)
	}
	err = json.Unmarshal(body, &v)
	return v, err
}

// waitReady polls /readyz (and with Redis, /lanes) until the replica is
// ready and, if shared, on Redis; up to d.
func (r *replica) waitReady(shared bool, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		err := r.readyOnce(shared)
		if err == nil {
			return nil
		}
		if r.exited() {
			return fmt.Errorf("%s exited (%v):\n%s", r.name, r.exitErr, r.out.last(3000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v", r.name, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *replica) readyOnce(shared bool) error {
	code, body, err := r.adminGet("/readyz")
	if err != nil {
		return err
	}
	var v struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(body, &v); err != nil || code != http.StatusOK || v.Status != "ready" {
		return fmt.Errorf("/readyz %d %q", code, strings.TrimSpace(string(body)))
	}
	want := "off"
	if shared {
		want = "ok"
	}
	lv, err := r.lanes()
	if err != nil {
		return err
	}
	if lv.Redis != want {
		return fmt.Errorf(`/lanes "redis": %q, want %q`, lv.Redis, want)
	}
	return nil
}

// metric is the sum of the samples of name on /metrics.
func (r *replica) metric(name string) (float64, bool) {
	series, ok := r.metricSeries(name)
	var sum float64
	for _, v := range series {
		sum += v
	}
	return sum, ok && len(series) > 0
}

// metricSeries is each sample of name on /metrics, by its labels as
// written (`{op="admit"}`, "" for none); false if /metrics did not answer.
func (r *replica) metricSeries(name string) (map[string]float64, bool) {
	code, body, err := r.adminGet("/metrics")
	if err != nil || code != http.StatusOK {
		return nil, false
	}
	series := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		end := strings.LastIndexByte(rest, '}') + 1
		fields := strings.Fields(rest[end:])
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			series[rest[:end]] += v
		}
	}
	return series, true
}

// lanesSummary is what /lanes says of each lane's limits and pauses, in a
// line, for -v.
func (r *replica) lanesSummary() string {
	code, body, err := r.adminGet("/lanes")
	if err != nil || code != http.StatusOK {
		return fmt.Sprintf("unavailable (%d, %v)", code, err)
	}
	var v struct {
		Redis string           `json:"redis"`
		Lanes []map[string]any `json:"lanes"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return err.Error()
	}
	keys := []string{"admitted", "absorbed_429", "concurrency_limit", "concurrency_from", "bound", "rate_from",
		"requests_per_second", "admitted_rate", "answer_seconds", "pauses", "paused_seconds", "attempts", "shared"}
	parts := []string{"redis=" + v.Redis}
	for _, l := range v.Lanes {
		var fields []string
		for _, k := range keys {
			if x, ok := l[k]; ok {
				b, _ := json.Marshal(x)
				fields = append(fields, k+"="+string(b))
			}
		}
		parts = append(parts, "{"+strings.Join(fields, " ")+"}")
	}
	return strings.Join(parts, " ")
}
