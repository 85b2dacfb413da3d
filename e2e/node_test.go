package e2e

// Real Node clients in front of the proxy: the official openai npm package
// and promptfoo, both pinned in node/package-lock.json. They need
//
//	npm ci --prefix e2e/testdata/node
//
// once; without testdata/node/node_modules these tests skip, unless
// LLMPROXY_E2E_REQUIRE_NODE=1 makes that a failure (for CI).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

// nodeTools is a Node runtime and the installed e2e/testdata/node packages.
type nodeTools struct {
	node string // path of the node binary
	dir  string // absolute path of e2e/testdata/node
}

// needNode finds node and e2e/testdata/node/node_modules, or skips the test (fails it
// with LLMPROXY_E2E_REQUIRE_NODE=1).
func needNode(t *testing.T) nodeTools {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv("LLMPROXY_E2E_REQUIRE_NODE") == "1" {
			t.Fatalf("%s; run npm ci --prefix e2e/testdata/node (LLMPROXY_E2E_REQUIRE_NODE=1)", why)
		}
		t.Skipf("%s; run npm ci --prefix e2e/testdata/node", why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node not found on PATH")
	}
	dir, err := filepath.Abs(filepath.Join("testdata", "node"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"openai", "promptfoo"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			missing("e2e/testdata/node/node_modules/" + pkg + " is not installed")
		}
	}
	return nodeTools{node: node, dir: dir}
}

// mustLoopback fails the test unless u is an http URL on a loopback address:
// the Node clients must never be pointed anywhere else.
func mustLoopback(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil || p.Scheme != "http" {
		t.Fatalf("%q is not an http URL", u)
	}
	if ip := net.ParseIP(p.Hostname()); ip == nil || !ip.IsLoopback() {
		t.Fatalf("%q is not a loopback URL", u)
	}
	return u
}

// nodeEnv is the subprocess environment: the parent's, minus anything that
// could point a client elsewhere or hand it a real key, plus extra.
// HOME is a fresh temp dir so nothing is read from or written to the real one.
func nodeEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		up := strings.ToUpper(name)
		switch {
		case strings.HasPrefix(up, "OPENAI_"), strings.HasPrefix(up, "ANTHROPIC_"),
			strings.HasPrefix(up, "AZURE_"), strings.HasPrefix(up, "PROMPTFOO_"),
			strings.HasSuffix(up, "_PROXY"), up == "HOME", up == "NODE_OPTIONS":
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+t.TempDir(), "NO_PROXY=127.0.0.1,localhost,::1", "no_proxy=127.0.0.1,localhost,::1")
	return append(env, extra...)
}

// nodeRun is a finished node process.
type nodeRun struct {
	stdout, stderr []byte
	took           time.Duration
	err            error // from exec: nil, an *exec.ExitError, a timeout
}

// runNode runs node with args in e2e/testdata/node under a timeout, with
// loopback_only.mjs preloaded so the process can reach nothing but loopback.
// The process is killed when the timeout passes or the test ends. Hosts the
// guard refused are logged.
func runNode(t *testing.T, nt nodeTools, timeout time.Duration, env []string, args ...string) nodeRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, nt.node, append([]string{"--import", "./loopback_only.mjs"}, args...)...)
	cmd.Dir = nt.dir
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := nodeRun{stdout: stdout.Bytes(), stderr: stderr.Bytes(), took: time.Since(start), err: err}
	if ctx.Err() != nil {
		r.err = fmt.Errorf("%w (timeout %v or test ended)", err, timeout)
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "loopback_only:") {
			t.Logf("%s: %s", args[0], line)
		}
	}
	return r
}

