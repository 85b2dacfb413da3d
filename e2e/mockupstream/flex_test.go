package mockupstream

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// flexChat is chatBody asking for flex: 4 prompt tokens, costing 20.
const flexChat = `{"model":"gpt-test","service_tier":"flex","messages":[{"role":"user","content":"hi"}]}`

// noLimitHeaders are the headers a flex refusal must not carry.
var noLimitHeaders = map[string]string{
	"Retry-After": "", "retry-after-ms": "",
	"x-ratelimit-limit-requests": "", "x-ratelimit-remaining-requests": "", "x-ratelimit-reset-requests": "",
	"x-ratelimit-limit-tokens": "", "x-ratelimit-remaining-tokens": "",
}

func TestFlexRefuseShare(t *testing.T) {
	const n, share = 2000, 0.3
	s := start(t, Config{FlexRefuseShare: share, Seed: 7})
	refused := 0
	for i := range n {
		resp, body := post(t, s, "/v1/chat/completions", "k", flexChat)
		switch resp.StatusCode {
		case http.StatusOK:
			if body["service_tier"] != "flex" {
				t.Fatalf("request %d: served %v", i, body["service_tier"])
			}
		case http.StatusTooManyRequests:
			refused++
			if refused == 1 {
				wantFlexRefusal(t, resp, body)
			}
		default:
			t.Fatalf("request %d: status %d %v", i, resp.StatusCode, body)
		}
	}
	if got := float64(refused) / n; math.Abs(got-share) > 0.04 {
		t.Errorf("refused %d of %d (%.3f), want about %v", refused, n, got, share)
	}
	l, st := s.Ledger(), s.Stats()
	if l.FlexRefused != refused || l.ByTier[TierFlex].Requests != n-refused || l.ByKey["k"].FlexRefused != refused {
		t.Errorf("ledger %+v, refused %d", l, refused)
	}
	if st.Requests != int64(n-refused) || st.RateLimited != 0 {
		t.Errorf("stats count refusals: %+v", st)
	}
}

// wantFlexRefusal checks a capacity refusal: its body, and no limit
// headers or retry-after.
func wantFlexRefusal(t *testing.T, resp *http.Response, body map[string]any) {
	t.Helper()
	e, _ := body["error"].(map[string]any)
	if msg, _ := e["message"].(string); !strings.Contains(msg, "Resource Unavailable") ||
		e["code"] != "resource_unavailable" || e["type"] != "server_error" || e["param"] != nil {
		t.Errorf("refusal body = %v", body)
	}
	if resp.Header.Get("x-request-id") == "" {
		t.Error("refusal has no x-request-id")
	}
	wantHeaders(t, resp.Header, noLimitHeaders)
}

func TestFlexRefusalIsNotCounted(t *testing.T) {
	clock := newFakeClock()
	s := start(t, Config{RPM: 60, RequestBurst: 3, TPM: 600, TokenBurst: 60, MaxInFlight: 1,
		FlexRefuseShare: 1, Now: clock.Now})
	for range 50 {
		resp, body := post(t, s, "/v1/responses", "k", `{"model":"gpt-test","service_tier":"flex","input":"hi"}`)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("flex: status %d %v", resp.StatusCode, body)
		}
		wantFlexRefusal(t, resp, body)
	}
	// The buckets are full: the burst of 3 (and its 60 tokens) is whole.
	for i := range 3 {
		resp, body := post(t, s, "/v1/chat/completions", "k", chatBody)
		if resp.StatusCode != http.StatusOK || body["service_tier"] != "default" {
			t.Fatalf("standard %d: status %d %v", i, resp.StatusCode, body)
		}
		wantHeaders(t, resp.Header, map[string]string{
			"x-ratelimit-remaining-requests": fmt.Sprint(2 - i),
			"x-ratelimit-remaining-tokens":   fmt.Sprint(40 - 20*i),
		})
	}
	if resp, _ := post(t, s, "/v1/chat/completions", "k", chatBody); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("4th standard: status %d, want the bucket's 429", resp.StatusCode)
	}
	st, l := s.Stats(), s.Ledger()
	if st.Requests != 4 || st.OK != 3 || st.RateLimited != 1 || st.ByKey["k"].Requests != 4 {
		t.Errorf("stats %+v", st)
	}
	if l.FlexRefused != 50 || l.ByTier[TierFlex] != (TierLedger{}) || l.ByTier[TierStandard].Requests != 3 {
		t.Errorf("ledger %+v", l)
	}
}

