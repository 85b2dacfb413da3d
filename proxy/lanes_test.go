package proxy

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

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

// TestAnAnswerWithoutUsageKeepsTheEstimate: an answer that tells no usage
// leaves its request's estimate charged to the lane's token budget.
func TestAnAnswerWithoutUsageKeepsTheEstimate(t *testing.T) {
	h := newHarness(t, settleUpstream(false, -1), nil)
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
	before := laneState(h.proxy, "m").TokensAvailable
	readAll(t, h.post("/v1/chat/completions", `{"model":"m","max_tokens":40000}`).Body)
	if held := before - laneState(h.proxy, "m").TokensAvailable; held < 40000 {
		t.Fatalf("the request holds %.0f tokens of the budget after an answer without usage, want its estimate of over 40,000", held)
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

// TestLanesRunOnTheProxysClock: a proxy given a clock gives it to its
// lanes when their configuration names none.
func TestLanesRunOnTheProxysClock(t *testing.T) {
	fc := clock.NewFake(time.Unix(2_000_000_000, 0))
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) }),
		func(c *Config) { c.Clock = fc })
	readAll(t, h.post("/v1/chat/completions", `{"model":"m"}`).Body)
	if got := laneState(h.proxy, "m").LastUsed; !got.Equal(fc.Now()) {
		t.Fatalf("lane last used at %v, want the proxy's clock %v", got, fc.Now())
	}
}