// fatalRun ends the test with r's error and output.
func fatalRun(t *testing.T, what string, r nodeRun) {
	t.Helper()
	t.Fatalf("%s: %v (after %v)\nstderr:\n%s\nstdout:\n%s", what, r.err, r.took.Round(time.Millisecond),
		tail(string(r.stderr), 4000), tail(string(r.stdout), 2000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// openaiLoadResult is the JSON line node/openai_load.mjs prints.
type openaiLoadResult struct {
	OK                 int       `json:"ok"`
	Failed             int       `json:"failed"`
	FirstErrors        []string  `json:"firstErrors"`
	MakespanMs         float64   `json:"makespanMs"`
	StreamChunks       int       `json:"streamChunks"`
	StreamChunkTimesMs []float64 `json:"streamChunkTimesMs"`
	StreamError        string    `json:"streamError"`
}

// TestNodeOpenAISDKAllSucceed: the official openai npm client, default
// retries, 400 chat completions at concurrency 50 against an upstream that
// allows 20 req/s: all succeed. A streamed answer reaches the client chunk
// by chunk, as the upstream sends it, not buffered into one delivery.
func TestNodeOpenAISDKAllSucceed(t *testing.T) {
	nt := needNode(t)
	const n, c, chunks, chunkDelay = 400, 50, 8, 100 * time.Millisecond
	s := newStack(t, mockupstream.Config{
		RPM: 1200, Latency: 50 * time.Millisecond,
		StreamChunks: chunks, ChunkDelay: chunkDelay,
	}, nil)
	env := nodeEnv(t,
		"OPENAI_BASE_URL="+mustLoopback(t, s.front.URL+"/v1"),
		"OPENAI_API_KEY=sk-e2e-node-fake-key",
		fmt.Sprintf("N=%d", n), fmt.Sprintf("C=%d", c),
	)
	run := runNode(t, nt, 2*time.Minute, env, "openai_load.mjs")
	if run.err != nil {
		fatalRun(t, "openai_load.mjs", run)
	}
	var r openaiLoadResult
	if err := json.Unmarshal(lastLine(run.stdout), &r); err != nil {
		run.err = fmt.Errorf("its output: %w", err)
		fatalRun(t, "openai_load.mjs", run)
	}
	st := s.mock.Stats()
	t.Logf("openai SDK: %d ok, %d failed, makespan %.0f ms; upstream %d requests, %d ok, %d rate-limited",
		r.OK, r.Failed, r.MakespanMs, st.Requests, st.OK, st.RateLimited)
	if r.OK != n || r.Failed != 0 {
		t.Errorf("%d of %d succeeded, %d failed; first errors: %q", r.OK, n, r.Failed, r.FirstErrors)
	}

	if r.StreamError != "" {
		t.Fatalf("streaming request: %s", r.StreamError)
	}
	if r.StreamChunks != chunks || len(r.StreamChunkTimesMs) != chunks {
		t.Fatalf("stream: %d content chunks (%d times), want %d", r.StreamChunks, len(r.StreamChunkTimesMs), chunks)
	}
	times := r.StreamChunkTimesMs
	spread := time.Duration((times[len(times)-1] - times[0]) * float64(time.Millisecond))
	want := time.Duration(chunks-1) * chunkDelay / 2
	t.Logf("stream: %d chunks at %v ms after the request; first-to-last spread %v (upstream spaced them %v apart)",
		len(times), times, spread.Round(time.Millisecond), chunkDelay)
	if spread < want {
		t.Errorf("stream chunks arrived within %v of each other, want at least %v: the answer was buffered, not streamed", spread, want)
	}
}

// lastLine is the last non-empty line of b.
func lastLine(b []byte) []byte {
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

// promptfooOutput is the part of promptfoo's -o JSON file the test reads.
type promptfooOutput struct {
	Results struct {
		Stats struct {
			Successes int `json:"successes"`
			Failures  int `json:"failures"`
			Errors    int `json:"errors"`
		} `json:"stats"`
		Results []struct {
			Success bool   `json:"success"`
			Error   string `json:"error"`
		} `json:"results"`
	} `json:"results"`
}

// promptfooRun is one promptfoo eval's outcome.
type promptfooRun struct {
	tests, passed, failed, errored int
	firstErrors                    []string
	took                           time.Duration
}

// runPromptfoo runs node/promptfooconfig.yaml against base (an OpenAI-style
// /v1 URL on loopback) at concurrency j, with caching, telemetry, update
// checks, sharing and result storage off, and all promptfoo state in a temp
// dir.
func runPromptfoo(t *testing.T, nt nodeTools, base string, j int) promptfooRun {
	t.Helper()
	tmp := t.TempDir()
	outFile := filepath.Join(tmp, "out.json")
	env := nodeEnv(t,
		"LLMPROXY_E2E_BASE="+mustLoopback(t, base),
		"PROMPTFOO_CONFIG_DIR="+filepath.Join(tmp, "promptfoo"),
		"PROMPTFOO_CACHE_PATH="+filepath.Join(tmp, "cache"),
		"PROMPTFOO_CACHE_ENABLED=false",
		"PROMPTFOO_DISABLE_TELEMETRY=1",
		"PROMPTFOO_DISABLE_UPDATE=1",
		"PROMPTFOO_DISABLE_SHARING=1",
		"PROMPTFOO_DISABLE_REMOTE_GENERATION=1",
		"PROMPTFOO_DISABLE_RUNTIME_WARNINGS=1",
		"CI=1",
	)
	cli := filepath.Join("node_modules", "promptfoo", "dist", "src", "entrypoint.js")
	run := runNode(t, nt, 2*time.Minute, env, cli,
		"eval", "-c", "promptfooconfig.yaml",
		"--no-cache", "--no-write", "--no-share", "--no-table", "--no-progress-bar",
		"-j", fmt.Sprint(j), "-o", outFile)
	// Exit status 100 is promptfoo's "some tests did not pass"; the caller
	// judges the results.
	var exit *exec.ExitError
	if run.err != nil && !(errors.As(run.err, &exit) && exit.ExitCode() == 100) {
		fatalRun(t, "promptfoo eval", run)
	}
	data, err := os.ReadFile(outFile)
	if err != nil {
		run.err = fmt.Errorf("no output file: %w", err)
		fatalRun(t, "promptfoo eval", run)
	}
	var out promptfooOutput
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("promptfoo output %s: %v", outFile, err)
	}
	r := promptfooRun{tests: len(out.Results.Results), took: run.took}
	for _, res := range out.Results.Results {
		switch {
		case res.Success:
			r.passed++
		case res.Error != "":
			r.errored++
			if len(r.firstErrors) < 3 {
				r.firstErrors = append(r.firstErrors, tail(res.Error, 300))
			}
		default:
			r.failed++
		}
	}
	if st := out.Results.Stats; st.Successes != r.passed {
		t.Logf("promptfoo stats say %d passed, %d failed, %d errors; results list %d passed", st.Successes, st.Failures, st.Errors, r.passed)
	}
	return r
}

// TestPromptfooEvalAllPass: a promptfoo eval of 200 tests at -j 50 through
// the proxy, against an upstream that allows 20 req/s: every test passes.
// The same eval straight against the upstream is run for comparison and
// only logged.
func TestPromptfooEvalAllPass(t *testing.T) {
	nt := needNode(t)
	const j, minTests = 50, 200
	s := newStack(t, mockupstream.Config{RPM: 1200}, nil)

	via := runPromptfoo(t, nt, s.front.URL+"/v1", j)
	st := s.mock.Stats()
	t.Logf("promptfoo via proxy: %d tests, %d passed, %d failed, %d errors in %v; upstream %d requests, %d ok, %d rate-limited",
		via.tests, via.passed, via.failed, via.errored, via.took.Round(time.Millisecond), st.Requests, st.OK, st.RateLimited)
	if via.tests < minTests {
		t.Fatalf("promptfoo ran %d tests, want at least %d", via.tests, minTests)
	}
	if via.passed != via.tests {
		t.Fatalf("%d of %d tests passed through the proxy (%d failed, %d errors); first errors: %q",
			via.passed, via.tests, via.failed, via.errored, via.firstErrors)
	}

	// The same eval with nothing in between, on a fresh upstream with the
	// same limit. Logged for docs/benchmarks.md, not asserted: the outcome
	// depends on promptfoo's own retry and backoff.
	direct := mockupstream.New(mockupstream.Config{RPM: 1200})
	t.Cleanup(direct.Close)
	d := runPromptfoo(t, nt, direct.URL()+"/v1", j)
	dst := direct.Stats()
	t.Logf("promptfoo direct:    %d tests, %d passed, %d failed, %d errors in %v; upstream %d requests, %d ok, %d rate-limited; first errors: %q",
		d.tests, d.passed, d.failed, d.errored, d.took.Round(time.Millisecond), dst.Requests, dst.OK, dst.RateLimited, d.firstErrors)
}
