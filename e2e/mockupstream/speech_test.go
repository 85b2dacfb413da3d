package mockupstream

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmproxy/llmproxy/headerparse"
)

// saying is what one answer tells a client about the limits.
type saying struct {
	status     int
	headerForm string // "openai", "anthropic", "both" or "" (no limit headers)
	retryAfter bool   // Retry-After or retry-after-ms
	hint       bool   // the body names a wait
	kind       headerparse.ErrorKind
	html       bool // Content-Type text/html
}

// sayingOf reads resp's body and sums up what it says.
func sayingOf(t testing.TB, resp *http.Response) saying {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var openai, anthropic bool
	for name := range resp.Header {
		n := strings.ToLower(name)
		openai = openai || strings.HasPrefix(n, "x-ratelimit-")
		anthropic = anthropic || strings.HasPrefix(n, "anthropic-ratelimit-")
	}
	form := map[[2]bool]string{{true, false}: "openai", {false, true}: "anthropic", {true, true}: "both"}[[2]bool{openai, anthropic}]
	info := headerparse.ParseError(resp.StatusCode, body)
	return saying{
		status:     resp.StatusCode,
		headerForm: form,
		retryAfter: resp.Header.Get("Retry-After") != "" || resp.Header.Get("retry-after-ms") != "",
		hint:       info.HasRetryIn || strings.Contains(strings.ToLower(string(body)), "try again in"),
		kind:       info.Kind,
		html:       strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html"),
	}
}

// hear gets three answers on path (chat or messages) from a mock with cfg
// plus a 1-request bucket and a 1-request concurrency cap: a 200, a bucket
// refusal and a concurrency refusal.
func hear(t *testing.T, cfg Config, path string) [3]saying {
	t.Helper()
	hold := make(chan struct{})
	cfg.RPM, cfg.MaxInFlight, cfg.StreamHold, cfg.Now = 60, 1, hold, newFakeClock().Now
	s := start(t, cfg)
	body, keyHeader, keyPrefix := chatBody, "Authorization", "Bearer "
	streamBody := `{"model":"m","stream":true,"messages":[]}`
	if path == "/v1/messages" {
		body, keyHeader, keyPrefix = `{"model":"c","max_tokens":5,"messages":[]}`, "x-api-key", ""
		streamBody = `{"model":"c","max_tokens":5,"stream":true,"messages":[]}`
	}
	ask := func(key, b string) *http.Response {
		return send(t, s, path, b, keyHeader, keyPrefix+key, "anthropic-version", "2023-06-01")
	}

	// Key a holds a stream open, so its next request meets the cap; key b
	// empties its bucket with one request, so its next one meets the bucket.
	stream := ask("a", streamBody)
	buf := make([]byte, 1)
	if _, err := stream.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	var got [3]saying
	got[2] = sayingOf(t, ask("a", body))
	got[0] = sayingOf(t, ask("b", body))
	got[1] = sayingOf(t, ask("b", body))
	close(hold)
	io.Copy(io.Discard, stream.Body)

	if st := s.Stats(); st.RateLimited != 2 || st.OK != 2 {
		t.Errorf("stats = %+v, want 2 refusals counted", st)
	}
	return got
}

// TestSpeechSwitches: each switch changes exactly what it names, in the
// 200, the bucket's refusal and the concurrency cap's refusal.
func TestSpeechSwitches(t *testing.T) {
	told := func(form string) [3]saying {
		return [3]saying{
			{status: 200, headerForm: form, kind: headerparse.KindNone},
			{status: 429, headerForm: form, retryAfter: true, hint: true, kind: headerparse.KindRateLimit},
			{status: 429, headerForm: form, retryAfter: true, hint: true, kind: headerparse.KindConcurrency},
		}
	}
	nginx := saying{status: 503, kind: headerparse.KindOther, html: true}
	chat, messages := "/v1/chat/completions", "/v1/messages"

	for _, tc := range []struct {
		name   string
		path   string
		cfg    Config
		change func(w *[3]saying)
	}{
		{"default openai", chat, Config{}, func(w *[3]saying) {}},
		{"default anthropic", messages, Config{}, func(w *[3]saying) {
			*w = told("anthropic")
		}},
		{"NoLimitHeaders", chat, Config{NoLimitHeaders: true}, func(w *[3]saying) {
			w[0].headerForm, w[1].headerForm, w[2].headerForm = "", "", ""
		}},
		{"NoRetryAfter", chat, Config{NoRetryAfter: true}, func(w *[3]saying) {
			w[1].retryAfter, w[2].retryAfter = false, false
		}},
		{"NoHeaders", chat, Config{NoHeaders: true}, func(w *[3]saying) {
			w[0].headerForm, w[1].headerForm, w[2].headerForm = "", "", ""
			w[1].retryAfter, w[2].retryAfter = false, false
		}},
		{"NoHint", chat, Config{NoHint: true}, func(w *[3]saying) {
			w[1].hint, w[2].hint = false, false
		}},
		{"NoHint anthropic", messages, Config{NoHint: true}, func(w *[3]saying) {
			*w = told("anthropic")
			w[1].hint, w[2].hint = false, false
		}},
		{"ConcurrencyUnnamed", chat, Config{ConcurrencyUnnamed: true}, func(w *[3]saying) {
			w[2].kind = headerparse.KindRateLimit
		}},
		{"ConcurrencyUnnamed anthropic", messages, Config{ConcurrencyUnnamed: true}, func(w *[3]saying) {
			*w = told("anthropic")
			w[2].kind = headerparse.KindRateLimit
		}},
		{"ConcurrencyUnnamed NoHint", chat, Config{ConcurrencyUnnamed: true, NoHint: true}, func(w *[3]saying) {
			w[1].hint, w[2].hint = false, false
			w[2].kind = headerparse.KindRateLimit
		}},
		{"HeaderForm anthropic on chat", chat, Config{HeaderForm: "anthropic"}, func(w *[3]saying) {
			*w = told("anthropic")
		}},
		{"HeaderForm openai on messages", messages, Config{HeaderForm: "openai"}, func(w *[3]saying) {}},
		{"HeaderForm openai on chat", chat, Config{HeaderForm: "openai"}, func(w *[3]saying) {}},
		{"RefusalStatus 429", chat, Config{RefusalStatus: 429}, func(w *[3]saying) {}},
		{"RefusalStatus 503", chat, Config{RefusalStatus: 503}, func(w *[3]saying) {
			w[1], w[2] = nginx, nginx
		}},
		{"RefusalStatus 503 anthropic", messages, Config{RefusalStatus: 503}, func(w *[3]saying) {
			*w = told("anthropic")
			w[1], w[2] = nginx, nginx
		}},
		{"RefusalStatus 503 overrides", chat, Config{RefusalStatus: 503, NoLimitHeaders: true, HeaderForm: "anthropic"}, func(w *[3]saying) {
			w[0].headerForm = ""
			w[1], w[2] = nginx, nginx
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := told("openai")
			tc.change(&want)
			got := hear(t, tc.cfg, tc.path)
			for i, what := range []string{"200", "bucket refusal", "concurrency refusal"} {
				if got[i] != want[i] {
					t.Errorf("%s: got %+v, want %+v", what, got[i], want[i])
				}
			}
		})
	}
}

