package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/internal/pacific"
	"github.com/llmproxy/llmproxy/proxy"
)

// quotaStart is the quota tests' fake time: 08:00 PST, far ahead of the
// wall clock that request deadlines are kept on.
var quotaStart = time.Date(2036, 11, 27, 16, 0, 0, 0, time.UTC)

// quotaDialect is one provider's way of saying a quota is spent.
type quotaDialect struct {
	name   string
	form   string // mockupstream.Config.QuotaForm
	path   string // through the proxy
	hdr    []string
	status int // of the upstream's quota answer, and the proxy's
	// renews is when the upstream renews the quota and the proxy knows it
	// (zero: the proxy does not know; the mock renews it at unknownRenewal).
	renews time.Time
	// worded: the answer says so in words alone, no structured field, so
	// the proxy sends one request a minute even with the renewal known.
	worded bool
}

// unknownRenewal is when the mock renews a quota whose answers do not say.
const unknownRenewal = 90 * time.Second

func quotaDialects() []quotaDialect {
	const key = "sk-quota-spent"
	openAI := []string{"Authorization", "Bearer " + key}
	return []quotaDialect{
		{"openai insufficient_quota", "", "/v1/chat/completions", openAI, 429, time.Time{}, false},
		{"anthropic spend cap", "", "/anthropic/v1/messages", []string{"X-Api-Key", key, "Anthropic-Version", "2023-06-01"}, 429, time.Time{}, false},
		{"gemini per day", "gemini-day", "/v1/chat/completions", openAI, 429, pacific.NextMidnight(quotaStart), false},
		{"groq requests per day", "groq-day", "/v1/chat/completions", openAI, 429, quotaStart.Add(90 * time.Second), true},
		{"azure api management quota", "apim", "/v1/chat/completions", openAI, 403, quotaStart.Add(time.Hour), true},
	}
}

// TestASpentQuotaReachesTheUpstreamNoMore: per dialect, after the
// upstream's first quota answer the proxy answers the key's requests
// itself at once (its status, quota_exhausted, x-should-retry: false) and
// the upstream's count does not move: until the renewal the upstream
// named, when requests reach it again; or, when it named none or said so
// in words alone, but for one request a minute, whose success ends the
// hold.
func TestASpentQuotaReachesTheUpstreamNoMore(t *testing.T) {
	for _, d := range quotaDialects() {
		t.Run(d.name, func(t *testing.T) {
			fc := clock.NewFake(quotaStart)
			renewal := d.renews
			if renewal.IsZero() {
				renewal = quotaStart.Add(unknownRenewal)
			}
			s := newStack(t, mockupstream.Config{HardQuotaKeys: []string{"sk-quota-spent"}, QuotaForm: d.form,
				QuotaUntil: renewal, Now: fc.Now}, func(c *proxy.Config) { c.Clock = fc })
			upstreamSaw := func() int64 { return s.mock.Stats().Requests }
			post := func() (*http.Response, string) { return quotaPost(t, s, d) }

			if resp, body := post(); resp.StatusCode != d.status || strings.Contains(body, "quota_exhausted") {
				t.Fatalf("first: %d %s, want the upstream's own %d", resp.StatusCode, body, d.status)
			}
			for range 5 {
				wantProxysQuotaAnswer(t, d, post)
			}
			if n := upstreamSaw(); n != 1 {
				t.Fatalf("the upstream saw %d requests, want only the first", n)
			}
			if d.worded {
				// Probed though the renewal is known: a minute on, one
				// request goes and meets the quota still spent.
				fc.Set(quotaStart.Add(time.Minute - time.Second))
				wantProxysQuotaAnswer(t, d, post)
				fc.Set(quotaStart.Add(time.Minute))
				if resp, body := post(); resp.StatusCode != d.status || strings.Contains(body, "quota_exhausted") || upstreamSaw() != 2 {
					t.Fatalf("a minute on: %d %s, the upstream saw %d; want the upstream's own answer to one request", resp.StatusCode, body, upstreamSaw())
				}
				wantProxysQuotaAnswer(t, d, post)
				fc.Set(d.renews)
				if resp, body := post(); resp.StatusCode != 200 || upstreamSaw() != 3 {
					t.Fatalf("at the renewal: %d %s, the upstream saw %d; want 200 from it", resp.StatusCode, body, upstreamSaw())
				}
				return
			}
			if !d.renews.IsZero() {
				fc.Set(d.renews.Add(-time.Second))
				wantProxysQuotaAnswer(t, d, post)
				if n := upstreamSaw(); n != 1 {
					t.Fatalf("a second before the renewal the upstream saw %d requests, want 1", n)
				}
				fc.Set(d.renews)
				if resp, body := post(); resp.StatusCode != 200 || upstreamSaw() != 2 {
					t.Fatalf("at the renewal: %d %s, the upstream saw %d; want 200 from it", resp.StatusCode, body, upstreamSaw())
				}
				return
			}
			// Not known: one request a minute goes to see.
			fc.Set(quotaStart.Add(time.Minute - time.Second))
			wantProxysQuotaAnswer(t, d, post)
			fc.Set(quotaStart.Add(time.Minute))
			if resp, body := post(); resp.StatusCode != d.status || strings.Contains(body, "quota_exhausted") || upstreamSaw() != 2 {
				t.Fatalf("a minute on: %d %s, the upstream saw %d; want the upstream's own answer to one request", resp.StatusCode, body, upstreamSaw())
			}
			wantProxysQuotaAnswer(t, d, post)
			fc.Set(quotaStart.Add(2 * time.Minute)) // the mock renewed at 90 s
			if resp, body := post(); resp.StatusCode != 200 || upstreamSaw() != 3 {
				t.Fatalf("two minutes on: %d %s, the upstream saw %d; want 200 from it", resp.StatusCode, body, upstreamSaw())
			}
			for i := range 3 {
				fc.Set(quotaStart.Add(2*time.Minute + time.Duration(i+1)*time.Second))
				if resp, _ := post(); resp.StatusCode != 200 {
					t.Fatalf("after the quota came back: %d", resp.StatusCode)
				}
			}
			if n := upstreamSaw(); n != 6 {
				t.Fatalf("the upstream saw %d requests, want 6", n)
			}
		})
	}
}

// quotaPost sends one request of d's dialect through the proxy.
func quotaPost(t *testing.T, s *stack, d quotaDialect) (*http.Response, string) {
	t.Helper()
	body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest("POST", s.front.URL+d.path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(d.hdr); i += 2 {
		req.Header.Set(d.hdr[i], d.hdr[i+1])
	}
	resp, err := s.httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// wantProxysQuotaAnswer checks that post gets the proxy's own quota
// answer.
func wantProxysQuotaAnswer(t *testing.T, d quotaDialect, post func() (*http.Response, string)) {
	t.Helper()
	resp, body := post()
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	_ = json.Unmarshal([]byte(body), &e)
	wantRetryAfter := resp.Header.Get("Retry-After") != ""
	if resp.StatusCode != d.status || e.Error.Code != "quota_exhausted" || !strings.HasPrefix(e.Error.Message, "llmproxy: ") ||
		resp.Header.Get("X-Should-Retry") != "false" || wantRetryAfter != !d.renews.IsZero() {
		t.Fatalf("%d %s (Retry-After %q), want the proxy's %d quota_exhausted", resp.StatusCode, body, resp.Header.Get("Retry-After"), d.status)
	}
}
