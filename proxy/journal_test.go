package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/state"
)

// numberedUpstream answers every call with its number, as JSON or, for
// a body asking for a stream, as three server-sent events. hold, when
// not nil, holds each answer until it is closed or receives.
type numberedUpstream struct {
	calls atomic.Int64
	hold  chan struct{}
}

func (c *numberedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.calls.Add(1)
	b, _ := io.ReadAll(r.Body)
	if c.hold != nil {
		select {
		case <-c.hold:
		case <-r.Context().Done():
			return
		}
	}
	if strings.Contains(string(b), `"stream":true`) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "7")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"call\":%d,\"part\":%d}\n\n", n, i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"call":%d}`, n)
}

func journalHarness(t *testing.T, up http.Handler, mode string) (*harness, *state.Journal) {
	t.Helper()
	h, _, j := storeHarness(t, up, mode)
	return h, j
}

// storeHarness is journalHarness with the store, to close under the proxy.
func storeHarness(t *testing.T, up http.Handler, mode string) (*harness, *state.Store, *state.Journal) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	j, err := st.Journal(time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, up, func(c *Config) {
		c.Journal, c.JournalMode, c.JournalPassGap = j, mode, 300*time.Millisecond
	})
	return h, st, j
}

// waitEntries waits until the journal holds n entries (its writes end
// after the answer).
func waitEntries(t *testing.T, j *state.Journal, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); j.Stats().Entries != n; {
		if time.Now().After(deadline) {
			t.Fatalf("journal holds %d entries, want %d", j.Stats().Entries, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestJournalGivesTheKthRecordingToTheKthIdenticalRequest(t *testing.T) {
	up := &numberedUpstream{}
	h, j := journalHarness(t, up, "record")
	body := `{"model":"m","temperature":1,"messages":[]}`
	for i := 1; i <= 3; i++ {
		resp := h.post("/v1/chat/completions", body, runHeader, "r1")
		if got := readAll(t, resp.Body); got != fmt.Sprintf(`{"call":%d}`, i) {
			t.Fatalf("recording %d: %s", i, got)
		}
		if v := resp.Header.Get(journalHeader); v != "recorded" {
			t.Fatalf("recording %d: x-llmproxy-journal %q, want recorded", i, v)
		}
	}
	waitEntries(t, j, 3)
	time.Sleep(400 * time.Millisecond) // the run rests: the next request starts a new pass

	// Keys written in another order and spacing are the same request.
	same := `{ "messages": [], "model": "m", "temperature": 1 }`
	for i := 1; i <= 3; i++ {
		resp := h.post("/v1/chat/completions", same, runHeader, "r1", journalHeader, "strict")
		if got := readAll(t, resp.Body); got != fmt.Sprintf(`{"call":%d}`, i) || resp.Header.Get(journalHeader) != "hit" {
			t.Fatalf("replay %d: %s (%s)", i, got, resp.Header.Get(journalHeader))
		}
	}
	resp := h.post("/v1/chat/completions", same, runHeader, "r1", journalHeader, "strict")
	if resp.StatusCode != http.StatusNotFound || decodeErr(t, resp).Error.Code != "journal_miss" {
		t.Fatalf("a fourth occurrence in strict mode: %d, want 404 journal_miss", resp.StatusCode)
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("upstream saw %d calls, want 3", n)
	}
}

func TestJournalKeepsRunsCredentialsAndStreamsApart(t *testing.T) {
	up := &numberedUpstream{}
	h, j := journalHarness(t, up, "record")
	body := `{"model":"m","messages":[]}`
	stream := `{"model":"m","messages":[],"stream":true}`
	readAll(t, h.post("/v1/chat/completions", body, runHeader, "a").Body)
	want := readAll(t, h.post("/v1/chat/completions", stream, runHeader, "a").Body)
	waitEntries(t, j, 2)
	time.Sleep(400 * time.Millisecond)

	for _, tc := range []struct {
		name string
		hdr  []string
		body string
	}{
		{"another run", []string{runHeader, "b"}, body},
		{"another credential", []string{runHeader, "a", "Authorization", "Bearer sk-other"}, body},
		{"another path", []string{runHeader, "a"}, body},
	} {
		path := "/v1/chat/completions"
		if tc.name == "another path" {
			path = "/v1/completions"
		}
		resp := h.post(path, tc.body, append(tc.hdr, journalHeader, "strict")...)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want a miss (404)", tc.name, resp.StatusCode)
		}
	}
	resp := h.post("/v1/chat/completions", stream, runHeader, "a", journalHeader, "strict")
	got := readAll(t, resp.Body)
	if got != want || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("the stream replayed as %q (%s), want byte for byte %q", got, resp.Header.Get("Content-Type"), want)
	}
	if resp.Header.Get("X-Ratelimit-Remaining-Requests") != "" {
		t.Error("a replay carries the recorded rate-limit headers, which said something of that moment only")
	}
}

func TestJournalReplayForwardsAMissAndRecordsIt(t *testing.T) {
	up := &numberedUpstream{}
	h, j := journalHarness(t, up, "replay")
	body := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	first := h.post("/v1/chat/completions", body, runHeader, "r")
	if first.Header.Get(journalHeader) != "recorded" || readAll(t, first.Body) != `{"call":1}` {
		t.Fatal("a miss in replay mode is not forwarded and recorded")
	}
	waitEntries(t, j, 1)
	time.Sleep(400 * time.Millisecond)
	again := h.post("/v1/chat/completions", body, runHeader, "r")
	if again.Header.Get(journalHeader) != "hit" || readAll(t, again.Body) != `{"call":1}` || up.calls.Load() != 1 {
		t.Fatalf("the re-run is not served from the journal: %s, %d calls", again.Header.Get(journalHeader), up.calls.Load())
	}
}

func TestJournalNeverKeepsAnError(t *testing.T) {
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"bad"}}`)
			return
		}
		fmt.Fprint(w, `{"ok":true}`)
	})
	h, j := journalHarness(t, up, "replay")
	resp := h.post("/v1/chat/completions", `{"model":"m"}`, runHeader, "r")
	if resp.StatusCode != 400 || resp.Header.Get(journalHeader) != "miss" {
		t.Fatalf("error answer: %d %s", resp.StatusCode, resp.Header.Get(journalHeader))
	}
	readAll(t, resp.Body)
	// Its occurrence was given back: the next identical request takes it.
	resp = h.post("/v1/chat/completions", `{"model":"m"}`, runHeader, "r")
	readAll(t, resp.Body)
	waitEntries(t, j, 1)
	var occ uint32
	if err := j.Each("r", func(e *state.Entry) bool { occ = e.Occurrence; return true }); err != nil {
		t.Fatal(err)
	}
	if occ != 1 {
		t.Fatalf("the answer after an error was recorded as occurrence %d, want 1", occ)
	}
}