func TestFlexUnsupportedModel(t *testing.T) {
	s := start(t, Config{RPM: 600, FlexModels: []string{"gpt-flex"}})
	for _, path := range []string{"/v1/chat/completions", "/v1/responses"} {
		resp, body := post(t, s, path, "k", `{"model":"gpt-big","service_tier":"flex","input":"hi","messages":[]}`)
		want := "map[error:map[code:unsupported_value message:Flex processing is not available for model gpt-big. param:service_tier type:invalid_request_error]]"
		if resp.StatusCode != http.StatusBadRequest || fmt.Sprint(body) != want {
			t.Errorf("%s: status %d, body %v", path, resp.StatusCode, body)
		}
		wantHeaders(t, resp.Header, noLimitHeaders)
	}
	if resp, body := post(t, s, "/v1/chat/completions", "k", `{"model":"gpt-flex","service_tier":"flex","messages":[]}`); resp.StatusCode != http.StatusOK || body["service_tier"] != "flex" {
		t.Errorf("offered model: status %d, body %v", resp.StatusCode, body)
	}
	if resp, body := post(t, s, "/v1/chat/completions", "k", `{"model":"gpt-big","service_tier":"auto","messages":[]}`); resp.StatusCode != http.StatusOK || body["service_tier"] != "default" {
		t.Errorf("auto: status %d, body %v", resp.StatusCode, body)
	}
	if st, l := s.Stats(), s.Ledger(); st.Requests != 2 || l.FlexUnsupported != 2 || l.ByKey["k"].FlexUnsupported != 2 {
		t.Errorf("stats %+v, ledger %+v", st, l)
	}
}

func TestFlexOnlyOnChatAndResponses(t *testing.T) {
	s := start(t, Config{FlexRefuseShare: 1, FlexModels: []string{}, Prices: map[string]TierPrice{TierStandard: {Input: 1, Output: 1}}})
	resp, body := postAnthropic(t, s, "k", `{"model":"claude","service_tier":"flex","max_tokens":5,"messages":[]}`)
	if _, has := body["service_tier"]; resp.StatusCode != http.StatusOK || has {
		t.Errorf("messages: status %d, body %v", resp.StatusCode, body)
	}
	resp, body = post(t, s, "/v1/embeddings", "k", `{"model":"e","service_tier":"flex","input":"hi"}`)
	if _, has := body["service_tier"]; resp.StatusCode != http.StatusOK || has {
		t.Errorf("embeddings: status %d, body %v", resp.StatusCode, body)
	}
	l := s.Ledger()
	if l.ByTier[TierStandard].Requests != 2 || len(l.ByTier) != 1 || l.FlexRefused != 0 || l.FlexUnsupported != 0 {
		t.Errorf("ledger %+v", l)
	}
}

