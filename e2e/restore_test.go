package e2e

// Learned limits kept across a restart (issue 52): a run restarts its
// proxy halfway, by SIGTERM and by kill -9; with LLMPROXY_STATE the new
// process starts from what the old one learned, and the upstream sees no
// more refusals after the restart than a run without one.

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

var (
	restoreChats    = flag.Int("restore.chats", 500, "chats in each run of the restart tests")
	restoreTimeline = flag.Bool("restore.timeline", false, "log what the upstream admitted and refused in each half second of each run")
	restoreShared   = flag.Bool("restore.shared", false, "add a shape of four models on one limit (not in CI: see the test)")
	restoreNoState  = flag.Bool("restore.nostate", false, "restart without LLMPROXY_STATE: the figures before the restore (the test then fails)")
)

// restartShape is an upstream the restart test runs against, n chats
// asking models models in turn (0: one).
type restartShape struct {
	name   string
	mock   mockupstream.Config
	n      int
	models int
}

// restartRun is one run's figures.
type restartRun struct {
	took          time.Duration
	refused       int64 // upstream refusals in the whole run
	refusedAfter  int64 // in the 10 s after the halfway mark (the restart, when there is one)
	failed        int
	firstFailures []string
	timeline      string // what the upstream admitted and refused by half second (see timeline)
}

// runWithRestart sends n chats at 50 in flight to a proxy on one
// address; restart, when not nil, is called once half of them are
// answered (it stops the proxy and starts another on the same address).
// A chat that meets no proxy, or one shutting down, is sent again after
// 20 ms, as a client with retries would.
func runWithRestart(t *testing.T, mock *mockupstream.Server, addr string, n, models int, restart func()) restartRun {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 50}}
	defer c.CloseIdleConnections()
	var run restartRun
	var mu sync.Mutex
	var next, answered atomic.Int64
	half := make(chan struct{})
	var halfOnce sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if ok, why := sendUntilAnswered(c, addr, i, models, start); !ok {
					mu.Lock()
					run.failed++
					if len(run.firstFailures) < 5 {
						run.firstFailures = append(run.firstFailures, why)
					}
					mu.Unlock()
				}
				if answered.Add(1) == int64(n/2) {
					halfOnce.Do(func() { close(half) })
				}
			}
		}()
	}
	<-half
	before := mock.Stats().RateLimited
	halfAt := time.Since(start)
	if restart != nil {
		restart()
	}
	time.Sleep(10 * time.Second)
	run.refusedAfter = mock.Stats().RateLimited - before
	wg.Wait()
	run.took = time.Since(start)
	st := mock.Stats()
	run.refused = st.RateLimited
	run.timeline = fmt.Sprintf("halfway at %v; admitted/refused by half second: %s", halfAt.Round(time.Millisecond), timeline(start, st.AdmittedAt, st.RefusedAt))
	if *restoreTimeline {
		t.Log(run.timeline)
	}
	return run
}

// timeline is "t:admitted/refused" for each half second after start
// that saw any.
func timeline(start time.Time, admitted, refused []time.Time) string {
	counts := map[int][2]int{}
	last := 0
	for i, ts := range [][]time.Time{admitted, refused} {
		for _, at := range ts {
			k := int(at.Sub(start) / (500 * time.Millisecond))
			c := counts[k]
			c[i]++
			counts[k] = c
			last = max(last, k)
		}
	}
	var b strings.Builder
	for k := 0; k <= last; k++ {
		if c, ok := counts[k]; ok {
			fmt.Fprintf(&b, " %.1f:%d/%d", float64(k)/2, c[0], c[1])
		}
	}
	return b.String()
}

