package proxy

import (
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