func TestServedTierInAnswers(t *testing.T) {
	s := start(t, Config{StreamChunks: 2})
	for _, tier := range []string{"flex", "default"} {
		req := func(extra string) string {
			return fmt.Sprintf(`{"model":"m","service_tier":%q,"input":"hi","messages":[]%s}`, tier, extra)
		}
		if _, body := post(t, s, "/v1/chat/completions", "k", req("")); body["service_tier"] != tier {
			t.Errorf("chat %s: %v", tier, body)
		}
		if _, body := post(t, s, "/v1/responses", "k", req("")); body["service_tier"] != tier {
			t.Errorf("responses %s: %v", tier, body)
		}
		for _, usage := range []bool{true, false} {
			evs := streamEvents(t, s, "/v1/chat/completions", req(fmt.Sprintf(`,"stream":true,"stream_options":{"include_usage":%v}`, usage)))
			if len(evs) != 2+1+1+map[bool]int{true: 1}[usage] {
				t.Fatalf("chat stream: %+v", evs)
			}
			for _, ev := range evs[:len(evs)-1] {
				if c := jsonOf(t, ev.data); c["service_tier"] != tier {
					t.Errorf("chat %s chunk %v", tier, c)
				}
			}
		}
		evs := streamEvents(t, s, "/v1/responses", req(`,"stream":true`))
		for _, i := range []int{0, len(evs) - 1} {
			if r := dig(jsonOf(t, evs[i].data), "response"); dig(r, "service_tier") != tier {
				t.Errorf("responses %s event %s: %v", tier, evs[i].name, r)
			}
		}
	}
}

// streamEvents posts a streamed request with key k and reads every event.
func streamEvents(t *testing.T, s *Server, path, body string) []event {
	t.Helper()
	resp := send(t, s, path, body, "Authorization", "Bearer k")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d", path, resp.StatusCode)
	}
	return readEvents(t, bufio.NewReader(resp.Body))
}