func sendUntilAnswered(c *http.Client, addr string, i int64, models int, start time.Time) (bool, string) {
	model := "gpt-4o-mini"
	if models > 1 {
		model = fmt.Sprintf("gpt-%c", 'a'+i%int64(models)) // asked in turn
	}
	body := fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"question %d"}]}`, model, i)
	for time.Since(start) < 3*time.Minute {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk-restart-key")
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			return true, ""
		case resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), "shutting_down"):
			time.Sleep(20 * time.Millisecond)
			continue
		}
		return false, fmt.Sprintf("chat %d: %d %s", i, resp.StatusCode, lastChars(string(b), 200))
	}
	return false, fmt.Sprintf("chat %d: no proxy answered", i)
}

// TestLearnedLimitsSurviveARestart: against 1,200 RPM with OpenAI's
// quantized headers, and against silent fixed 10 s windows of 200 (where
// relearning costs most), a run whose proxy restarts halfway, by SIGTERM
// and by kill -9, with LLMPROXY_STATE: no more refusals in the 10 s
// after the restart than the same run without a restart sees then (a
// kill -9 mid-window too: a window's requests are counted in the file
// before they go), and the whole run within 1.03× its time. The three runs
// of a shape go side by side, each on its own upstream; the shapes one
// after the other.
func TestLearnedLimitsSurviveARestart(t *testing.T) {
	if raceEnabled {
		// Its figures are wall-clock times and counts beside them: the race
		// detector's load on a 2-core machine moves them. .ci/run runs it
		// in a step of its own, without the detector.
		t.Skip("wall-clock figures: run without -race (.ci/run does)")
	}
	bin := llmproxyBinary(t)
	silent := func(c mockupstream.Config) mockupstream.Config {
		c.NoLimitHeaders, c.NoRetryAfter, c.NoHint, c.ConcurrencyUnnamed = true, true, true, true
		return c
	}
	shapes := []restartShape{
		{"quantized-headers", mockupstream.Config{RPM: 1200, Latency: 50 * time.Millisecond, QuantizedHeaders: true}, *restoreChats, 0},
		// 700: halfway is in the second window, and the last window has
		// room for what a kill -9 had in flight (paid for, its answers
		// lost, sent again).
		{"window-silent", silent(mockupstream.Config{RPM: 1200, Window: 10 * time.Second, Latency: 50 * time.Millisecond}), *restoreChats + 200, 0},
	}
	if *restoreShared {
		// Four models on one limit of the key: the restarted proxy pools
		// them as the one before found them, at each model's first answer.
		// Not in CI: 0-8 refusals in the 10 s after a restart (median 1)
		// where a run without one sees 0 (docs/journal.md).
		shapes = append(shapes, restartShape{"shared-models", mockupstream.Config{RPM: 1200, Latency: 50 * time.Millisecond}, *restoreChats, 4})
	}
	for _, sh := range shapes {
		// One shape at a time: its three runs side by side are load enough
		// for the machine's two cores. With both shapes at once, a burst's
		// first request once reached the silent window's upstream more
		// than 50 ms after it went, the first closure's knock just past
		// the tenth second was refused, and the window was read 11 s long
		// from then on (a CI run: kill -9 1.099×, its first roll at 11 s
		// before the restart).
		t.Run(sh.name, func(t *testing.T) {
			runs := map[string]restartRun{}
			says := map[string]string{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, how := range []string{"none", "SIGTERM", "kill -9"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					run, said := restartOnce(t, bin, sh.mock, sh.n, sh.models, how)
					mu.Lock()
					runs[how], says[how] = run, said
					mu.Unlock()
				}()
			}
			wg.Wait()
			base := runs["none"]
			t.Logf("%d chats without a restart: %v, %d refused (%d in the 10 s after halfway), %d failed",
				sh.n, base.took.Round(time.Millisecond), base.refused, base.refusedAfter, base.failed)
			if base.failed > 0 {
				t.Fatalf("the run without a restart: %d failed: %q", base.failed, base.firstFailures)
			}
			for _, how := range []string{"SIGTERM", "kill -9"} {
				run := runs[how]
				ratio := run.took.Seconds() / base.took.Seconds()
				t.Logf("%s halfway: %v (%.3f×), %d refused (%d in the 10 s after the restart), %d failed; /lanes after: %q",
					how, run.took.Round(time.Millisecond), ratio, run.refused, run.refusedAfter, run.failed, says[how])
				if run.failed > 0 {
					t.Errorf("%s: %d failed: %q", how, run.failed, run.firstFailures)
				}
				if !strings.Contains(says[how], "restored from state at ") {
					t.Errorf("%s: /lanes does not say the lane was restored: %q", how, says[how])
				}
				// A window's requests are counted in the file before they
				// go, so even a kill -9 mid-window leaves nothing to probe.
				if run.refusedAfter > base.refusedAfter {
					t.Errorf("%s: %d refusals in the 10 s after the restart, the run without one had %d then", how, run.refusedAfter, base.refusedAfter)
				}
				// The window shape's first closure is found within 50 ms of
				// its boundary (knocks just past whole seconds of the window),
				// so runs with and without a restart follow one timeline:
				// 0.999-1.002× over 2026-12-06's runs (before, the closure
				// was found up to 0.9 s late, by luck, and runs spread over
				// 0.95-1.07×).
				if ratio > 1.03 {
					t.Errorf("%s: the run took %.3f× the run without a restart, want at most 1.03×", how, ratio)
				}
				if t.Failed() && !*restoreTimeline {
					t.Logf("%s: %s", how, run.timeline)
					t.Logf("without a restart: %s", base.timeline)
				}
			}
		})
	}
}

// restartOnce runs n chats through a proxy with a state file against its
// own upstream with mcfg, restarting the proxy halfway as how says
// ("none", "SIGTERM" or "kill -9"); said is what /lanes said of the
// lanes at the end.
func restartOnce(t *testing.T, bin string, mcfg mockupstream.Config, n, models int, how string) (run restartRun, said string) {
	mock := startMockUpstream(t, mcfg)
	env := []string{"LLMPROXY_ADDR=127.0.0.1:0", "LLMPROXY_STATE=" + filepath.Join(t.TempDir(), "state.db"), "LLMPROXY_LANE_MAX_CONCURRENCY=64"}
	if *restoreNoState {
		env[1] = "LLMPROXY_STATE="
	}
	// The first process takes a port of its own; the one after a restart
	// takes the same (a port picked free and let go before the proxy
	// bound it could be taken by another's listener meanwhile: a CI run
	// saw a proxy exit at start).
	p := startReplica(t, how, bin, mock.URL(), env...)
	addr := p.addr
	env[0] = "LLMPROXY_ADDR=" + addr
	var restart func()
	switch how {
	case "SIGTERM", "kill -9":
		restart = func() {
			if how == "SIGTERM" {
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				p.waitExit(10 * time.Second)
			} else {
				_ = p.kill()
			}
			p = startReplica(t, "after "+how, bin, mock.URL(), env...)
		}
	}
	run = runWithRestart(t, mock, addr, n, models, restart)
	if restart != nil {
		said = restoredSays(t, p)
	}
	p.stop(5 * time.Second)
	return run, said
}

// restoredSays is what /lanes says of where each lane's limits live.
func restoredSays(t *testing.T, r *replica) string {
	t.Helper()
	code, body, err := r.adminGet("/lanes")
	if err != nil || code != 200 {
		t.Fatalf("/lanes: %d %v", code, err)
	}
	var out struct {
		Lanes []struct {
			Shared string `json:"shared"`
		} `json:"lanes"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	var says []string
	for _, l := range out.Lanes {
		says = append(says, l.Shared)
	}
	return strings.Join(says, "; ")
}
