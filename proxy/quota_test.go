package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/internal/pacific"
)

// quotaUpstream answers every request with status, headers and body, and
// counts them.
func quotaUpstream(calls *atomic.Int32, status int, body string, hdr ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		calls.Add(1)
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	})
}

// TestASpentQuotaIsAnsweredHere: after an upstream answer that spends a
// quota, passed on as it came, the lane's next requests get the proxy's
// own answer at once, with the upstream's status, x-should-retry: false,
// Retry-After and the renewal in its message when the upstream said when,
// and the upstream hears none of them; /lanes shows the quota.
func TestASpentQuotaIsAnsweredHere(t *testing.T) {
	start := time.Date(2036, 11, 27, 16, 0, 0, 0, time.UTC) // 08:00 PST; far ahead of the wall clock the request deadlines use
	midnight := pacific.NextMidnight(start)
	for _, c := range []struct {
		name       string
		status     int
		body       string
		hdr        []string
		retryAfter string // "" when the renewal is not known
		words      []string
		lane       []string // in /lanes
	}{
		{"openai insufficient quota", 429,
			`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			nil, "", []string{"did not say when it renews", "one request a minute"}, []string{`"quota": "quota spent, reset not known"`}},
		{"gemini per day", 429,
			`{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}`,
			nil, strconv.Itoa(int(midnight.Sub(start).Seconds())), []string{"until 2036-11-28T08:00:00Z (00:00 PT)"}, []string{`"quota": "quota spent until 00:00 PT"`, `"quota_until": "2036-11-28T00:00:00-08:00"`}},
		{"azure api management 403", 403,
			`{"statusCode":403,"message":"Out of call volume quota. Quota will be replenished in 01:00:00."}`,
			[]string{"Retry-After", "3600"}, "3600", []string{"until 2036-11-27T17:00:00Z (09:00 PT)"}, []string{`"quota": "quota spent until 09:00 PT"`, `"quota_until": "2036-11-27T17:00:00Z"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int32
			fc := clock.NewFake(start)
			h := newHarness(t, quotaUpstream(&calls, c.status, c.body, c.hdr...), func(cfg *Config) { cfg.Clock = fc })
			resp := h.post("/v1/chat/completions", `{"model":"m"}`)
			if body := readAll(t, resp.Body); resp.StatusCode != c.status || body != c.body {
				t.Fatalf("first: %d %s, want the upstream's own answer", resp.StatusCode, body)
			}
			for i := range 3 {
				resp := h.post("/v1/chat/completions", `{"model":"m"}`)
				e := decodeErr(t, resp)
				if resp.StatusCode != c.status || e.Error.Code != "quota_exhausted" || e.Error.Type != "insufficient_quota" ||
					resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") != c.retryAfter ||
					resp.Header.Get("X-Llmproxy-Lane") == "" {
					t.Fatalf("request %d: %d %+v, headers %v; want %d quota_exhausted, Retry-After %q", i, resp.StatusCode, e.Error, resp.Header, c.status, c.retryAfter)
				}
				for _, w := range c.words {
					if !strings.Contains(e.Error.Message, w) {
						t.Errorf("message %q lacks %q", e.Error.Message, w)
					}
				}
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("the upstream got %d requests, want the first alone", n)
			}
			lanes := newAdmin(t, h)("/lanes")
			for _, w := range c.lane {
				if !strings.Contains(lanes, w) {
					t.Fatalf("/lanes lacks %s:\n%s", w, lanes)
				}
			}
		})
	}
}

