package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The journal's and the joins' edges: what readKeepSay takes from a
// client's headers, a journal that fails, the joins' waits and ends, and
// a client gone before its answer.

func TestReadKeepSayTakesOnlyARetryCountAbove0AsARetry(t *testing.T) {
	for _, tc := range []struct {
		count string
		retry bool
	}{{"0", false}, {"1", true}, {" 2 ", true}, {"-1", false}, {"x", false}} {
		var s clientSay
		if err := readKeepSay(http.Header{retryCountHeader: {tc.count}}, &s); err != nil {
			t.Fatal(err)
		}
		if s.keep.retry != tc.retry || !s.keep.retries {
			t.Errorf("X-Stainless-Retry-Count %q: retry %v, retries %v; want retry %v, retries true", tc.count, s.keep.retry, s.keep.retries, tc.retry)
		}
	}
}

func TestReadKeepSayTakesATimeoutAbove0AndBelowAMillionSeconds(t *testing.T) {
	for _, tc := range []struct {
		hdr  http.Header
		want time.Duration
	}{
		{http.Header{"X-Stainless-Timeout": {"0.5"}}, 500 * time.Millisecond},
		{http.Header{"X-Stainless-Timeout": {"999999"}}, 999999 * time.Second},
		{http.Header{"X-Stainless-Timeout": {"1e6"}}, 0},
		{http.Header{"X-Stainless-Timeout": {"-1"}}, 0},
		// A read timeout of 0 states none: the timeout stands.
		{http.Header{"X-Stainless-Timeout": {"5"}, "X-Stainless-Read-Timeout": {"0"}}, 5 * time.Second},
		{http.Header{"X-Stainless-Timeout": {"5"}, "X-Stainless-Read-Timeout": {"1e6"}}, 5 * time.Second},
	} {
		var s clientSay
		if err := readKeepSay(tc.hdr, &s); err != nil {
			t.Fatal(err)
		}
		if s.keep.timeout != tc.want {
			t.Errorf("%v: timeout %v, want %v", tc.hdr, s.keep.timeout, tc.want)
		}
	}
}

func TestReadKeepSayKeepsAnIdempotencyKeyOfUpTo256Bytes(t *testing.T) {
	for _, n := range []int{1, 255, 256, 257} {
		key := strings.Repeat("k", n)
		var s clientSay
		if err := readKeepSay(http.Header{idempotencyHeader: {key}}, &s); err != nil {
			t.Fatal(err)
		}
		if kept := s.keep.idem == key; kept != (n <= 256) {
			t.Errorf("an Idempotency-Key of %d bytes: kept %v, want %v", n, kept, n <= 256)
		}
	}
}

// TestAStreamsClientThatLeavesStatingNoTimeoutEndsItsCall: a stream's
// client that states no timeout of its own and leaves stopped reading:
// its call ends at once, though it carries a retry count.
func TestAStreamsClientThatLeavesStatingNoTimeoutEndsItsCall(t *testing.T) {
	var calls atomic.Int64
	ended := make(chan struct{})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.ReadAll(r.Body) // the server sees its client leave only once the body is read
		<-r.Context().Done()
		close(ended)
	})
	h := newHarness(t, up, nil)
	leaveMidCall(h, `{"model":"m","messages":[],"stream":true}`, func() bool { return calls.Load() > 0 }, 0, retryCountHeader, "0")
	select {
	case <-ended:
	case <-time.After(3 * time.Second):
		t.Fatalf("the call of a stream's client that left, stating no timeout, still runs:\n%s", h.logs.String())
	}
}

