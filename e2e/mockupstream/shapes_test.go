package mockupstream

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// chatFor posts a chat for key (and model) and returns its status and
// headers.
func chatFor(t testing.TB, s *Server, key, model string) (*http.Response, map[string]any) {
	t.Helper()
	return post(t, s, "/v1/chat/completions", key, `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`)
}

func TestFixedWindowCountedFromTheFirstRequest(t *testing.T) {
	clock := newFakeClock()
	clock.Advance(3 * time.Second) // nothing aligns with the window
	s := start(t, Config{RPM: 60, Window: 10 * time.Second, Now: clock.Now})

	// 10 a window (60 a minute × 10 s), all at once at its start.
	for i := range 10 {
		resp, _ := chatFor(t, s, "k", "m")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		if i == 0 {
			wantHeaders(t, resp.Header, map[string]string{
				"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9", "x-ratelimit-reset-requests": "10s"})
		}
	}
	clock.Advance(3 * time.Second)
	resp, body := chatFor(t, s, "k", "m")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("11th: status %d", resp.StatusCode)
	}
	// Every wait points at the window's end, 7 s away.
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "7", "retry-after-ms": "7000",
		"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "7s"})
	if m := dig(body, "error", "message").(string); !strings.Contains(m, "Please try again in 7s.") {
		t.Errorf("message %q", m)
	}
	clock.Advance(6999 * time.Millisecond)
	if resp, _ := chatFor(t, s, "k", "m"); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("retry-after-ms") != "1" {
		t.Fatalf("a millisecond before the boundary: %d, retry-after-ms %s", resp.StatusCode, resp.Header.Get("retry-after-ms"))
	}
	// Nothing runs for 2 s after the boundary; the next window starts with
	// the next request and runs 10 s from it.
	clock.Advance(2001 * time.Millisecond)
	resp, _ = chatFor(t, s, "k", "m")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the boundary: status %d", resp.StatusCode)
	}
	wantHeaders(t, resp.Header, map[string]string{"x-ratelimit-remaining-requests": "9", "x-ratelimit-reset-requests": "10s"})
	if st := s.Stats(); st.OK != 11 || st.RateLimited != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	clock := newFakeClock()
	s := start(t, Config{RPM: 60, Window: 10 * time.Second, RetryAfterSeconds: true, Now: clock.Now})
	chatFor(t, s, "k", "m")
	for range 10 {
		chatFor(t, s, "k", "m")
	}
	clock.Advance(2500 * time.Millisecond)
	resp, _ := chatFor(t, s, "k", "m")
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "8", "retry-after-ms": ""})
}

