package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestJournalKeysALargeBodyByAllOfIt: two bodies past canonicalMax that
// differ only at their end are two requests.
func TestJournalKeysALargeBodyByAllOfIt(t *testing.T) {
	up := &numberedUpstream{}
	h, j := journalHarness(t, up, "record")
	pad := strings.Repeat("x", 5<<20)
	a := `{"model":"m","messages":[{"role":"user","content":"` + pad + ` question A"}]}`
	b := `{"model":"m","messages":[{"role":"user","content":"` + pad + ` question B"}]}`
	resp := h.post("/v1/chat/completions", a, runHeader, "big")
	t.Log("A:", resp.StatusCode, readAll(t, resp.Body))
	waitEntries(t, j, 1)
	time.Sleep(400 * time.Millisecond)
	resp = h.post("/v1/chat/completions", b, runHeader, "big", journalHeader, "strict")
	got := readAll(t, resp.Body)
	t.Logf("B (a different request) in strict mode: %d %s %q", resp.StatusCode, resp.Header.Get(journalHeader), got)
	if resp.StatusCode == 200 {
		t.Errorf("a different request got A's recording")
	}
}

// TestAJoinedRecordingCutOffStillEndsItsRequestInThePass: a re-run's
// request joins the killed run's call, which breaks off; the run's pass
// counts no live request after.
func TestAJoinedRecordingCutOffStillEndsItsRequestInThePass(t *testing.T) {
	hold := make(chan struct{})
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		<-hold
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprint(w, "data: {\"part\":0}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		panic(http.ErrAbortHandler)
	})
	h, _ := journalHarness(t, up, "replay")
	h.proxy.keeping.passGap = 200 * time.Millisecond
	body := `{"model":"m","messages":[],"stream":true}`
	leaveMidCall(h, body, func() bool { return calls.Load() > 0 }, 0, runHeader, "k")
	got := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set(runHeader, "k")
		resp, err := testClient.Do(req)
		if err != nil {
			got <- "err " + err.Error()
			return
		}
		s, err := readAllErr(resp)
		got <- fmt.Sprintf("%s %q %v", resp.Header.Get(journalHeader), s, err)
	}()
	time.Sleep(50 * time.Millisecond)
	close(hold)
	t.Log("joiner:", <-got)
	time.Sleep(time.Second) // far past passGap
	h.proxy.keeping.mu.Lock()
	p := h.proxy.keeping.runs["k"]
	live := -1
	if p != nil {
		live = p.live
	}
	h.proxy.keeping.mu.Unlock()
	t.Logf("run k's pass live=%d", live)
	if live > 0 {
		t.Errorf("the pass counts %d live requests after every request ended", live)
	}
}

// TestAnOccurrenceGoesBackOnlyToItsOwnPass: a call of a killed pass
// that fails later gives its occurrence back to that pass, not to the
// new one, where it would be taken twice.
func TestAnOccurrenceGoesBackOnlyToItsOwnPass(t *testing.T) {
	hold := make(chan struct{})
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if n == 2 {
			<-hold
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":{"message":"bad"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"call":%d}`, n)
	})
	h, _ := journalHarness(t, up, "replay")
	h.proxy.keeping.passGap = time.Hour
	body := `{"model":"m","temperature":1,"messages":[]}`
	post := func() string {
		resp := h.post("/v1/chat/completions", body, runHeader, "k")
		return resp.Header.Get(journalHeader) + " " + readAll(t, resp.Body)
	}
	t.Log("pass1 occ1:", post())
	leaveMidCall(h, body, func() bool { return calls.Load() >= 2 }, 0, runHeader, "k") // the eval killed with occ 2 in flight
	t.Log("pass2 occ1:", post())
	close(hold) // the orphan fails: gives occ 2 back, into pass 2
	time.Sleep(100 * time.Millisecond)
	c, d := post(), post()
	t.Log("pass2 C:", c)
	t.Log("pass2 D:", d)
	if strings.HasPrefix(d, "hit") && strings.TrimPrefix(d, "hit ") == strings.SplitN(c, " ", 2)[1] {
		t.Errorf("D got C's sample: occurrence 2 used twice")
	}
}

// TestARetryJoinsAStreamInFlightFromItsFirstByte: the retry of a stream
// whose client left gets all of it, from one upstream call (EOF: the
// stream ended whole).
func TestARetryJoinsAStreamInFlightFromItsFirstByte(t *testing.T) {
	hold := make(chan struct{})
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		<-hold
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(100 * time.Millisecond)
		fmt.Fprint(w, "data: 2\n\n")
	})
	h := newHarness(t, up, nil)
	body := `{"model":"m","messages":[]}`
	send := func(ctx context.Context, retry string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set(retryCountHeader, retry)
		req.Header.Set("X-Stainless-Timeout", "0.01") // it leaves at its timeout, as an SDK does
		return testClient.Do(req)
	}
	leaveMidCall(h, body, func() bool { return calls.Load() > 0 }, 0, retryCountHeader, "0", "X-Stainless-Timeout", "0.01")
	got := make(chan string, 1)
	go func() {
		resp, err := send(context.Background(), "1")
		if err != nil {
			got <- err.Error()
			return
		}
		s, err := readAllErr(resp)
		got <- fmt.Sprintf("%d joined=%s %q err=%v", resp.StatusCode, resp.Header.Get("X-Llmproxy-Joined"), s, err)
	}()
	time.Sleep(50 * time.Millisecond)
	close(hold)
	if g := <-got; g != `200 joined=true "data: 1\n\ndata: 2\n\n" err=EOF` || calls.Load() != 1 {
		t.Fatalf("retry got %s from %d upstream calls; want the whole stream, joined, from one", g, calls.Load())
	}
}