// TestJournalSharesTheKeyOfABodyOfExactlyCanonicalMaxWrittenTwoWays: a
// body of exactly canonicalMax bytes is still read as JSON for its key,
// so the same request with its keys in another order replays it.
func TestJournalSharesTheKeyOfABodyOfExactlyCanonicalMaxWrittenTwoWays(t *testing.T) {
	up := &numberedUpstream{}
	h, j := journalHarness(t, up, "record")
	pad := strings.Repeat("x", canonicalMax-len(`{"model":"m","content":""}`))
	a := `{"model":"m","content":"` + pad + `"}`
	b := `{"content":"` + pad + `","model":"m"}`
	if len(a) != canonicalMax || len(b) != canonicalMax {
		t.Fatalf("bodies of %d and %d bytes, want %d", len(a), len(b), canonicalMax)
	}
	if got := readAll(t, h.post("/v1/chat/completions", a, runHeader, "big").Body); got != `{"call":1}` {
		t.Fatalf("recording: %s", got)
	}
	waitEntries(t, j, 1)
	time.Sleep(400 * time.Millisecond) // the run rests: a new pass
	resp := h.post("/v1/chat/completions", b, runHeader, "big", journalHeader, "strict")
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || resp.Header.Get(journalHeader) != "hit" || got != `{"call":1}` {
		t.Fatalf("the same request written another way: %d %q %s, want 200 hit {\"call\":1}", resp.StatusCode, resp.Header.Get(journalHeader), got)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
}

// TestAJournalThatFailsIsLoggedAndTheAnswerStillGoes: a journal that
// reads and writes is quiet and counts its recordings; once its state
// file is closed, a replay's read and the recording's write fail, each
// is logged (without the key), nothing is counted recorded, and the
// client gets the upstream's answer.
func TestAJournalThatFailsIsLoggedAndTheAnswerStillGoes(t *testing.T) {
	up := &numberedUpstream{}
	h, st, j := storeHarness(t, up, "replay")
	recorded := h.proxy.metrics.journal("recorded")
	body := `{"model":"m","messages":[]}`
	if got := readAll(t, h.post("/v1/chat/completions", body, runHeader, "r").Body); got != `{"call":1}` {
		t.Fatalf("first answer: %s", got)
	}
	waitEntries(t, j, 1)
	if n := testutil.ToFloat64(recorded); n != 1 {
		t.Fatalf("recorded %v, want 1", n)
	}
	if logs := h.logs.String(); strings.Contains(logs, "journal read failed") || strings.Contains(logs, "journal write failed") {
		t.Fatalf("a journal that works logged a failure:\n%s", logs)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user"}]}`, runHeader, "r")
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != `{"call":2}` {
		t.Fatalf("with the journal closed: %d %s, want the upstream's answer", resp.StatusCode, got)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.logs.String(), "journal write failed"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the failed write is not logged:\n%s", h.logs.String())
		}
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "journal read failed") {
		t.Errorf("the failed read is not logged:\n%s", logs)
	}
	if strings.Contains(logs, testKey) {
		t.Error("the log holds the API key")
	}
	if n := testutil.ToFloat64(recorded); n != 1 {
		t.Errorf("recorded %v after a failed write, want 1", n)
	}
}

// TestJournalEndpointsAnswer500WhenTheJournalFails: with its state file
// closed, GET /journal and DELETE /journal say the journal could not be
// read or changed.
func TestJournalEndpointsAnswer500WhenTheJournalFails(t *testing.T) {
	h, st, _ := storeHarness(t, &numberedUpstream{}, "record")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	admin := h.proxy.AdminHandler(Health{}, ListenerAddr("127.0.0.1:9090"))
	for _, tc := range [][3]string{{"GET", "/journal", "the journal could not be read: "}, {"DELETE", "/journal?all=1", "the journal could not be changed: "}} {
		rec := adminServe(admin, tc[0], tc[1])
		if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), tc[2]) || !strings.Contains(rec.Body.String(), "internal_error") {
			t.Errorf("%s %s: %d %s", tc[0], tc[1], rec.Code, rec.Body)
		}
	}
}

