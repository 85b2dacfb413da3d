package e2e

// Plumbing for the replica tests in replicas_test.go: a throwaway
// redis-server on loopback, the llmproxy binary built from this tree, replica
// processes of that binary, their admin endpoints, and a plain-HTTP load
// runner aimed at them.

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
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

// needRedisServer finds redis-server on PATH. Without it the test is
// skipped, or failed when LLMPROXY_E2E_REQUIRE_REDIS=1 (for CI).
func needRedisServer(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("LLMPROXY_E2E_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server not found on PATH (LLMPROXY_E2E_REQUIRE_REDIS=1); install it, e.g. apt-get install redis-server")
		}
		t.Skip("redis-server not found on PATH; install it (e.g. apt-get install redis-server) to run the replica tests")
	}
	return path
}

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment
// ago. Nothing listens on it when this returns.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// ---- child processes ----

// outputLog collects what a child writes and, if onLine is set, hands it
// every complete line as it arrives.
type outputLog struct {
	mu      sync.Mutex
	all     bytes.Buffer
	partial []byte
	onLine  func(string) // called with mu held; must not block
}

func (o *outputLog) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all.Write(p)
	if o.onLine != nil {
		o.partial = append(o.partial, p...)
		for {
			i := bytes.IndexByte(o.partial, '\n')
			if i < 0 {
				break
			}
			o.onLine(string(o.partial[:i]))
			o.partial = o.partial[i+1:]
		}
	}
	return len(p), nil
}

func (o *outputLog) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.all.String()
}

// lastChars is the end of s, at most n bytes of it.
func lastChars(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// child is a started process. Its Wait runs in a goroutine; done closes when
// it has returned, and then exitErr holds its result.
type child struct {
	name    string
	cmd     *exec.Cmd
	stdout  *outputLog
	stderr  *outputLog
	done    chan struct{}
	exitErr error
}

// startChild starts path with args and env (nil: the parent's). stderr may
// carry a line callback. The child is SIGKILLed and reaped when the test
// ends; if the test failed, the end of its output goes to the test log.
func startChild(t testing.TB, name, path string, args, env []string, stderr *outputLog) *child {
	t.Helper()
	if stderr == nil {
		stderr = &outputLog{}
	}
	c := &child{name: name, stdout: &outputLog{}, stderr: stderr, done: make(chan struct{})}
	c.cmd = exec.Command(path, args...)
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = c.stdout, c.stderr
	// The output is copied through pipes; if the process dies but something
	// still holds a pipe open, Wait gives up after this long.
	c.cmd.WaitDelay = 3 * time.Second
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		c.exitErr = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		if err := c.kill(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("%s (pid %d) stderr, last part:\n%s", name, c.cmd.Process.Pid, lastChars(c.stderr.String(), 3000))
			if out := c.stdout.String(); out != "" {
				t.Logf("%s stdout, last part:\n%s", name, lastChars(out, 1000))
			}
		}
	})
	return c
}

// exited reports whether the process has been reaped.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// waitExit waits up to d for the process to be reaped.
func (c *child) waitExit(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-c.done:
		return true
	case <-timer.C:
		return false
	}
}

