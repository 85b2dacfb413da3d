package mockupstream

import (
	"bufio"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chatBody has 2 runes of text in 1 message: 1+3 = 4 prompt tokens, and
// costs 4+16 = 20 tokens at admission.
const chatBody = `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`

// forty is a chat body with 40 runes in one message and max_tokens 27:
// 10+3 = 13 prompt tokens, costing 40.
var forty = `{"model":"gpt-test","max_tokens":27,"messages":[{"role":"user","content":"` + strings.Repeat("a", 40) + `"}]}`

func TestRequestBucketAdmitsBurstThenLimits(t *testing.T) {
	clock := newFakeClock()
	s := start(t, Config{RPM: 60, RequestBurst: 3, Now: clock.Now})

	for i, reset := range []string{"1s", "2s", "3s"} {
		resp, _ := post(t, s, "/v1/chat/completions", "k", chatBody)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		wantHeaders(t, resp.Header, map[string]string{
			"x-ratelimit-limit-requests":     "3",
			"x-ratelimit-remaining-requests": strconv.Itoa(2 - i),
			"x-ratelimit-reset-requests":     reset,
			"x-ratelimit-limit-tokens":       "", // TPM unlimited
			"Retry-After":                    "",
		})
	}

	resp, body := post(t, s, "/v1/chat/completions", "k", chatBody)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th request: status %d, want 429", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"Retry-After":                    "1",
		"retry-after-ms":                 "1000",
		"x-ratelimit-remaining-requests": "0",
		"x-ratelimit-reset-requests":     "3s",
	})
	if got := dig(body, "error", "type"); got != "requests" {
		t.Errorf("error.type = %v, want requests", got)
	}
	if got := dig(body, "error", "code"); got != "rate_limit_exceeded" {
		t.Errorf("error.code = %v", got)
	}
	if e := dig(body, "error").(map[string]any); e["param"] != nil || !strings.HasPrefix(e["message"].(string), "Rate limit reached for requests") {
		t.Errorf("error = %v", e)
	}

	clock.Advance(250 * time.Millisecond)
	resp, _ = post(t, s, "/v1/chat/completions", "k", chatBody)
	wantHeaders(t, resp.Header, map[string]string{
		"Retry-After":                "1",
		"retry-after-ms":             "750",
		"x-ratelimit-reset-requests": "2.75s",
	})

	clock.Advance(750 * time.Millisecond)
	resp, _ = post(t, s, "/v1/chat/completions", "k", chatBody)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after refill: status %d", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{"x-ratelimit-remaining-requests": "0"})

	clock.Advance(time.Hour) // refills to capacity, not beyond
	resp, _ = post(t, s, "/v1/chat/completions", "k", chatBody)
	wantHeaders(t, resp.Header, map[string]string{"x-ratelimit-remaining-requests": "2"})

	// Another key has its own bucket.
	if resp, _ := post(t, s, "/v1/chat/completions", "other", chatBody); resp.StatusCode != http.StatusOK {
		t.Errorf("other key: status %d", resp.StatusCode)
	}

	st := s.Stats()
	if st.Requests != 8 || st.OK != 6 || st.RateLimited != 2 {
		t.Errorf("stats = %+v", st)
	}
	// Each admission and refusal is timed, on the server's clock, in order.
	if len(st.AdmittedAt) != 6 || len(st.RefusedAt) != 2 || !slices.IsSortedFunc(st.AdmittedAt, time.Time.Compare) ||
		!st.AdmittedAt[5].Equal(clock.Now()) || st.RefusedAt[1].After(st.AdmittedAt[3]) {
		t.Errorf("admitted at %v, refused at %v", st.AdmittedAt, st.RefusedAt)
	}
	if k := st.ByKey["k"]; k != (KeyStats{Requests: 7, OK: 5, RateLimited: 2, MaxInFlightSeen: 1}) {
		t.Errorf("ByKey[k] = %+v", k)
	}
}