// TestARequestJoiningARecordingThatFailsGoesOnByItself: a re-run's
// request that joined its killed run's recording, which then fails, is
// not answered the error: it goes upstream itself.
func TestARequestJoiningARecordingThatFailsGoesOnByItself(t *testing.T) {
	hold := make(chan struct{})
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		_, _ = io.ReadAll(r.Body)
		if n == 1 {
			<-hold
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"bad"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"call":%d}`, n)
	})
	h, j := journalHarness(t, up, "replay")
	h.proxy.keeping.passGap = time.Hour // only the kill ends the pass
	body := `{"model":"m","messages":[]}`
	leaveMidCall(h, body, func() bool { return calls.Load() > 0 }, 0, runHeader, "k") // the eval killed
	got := make(chan string, 1)
	go func() {
		resp := h.post("/v1/chat/completions", body, runHeader, "k")
		got <- fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get(journalHeader), readAll(t, resp.Body))
	}()
	for deadline := time.Now().Add(5 * time.Second); !recordingJoined(h); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the re-run's request did not join the recording")
		}
	}
	close(hold)
	if g := <-got; g != `200 recorded {"call":2}` {
		t.Fatalf("the re-run's request got %q, want its own call's answer, recorded", g)
	}
	waitEntries(t, j, 1)
}

// anyJoined reports whether a call of calls (the keeping's by slot or by
// Idempotency-Key) has a request joined to it.
func anyJoined[K comparable](h *harness, calls func(*keeping) map[K]*tape) bool {
	k := &h.proxy.keeping
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, t := range calls(k) {
		t.mu.Lock()
		n := t.joiners
		t.mu.Unlock()
		if n != 0 {
			return true
		}
	}
	return false
}

func recordingJoined(h *harness) bool {
	return anyJoined(h, func(k *keeping) map[slotKey]*tape { return k.recs })
}

func idemJoined(h *harness) bool {
	return anyJoined(h, func(k *keeping) map[[32]byte]*tape { return k.byIdem })
}

// TestARetryClaimsNoOrphanWhileAnotherRequestIsJoinedToIt: an orphan
// serves one joiner at a time; while a request with its Idempotency-Key
// is joined to it, a retry of the same request goes upstream itself.
func TestARetryClaimsNoOrphanWhileAnotherRequestIsJoinedToIt(t *testing.T) {
	var calls atomic.Int64
	hold := make(chan struct{})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if b, _ := io.ReadAll(r.Body); strings.Contains(string(b), "held") {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, `{"call":%d}`, n)
	})
	h := newHarness(t, up, nil)
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body) // the lane has heard an answer: it sends without waiting for one
	body := `{"model":"m","messages":["held"]}`
	leaveMidCall(h, body, func() bool { return calls.Load() > 1 }, 0,
		retryCountHeader, "0", "X-Stainless-Timeout", "0.01", idempotencyHeader, "idem-1") // at its timeout: an orphan
	got := make(chan string, 2)
	send := func(who string, hdr ...string) {
		resp := h.post("/v1/chat/completions", body, hdr...)
		got <- who + " " + resp.Header.Get("X-Llmproxy-Joined") + " " + readAll(t, resp.Body)
	}
	go send("same-key", idempotencyHeader, "idem-1")
	for deadline := time.Now().Add(5 * time.Second); !idemJoined(h); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request with the same Idempotency-Key did not join")
		}
	}
	go send("retry", retryCountHeader, "1")
	for deadline := time.Now().Add(2 * time.Second); calls.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(hold)
	answers := map[string]bool{}
	for range 2 {
		answers[<-got] = true
	}
	if !answers[`same-key true {"call":2}`] || !answers[`retry  {"call":3}`] || calls.Load() != 3 {
		t.Fatalf("answers %v from %d upstream calls; want the same key's joined to call 2 and the retry's its own call 3", answers, calls.Load())
	}
}

// joinedStream sends a stream's request (its body canonical, so that the
// journal's key and a join's are one), whose client leaves at its own
// timeout once the upstream has it, then a retry of it, which joins that
// call, and releases hold, which the upstream (streamUpstream) waits on.
// It returns the retry's answer, its headers read; hdr are the retry's
// extra header pairs.
func joinedStream(t *testing.T, h *harness, calls *atomic.Int64, hold chan struct{}, hdr ...string) *http.Response {
	t.Helper()
	body := `{"messages":[],"model":"m","stream":true}` // canonical: the journal's key and a join's are one
	leaveMidCall(h, body, func() bool { return calls.Load() > 0 }, 0, retryCountHeader, "0", "X-Stainless-Timeout", "0.01")
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set(retryCountHeader, "1")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := testClient.Do(req)
		got <- answer{resp, err}
	}()
	time.Sleep(50 * time.Millisecond)
	close(hold)
	var a answer
	select {
	case a = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the retry got no answer's headers within 5 s")
	}
	if a.err != nil {
		t.Fatal(a.err)
	}
	t.Cleanup(func() { a.resp.Body.Close() })
	return a.resp
}

// streamUpstream counts its calls in calls and answers each, once hold
// is closed, with status and "data: 1\n\n"; then, once next is closed,
// it calls end, or, when end is nil, sends "data: 2\n\n" and ends.
func streamUpstream(calls *atomic.Int64, hold, next chan struct{}, status int, end func(http.ResponseWriter)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.ReadAll(r.Body)
		<-hold
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(status)
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		if end != nil {
			end(w)
			return
		}
		fmt.Fprint(w, "data: 2\n\n")
	})
}

// releaser returns a func that closes next once; the test's end closes
// it too, so that a call still waiting on it ends before the servers
// close. Call it after the harness is made.
func releaser(t *testing.T, next chan struct{}) func() {
	var once sync.Once
	release := func() { once.Do(func() { close(next) }) }
	t.Cleanup(release)
	return release
}

// readWithin reads n bytes of r, or fails the test after 5 s.
func readWithin(t *testing.T, r io.Reader, n int) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		b := make([]byte, n)
		k, err := io.ReadFull(r, b)
		got <- fmt.Sprintf("%q %v", b[:k], err)
	}()
	select {
	case g := <-got:
		return g
	case <-time.After(5 * time.Second):
		t.Fatalf("no %d bytes within 5 s", n)
		return ""
	}
}

// TestAJoinerGetsASuccessAsItComes: a retry joined to a stream answered
// with any success (200 to 299) gets its first event while the call is
// still under way, then the rest and its end, from one upstream call;
// no journal, so the answer says nothing of one.
func TestAJoinerGetsASuccessAsItComes(t *testing.T) {
	for _, status := range []int{200, 299} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			var calls atomic.Int64
			hold, next := make(chan struct{}), make(chan struct{})
			h := newHarness(t, streamUpstream(&calls, hold, next, status, nil), nil)
			release := releaser(t, next)
			resp := joinedStream(t, h, &calls, hold)
			if resp.StatusCode != status || resp.Header.Get("X-Llmproxy-Joined") != "true" {
				t.Fatalf("the retry: %d, joined %q; want %d, joined", resp.StatusCode, resp.Header.Get("X-Llmproxy-Joined"), status)
			}
			if v, ok := resp.Header[journalHeader]; ok {
				t.Errorf("a join without a journal says x-llmproxy-journal: %q", v)
			}
			if g := readWithin(t, resp.Body, 9); g != `"data: 1\n\n" <nil>` {
				t.Fatalf("the first event, while the call runs: %s", g)
			}
			release()
			if g := readWithin(t, resp.Body, 10); g != `"data: 2\n\n" unexpected EOF` {
				t.Fatalf("the rest and its end: %s, want the second event, then EOF", g)
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("upstream called %d times, want 1", n)
			}
		})
	}
}

// TestAJoinedAnswerSaysHitWhenTheJoinerAsksTheJournal: a joiner that
// says x-llmproxy-journal (replay) is told its answer came from the
// journal's keeping, though the call it joined is not recorded.
func TestAJoinedAnswerSaysHitWhenTheJoinerAsksTheJournal(t *testing.T) {
	var calls atomic.Int64
	hold, next := make(chan struct{}), make(chan struct{})
	close(next)
	h, _ := journalHarness(t, streamUpstream(&calls, hold, next, 200, nil), "")
	resp := joinedStream(t, h, &calls, hold, journalHeader, "replay")
	body, err := readAllErr(resp)
	if resp.Header.Get("X-Llmproxy-Joined") != "true" || resp.Header.Get(journalHeader) != "hit" || body != "data: 1\n\ndata: 2\n\n" || err != io.EOF {
		t.Fatalf("the joiner: joined %q, journal %q, %q %v; want joined, hit, the whole stream", resp.Header.Get("X-Llmproxy-Joined"), resp.Header.Get(journalHeader), body, err)
	}
}

// TestAJoinersAnswerBreaksOffWithTheCallItJoined: when the joined call
// breaks off, the joiner's answer breaks off too, not ends as if whole.
func TestAJoinersAnswerBreaksOffWithTheCallItJoined(t *testing.T) {
	var calls atomic.Int64
	hold, next := make(chan struct{}), make(chan struct{})
	h := newHarness(t, streamUpstream(&calls, hold, next, 200, func(http.ResponseWriter) { panic(http.ErrAbortHandler) }), nil)
	release := releaser(t, next)
	resp := joinedStream(t, h, &calls, hold)
	if g := readWithin(t, resp.Body, 9); g != `"data: 1\n\n" <nil>` || resp.Header.Get("X-Llmproxy-Joined") != "true" {
		t.Fatalf("the first event, joined: %s (joined %q)", g, resp.Header.Get("X-Llmproxy-Joined"))
	}
	release()
	rest, err := readAllErr(resp)
	if rest != "" || err == nil || err == io.EOF {
		t.Fatalf("after the call broke off the joiner read %q, %v; want nothing more and a broken answer", rest, err)
	}
}

// TestAnAnswerGoesToAClientStillThereAndNoneToOneGone: the upstream's
// answer reaches a client that waits for it; a client that leaves
// before it is logged gone, and its call is not tried again.
func TestAnAnswerGoesToAClientStillThereAndNoneToOneGone(t *testing.T) {
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if b, _ := io.ReadAll(r.Body); strings.Contains(string(b), "hold") {
			<-r.Context().Done()
			return
		}
		fmt.Fprintf(w, `{"call":%d}`, n)
	})
	h := newHarness(t, up, nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != `{"call":1}` {
		t.Fatalf("a client that waits: %d %q, want the upstream's answer", resp.StatusCode, got)
	}
	if strings.Contains(h.logs.String(), "outcome=client_gone") {
		t.Fatalf("a client that waited is logged gone:\n%s", h.logs.String())
	}
	leaveMidCall(h, `{"model":"hold"}`, func() bool { return calls.Load() > 1 }, 0)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.logs.String(), "outcome=client_gone"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a client that left is not logged gone:\n%s", h.logs.String())
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("upstream called %d times, want 2: a call whose client left is not tried again", n)
	}
}
