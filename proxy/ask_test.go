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

	"github.com/coder/websocket"

	"github.com/llmproxy/llmproxy/clock"
)

// TestReadSay: x-llmproxy-max-wait takes a number of seconds above 0, and
// x-llmproxy-retry on or off in any case; anything else is an error that
// names its header.
func TestReadSay(t *testing.T) {
	for _, c := range []struct {
		header, value string
		want          clientSay
		bad           string // the header the error names; "" for none
	}{
		{"X-Llmproxy-Max-Wait", "30", clientSay{maxWait: 30 * time.Second}, ""},
		{"X-Llmproxy-Max-Wait", " 2.5 ", clientSay{maxWait: 2500 * time.Millisecond}, ""},
		{"X-Llmproxy-Max-Wait", "1e3", clientSay{maxWait: 1000 * time.Second}, ""},
		{"X-Llmproxy-Max-Wait", "0.0000000001", clientSay{maxWait: 1}, ""}, // under a nanosecond: the least there is
		{"X-Llmproxy-Max-Wait", "1e300", clientSay{maxWait: time.Duration(1<<63 - 1)}, ""},
		{"X-Llmproxy-Max-Wait", "9223372036.854775807", clientSay{maxWait: time.Duration(1<<63 - 1)}, ""}, // the longest there is
		{"X-Llmproxy-Max-Wait", "0", clientSay{}, "x-llmproxy-max-wait"},
		{"X-Llmproxy-Max-Wait", "-5", clientSay{}, "x-llmproxy-max-wait"},
		{"X-Llmproxy-Max-Wait", "NaN", clientSay{}, "x-llmproxy-max-wait"},
		{"X-Llmproxy-Max-Wait", "Inf", clientSay{}, "x-llmproxy-max-wait"},
		{"X-Llmproxy-Max-Wait", "30s", clientSay{}, "x-llmproxy-max-wait"},
		{"X-Llmproxy-Max-Wait", "", clientSay{}, "x-llmproxy-max-wait"},
		{"X-Llmproxy-Retry", "off", clientSay{retryOff: true}, ""},
		{"X-Llmproxy-Retry", " OFF ", clientSay{retryOff: true}, ""},
		{"X-Llmproxy-Retry", "on", clientSay{}, ""},
		{"X-Llmproxy-Retry", "On", clientSay{}, ""},
		{"X-Llmproxy-Retry", "no", clientSay{}, "x-llmproxy-retry"},
		{"X-Llmproxy-Retry", "", clientSay{}, "x-llmproxy-retry"},
	} {
		got, err := readSay(http.Header{c.header: {c.value}})
		switch {
		case c.bad == "" && err != nil:
			t.Errorf("%s: %q: %v", c.header, c.value, err)
		case c.bad != "" && (err == nil || !strings.HasPrefix(err.Error(), c.bad+" must be")):
			t.Errorf("%s: %q: error %v, want one naming %s", c.header, c.value, err, c.bad)
		case got != c.want:
			t.Errorf("%s: %q: %+v, want %+v", c.header, c.value, got, c.want)
		}
	}
	if got, err := readSay(http.Header{}); err != nil || got != (clientSay{}) {
		t.Errorf("no headers: %+v, %v; want the defaults", got, err)
	}
}

// TestTheDeadlineFollowsTheClientsMaxWait: x-llmproxy-max-wait brings the
// deadline before LLMPROXY_MAX_WAIT's, a longer one leaves it; with
// X-Stainless-Timeout the shorter of the two counts.
func TestTheDeadlineFollowsTheClientsMaxWait(t *testing.T) {
	p := &Proxy{cfg: Config{MaxWait: 10 * time.Minute}}
	now := time.Unix(1_000_000, 0)
	for _, c := range []struct {
		maxWait   time.Duration
		stainless string
		want      time.Duration
	}{
		{0, "", 10 * time.Minute},
		{30 * time.Second, "", 30 * time.Second},
		{10 * time.Minute, "", 10 * time.Minute},
		{time.Hour, "", 10 * time.Minute},
		{30 * time.Second, "20", 20 * time.Second},
		{20 * time.Second, "30", 20 * time.Second},
	} {
		r, _ := http.NewRequest("POST", "/v1/x", nil)
		if c.stainless != "" {
			r.Header.Set("X-Stainless-Timeout", c.stainless)
		}
		if got := p.deadline(r, now, c.maxWait).Sub(now); got != c.want {
			t.Errorf("max-wait %v, X-Stainless-Timeout %q: wait %v, want %v", c.maxWait, c.stainless, got, c.want)
		}
	}
}