func TestTokenBucketLimitsIndependentlyOfRequests(t *testing.T) {
	clock := newFakeClock()
	s := start(t, Config{RPM: 6000, RequestBurst: 100, TPM: 600, TokenBurst: 100, Now: clock.Now})

	for _, want := range []struct{ remaining, reset string }{{"60", "4s"}, {"20", "8s"}} {
		resp, _ := post(t, s, "/v1/chat/completions", "k", forty)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		wantHeaders(t, resp.Header, map[string]string{
			"x-ratelimit-limit-tokens":     "100",
			"x-ratelimit-remaining-tokens": want.remaining,
			"x-ratelimit-reset-tokens":     want.reset,
		})
	}

	resp, body := post(t, s, "/v1/chat/completions", "k", forty)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"Retry-After":                    "2", // 20 missing tokens at 10/s
		"retry-after-ms":                 "2000",
		"x-ratelimit-remaining-requests": "98", // requests are plentiful
		"x-ratelimit-remaining-tokens":   "20",
	})
	if got := dig(body, "error", "type"); got != "tokens" {
		t.Errorf("error.type = %v, want tokens", got)
	}
	if msg := dig(body, "error", "message").(string); !strings.Contains(msg, "Limit 100, Used 80, Requested 40") {
		t.Errorf("message = %q", msg)
	}

	clock.Advance(2 * time.Second)
	resp, _ = post(t, s, "/v1/chat/completions", "k", forty)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after refill: status %d", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{"x-ratelimit-remaining-tokens": "0"})

	// A request that can never fit is refused with no Retry-After.
	clock.Advance(time.Minute)
	resp, body = post(t, s, "/v1/chat/completions", "k", `{"model":"m","max_tokens":1000,"messages":[]}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("too large: status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if msg := dig(body, "error", "message").(string); !strings.HasPrefix(msg, "Request too large") {
		t.Errorf("message = %q", msg)
	}
}

func TestDefaultBurstIsOneSecondsWorth(t *testing.T) {
	for _, tc := range []struct {
		cfg                   Config
		wantRequests, wantTok string
	}{
		{Config{RPM: 120, TPM: 6000}, "2", "100"},
		{Config{RPM: 30, TPM: 30}, "1", "1"},
		{Config{RPM: 30, RequestBurst: 7, TPM: 30, TokenBurst: 500}, "7", "500"},
	} {
		s := start(t, tc.cfg)
		resp, _ := post(t, s, "/v1/embeddings", "k", `{"model":"e","input":""}`)
		wantHeaders(t, resp.Header, map[string]string{
			"x-ratelimit-limit-requests": tc.wantRequests,
			"x-ratelimit-limit-tokens":   tc.wantTok,
		})
	}
}

func TestQuantizedHeadersStatePerMinuteLimits(t *testing.T) {
	clock := newFakeClock()
	// Enforced: 20 requests and 1,000 tokens a second, one second's worth of
	// burst. Stated: 1,200 and 60,000 a minute.
	s := start(t, Config{RPM: 1200, TPM: 60000, QuantizedHeaders: true, Now: clock.Now})

	for i := range 20 {
		resp, _ := post(t, s, "/v1/chat/completions", "k", chatBody) // 20 tokens each
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		wantHeaders(t, resp.Header, map[string]string{
			"x-ratelimit-limit-requests":     "1200",
			"x-ratelimit-remaining-requests": strconv.Itoa(19 - i),
			"x-ratelimit-reset-requests":     (time.Duration(i+1) * 50 * time.Millisecond).String(),
			"x-ratelimit-limit-tokens":       "60000",
			"x-ratelimit-remaining-tokens":   strconv.Itoa(980 - 20*i),
			"x-ratelimit-reset-tokens":       (time.Duration(i+1) * 20 * time.Millisecond).String(),
		})
	}

	// The 21st request in the same instant is refused although the headers
	// promised 1,200; the 429 is the one an unquantized mock sends.
	resp, body := post(t, s, "/v1/chat/completions", "k", chatBody)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("21st request: status %d, want 429", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"x-ratelimit-limit-requests":     "1200",
		"x-ratelimit-remaining-requests": "0",
		"x-ratelimit-reset-requests":     "1s",
		"Retry-After":                    "1",
		"retry-after-ms":                 "50",
	})
	if msg := dig(body, "error", "message").(string); !strings.Contains(msg, "Limit 20, Used 20, Requested 1") {
		t.Errorf("message = %q", msg)
	}

	// Anthropic's names state the same figures.
	resp, _ = postAnthropic(t, s, "c", `{"model":"c","max_tokens":5,"messages":[]}`)
	wantHeaders(t, resp.Header, map[string]string{
		"anthropic-ratelimit-requests-limit":     "1200",
		"anthropic-ratelimit-requests-remaining": "19",
		"anthropic-ratelimit-tokens-limit":       "60000",
		"anthropic-ratelimit-tokens-remaining":   "995",
	})

	// However long the key rests, it gets back one second's worth, not a
	// minute's.
	clock.Advance(time.Hour)
	resp, _ = post(t, s, "/v1/chat/completions", "k", chatBody)
	wantHeaders(t, resp.Header, map[string]string{
		"x-ratelimit-limit-requests":     "1200",
		"x-ratelimit-remaining-requests": "19",
	})

	if st := s.Stats(); st.Requests != 23 || st.OK != 22 || st.RateLimited != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestSetRetryAfterOverridesAdvertisedWait(t *testing.T) {
	s := start(t, Config{RPM: 60, Now: newFakeClock().Now})
	post(t, s, "/v1/chat/completions", "k", chatBody)

	s.SetRetryAfter(1500 * time.Millisecond)
	resp, _ := post(t, s, "/v1/chat/completions", "k", chatBody)
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "2", "retry-after-ms": "1500"})

	s.SetRetryAfter(0)
	resp, _ = post(t, s, "/v1/chat/completions", "k", chatBody)
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "1", "retry-after-ms": "1000"})
}

func TestHardQuotaKeys(t *testing.T) {
	s := start(t, Config{RPM: 600, HardQuotaKeys: []string{"broke"}})

	resp, body := post(t, s, "/v1/chat/completions", "broke", chatBody)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if dig(body, "error", "type") != "insufficient_quota" || dig(body, "error", "code") != "insufficient_quota" {
		t.Errorf("body = %v", body)
	}
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "", "retry-after-ms": "", "x-ratelimit-limit-requests": ""})

	resp, body = postAnthropic(t, s, "broke", `{"model":"c","max_tokens":5,"messages":[]}`)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("anthropic status %d", resp.StatusCode)
	}
	if dig(body, "type") != "error" || dig(body, "error", "type") != "rate_limit_error" ||
		dig(body, "error", "details", "error_code") != "enforced_spend_limit_reached" {
		t.Errorf("anthropic body = %v", body)
	}
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "", "anthropic-ratelimit-requests-limit": ""})

	if resp, _ := post(t, s, "/v1/chat/completions", "fine", chatBody); resp.StatusCode != http.StatusOK {
		t.Errorf("other key: status %d", resp.StatusCode)
	}
	if st := s.Stats(); st.HardQuota != 2 || st.RateLimited != 0 || st.OK != 1 || st.Requests != 3 {
		t.Errorf("stats = %+v", st)
	}
}

func TestMaxInFlightCountsUntilStreamEnds(t *testing.T) {
	hold := make(chan struct{})
	s := start(t, Config{MaxInFlight: 1, StreamHold: hold})

	stream := send(t, s, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`, "Authorization", "Bearer a")
	r := bufio.NewReader(stream.Body)
	if _, ok := readEvent(t, r); !ok {
		t.Fatal("no first chunk")
	}

	resp, body := post(t, s, "/v1/chat/completions", "a", chatBody)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second request: status %d, want 429", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "1", "retry-after-ms": "1000"})
	if msg := dig(body, "error", "message").(string); dig(body, "error", "code") != "rate_limit_exceeded" || !strings.Contains(msg, "concurren") {
		t.Errorf("body = %v", body)
	}
	if resp, _ := post(t, s, "/v1/chat/completions", "b", chatBody); resp.StatusCode != http.StatusOK {
		t.Errorf("key b: status %d", resp.StatusCode)
	}

	close(hold)
	readEvents(t, r)
	// Having read the whole stream, the client finds its slot free again.
	if resp, _ := post(t, s, "/v1/chat/completions", "a", chatBody); resp.StatusCode != http.StatusOK {
		t.Errorf("after stream: status %d", resp.StatusCode)
	}

	st := s.Stats()
	if st.MaxInFlightSeen != 2 || st.ByKey["a"].MaxInFlightSeen != 1 || st.ByKey["a"].RateLimited != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestNoHeaders(t *testing.T) {
	s := start(t, Config{RPM: 60, TPM: 6000, NoHeaders: true, Now: newFakeClock().Now})
	check := func(resp *http.Response, wantStatus int) {
		t.Helper()
		if resp.StatusCode != wantStatus {
			t.Errorf("status %d, want %d", resp.StatusCode, wantStatus)
		}
		for name := range resp.Header {
			n := strings.ToLower(name)
			if strings.Contains(n, "ratelimit") || strings.HasPrefix(n, "retry-after") {
				t.Errorf("unexpected header %s", name)
			}
		}
	}
	resp, _ := post(t, s, "/v1/chat/completions", "k", chatBody)
	check(resp, http.StatusOK)
	resp, body := post(t, s, "/v1/chat/completions", "k", chatBody)
	check(resp, http.StatusTooManyRequests)
	if dig(body, "error", "code") != "rate_limit_exceeded" {
		t.Errorf("body = %v", body)
	}
	resp, _ = postAnthropic(t, s, "c", `{"model":"c","max_tokens":5,"messages":[]}`)
	check(resp, http.StatusOK)
	s.InjectFailures("k", 429)
	resp, _ = post(t, s, "/v1/chat/completions", "k", chatBody)
	check(resp, http.StatusTooManyRequests)
}