func TestConcurrencyRefusalWording(t *testing.T) {
	for _, tc := range []struct {
		cfg     Config
		path    string
		want    string
		unnamed bool
	}{
		{Config{ConcurrencyUnnamed: true}, "/v1/chat/completions",
			`{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached for requests. Please try again in 1s.","param":null,"type":"requests"}}`, true},
		{Config{ConcurrencyUnnamed: true, NoHint: true}, "/v1/chat/completions",
			`{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached for requests.","param":null,"type":"requests"}}`, true},
		{Config{NoHint: true}, "/v1/chat/completions",
			`{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached for requests: too many concurrent requests for this key (concurrency limit 1).","param":null,"type":"requests"}}`, false},
	} {
		hold := make(chan struct{})
		tc.cfg.MaxInFlight, tc.cfg.StreamHold = 1, hold
		s := start(t, tc.cfg)
		stream := send(t, s, tc.path, `{"model":"m","stream":true,"messages":[]}`, "Authorization", "Bearer a")
		stream.Body.Read(make([]byte, 1))
		resp := send(t, s, tc.path, chatBody, "Authorization", "Bearer a")
		b, _ := io.ReadAll(resp.Body)
		if string(b) != tc.want {
			t.Errorf("%+v: body\n%s\nwant\n%s", tc.cfg, b, tc.want)
		}
		lower := strings.ToLower(string(b))
		hasWord := strings.Contains(lower, "concurren") || strings.Contains(lower, "parallel")
		if hasWord == tc.unnamed {
			t.Errorf("%+v: names concurrency = %v", tc.cfg, hasWord)
		}
		close(hold)
	}
}

func TestRefusalStatus503IsNginxPage(t *testing.T) {
	s := start(t, Config{RPM: 60, RefusalStatus: 503, HardQuotaKeys: []string{"broke"}, Now: newFakeClock().Now})
	post(t, s, "/v1/chat/completions", "k", chatBody)
	resp := send(t, s, "/v1/chat/completions", chatBody, "Authorization", "Bearer k")
	b, _ := io.ReadAll(resp.Body)
	want := "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n" +
		"<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
	if resp.StatusCode != 503 || string(b) != want {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"Content-Type": "text/html", "Server": "nginx", "x-request-id": "", "Retry-After": "",
		"retry-after-ms": "", "x-ratelimit-limit-requests": "",
	})

	// Injected failures and hard quotas are not the limiter's: unchanged.
	s.InjectFailures("k", 429)
	if resp, _ := post(t, s, "/v1/chat/completions", "k", chatBody); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("injected: status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp, body := post(t, s, "/v1/chat/completions", "broke", chatBody); resp.StatusCode != 429 || dig(body, "error", "code") != "insufficient_quota" {
		t.Errorf("hard quota: %d %v", resp.StatusCode, body)
	}
	if st := s.Stats(); st.RateLimited != 1 || st.Injected != 1 || st.HardQuota != 1 || st.OK != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestNoHintAndNoRetryAfterCoverInjected429(t *testing.T) {
	s := start(t, Config{NoHint: true, NoRetryAfter: true})
	s.InjectFailures("k", 429)
	resp, body := post(t, s, "/v1/chat/completions", "k", chatBody)
	msg, _ := dig(body, "error", "message").(string)
	if resp.StatusCode != 429 || strings.Contains(msg, "try again") || resp.Header.Get("Retry-After") != "" {
		t.Errorf("status %d, message %q, Retry-After %q", resp.StatusCode, msg, resp.Header.Get("Retry-After"))
	}
}

func TestUnknownSwitchValuesPanic(t *testing.T) {
	for _, cfg := range []Config{{HeaderForm: "gemini"}, {RefusalStatus: 500}} {
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