func TestJournalSaysWhatIsWrong(t *testing.T) {
	h := newHarness(t, &numberedUpstream{}, nil)
	resp := h.post("/v1/chat/completions", `{}`, journalHeader, "replay")
	if e := decodeErr(t, resp); resp.StatusCode != 400 || e.Error.Code != "invalid_journal" || !strings.Contains(e.Error.Message, "LLMPROXY_STATE") {
		t.Fatalf("journal header with no state file: %d %+v", resp.StatusCode, e)
	}
	h2, _ := journalHarness(t, &numberedUpstream{}, "")
	resp = h2.post("/v1/chat/completions", `{}`, journalHeader, "sometimes")
	if e := decodeErr(t, resp); resp.StatusCode != 400 || e.Error.Code != "invalid_journal" {
		t.Fatalf("a bad journal mode: %d %+v", resp.StatusCode, e)
	}
}

// TestARetryJoinsTheCallItsClientLeft: a client gives up on a call in
// flight and retries, as the SDKs do; the retry gets the first call's
// answer, and the upstream is called once.
func TestARetryJoinsTheCallItsClientLeft(t *testing.T) {
	up := &numberedUpstream{hold: make(chan struct{})}
	h := newHarness(t, up, nil)
	body := `{"model":"m","messages":[]}`
	send := func(ctx context.Context, retry string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set(retryCountHeader, retry)
		req.Header.Set("X-Stainless-Timeout", "1") // it leaves at its timeout, as an SDK does
		return testClient.Do(req)
	}
	called := func() bool { return up.calls.Load() > 0 }
	leaveMidCall(h, body, called, time.Second, retryCountHeader, "0", "X-Stainless-Timeout", "1") // at its timeout
	got := make(chan string, 1)
	go func() {
		resp, err := send(context.Background(), "1")
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- resp.Header.Get("X-Llmproxy-Joined") + " " + string(b)
	}()
	time.Sleep(50 * time.Millisecond)
	close(up.hold)
	if g := <-got; g != `true {"call":1}` {
		t.Fatalf("the retry got %q, want the first call's answer, joined", g)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
}

// TestARunKilledStartsANewPass: when every request of a run in flight
// loses its client at once (the eval killed), the run's next request
// counts its occurrences from 1 again, and one whose recording is still
// in flight joins that call.
func TestARunKilledStartsANewPass(t *testing.T) {
	up := &numberedUpstream{hold: make(chan struct{})}
	h, j := journalHarness(t, up, "replay")
	h.proxy.keeping.passGap = time.Hour // only the kill can end the pass
	body := `{"model":"m","messages":[]}`
	leaveMidCall(h, body, func() bool { return up.calls.Load() > 0 }, 0, runHeader, "k") // the eval killed
	got := make(chan string, 1)
	go func() {
		resp := h.post("/v1/chat/completions", body, runHeader, "k")
		got <- resp.Header.Get(journalHeader) + " " + readAll(t, resp.Body)
	}()
	time.Sleep(50 * time.Millisecond)
	close(up.hold)
	if g := <-got; g != `hit {"call":1}` {
		t.Fatalf("the re-run's request got %q, want the killed run's call, joined", g)
	}
	waitEntries(t, j, 1)
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
}

// TestARequestWithTheSameIdempotencyKeyJoinsTheCall: two requests with
// one Idempotency-Key and credential are one call upstream; another
// credential with the same key is a call of its own.
func TestARequestWithTheSameIdempotencyKeyJoinsTheCall(t *testing.T) {
	up := &numberedUpstream{hold: make(chan struct{})}
	h := newHarness(t, up, nil)
	got := make(chan string, 3)
	send := func(key string) {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`, idempotencyHeader, "idem-1", "Authorization", "Bearer "+key)
		got <- key + " " + readAll(t, resp.Body)
	}
	go send(testKey)
	for up.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	go send(testKey)
	go send("sk-another")
	for up.calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	close(up.hold)
	answers := map[string]int{}
	for range 3 {
		answers[<-got]++
	}
	if answers[testKey+` {"call":1}`] != 2 || up.calls.Load() != 2 {
		t.Fatalf("answers %v, %d upstream calls; want the key's two requests answered by call 1, and two calls", answers, up.calls.Load())
	}
}

// TestAClientThatGivesUpBeforeItsTimeoutLeavesNoCall: a client that
// leaves well before its own timeout gave up (a user's cancel): its call
// ends at once, and no retry can join it.
func TestAClientThatGivesUpBeforeItsTimeoutLeavesNoCall(t *testing.T) {
	up := &numberedUpstream{hold: make(chan struct{})}
	defer close(up.hold)
	h := newHarness(t, up, nil)
	leaveMidCall(h, `{"model":"m"}`, func() bool { return up.calls.Load() > 0 }, 0, retryCountHeader, "0", "X-Stainless-Timeout", "600")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st := h.proxy.States(); len(st) == 1 && st[0].InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call of a client that gave up is still in flight")
		}
	}
}

// leaveMidCall sends a chat with body and hdr (name, value pairs) and
// leaves, as a client whose timeout or kill ends it, once upstream
// reports the call arrived and stay more has passed; it returns when the
// proxy has seen it go.
func leaveMidCall(h *harness, body string, upstream func() bool, stay time.Duration, hdr ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		if resp, err := testClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for !upstream() {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(stay)
	cancel()
	<-done
	time.Sleep(50 * time.Millisecond) // the proxy sees it leave
}