func TestLedgerSums(t *testing.T) {
	// Flex is left out of Prices: half of standard.
	s := start(t, Config{FlexModels: []string{"gpt-test"}, Prices: map[string]TierPrice{TierStandard: {Input: 2.5, Output: 10}}})
	stream := `{"model":"gpt-test","service_tier":"flex","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	post(t, s, "/v1/chat/completions", "a", chatBody)                                                                       // 4+8: 10,000+80,000
	post(t, s, "/v1/chat/completions", "a", forty)                                                                          // 13+8: 32,500+80,000
	post(t, s, "/v1/embeddings", "b", `{"model":"e","input":"hello world"}`)                                                // 6+0: 15,000
	postAnthropic(t, s, "b", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)                    // 4+5: 10,000+50,000
	post(t, s, "/v1/chat/completions", "a", flexChat)                                                                       // 4+8: 5,000+40,000
	streamEvents(t, s, "/v1/chat/completions", stream)                                                                      // key k, the same, usage not sent
	post(t, s, "/v1/responses", "b", `{"model":"gpt-test","service_tier":"flex","max_output_tokens":3,"input":"abcdefgh"}`) // 5+3: 6,250+15,000
	post(t, s, "/v1/responses", "b", `{"model":"other","service_tier":"flex","input":"x"}`)                                 // unsupported

	l := s.Ledger()
	std := TierLedger{Requests: 4, PromptTokens: 4 + 13 + 6 + 4, CompletionTokens: 8 + 8 + 0 + 5, NanoUSD: 90_000 + 112_500 + 15_000 + 60_000}
	flex := TierLedger{Requests: 3, PromptTokens: 4 + 4 + 5, CompletionTokens: 8 + 8 + 3, NanoUSD: 45_000 + 45_000 + 21_250}
	if l.ByTier[TierStandard] != std || l.ByTier[TierFlex] != flex || l.FlexUnsupported != 1 || l.FlexRefused != 0 {
		t.Errorf("ledger %+v\nwant standard %+v, flex %+v", l, std, flex)
	}
	if total := l.Total(); total.Requests != 7 || total.NanoUSD != std.NanoUSD+flex.NanoUSD {
		t.Errorf("total %+v", total)
	}
	a, b := l.ByKey["a"], l.ByKey["b"]
	if a.ByTier[TierStandard].NanoUSD != 202_500 || a.ByTier[TierFlex].Requests != 1 ||
		b.ByTier[TierStandard].NanoUSD != 75_000 || b.ByTier[TierFlex].NanoUSD != 21_250 ||
		l.ByKey["k"].ByTier[TierFlex].NanoUSD != 45_000 ||
		b.FlexUnsupported != 1 || a.ByKey != nil || len(l.ByKey) != 3 {
		t.Errorf("by key %+v", l.ByKey)
	}
	// Ledger is a copy.
	l.ByTier[TierFlex] = TierLedger{}
	l.ByKey["a"].ByTier[TierFlex] = TierLedger{}
	if again := s.Ledger(); again.ByTier[TierFlex] != flex || again.ByKey["a"].ByTier[TierFlex].Requests != 1 {
		t.Errorf("ledger changed through its copy: %+v", again)
	}
}

func TestTierPrices(t *testing.T) {
	for _, c := range []struct {
		prices            map[string]TierPrice
		wantStd, wantFlex int64 // nano-dollars of 1,000 prompt and 100 completion tokens
	}{
		{nil, 0, 0},
		{map[string]TierPrice{TierStandard: {Input: 1.1, Output: 4.4}}, 1_540_000, 770_000},
		{map[string]TierPrice{TierStandard: {Input: 2, Output: 8}, TierFlex: {Input: 0.3, Output: 0.7}}, 2_800_000, 370_000},
		{map[string]TierPrice{TierFlex: {Input: 1.4e-6}}, 0, 1}, // rounded to the nano-dollar
	} {
		s := NewInProcess(Config{Prices: c.prices})
		std, flex := nanoUSD(s.price(TierStandard), 1000, 100), nanoUSD(s.price(TierFlex), 1000, 100)
		if std != c.wantStd || flex != c.wantFlex {
			t.Errorf("%v: standard %d, flex %d; want %d, %d", c.prices, std, flex, c.wantStd, c.wantFlex)
		}
	}
}

func TestAbandonedStreamIsNotBilled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{StreamChunks: 3, ChunkDelay: time.Second})
		defer s.Close()
		ctx, cancel := context.WithCancel(t.Context())
		resp, err := s.Transport().RoundTrip(newRequest(t, ctx, s, flexStreamChat))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := readEvent(t, bufio.NewReader(resp.Body)); !ok {
			t.Fatal("no first chunk")
		}
		cancel()
		resp.Body.Close()
		synctest.Wait() // the handler has returned
		if l := s.Ledger(); len(l.ByTier) != 0 {
			t.Errorf("abandoned stream billed: %+v", l)
		}
		resp, err = s.Transport().RoundTrip(newRequest(t, t.Context(), s, flexStreamChat))
		if err != nil {
			t.Fatal(err)
		}
		readEvents(t, bufio.NewReader(resp.Body))
		resp.Body.Close()
		if got := s.Ledger().ByTier[TierFlex]; got != (TierLedger{Requests: 1, PromptTokens: 4, CompletionTokens: 8}) {
			t.Errorf("whole stream billed %+v", got)
		}
	})
}

// flexStreamChat is streamChat asking for flex.
const flexStreamChat = `{"model":"m","service_tier":"flex","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`

func TestFlexSlowdown(t *testing.T) {
	for _, c := range []struct {
		slowdown float64
		flex     time.Duration
	}{{0, 200 * time.Millisecond}, {1, 200 * time.Millisecond}, {2.5, 500 * time.Millisecond}} {
		synctest.Test(t, func(t *testing.T) {
			s := NewInProcess(Config{Latency: 200 * time.Millisecond, FlexSlowdown: c.slowdown})
			defer s.Close()
			for _, q := range []struct {
				body string
				want time.Duration
			}{{chatBody, 200 * time.Millisecond}, {flexChat, c.flex}} {
				start := time.Now()
				resp, err := s.Transport().RoundTrip(newRequest(t, t.Context(), s, q.body))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if got := time.Since(start); got != q.want {
					t.Errorf("slowdown %v, %s: answered after %v, want %v", c.slowdown, q.body, got, q.want)
				}
			}
		})
	}
}

func TestFlexSwitchesOutOfRangePanic(t *testing.T) {
	for _, cfg := range []Config{{FlexRefuseShare: -0.1}, {FlexRefuseShare: 1.5}, {FlexSlowdown: -1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%+v: no panic", cfg)
				}
			}()
			NewInProcess(cfg)
		}()
	}
}
