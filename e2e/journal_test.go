package e2e

// The journal against the real binary and real clients (issue 52): an
// eval killed at 60 % and run again pays only for what it had left; a
// recorded run replays offline, byte for byte; sampled requests keep
// their samples; a client's retry of a call in flight joins it.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

// journalLine is one line journal_run.mjs prints.
type journalLine struct {
	I       int    `json:"i"`
	Stream  bool   `json:"stream"`
	SHA     string `json:"sha"`
	Journal string `json:"journal"`
	Joined  bool   `json:"joined"`
	Error   string `json:"error"`
	Done    int    `json:"done"`
	Failed  int    `json:"failed"`
	MS      int    `json:"ms"`
}

// journalRun is what one journal_run.mjs process answered: each request's
// line by its number, and how long it took.
type journalRun struct {
	lines  map[int]journalLine
	errors []string
	took   time.Duration
	ended  bool // it printed its last line (it was not killed)
}

func (r journalRun) count(journal string) (n int) {
	for _, l := range r.lines {
		if l.Journal == journal {
			n++
		}
	}
	return n
}

// runJournalNode runs journal_run.mjs with env; when killAt > 0 it
// SIGKILLs the process once killAt answers are in, as a crash would end
// an eval.
func runJournalNode(t *testing.T, nt nodeTools, env []string, killAt int) journalRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nt.node, "--import", "./loopback_only.mjs", "journal_run.mjs")
	cmd.Dir, cmd.Env, cmd.WaitDelay = nt.dir, env, 5*time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := journalRun{lines: map[int]journalLine{}}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var l journalLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("journal_run.mjs printed %q: %v", sc.Text(), err)
		}
		switch {
		case l.Done > 0:
			r.ended = true
		case l.Error != "":
			r.errors = append(r.errors, fmt.Sprintf("request %d: %s", l.I, l.Error))
		default:
			r.lines[l.I] = l
		}
		if killAt > 0 && len(r.lines) >= killAt && cmd.Process != nil {
			_ = cmd.Process.Kill()
			killAt = 0
		}
	}
	werr := cmd.Wait()
	r.took = time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("journal_run.mjs: timed out after %v; stderr:\n%s", r.took, tail(stderr.String(), 3000))
	}
	if r.ended && werr != nil {
		t.Fatalf("journal_run.mjs: %v; stderr:\n%s", werr, tail(stderr.String(), 3000))
	}
	return r
}

// TestJournalResumesAKilledEvalAndReplaysItOffline: an eval of 2,000
// requests through openai-node (every fifth streamed), at 50 in flight,
// is killed at 60 % and run again with the journal on: the second run
// sends upstream only what the first had left (and what was in flight at
// the kill), and every answer the first got comes back identical. Then
// the proxy restarts in strict mode with the upstream's port closed:
// the run, and a promptfoo eval recorded beside it, replay whole, every
// body and event sequence byte for byte.
func TestJournalResumesAKilledEvalAndReplaysItOffline(t *testing.T) {
	nt := needNode(t)
	const n, c = 2000, 50
	mock := startMockUpstream(t, mockupstream.Config{Latency: 40 * time.Millisecond, StreamChunks: 6, ChunkDelay: 10 * time.Millisecond})
	bin := llmproxyBinary(t)
	file := filepath.Join(t.TempDir(), "state.db")
	p := startReplica(t, "proxy", bin, mock.URL(), "LLMPROXY_STATE="+file, "LLMPROXY_JOURNAL=replay",
		"LLMPROXY_LANE_MAX_CONCURRENCY=64")
	env := func(r *replica) []string {
		return nodeEnv(t, "OPENAI_BASE_URL="+mustLoopback(t, "http://"+r.addr+"/v1"),
			fmt.Sprintf("N=%d", n), fmt.Sprintf("C=%d", c), "RUN=eval")
	}

	killed := runJournalNode(t, nt, env(p), n*60/100)
	sentFirst := mock.Stats().Requests
	if killed.ended {
		t.Fatal("the first run was not killed")
	}
	t.Logf("first run killed after %d answers (%v); the upstream had %d requests", len(killed.lines), killed.took.Round(time.Millisecond), sentFirst)

	resumed := runJournalNode(t, nt, env(p), 0)
	sentAgain := mock.Stats().Requests - sentFirst
	t.Logf("second run: %d answers (%d hits, %d joined, %d recorded) in %v; the upstream had %d more requests",
		len(resumed.lines), resumed.count("hit"), countJoined(resumed), resumed.count("recorded"), resumed.took.Round(time.Millisecond), sentAgain)
	if len(resumed.lines) != n || len(resumed.errors) > 0 {
		t.Fatalf("second run: %d of %d answered; errors %q", len(resumed.lines), n, first(resumed.errors, 5))
	}
	if left := n - len(killed.lines); sentAgain > int64(left+c) {
		t.Errorf("the second run sent %d requests upstream, want at most %d (the %d left and the %d in flight at the kill)", sentAgain, left+c, left, c)
	}
	for i, l := range killed.lines {
		if got := resumed.lines[i]; got.SHA != l.SHA {
			t.Fatalf("request %d (stream %v): the second run's answer differs from the first's (%s, journal %q)", i, l.Stream, got.SHA[:12], got.Journal)
		}
	}

	recorded := runPromptfoo(t, nt, "http://"+p.addr+"/v1", 20)
	if recorded.passed != recorded.tests || recorded.tests == 0 {
		t.Fatalf("promptfoo, recorded: %d of %d passed; %q", recorded.passed, recorded.tests, recorded.firstErrors)
	}
	if ok, err := p.stop(10 * time.Second); !ok {
		t.Fatalf("the proxy did not stop on SIGTERM: %v", err)
	}
	closed := mock.URL()
	mock.Close() // the upstream's port is closed from here on: a miss could only fail

	offline := startReplica(t, "offline proxy", bin, closed, "LLMPROXY_STATE="+file, "LLMPROXY_JOURNAL=strict")
	replay := runJournalNode(t, nt, env(offline), 0)
	t.Logf("strict replay, upstream closed: %d answers, %d hits, in %v", len(replay.lines), replay.count("hit"), replay.took.Round(time.Millisecond))
	if len(replay.lines) != n || replay.count("hit") != n || len(replay.errors) > 0 {
		t.Fatalf("strict replay: %d of %d answered, %d hits; errors %q", len(replay.lines), n, replay.count("hit"), first(replay.errors, 5))
	}
	for i, l := range resumed.lines {
		if replay.lines[i].SHA != l.SHA {
			t.Fatalf("request %d (stream %v): the replay differs from the recording", i, l.Stream)
		}
	}
	again := runPromptfoo(t, nt, "http://"+offline.addr+"/v1", 20)
	t.Logf("promptfoo, strict replay: %d of %d passed in %v", again.passed, again.tests, again.took.Round(time.Millisecond))
	if again.passed != recorded.tests {
		t.Fatalf("promptfoo, strict replay: %d of %d passed; %q", again.passed, recorded.tests, again.firstErrors)
	}
}