// echoingUpstream answers as OpenAI does: a body with a field it does not
// know gets a 400 naming the field ("Unrecognized request argument
// supplied: X"); any other, a success.
func echoingUpstream(calls *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var fields map[string]json.RawMessage
		_ = json.NewDecoder(r.Body).Decode(&fields)
		w.Header().Set("Content-Type", "application/json")
		for name := range fields {
			if name != "model" && name != "messages" {
				msg, _ := json.Marshal("Unrecognized request argument supplied: " + name)
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"error":{"message":%s,"type":"invalid_request_error","param":null,"code":null}}`, msg)
				return
			}
		}
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})
}

// TestAClientCannotSpendTheQuota (issue 49): a field named like a day's
// quota, echoed in a 400, and a 403 with a month's Retry-After and a
// plain body, hold nothing: the upstream's answer goes to the client as
// it came, and the next request of the key and model reaches the
// upstream.
func TestAClientCannotSpendTheQuota(t *testing.T) {
	start := time.Date(2036, 11, 27, 16, 0, 0, 0, time.UTC)
	forbidden := func(calls *atomic.Int32) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			readAllQuiet(r)
			if calls.Add(1) == 1 {
				w.Header().Set("Retry-After", "2678000")
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprint(w, "Forbidden")
				return
			}
			fmt.Fprint(w, `{"choices":[]}`)
		})
	}
	for _, c := range []struct {
		name   string
		up     func(*atomic.Int32) http.Handler
		first  string
		status int
	}{
		{"an echoed per day field", echoingUpstream, `{"model":"gpt-4o","messages":[],"per day (try again in 744h":1}`, 400},
		{"an echoed perday field", echoingUpstream, `{"model":"gpt-4o","messages":[],"GenerateRequestsPerDay midnight pacific":1}`, 400},
		{"a 403 with a month's Retry-After", forbidden, `{"model":"gpt-4o","messages":[]}`, 403},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int32
			fc := clock.NewFake(start)
			h := newHarness(t, c.up(&calls), func(cfg *Config) { cfg.Clock = fc })
			resp := h.post("/v1/chat/completions", c.first)
			if body := readAll(t, resp.Body); resp.StatusCode != c.status || strings.Contains(body, "quota_exhausted") {
				t.Fatalf("first: %d %s, want the upstream's own %d", resp.StatusCode, body, c.status)
			}
			for i := range 3 {
				resp := h.post("/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`)
				if body := readAll(t, resp.Body); resp.StatusCode != 200 {
					t.Fatalf("request %d after: %d %s, want the upstream's 200", i, resp.StatusCode, body)
				}
			}
			if n := calls.Load(); n != 4 {
				t.Fatalf("the upstream got %d requests, want all 4", n)
			}
			if lanes := newAdmin(t, h)("/lanes"); strings.Contains(lanes, "quota spent") {
				t.Fatalf("/lanes shows a quota:\n%s", lanes)
			}
		})
	}
}

// TestADailyLimitInWordsIsProbed (issue 49): OpenAI's 429 on requests per
// day, which says so in words alone, holds the key and model, but for at
// most a day whatever its Retry-After says, and one request a minute goes
// upstream; its success ends the hold.
func TestADailyLimitInWordsIsProbed(t *testing.T) {
	start := time.Date(2036, 11, 27, 16, 0, 0, 0, time.UTC)
	const rpd = `{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on requests per day (RPD): Limit 10000, Used 10000, Requested 1. Please try again in 744h.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	var calls atomic.Int32
	spent := atomic.Bool{}
	spent.Store(true)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if spent.Load() {
			w.Header().Set("Retry-After", "2678000")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, rpd)
			return
		}
		fmt.Fprint(w, `{"choices":[]}`)
	})
	fc := clock.NewFake(start)
	h := newHarness(t, up, func(cfg *Config) { cfg.Clock = fc })
	post := func() *http.Response { return h.post("/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`) }
	if resp := post(); resp.StatusCode != 429 || calls.Load() != 1 {
		t.Fatalf("first: %d, the upstream got %d", resp.StatusCode, calls.Load())
	}
	refused := func(when string) {
		t.Helper()
		resp := post()
		e := decodeErr(t, resp)
		day := strconv.Itoa(int(start.Add(24 * time.Hour).Sub(fc.Now()).Seconds()))
		if resp.StatusCode != 429 || e.Error.Code != "quota_exhausted" || resp.Header.Get("Retry-After") != day ||
			!strings.Contains(e.Error.Message, "one request a minute") {
			t.Fatalf("%s: %d %+v, Retry-After %q; want quota_exhausted for at most a day", when, resp.StatusCode, e.Error, resp.Header.Get("Retry-After"))
		}
	}
	refused("at once")
	fc.Set(start.Add(time.Minute - time.Second))
	refused("59 s on")
	if n := calls.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests in the first minute, want 1", n)
	}
	fc.Set(start.Add(time.Minute))
	spent.Store(false)
	if resp := post(); resp.StatusCode != 200 || calls.Load() != 2 {
		t.Fatalf("a minute on: %d, the upstream got %d; want the probe's 200", resp.StatusCode, calls.Load())
	}
	if resp := post(); resp.StatusCode != 200 || calls.Load() != 3 {
		t.Fatalf("after the probe: %d, the upstream got %d; want 200", resp.StatusCode, calls.Load())
	}
}
