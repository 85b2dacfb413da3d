package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// These tests hold promises of the README that mutation testing found
// unguarded: each fails when the behaviour it names breaks.

// TestHopByHopHeadersNeverReachTheClient: the upstream's hop-by-hop
// headers, and those its Connection header names, stay between the proxy
// and the upstream; its other headers reach the client.
func TestHopByHopHeadersNeverReachTheClient(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Connection", "X-Upstream-Hop, X-Other-Hop")
		hd.Set("X-Upstream-Hop", "between proxy and upstream")
		hd.Set("X-Other-Hop", "also")
		hd.Set("Keep-Alive", "timeout=5")
		hd.Set("Proxy-Authenticate", `Basic realm="upstream"`)
		hd.Set("Proxy-Connection", "keep-alive")
		hd.Set("Upgrade", "h2c")
		hd.Set("X-End-To-End", "kept")
		fmt.Fprint(w, `{}`)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	readAll(t, resp.Body)
	for _, name := range []string{"X-Upstream-Hop", "X-Other-Hop", "Keep-Alive", "Proxy-Authenticate", "Proxy-Connection", "Upgrade"} {
		if v := resp.Header.Get(name); v != "" {
			t.Errorf("hop-by-hop header %s: %q reached the client", name, v)
		}
	}
	if c := resp.Header.Get("Connection"); strings.Contains(strings.ToLower(c), "hop") {
		t.Errorf("the upstream's Connection header %q reached the client", c)
	}
	if resp.Header.Get("X-End-To-End") != "kept" {
		t.Error("an end-to-end header was dropped")
	}
}

// blockingUpstream answers nothing until release is closed or the
// request's context ends; arrived receives each request's model.
func blockingUpstream(release <-chan struct{}, arrived chan<- string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readAllQuiet(r)
		select {
		case arrived <- body:
		default:
		}
		select {
		case <-release:
			fmt.Fprint(w, `{}`)
		case <-r.Context().Done():
		}
	})
}

func readAllQuiet(r *http.Request) string {
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := r.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestFullLaneQueueIs429QueueFull: a request beyond LLMPROXY_MAX_QUEUE is
// answered at once with 429 queue_full and Retry-After: 1, retryable; the
// queued one is not disturbed.
func TestFullLaneQueueIs429QueueFull(t *testing.T) {
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock() // also when the test fails: the upstream's handlers must end
	arrived := make(chan string, 4)
	h := newHarness(t, blockingUpstream(release, arrived), func(c *Config) {
		c.Lanes.Lane = lanequeue.Config{Concurrency: 1, MaxConcurrency: 1, MaxQueue: 1}
	})
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post("/v1/chat/completions", `{"model":"m"}`)
			readAll(t, resp.Body)
			statuses[i] = resp.StatusCode
		}()
		if i == 0 {
			<-arrived // the first holds the one slot
		}
	}
	waitFor(t, func() bool { return laneQueued(h.proxy, "m") == 1 })

	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	e := decodeErr(t, resp)
	if resp.StatusCode != 429 || e.Error.Code != "queue_full" || e.Error.Type != "rate_limit_error" {
		t.Fatalf("got %d %s/%s, want 429 rate_limit_error/queue_full", resp.StatusCode, e.Error.Type, e.Error.Code)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
	if resp.Header.Get("X-Should-Retry") == "false" {
		t.Error("a full queue told the client not to retry")
	}
	if q := laneQueued(h.proxy, "m"); q != 1 {
		t.Errorf("queued %d after the refusal, want 1", q)
	}
	unblock()
	wg.Wait()
	if statuses[0] != 200 || statuses[1] != 200 {
		t.Fatalf("the admitted requests got %v, want 200 both", statuses)
	}
}