func TestInjectedFailuresComeFirstAndCostNothing(t *testing.T) {
	s := start(t, Config{RPM: 60, Now: newFakeClock().Now})
	cases := []struct {
		status   int
		wantType string
	}{
		{503, "server_error"}, {429, "requests"}, {500, "server_error"}, {502, "server_error"},
		{504, "timeout"}, {408, "timeout"}, {529, "server_error"},
	}
	for _, c := range cases {
		s.InjectFailures("k", c.status)
	}
	for _, c := range cases {
		resp, body := post(t, s, "/v1/chat/completions", "k", chatBody)
		if resp.StatusCode != c.status || dig(body, "error", "type") != c.wantType {
			t.Errorf("got %d %v, want %d %s", resp.StatusCode, body, c.status, c.wantType)
		}
		wantRetry := ""
		if c.status == 429 {
			wantRetry = "1"
		}
		wantHeaders(t, resp.Header, map[string]string{"Retry-After": wantRetry, "x-ratelimit-limit-requests": ""})
	}
	// None of them took the single request token.
	if resp, _ := post(t, s, "/v1/chat/completions", "k", chatBody); resp.StatusCode != http.StatusOK {
		t.Errorf("after injected: status %d", resp.StatusCode)
	}

	s.InjectFailures("k", 529, 429)
	for _, want := range []struct {
		status int
		typ    string
	}{{529, "overloaded_error"}, {429, "rate_limit_error"}} {
		resp, body := postAnthropic(t, s, "k", `{"model":"c","max_tokens":5,"messages":[]}`)
		if resp.StatusCode != want.status || dig(body, "error", "type") != want.typ || dig(body, "type") != "error" {
			t.Errorf("anthropic: got %d %v, want %d %s", resp.StatusCode, body, want.status, want.typ)
		}
	}

	st := s.Stats()
	if st.Injected != 9 || st.Requests != 10 || st.OK != 1 || st.RateLimited != 0 {
		t.Errorf("stats = %+v", st)
	}
}