// kill sends SIGKILL (if the process still runs) and waits for it to be
// reaped, up to ten seconds.
func (c *child) kill() error {
	if c.exited() {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	if !c.waitExit(10 * time.Second) {
		return fmt.Errorf("pid %d not reaped 10s after SIGKILL", c.cmd.Process.Pid)
	}
	return nil
}

// stop sends SIGTERM and waits up to grace for the process to exit, then
// kills it. It reports whether the process exited on its own.
func (c *child) stop(grace time.Duration) (bool, error) {
	if c.exited() {
		return true, nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if c.waitExit(grace) {
		return true, nil
	}
	return false, c.kill()
}

// ---- redis-server ----

// redisServer is a redis-server on a fixed loopback port that a test can
// stop and start again on the same port. It keeps nothing on disk.
type redisServer struct {
	t    *testing.T
	bin  string
	dir  string
	port int
	proc *child // the running server; nil while stopped
}

// startRedis starts a redis-server on a free loopback port and waits until
// it answers PING. It skips the test when redis-server is missing (see
// needRedisServer). The server is killed when the test ends.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	r := &redisServer{t: t, bin: needRedisServer(t), dir: t.TempDir()}
	var err error
	// The free port could be taken by someone else before redis binds it;
	// a few fresh ports make that harmless.
	for attempt := 0; attempt < 3; attempt++ {
		r.port = freeLoopbackPort(t)
		if err = r.launch(); err == nil {
			return r
		}
	}
	t.Fatal(err)
	return nil
}

// URL is the LLMPROXY_REDIS_URL value for this server.
func (r *redisServer) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// launch starts the server on r.port and waits up to ten seconds for PONG.
func (r *redisServer) launch() error {
	r.t.Helper()
	args := []string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no",
	}
	p := startChild(r.t, fmt.Sprintf("redis-server :%d", r.port), r.bin, args, nil, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := redisPing(r.addr(), 500*time.Millisecond)
		if err == nil {
			r.proc = p
			return nil
		}
		if p.exited() {
			return fmt.Errorf("redis-server on port %d exited: %v; output:\n%s", r.port, p.exitErr, lastChars(p.stdout.String(), 2000))
		}
		if time.Now().After(deadline) {
			_ = p.kill()
			return fmt.Errorf("redis-server on port %d does not answer PING after 10s: %v", r.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the server with SIGTERM and waits for it to exit.
func (r *redisServer) stop() {
	r.t.Helper()
	if r.proc == nil {
		return
	}
	clean, err := r.proc.stop(10 * time.Second)
	r.proc = nil
	if err != nil {
		r.t.Fatalf("stop redis-server: %v", err)
	}
	if !clean {
		r.t.Logf("redis-server ignored SIGTERM for 10s and was killed")
	}
}

// restart starts the server again on the same port, empty.
func (r *redisServer) restart() {
	r.t.Helper()
	if r.proc != nil {
		r.t.Fatal("restart: redis-server is still running")
	}
	if err := r.launch(); err != nil {
		r.t.Fatal(err)
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

// ---- the llmproxy binary ----

// The binary is built at most once per test that needs it and shared by all
// the replicas of that test. It cannot live for the whole run: the package's
// TestMain (harness_test.go) belongs to goleak, so the only place to remove
// the build directory is the cleanup of the test that built it. A later test
// builds again, which with a warm build cache is only the link (~1s).
var llmproxyBuild struct {
	mu   sync.Mutex
	path string
}

// llmproxyBinary returns the path of an llmproxy binary built from this
// tree with `go build`.
func llmproxyBinary(t testing.TB) string {
	t.Helper()
	llmproxyBuild.mu.Lock()
	defer llmproxyBuild.mu.Unlock()
	if llmproxyBuild.path != "" {
		return llmproxyBuild.path
	}
	root, err := filepath.Abs("..") // tests run in e2e/; the module is its parent
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found above the e2e package: %v", err)
	}
	dir, err := os.MkdirTemp("", "llmproxy-e2e-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		llmproxyBuild.mu.Lock()
		defer llmproxyBuild.mu.Unlock()
		llmproxyBuild.path = ""
		os.RemoveAll(dir)
	})
	// go test puts its own GOROOT/bin first on PATH, so this is the same
	// toolchain that builds the tests.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "llmproxy")
	cmd := exec.CommandContext(ctx, goTool, "build", "-buildvcs=false", "-o", bin, "./cmd/llmproxy")
	cmd.Dir = root
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/llmproxy: %v\n%s", err, lastChars(string(out), 4000))
	}
	t.Logf("built llmproxy in %v", time.Since(start).Round(10*time.Millisecond))
	llmproxyBuild.path = bin
	return bin
}

// replicaEnv is the environment of an llmproxy process: the parent's
// without any LLMPROXY_* or *_PROXY variable, then the replica defaults
// (loopback listeners on free ports, every route to upstream), then extra,
// which wins over both.
//
// The log level is info, not warn: "llmproxy listening", the line that
// carries the bound addresses, is logged at info. Nothing is logged per
// request at that level.
func replicaEnv(upstream string, extra ...string) []string {
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
		"LLMPROXY_LANE_MAX_CONCURRENCY=8",
		"LLMPROXY_LOG_LEVEL=info",
		"LLMPROXY_SHUTDOWN_TIMEOUT=5s",
	)
	// exec keeps the last value of a repeated name.
	return append(env, extra...)
}

// redisEnv is what makes a replica share lane state through r.
func redisEnv(redisURL string) []string {
	return []string{"LLMPROXY_REDIS_URL=" + redisURL, "LLMPROXY_REDIS_LEASE_TTL=2s"}
}

// replica is a running llmproxy process and the addresses it bound.
type replica struct {
	*child
	addr  string // proxy listener, host:port
	admin string // admin listener, host:port
	token string // its LLMPROXY_ADMIN_TOKEN, sent to the admin listener; "" none
}

// The start-up line, parsed as .ci/run parses it.
var (
	listeningAddrRE  = regexp.MustCompile(`(?:^|\s)addr=([0-9.:]+)`)
	listeningAdminRE = regexp.MustCompile(`(?:^|\s)admin=([0-9.:]+)`)
)

// launchLLMProxy starts the binary with env. The returned channel yields
// the "llmproxy listening" line once, if the process gets that far.
func launchLLMProxy(t testing.TB, name, bin string, env []string) (*child, <-chan string) {
	t.Helper()
	listening := make(chan string, 1)
	stderr := &outputLog{onLine: func(line string) {
		if strings.Contains(line, "llmproxy listening") {
			select {
			case listening <- line:
			default:
			}
		}
	}}
	return startChild(t, name, bin, nil, env, stderr), listening
}

// startReplica starts an llmproxy with replicaEnv(upstream, extra...) and
// waits (up to 15s) until it says where it listens.
func startReplica(t testing.TB, name, bin, upstream string, extra ...string) *replica {
	t.Helper()
	c, listening := launchLLMProxy(t, name, bin, replicaEnv(upstream, extra...))
	timer := time.NewTimer(15 * time.Second)
	defer timer.Stop()
	select {
	case line := <-listening:
		a, b := listeningAddrRE.FindStringSubmatch(line), listeningAdminRE.FindStringSubmatch(line)
		if a == nil || b == nil {
			t.Fatalf("%s: no addr= or admin= in %q", name, line)
		}
		r := &replica{child: c, addr: a[1], admin: b[1]}
		for _, kv := range extra {
			if v, ok := strings.CutPrefix(kv, "LLMPROXY_ADMIN_TOKEN="); ok {
				r.token = v
			}
		}
		for _, hp := range []string{r.addr, r.admin} {
			host, _, err := net.SplitHostPort(hp)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				t.Fatalf("%s: %q is not a loopback address", name, hp)
			}
		}
		return r
	case <-c.done:
		t.Fatalf("%s exited at start (%v); stderr:\n%s", name, c.exitErr, lastChars(c.stderr.String(), 3000))
	case <-timer.C:
		t.Fatalf("%s: no \"llmproxy listening\" line within 15s; stderr:\n%s", name, lastChars(c.stderr.String(), 3000))
	}
	return nil
}

// startReplicas starts n replicas with the same settings.
func startReplicas(t *testing.T, n int, bin, upstream string, extra ...string) []*replica {
	t.Helper()
	reps := make([]*replica, n)
	for i := range reps {
		reps[i] = startReplica(t, fmt.Sprintf("replica %d", i), bin, upstream, extra...)
	}
	return reps
}

// startMockUpstream starts the mock upstream and closes it when the test
// ends (after the replicas, whose cleanups were registered later).
func startMockUpstream(t *testing.T, cfg mockupstream.Config) *mockupstream.Server {
	t.Helper()
	m := mockupstream.New(cfg)
	t.Cleanup(m.Close)
	return m
}

// ---- admin endpoints ----

// adminGet fetches path from the replica's admin listener, on a connection
// of its own that is closed afterwards (no idle connection outlives it).
func (r *replica) adminGet(path string) (int, []byte, error) {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequest(http.MethodGet, "http://"+r.admin+path, nil)
	if err != nil {
		return 0, nil, err
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, body, err
}

// readyz returns /readyz's HTTP status and its "status" field.
func (r *replica) readyz() (int, string, error) {
	code, body, err := r.adminGet("/readyz")
	if err != nil {
		return code, "", err
	}
	var v struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return code, "", fmt.Errorf("/readyz %d, not JSON: %q", code, lastChars(string(body), 300))
	}
	return code, v.Status, nil
}

// lanesRedis returns the top-level "redis" field of /lanes.
func (r *replica) lanesRedis() (string, error) {
	code, body, err := r.adminGet("/lanes")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("/lanes answered %d", code)
	}
	var v struct {
		Redis *string `json:"redis"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("/lanes is not a JSON object: %v", err)
	}
	if v.Redis == nil {
		return "", errors.New(`/lanes has no top-level "redis" field`)
	}
	return *v.Redis, nil
}

// metricsText returns the /metrics page.
func (r *replica) metricsText() (string, error) {
	code, body, err := r.adminGet("/metrics")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("/metrics answered %d", code)
	}
	return string(body), nil
}

// metricValue finds an unlabelled or labelled sample of name in a
// Prometheus text page and returns its value.
func metricValue(page, name string) (float64, bool) {
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another metric whose name starts the same
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err == nil {
			return v, true
		}
	}
	return 0, false
}

// pollAdmin calls check every 100ms until it returns nil or d has passed;
// then it returns check's last error.
func pollAdmin(d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---- load ----

// chatBody is the request every load request sends.
const chatBody = `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":16}`

// loadClient is a plain HTTP client for load runs: no proxy from the
// environment, enough idle connections for the concurrency used here. Its
// connections are closed when the test ends.
func loadClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// sendChat posts one chat completion to addr with the shared key and
// returns nil only for a 200 that carries a choice.
func sendChat(ctx context.Context, client *http.Client, addr string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer sk-shared")
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return resp.StatusCode, fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("status %d: %s", resp.StatusCode, lastChars(string(body), 300))
	}
	var v struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if err := json.Unmarshal(body, &v); err != nil || len(v.Choices) == 0 {
		return resp.StatusCode, fmt.Errorf("200 without a chat completion: %s", lastChars(string(body), 300))
	}
	return resp.StatusCode, nil
}

// chatOutcome is one request of a load run.
type chatOutcome struct {
	replica    int
	start, end time.Time
	status     int   // 0: no answer
	err        error // nil: a 200 chat completion
	skipped    bool  // never sent (chatLoad.skip)
}

// chatLoad sends perReplica requests to each target, at most concurrency at
// a time per target, all targets at once.
type chatLoad struct {
	targets     []*replica
	perReplica  int
	concurrency int
	timeout     time.Duration             // each request's own
	skip        func(replica int) bool    // asked before each send; nil: never skip
	onDone      func(outcome chatOutcome) // after each request, from its goroutine; may be nil
}

// runningLoad is a chatLoad under way.
type runningLoad struct {
	done    chan struct{}
	results [][]chatOutcome // by target, then request; valid after done
}

// start runs the load in the background. When the test ends early the
// load's context is cancelled and the cleanup waits for it to stop.
func (l chatLoad) start(t *testing.T, client *http.Client) *runningLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	rl := &runningLoad{done: make(chan struct{})}
	go func() {
		defer close(rl.done)
		rl.results = l.run(ctx, client)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-rl.done:
		case <-time.After(30 * time.Second):
			t.Error("load still running 30s after it was cancelled")
		}
	})
	return rl
}