// oneSlotTaken is a proxy whose lane has one slot, taken by a request the
// upstream holds until release is called (defer it, so a failing test
// ends too); first yields that request's status, arrived the bodies of any
// later request the upstream gets.
func oneSlotTaken(t *testing.T) (h *harness, release func(), arrived chan string, first chan int) {
	ch, arrived, first := make(chan struct{}), make(chan string, 4), make(chan int, 1)
	release = sync.OnceFunc(func() { close(ch) })
	h = newHarness(t, blockingUpstream(ch, arrived), func(c *Config) {
		c.Lanes.Lane = lanequeue.Config{Concurrency: 1, MaxConcurrency: 1}
	})
	go func() {
		resp := h.post("/v1/chat/completions", `{"model":"m","who":"first"}`)
		readAll(t, resp.Body)
		first <- resp.StatusCode
	}()
	<-arrived
	return h, release, arrived, first
}

// TestBudgetRunOutWhileQueuedIs504NoRetry: a request whose budget (here the
// SDK's own timeout) ends while it waits behind a slow one gets 504
// budget_exceeded with x-should-retry: false, leaves the queue, and never
// reaches the upstream.
func TestBudgetRunOutWhileQueuedIs504NoRetry(t *testing.T) {
	h, release, arrived, first := oneSlotTaken(t)
	defer release()
	resp := h.post("/v1/chat/completions", `{"model":"m","who":"second"}`, "X-Stainless-Timeout", "1")
	e := decodeErr(t, resp)
	if resp.StatusCode != 504 || e.Error.Code != "budget_exceeded" || e.Error.Type != "timeout_error" {
		t.Fatalf("got %d %s/%s, want 504 timeout_error/budget_exceeded", resp.StatusCode, e.Error.Type, e.Error.Code)
	}
	if resp.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("x-should-retry %q, want false", resp.Header.Get("X-Should-Retry"))
	}
	if q := laneQueued(h.proxy, "m"); q != 0 {
		t.Errorf("queued %d after the budget ran out, want 0", q)
	}
	release()
	if s := <-first; s != 200 {
		t.Fatalf("the first request got %d", s)
	}
	select {
	case body := <-arrived:
		t.Fatalf("the upstream got %s after its budget ran out", body)
	default:
	}
}

// settleUpstream learns a large token window on the first answer, which
// refills a few tokens a second, then answers without headers with the
// usage given, plainly or as a stream.
func settleUpstream(stream bool, used int) http.Handler {
	var n atomic.Int32
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		if n.Add(1) == 1 {
			w.Header().Set("X-Ratelimit-Limit-Tokens", "1000000")
			w.Header().Set("X-Ratelimit-Remaining-Tokens", "500000")
			w.Header().Set("X-Ratelimit-Reset-Tokens", "100000s")
			fmt.Fprint(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			return
		}
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, used-5, 5, used)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", used-5, 5, used)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
}

// TestAnswerUsageSettlesTheTokenEstimate: a request estimated at 40,000
// tokens (its max_tokens) that used 30 gives the difference back to the
// lane's token budget once its answer, plain or streamed, has been read.
func TestAnswerUsageSettlesTheTokenEstimate(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			h := newHarness(t, settleUpstream(stream, 30), nil)
			readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
			before := laneState(h.proxy, "m").TokensAvailable
			if before < 490000 {
				t.Fatalf("tokens available %v after the first answer, want about 500,000", before)
			}
			body := `{"model":"m","max_tokens":40000,"stream":` + fmt.Sprint(stream) + `}`
			readAll(t, h.post("/v1/chat/completions", body).Body)
			after := laneState(h.proxy, "m").TokensAvailable
			// Unsettled, the estimate of over 40,000 would stay charged.
			if used := before - after; used > 1000 {
				t.Fatalf("the request still holds %.0f tokens of the budget, want its usage of 30", used)
			}
		})
	}
}