// TestQuotaForms: each QuotaForm answers a hard-quota key in its dialect,
// with the renewal it states (the wait to QuotaUntil), until QuotaUntil,
// when the key is served as any other.
func TestQuotaForms(t *testing.T) {
	for _, c := range []struct {
		form    string
		status  int
		headers map[string]string
		check   func(body map[string]any) bool
	}{
		{"gemini-day", 429, map[string]string{"Retry-After": "", "x-ratelimit-limit-requests": ""}, func(b map[string]any) bool {
			details, _ := dig(b, "error", "details").([]any)
			if dig(b, "error", "status") != "RESOURCE_EXHAUSTED" || len(details) != 2 {
				return false
			}
			violations, _ := details[0].(map[string]any)["violations"].([]any)
			return len(violations) == 1 && violations[0].(map[string]any)["quotaId"] == "GenerateRequestsPerDayPerProjectPerModel-FreeTier" &&
				details[1].(map[string]any)["retryDelay"] == "60s"
		}},
		{"groq-day", 429, map[string]string{"Retry-After": "5400", "retry-after-ms": "", "x-ratelimit-limit-requests": "1000",
			"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1h30m0s"}, func(b map[string]any) bool {
			m, _ := dig(b, "error", "message").(string)
			return dig(b, "error", "code") == "rate_limit_exceeded" && strings.Contains(m, "on requests per day (RPD): Limit 1000, Used 1000") &&
				strings.Contains(m, "Please try again in 1h30m0s.")
		}},
		{"apim", 403, map[string]string{"Retry-After": "5400", "retry-after-ms": ""}, func(b map[string]any) bool {
			return b["statusCode"] == float64(403) && b["message"] == "Out of call volume quota. Quota will be replenished in 01:30:00."
		}},
	} {
		t.Run(c.form, func(t *testing.T) {
			clk := newFakeClock()
			s := start(t, Config{HardQuotaKeys: []string{"broke"}, QuotaForm: c.form, QuotaUntil: clk.Now().Add(90 * time.Minute), Now: clk.Now})
			resp, body := post(t, s, "/v1/chat/completions", "broke", chatBody)
			if resp.StatusCode != c.status || !c.check(body) {
				t.Fatalf("status %d, body %v", resp.StatusCode, body)
			}
			wantHeaders(t, resp.Header, c.headers)
			clk.Advance(90*time.Minute - time.Nanosecond)
			if resp, _ := post(t, s, "/v1/chat/completions", "broke", chatBody); resp.StatusCode != c.status {
				t.Fatalf("before the renewal: status %d", resp.StatusCode)
			}
			clk.Advance(time.Nanosecond)
			if resp, _ := post(t, s, "/v1/chat/completions", "broke", chatBody); resp.StatusCode != http.StatusOK {
				t.Fatalf("at the renewal: status %d, want 200", resp.StatusCode)
			}
			if st := s.Stats(); st.HardQuota != 2 || st.OK != 1 {
				t.Errorf("stats = %+v", st)
			}
		})
	}
}

// TestQuotaFormsStateADayWithoutRenewal: with no QuotaUntil the stated
// renewal is a day away, in the TimeSpan's day form for the apim form,
// and the quota never renews.
func TestQuotaFormsStateADayWithoutRenewal(t *testing.T) {
	clk := newFakeClock()
	s := start(t, Config{HardQuotaKeys: []string{"broke"}, QuotaForm: "apim", Now: clk.Now})
	resp, body := post(t, s, "/v1/chat/completions", "broke", chatBody)
	if resp.StatusCode != 403 || body["message"] != "Out of call volume quota. Quota will be replenished in 1.00:00:00." {
		t.Fatalf("status %d, body %v", resp.StatusCode, body)
	}
	clk.Advance(48 * time.Hour)
	if resp, _ := post(t, s, "/v1/chat/completions", "broke", chatBody); resp.StatusCode != 403 {
		t.Fatalf("two days on: status %d, want the quota still spent", resp.StatusCode)
	}
}

// TestAnUnknownQuotaFormPanics: a QuotaForm the mock does not know stops
// New.
func TestAnUnknownQuotaFormPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New took QuotaForm \"bedrock\"")
		}
	}()
	New(Config{QuotaForm: "bedrock"}).Close()
}