func countJoined(r journalRun) (n int) {
	for _, l := range r.lines {
		if l.Joined {
			n++
		}
	}
	return n
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// TestJournalKeepsEachSampleOfOneRequest: 30 identical requests at
// temperature 1 are 30 recordings, replayed in their order; another run
// or another key gets none of them.
func TestJournalKeepsEachSampleOfOneRequest(t *testing.T) {
	nt := needNode(t)
	mock := startMockUpstream(t, mockupstream.Config{})
	file := filepath.Join(t.TempDir(), "state.db")
	p := startReplica(t, "proxy", llmproxyBinary(t), mock.URL(), "LLMPROXY_STATE="+file,
		"LLMPROXY_JOURNAL=record", "LLMPROXY_JOURNAL_PASS_GAP=200ms")
	base := "OPENAI_BASE_URL=" + mustLoopback(t, "http://"+p.addr+"/v1")
	sampled := runJournalNode(t, nt, nodeEnv(t, base, "N=30", "C=1", "SAME=1", "RUN=samples"), 0)
	distinct := map[string]bool{}
	for _, l := range sampled.lines {
		distinct[l.SHA] = true
	}
	if len(sampled.lines) != 30 || len(distinct) != 30 || sampled.count("recorded") != 30 {
		t.Fatalf("recorded %d answers, %d distinct, %d said recorded; errors %q", len(sampled.lines), len(distinct), sampled.count("recorded"), sampled.errors)
	}
	strict := func(run, key string) journalRun {
		time.Sleep(400 * time.Millisecond) // the run rests: its next request starts a new pass
		return runJournalNode(t, nt, nodeEnv(t, base, "N=30", "C=1", "SAME=1", "RUN="+run, "OPENAI_API_KEY="+key, "JOURNAL=strict"), 0)
	}
	same := strict("samples", "sk-e2e-journal-fake-key")
	for i := range 30 {
		if same.lines[i].SHA != sampled.lines[i].SHA || same.lines[i].Journal != "hit" {
			t.Fatalf("sample %d replayed as %+v, want the %d-th recording", i, same.lines[i], i+1)
		}
	}
	for _, other := range [][2]string{{"other-run", "sk-e2e-journal-fake-key"}, {"samples", "sk-e2e-journal-other-key"}} {
		r := strict(other[0], other[1])
		if len(r.lines) != 0 || len(r.errors) != 30 || !strings.Contains(r.errors[0], "404") {
			t.Errorf("run %s, key %s: %d answers, errors %q; want 30 misses (404)", other[0], other[1][:16], len(r.lines), first(r.errors, 2))
		}
	}
	if n := mock.Stats().Requests; n != 30 {
		t.Errorf("the upstream had %d requests, want 30", n)
	}
}

// TestAClientRetryJoinsItsCallInFlight: openai-node's timeout (1 s) ends
// its first attempt while the upstream takes 2.5 s; its retries join the
// call in flight, and the upstream is called once.
func TestAClientRetryJoinsItsCallInFlight(t *testing.T) {
	nt := needNode(t)
	mock := startMockUpstream(t, mockupstream.Config{Latency: 2500 * time.Millisecond})
	p := startReplica(t, "proxy", llmproxyBinary(t), mock.URL())
	r := runJournalNode(t, nt, nodeEnv(t, "OPENAI_BASE_URL="+mustLoopback(t, "http://"+p.addr+"/v1"),
		"N=1", "C=1", "TIMEOUT_MS=1000"), 0)
	t.Logf("%d answers, errors %q, joined %v, in %v; upstream requests %d", len(r.lines), r.errors, countJoined(r) == 1, r.took.Round(time.Millisecond), mock.Stats().Requests)
	if len(r.lines) != 1 || !r.lines[0].Joined {
		t.Fatalf("the retried request: %+v, errors %q; want its answer from the call in flight", r.lines, r.errors)
	}
	if n := mock.Stats().Requests; n != 1 {
		t.Fatalf("the upstream was called %d times, want once", n)
	}
}