// wait returns the outcomes once every request has ended.
func (rl *runningLoad) wait() [][]chatOutcome {
	<-rl.done
	return rl.results
}

func (l chatLoad) run(ctx context.Context, client *http.Client) [][]chatOutcome {
	results := make([][]chatOutcome, len(l.targets))
	var all sync.WaitGroup
	for ri, target := range l.targets {
		results[ri] = make([]chatOutcome, l.perReplica)
		all.Add(1)
		go func() {
			defer all.Done()
			sem := make(chan struct{}, l.concurrency)
			var wg sync.WaitGroup
			for i := range l.perReplica {
				sem <- struct{}{}
				if l.skip != nil && l.skip(ri) {
					<-sem
					results[ri][i] = chatOutcome{replica: ri, skipped: true}
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					rctx, cancel := context.WithTimeout(ctx, l.timeout)
					defer cancel()
					o := chatOutcome{replica: ri, start: time.Now()}
					o.status, o.err = sendChat(rctx, client, target.addr)
					o.end = time.Now()
					results[ri][i] = o
					if l.onDone != nil {
						l.onDone(o)
					}
				}()
			}
			wg.Wait()
		}()
	}
	all.Wait()
	return results
}

// failures counts the sent requests of outs that did not succeed, with the
// first few errors.
func failures(outs []chatOutcome) (sent, failed int, first []string) {
	for _, o := range outs {
		if o.skipped {
			continue
		}
		sent++
		if o.err != nil {
			failed++
			if len(first) < 3 {
				first = append(first, o.err.Error())
			}
		}
	}
	return sent, failed, first
}