// TestABadSayGets400NamingTheHeader: a value of x-llmproxy-max-wait or
// x-llmproxy-retry the proxy cannot read gets a 400 in OpenAI's form that
// names the header, and nothing goes upstream.
func TestABadSayGets400NamingTheHeader(t *testing.T) {
	var calls atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		fmt.Fprint(w, `{}`)
	}), nil)
	for _, c := range []struct{ header, value, code string }{
		{"X-Llmproxy-Max-Wait", "soon", "invalid_max_wait"},
		{"X-Llmproxy-Retry", "sometimes", "invalid_retry"},
	} {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`, c.header, c.value)
		if resp.StatusCode != 400 || resp.Header.Get("X-Should-Retry") != "false" {
			t.Fatalf("%s: %s: status %d, x-should-retry %q; want 400, false", c.header, c.value, resp.StatusCode, resp.Header.Get("X-Should-Retry"))
		}
		e := decodeErr(t, resp)
		if e.Error.Code != c.code || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, strings.ToLower(c.header)) {
			t.Errorf("%s: %+v", c.header, e.Error)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests with bad headers", n)
	}
}

// TestTheClientsSayStaysHere: x-llmproxy-priority, -max-wait and -retry
// are not sent upstream, on a request or on a WebSocket handshake.
func TestTheClientsSayStaysHere(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := &realtimeUpstream{}
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		for name := range r.Header {
			if strings.HasPrefix(name, "X-Llmproxy-") && name != "X-Llmproxy-Request-Id" {
				seen = append(seen, name)
			}
		}
		mu.Unlock()
		up.ServeHTTP(w, r)
	}), nil)
	say := []string{"X-Llmproxy-Priority", "low", "X-Llmproxy-Max-Wait", "30", "X-Llmproxy-Retry", "off"}
	resp := h.post("/v1/chat/completions", `{"model":"m"}`, say...)
	readAll(t, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := http.Header{"Authorization": {"Bearer " + testKey}}
	for i := 0; i+1 < len(say); i += 2 {
		hdr.Set(say[i], say[i+1])
	}
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.front.URL, "http")+"/v1/realtime?model=gpt-realtime",
		&websocket.DialOptions{HTTPHeader: hdr, Subprotocols: []string{"realtime"}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	mu.Lock()
	defer mu.Unlock()
	if len(seen) > 0 || up.handshakes.Load() != 1 {
		t.Fatalf("the upstream saw %v (and %d handshakes, want 1)", seen, up.handshakes.Load())
	}
}

// TestMaxWaitShortensTheDeadline: a request whose lane a refusal's pause
// holds longer than its x-llmproxy-max-wait is answered 429
// wait_exceeds_budget at once, while one without it waits the pause out;
// a request queued behind a slot held longer than its max-wait gets 504
// budget_exceeded while that slot is still held.
func TestMaxWaitShortensTheDeadline(t *testing.T) {
	t.Run("paused", func(t *testing.T) {
		// The proxy runs on a fake clock, which stands still while the
		// machine is slow: the pause has its 1.5 s left until the test
		// moves the clock.
		fc := clock.NewFake(time.Unix(2_000_000_000, 0))
		var n atomic.Int32
		h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			readAllQuiet(r)
			if n.Add(1) == 1 {
				w.Header().Set("Retry-After-Ms", "1500")
				w.WriteHeader(429)
				fmt.Fprint(w, `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`)
				return
			}
			fmt.Fprint(w, `{}`)
		}), func(c *Config) { c.Clock = fc })
		type answer struct {
			status int
			at     time.Time // on the fake clock
		}
		send := func(say ...string) chan answer {
			out := make(chan answer, 1)
			go func() {
				resp := h.post("/v1/chat/completions", `{"model":"m"}`, say...)
				readAll(t, resp.Body)
				out <- answer{resp.StatusCode, fc.Now()}
			}()
			return out
		}
		first := send()
		waitFor(t, func() bool { return laneState(h.proxy, "m").PausedUntil.After(fc.Now()) })
		until := laneState(h.proxy, "m").PausedUntil
		resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Llmproxy-Max-Wait", "0.5")
		if e := decodeErr(t, resp); resp.StatusCode != 429 || e.Error.Code != "wait_exceeds_budget" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("with max-wait 0.5 under a 1.5 s pause: %d %+v, Retry-After %q; want 429 wait_exceeds_budget", resp.StatusCode, e.Error, resp.Header.Get("Retry-After"))
		}
		waited := send("X-Llmproxy-Max-Wait", "60")
		waitFor(t, func() bool { return laneState(h.proxy, "m").Queued == 2 }) // the first's retry and this one
		var answers []answer
		for deadline := time.Now().Add(20 * time.Second); len(answers) < 2; {
			select {
			case a := <-first:
				answers = append(answers, a)
			case a := <-waited:
				answers = append(answers, a)
				if a.status != 200 || a.at.Before(until) {
					t.Fatalf("with max-wait 60 under the pause: %d, %v from the pause's end; want 200 after it", a.status, a.at.Sub(until))
				}
			case <-time.After(5 * time.Millisecond):
				if time.Now().After(deadline) {
					t.Fatalf("%d of two answered after the pause, at %v", len(answers), fc.Now())
				}
				fc.Advance(50 * time.Millisecond)
			}
		}
		for _, a := range answers {
			if a.status != 200 {
				t.Fatalf("answers %+v after the pause, want 200 for both", answers)
			}
		}
	})
	t.Run("queued", func(t *testing.T) {
		h, release, _, first := oneSlotTaken(t)
		defer release()
		h.proxy.cfg.MaxWait = time.Minute // the client's timeout ends the test long before
		resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Llmproxy-Max-Wait", "0.2")
		if e := decodeErr(t, resp); resp.StatusCode != 504 || e.Error.Code != "budget_exceeded" {
			t.Fatalf("queued with max-wait 0.2: %d %+v, want 504 budget_exceeded", resp.StatusCode, e.Error)
		}
		select {
		case s := <-first:
			t.Fatalf("the slot was given up (%d) before the queued request's answer", s)
		default:
		}
		release()
		if s := <-first; s != 200 {
			t.Fatalf("the first request got %d", s)
		}
	})
}

// TestRetryOffPassesTheUpstreamsAnswer: with x-llmproxy-retry: off, a 429
// comes back with the upstream's body and headers, its rate-limit headers
// and Retry-After included and no x-should-retry the upstream did not
// send, after one attempt; the lane still takes the refusal's pause. A 503
// comes back the same way; with "on" the proxy retries as always.
func TestRetryOffPassesTheUpstreamsAnswer(t *testing.T) {
	var calls atomic.Int32
	var status atomic.Int32
	status.Store(429)
	const refusal = `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		if calls.Add(1)%2 == 0 {
			fmt.Fprint(w, `{}`)
			return
		}
		w.Header().Set("Retry-After", "2")
		w.Header().Set("X-Ratelimit-Limit-Requests", "10")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
		w.Header().Set("X-Ratelimit-Reset-Requests", "2s")
		w.Header().Set("X-Upstream-Own", "kept")
		w.WriteHeader(int(status.Load()))
		fmt.Fprint(w, refusal)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Llmproxy-Retry", "off")
	body := readAll(t, resp.Body)
	if resp.StatusCode != 429 || strings.TrimSpace(body) != refusal {
		t.Fatalf("retry off: %d %s, want the upstream's 429 and body", resp.StatusCode, body)
	}
	for name, want := range map[string]string{"Retry-After": "2", "X-Ratelimit-Remaining-Requests": "0",
		"X-Upstream-Own": "kept", "X-Should-Retry": "", "X-Llmproxy-Retries": "0"} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("retry off: %s %q, want %q", name, got, want)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("retry off: the upstream got %d attempts, want 1", n)
	}
	if st := laneState(h.proxy, "m"); !st.PausedUntil.After(time.Now()) || st.Answers[429] != 1 {
		t.Fatalf("retry off: the lane did not take the refusal's pause: %+v", st)
	}

	status.Store(503)
	calls.Store(2) // the next answer is the refusal
	resp = h.post("/v1/chat/completions", `{"model":"m2"}`, "X-Llmproxy-Retry", "OFF")
	readAll(t, resp.Body)
	if resp.StatusCode != 503 || calls.Load() != 3 || resp.Header.Get("X-Should-Retry") != "" {
		t.Fatalf("retry off on a 503: %d after %d attempts, x-should-retry %q; want the 503 after one", resp.StatusCode, calls.Load()-2, resp.Header.Get("X-Should-Retry"))
	}

	calls.Store(4)
	resp = h.post("/v1/chat/completions", `{"model":"m3"}`, "X-Llmproxy-Retry", "on")
	readAll(t, resp.Body)
	if resp.StatusCode != 200 || calls.Load() != 6 {
		t.Fatalf("retry on: %d after %d attempts, want 200 after a retry", resp.StatusCode, calls.Load()-4)
	}
}

// TestRetryOffShowsAnErrorsRateLimitHeaders: under x-llmproxy-retry: off
// an error answer, a 400 too, keeps the upstream's rate-limit headers,
// which the proxy strips from it otherwise and from a success either way.
func TestRetryOffShowsAnErrorsRateLimitHeaders(t *testing.T) {
	var status atomic.Int32
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("X-Ratelimit-Remaining-Requests", "5")
		w.WriteHeader(int(status.Load()))
		fmt.Fprint(w, `{}`)
	}), nil)
	for _, c := range []struct {
		status int
		say    []string
		want   string
	}{
		{400, []string{"X-Llmproxy-Retry", "off"}, "5"},
		{400, nil, ""},
		{200, []string{"X-Llmproxy-Retry", "off"}, ""},
	} {
		status.Store(int32(c.status))
		resp := h.post("/v1/chat/completions", `{"model":"m"}`, c.say...)
		readAll(t, resp.Body)
		if got := resp.Header.Get("X-Ratelimit-Remaining-Requests"); resp.StatusCode != c.status || got != c.want {
			t.Errorf("%d with %v: x-ratelimit-remaining-requests %q, want %q", resp.StatusCode, c.say, got, c.want)
		}
	}
}
