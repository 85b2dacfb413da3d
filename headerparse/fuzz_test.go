package headerparse

import (
	"net/http"
	"testing"
	"time"
	"unicode/utf8"
)

// fuzzHeaders are the names FuzzParse fills, grouped by the role of the
// value each takes: limit, remaining, reset, then the structured fields.
var fuzzHeaders = [...][]string{
	{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Limit-Project-Tokens",
		"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Output-Tokens-Limit",
		"X-Ratelimit-Limit", "X-Tokenlimit-Limit", "Ratelimit-Limit"},
	{"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Remaining-Project-Tokens",
		"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Input-Tokens-Remaining",
		"X-Ratelimit-Remaining", "X-Tokenlimit-Remaining", "Ratelimit-Remaining"},
	{"X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens", "Anthropic-Ratelimit-Tokens-Reset",
		"Anthropic-Ratelimit-Requests-Reset", "X-Ratelimit-Reset", "Ratelimit-Reset"},
	{"Retry-After", "Retry-After-Ms"},
	{"Ratelimit"},
	{"Ratelimit-Policy"},
}

func FuzzParse(f *testing.F) {
	f.Add("60", "0", "1s", "56", `"default";r=50;t=30`, `"default";q=100;w=60`, int64(0))
	f.Add("-1", "-1", "0", "2000", "limit=10, remaining=0, reset=10", "100;w=10", int64(3600))
	f.Add("150000", "149984", "1774047180000", "Fri, 20 Mar 2026 22:52:30 GMT", "", "", int64(-7200))
	f.Add("1e5", "NaN", "2026-03-20T22:52:59Z", "-1", `"a";r=-1;t=99999999999`, `"a";qu=tokens;q=1`, int64(1e12))
	f.Add("99999999999999999999", "1.5", "1774047180", "Inf", `;,"\`, `"`, int64(-1e12))
	f.Fuzz(func(t *testing.T, limit, remaining, reset, retryAfter, rateLimit, policy string, offset int64) {
		values := [...]string{limit, remaining, reset, retryAfter, rateLimit, policy}
		h := http.Header{}
		for i, names := range fuzzHeaders {
			for _, name := range names {
				h[name] = []string{values[i]}
			}
		}
		at := now.Add(time.Duration(offset) * time.Second) // far past and future too
		l := Parse(h, at)
		for _, w := range [...]Window{l.Requests, l.Tokens} {
			checkWindow(t, w, at)
		}
		if l.HasRetryAfter && (l.RetryAfter < 0 || l.RetryAfter > monthHorizon) {
			t.Errorf("RetryAfter = %v", l.RetryAfter)
		}
		if !l.HasRetryAfter && l.RetryAfter != 0 {
			t.Errorf("RetryAfter = %v without HasRetryAfter", l.RetryAfter)
		}
		if resume, ok := l.ResumeAt(at); ok && (resume.Before(at) || resume.After(at.Add(monthHorizon))) {
			t.Errorf("ResumeAt = %v, now %v", resume, at)
		}
	})
}

func checkWindow(t *testing.T, w Window, now time.Time) {
	t.Helper()
	if w.Limit < 0 || w.Remaining < 0 || (!w.HasRemaining && w.Remaining != 0) {
		t.Errorf("bad counts: %+v", w)
	}
	if !w.Known() && w != (Window{}) {
		t.Errorf("unknown window not zero: %+v", w)
	}
	if !w.Reset.IsZero() && (w.Reset.Before(now) || w.Reset.After(now.Add(monthHorizon))) {
		t.Errorf("Reset %v out of bounds of now %v", w.Reset, now)
	}
}

func FuzzParseError(f *testing.F) {
	f.Add(429, []byte(`{"error":{"message":"Please try again in 1.574s.","type":"tokens","code":"rate_limit_exceeded"}}`))
	f.Add(429, []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"x"},"details":{"error_code":"enforced_spend_limit_reached"}}`))
	f.Add(429, []byte(`[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"retryDelay":"7s"}]}}]`))
	f.Add(402, []byte(`{"error":{"code":402,"message":"Insufficient credits"}}`))
	f.Add(500, []byte(`{"error":"boom"}`))
	f.Add(200, []byte(``))
	f.Add(-1, []byte("\xff\xfe{"))
	f.Add(429, []byte(geminiPerDay))
	f.Add(429, []byte(groqPerDay))
	f.Add(403, []byte(apimQuota))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		info := ParseError(status, body)
		if info.Kind < KindNone || info.Kind > KindOther {
			t.Errorf("Kind = %d", info.Kind)
		}
		if len(info.Message) > maxMessage {
			t.Errorf("Message is %d bytes", len(info.Message))
		}
		// encoding/json replaces invalid UTF-8, and truncate keeps runes whole.
		if !utf8.ValidString(info.Message) {
			t.Errorf("Message %q is not UTF-8", info.Message)
		}
		if info.RetryIn < 0 || info.RetryIn > monthHorizon || (!info.HasRetryIn && info.RetryIn != 0) {
			t.Errorf("RetryIn = %v, %v", info.RetryIn, info.HasRetryIn)
		}
		if info.Kind.Final() != (info.Kind == KindHardQuota || info.Kind == KindTooLarge) {
			t.Errorf("Final disagrees with Kind %v", info.Kind)
		}
		if info.renewal != renewsUnsaid && info.Kind != KindHardQuota {
			t.Errorf("a renewal (%d) on Kind %v", info.renewal, info.Kind)
		}
		// With no headers, a quota is spent only by the body's word, and
		// renews at most a month from now (a day, at midnight Pacific).
		q := QuotaOf(status, http.Header{}, info, now)
		if q.Spent != (info.Kind == KindHardQuota) {
			t.Errorf("QuotaOf spent %v for Kind %v", q.Spent, info.Kind)
		}
		if !q.Renews.IsZero() && (!q.Renews.After(now) || q.Renews.After(now.Add(monthHorizon))) {
			t.Errorf("QuotaOf renews at %v, now %v", q.Renews, now)
		}
	})
}