// TestRateRefusalPausesTheWholeLane: after a 429 with a wait hint, a
// request that arrives during the wait is held until it ends: the refused
// request's retry reaches the upstream before it.
func TestRateRefusalPausesTheWholeLane(t *testing.T) {
	var mu sync.Mutex
	var order []string
	var n atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := readAllQuiet(r)
		mu.Lock()
		order = append(order, who)
		mu.Unlock()
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After-Ms", "600")
			w.WriteHeader(429)
			fmt.Fprint(w, `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`)
			return
		}
		fmt.Fprint(w, `{}`)
	}), nil)
	a := make(chan int, 1)
	go func() {
		resp := h.post("/v1/chat/completions", `{"model":"m","who":"a"}`)
		readAll(t, resp.Body)
		a <- resp.StatusCode
	}()
	waitFor(t, func() bool { return laneState(h.proxy, "m").Absorbed429 == 1 })
	if st := laneState(h.proxy, "m"); !st.PausedUntil.After(time.Now()) {
		t.Fatalf("lane not paused after a 429 with a 600ms hint: %+v", st)
	}
	resp := h.post("/v1/chat/completions", `{"model":"m","who":"b"}`)
	readAll(t, resp.Body)
	if resp.StatusCode != 200 || <-a != 200 {
		t.Fatalf("b got %d", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{`{"model":"m","who":"a"}`, `{"model":"m","who":"a"}`, `{"model":"m","who":"b"}`}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("upstream saw %v, want a, a's retry, then b", order)
	}
}

// TestBearerKeysGetTheirOwnLanes: two Bearer keys never share a lane (one
// key's 429 must not hold the other), and one key keeps its lane.
func TestBearerKeysGetTheirOwnLanes(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) }), nil)
	lane := func(key string) string {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`, "Authorization", "Bearer "+key)
		readAll(t, resp.Body)
		return resp.Header.Get("X-Llmproxy-Lane")
	}
	a, b, a2 := lane("sk-key-one-aaaaaaaa"), lane("sk-key-two-bbbbbbbb"), lane("sk-key-one-aaaaaaaa")
	if a == "" || a == b {
		t.Fatalf("two keys got lanes %q and %q", a, b)
	}
	if a != a2 {
		t.Fatalf("one key got lanes %q and %q", a, a2)
	}
	if n := len(h.proxy.States()); n != 2 {
		t.Fatalf("%d lanes, want 2", n)
	}
}

// TestClientCancellationReachesTheUpstream: a client that hangs up while
// its request is at the upstream, before the answer's headers or while the
// answer streams, cancels the upstream call and frees its slot.
func TestClientCancellationReachesTheUpstream(t *testing.T) {
	for _, midStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("mid-stream=%v", midStream), func(t *testing.T) {
			arrived := make(chan struct{}, 1)
			cancelled := make(chan struct{})
			h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				readAllQuiet(r) // the server notices a closed connection once the body is read
				if midStream {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: {}\n\n")
					w.(http.Flusher).Flush()
				}
				arrived <- struct{}{}
				select {
				case <-r.Context().Done():
					close(cancelled)
				case <-time.After(10 * time.Second):
				}
			}), nil)
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
			req.Header.Set("Authorization", "Bearer "+testKey)
			errc := make(chan error, 1)
			go func() {
				resp, err := testClient.Do(req)
				if err == nil {
					buf := make([]byte, 64)
					_, err = resp.Body.Read(buf) // the first event, mid-stream
					resp.Body.Close()
				}
				errc <- err
			}()
			<-arrived
			if midStream {
				if err := <-errc; err != nil {
					t.Fatalf("the first event did not arrive: %v", err)
				}
			}
			cancel()
			if !midStream {
				<-errc
			}
			select {
			case <-cancelled:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream call went on after the client hung up")
			}
			waitFor(t, func() bool { return laneInFlight(h.proxy, "m") == 0 })
		})
	}
}

// TestQueuedClientThatHangsUpLeavesTheQueue: a client that gives up while
// its request waits for a slot is taken out of the lane's queue at once and
// never reaches the upstream.
func TestQueuedClientThatHangsUpLeavesTheQueue(t *testing.T) {
	h, release, arrived, first := oneSlotTaken(t)
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","who":"second"}`))
	req.Header.Set("Authorization", "Bearer "+testKey)
	errc := make(chan error, 1)
	go func() {
		resp, err := testClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, func() bool { return laneQueued(h.proxy, "m") == 1 })
	cancel()
	<-errc
	waitFor(t, func() bool { st := laneState(h.proxy, "m"); return st.Queued == 0 && st.Cancelled == 1 })
	release()
	if s := <-first; s != 200 {
		t.Fatalf("the first request got %d", s)
	}
	select {
	case body := <-arrived:
		t.Fatalf("the upstream got %s from a client that had hung up", body)
	default:
	}
}