func TestFixedWindowAlignedToTheClock(t *testing.T) {
	clock := newFakeClock() // 12:00:00
	clock.Advance(7 * time.Second)
	s := start(t, Config{RPM: 120, Window: 10 * time.Second, WindowAligned: true, Now: clock.Now})
	for range 20 {
		if resp, _ := chatFor(t, s, "k", "m"); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	resp, _ := chatFor(t, s, "k", "m")
	// The window is the clock's 12:00:00–12:00:10: 3 s left.
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("21st: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	clock.Advance(3 * time.Second)
	resp, _ = chatFor(t, s, "k", "m")
	wantHeaders(t, resp.Header, map[string]string{"x-ratelimit-remaining-requests": "19", "x-ratelimit-reset-requests": "10s"})
}

func TestCountRefusedKeepsAKnockingClientOut(t *testing.T) {
	for _, counted := range []bool{false, true} {
		clock := newFakeClock()
		s := start(t, Config{RPM: 60, CountRefused: counted, Now: clock.Now})
		if resp, _ := chatFor(t, s, "k", "m"); resp.StatusCode != http.StatusOK {
			t.Fatal("first refused")
		}
		// Knocking twice in the second the bucket needs to refill one.
		for range 2 {
			clock.Advance(400 * time.Millisecond)
			chatFor(t, s, "k", "m")
		}
		clock.Advance(200 * time.Millisecond)
		resp, _ := chatFor(t, s, "k", "m")
		if got, want := resp.StatusCode == http.StatusOK, !counted; got != want {
			t.Errorf("CountRefused %v: a second after the first, admitted %v", counted, got)
		}
		if counted {
			// The two knocks and this refusal took three: the bucket owes
			// two requests and needs a third, and says so.
			wantHeaders(t, resp.Header, map[string]string{"Retry-After": "3", "x-ratelimit-remaining-requests": "0"})
		}
	}
}

func TestPerModelLimits(t *testing.T) {
	for _, perModel := range []bool{false, true} {
		s := start(t, Config{RPM: 60, PerModel: perModel, Now: newFakeClock().Now})
		chatFor(t, s, "k", "a")
		resp, _ := chatFor(t, s, "k", "b")
		if got := resp.StatusCode == http.StatusOK; got != perModel {
			t.Errorf("PerModel %v: model b admitted after model a used the key's one request: %v", perModel, got)
		}
		if st := s.Stats().ByKey["k"]; st.Requests != 2 {
			t.Errorf("stats by key %+v", st)
		}
	}
}

// TestModelRPMSizesAModelsOwnLimit: with PerModel, a model ModelRPM names
// gets a limit of that size (60 a minute: a burst of one), the others
// RPM's (180: a burst of three); without PerModel it changes nothing.
func TestModelRPMSizesAModelsOwnLimit(t *testing.T) {
	for _, perModel := range []bool{false, true} {
		s := start(t, Config{RPM: 180, PerModel: perModel, ModelRPM: map[string]int{"small": 60}, Now: newFakeClock().Now})
		var small, big int
		for range 3 {
			if resp, _ := chatFor(t, s, "k", "small"); resp.StatusCode == http.StatusOK {
				small++
			}
		}
		for range 3 {
			if resp, _ := chatFor(t, s, "k", "big"); resp.StatusCode == http.StatusOK {
				big++
			}
		}
		want := [2]int{3, 0} // one bucket of 3 for the key
		if perModel {
			want = [2]int{1, 3}
		}
		if [2]int{small, big} != want {
			t.Errorf("PerModel %v: admitted %d of model small, %d of big; want %v", perModel, small, big, want)
		}
	}
}

func TestAnthropicResetsRoundedDownOrOnAnotherClock(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		// 1 request a second, used: full again in 1 s, at 12:00:00.5.
		{"rounded up", Config{}, "2026-03-01T12:00:02Z"},
		{"rounded down", Config{ResetRoundDown: true}, "2026-03-01T12:00:01Z"},
		{"clock 2s ahead", Config{ClockAhead: 2 * time.Second}, "2026-03-01T12:00:04Z"},
		{"clock 1s behind, rounded down", Config{ClockAhead: -time.Second, ResetRoundDown: true}, "2026-03-01T12:00:00Z"},
	} {
		clock := newFakeClock()
		clock.Advance(500 * time.Millisecond)
		cfg := c.cfg
		cfg.RPM, cfg.Now = 60, clock.Now
		s := start(t, cfg)
		resp, _ := postAnthropic(t, s, "k", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
		if got := resp.Header.Get("anthropic-ratelimit-requests-reset"); got != c.want {
			t.Errorf("%s: reset %s, want %s", c.name, got, c.want)
		}
	}
}

func TestIETFHeaders(t *testing.T) {
	clock := newFakeClock()
	s := start(t, Config{RPM: 1200, Window: 10 * time.Second, HeaderForm: "ietf", Now: clock.Now})
	chatFor(t, s, "k", "m")
	clock.Advance(2500 * time.Millisecond)
	resp, _ := chatFor(t, s, "k", "m")
	wantHeaders(t, resp.Header, map[string]string{"RateLimit-Limit": "200", "RateLimit-Remaining": "198",
		"RateLimit-Reset": "8", "RateLimit-Policy": "200;w=10", "x-ratelimit-limit-requests": ""})
}

func TestHintForms(t *testing.T) {
	for _, c := range []struct {
		form, noHint string
		check        func(map[string]any) bool
	}{
		{"azure", "", func(b map[string]any) bool {
			return strings.Contains(dig(b, "error", "message").(string), "Please retry after 8 seconds.")
		}},
		{"gemini", "", func(b map[string]any) bool {
			return dig(b, "error", "status") == "RESOURCE_EXHAUSTED" && dig(b, "error", "code") == 429.0 &&
				dig(b, "error", "details", 0, "retryDelay") == "8s" &&
				dig(b, "error", "details", 0, "@type") == "type.googleapis.com/google.rpc.RetryInfo"
		}},
		{"gemini", "no hint", func(b map[string]any) bool {
			return dig(b, "error", "status") == "RESOURCE_EXHAUSTED" && dig(b, "error", "details") == nil
		}},
	} {
		clock := newFakeClock()
		s := start(t, Config{RPM: 60, Window: 10 * time.Second, HintForm: c.form, NoHint: c.noHint != "", Now: clock.Now})
		for range 10 {
			chatFor(t, s, "k", "m")
		}
		clock.Advance(2500 * time.Millisecond)
		resp, body := chatFor(t, s, "k", "m")
		if resp.StatusCode != http.StatusTooManyRequests || !c.check(body) {
			t.Errorf("%s %s: %d %v", c.form, c.noHint, resp.StatusCode, body)
		}
	}
}

func TestLatencyJitterVariesAnswerTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{Latency: 200 * time.Millisecond, LatencyJitter: 50 * time.Millisecond, Seed: 7})
		defer s.Close()
		client := &http.Client{Transport: s.Transport()}
		var took []time.Duration
		for range 20 {
			start := time.Now()
			resp, err := client.Do(newRequest(t, context.Background(), s, chatBody))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		if took[0] < 200*time.Millisecond || took[len(took)-1] >= 250*time.Millisecond || took[0] == took[len(took)-1] {
			t.Errorf("answer times %v, want varied within [200ms, 250ms)", took)
		}
	})
}
