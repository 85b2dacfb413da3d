package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
)

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

// TestADeadlineWhileQueuedIs504NoRetry: a request whose deadline (here the
// SDK's own timeout) ends while it waits behind a slow one gets 504
// budget_exceeded with x-should-retry: false, leaves the queue, and never
// reaches the upstream.
func TestADeadlineWhileQueuedIs504NoRetry(t *testing.T) {
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
		t.Errorf("queued %d after the deadline passed, want 0", q)
	}
	release()
	if s := <-first; s != 200 {
		t.Fatalf("the first request got %d", s)
	}
	select {
	case body := <-arrived:
		t.Fatalf("the upstream got %s after its deadline passed", body)
	default:
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

// TestTheDeadlineFollowsTheSDKsTimeoutWhenItIsShorter: X-Stainless-Timeout
// brings the request's deadline before LLMPROXY_MAX_WAIT's; a timeout of
// zero, negative, unreadable or longer than MAX_WAIT leaves it as it is.
func TestTheDeadlineFollowsTheSDKsTimeoutWhenItIsShorter(t *testing.T) {
	p := &Proxy{cfg: Config{MaxWait: 10 * time.Minute}}
	now := time.Unix(1_000_000, 0)
	for v, want := range map[string]time.Duration{
		"":      10 * time.Minute,
		"30":    30 * time.Second,
		"0.5":   500 * time.Millisecond,
		"0":     10 * time.Minute,
		"-5":    10 * time.Minute,
		"junk":  10 * time.Minute,
		"NaN":   10 * time.Minute,
		"3600":  10 * time.Minute,
		"1e300": 10 * time.Minute,
	} {
		r, _ := http.NewRequest("POST", "/v1/x", nil)
		if v != "" {
			r.Header.Set("X-Stainless-Timeout", v)
		}
		if got := p.deadline(r, now, 0).Sub(now); got != want {
			t.Errorf("X-Stainless-Timeout %q: wait %v, want %v", v, got, want)
		}
	}
}
