package headerparse

import (
	"net/http"
	"testing"
	"time"
)

// Error bodies of quotas that a wait for a rate cannot renew, in each
// dialect's words.
const (
	// Gemini's per-day quota, as its native API and the OpenAI-compatible
	// endpoint (an array) send it: a QuotaFailure naming the day's quota,
	// and a RetryInfo that does not tell the renewal.
	geminiPerDay = `{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 20, model: gemini-2.5-flash\nPlease retry in 59.6s.","status":"RESOURCE_EXHAUSTED","details":[` +
		`{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"20"}]},` +
		`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"59s"}]}}`
	// The same limit per minute is a rate: waiting fixes it.
	geminiPerMinute = `{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[` +
		`{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},` +
		`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}`
	groqPerDay       = `{"error":{"message":"Rate limit reached for model ` + "`llama-3.3-70b-versatile`" + ` in organization ` + "`org_x`" + ` service tier ` + "`on_demand`" + ` on requests per day (RPD): Limit 1000, Used 1000, Requested 1. Please try again in 1m26.4s. Need more requests? Upgrade to Dev Tier today at https://console.groq.com/settings/billing","type":"requests","code":"rate_limit_exceeded"}}`
	groqTokensPerDay = `{"error":{"message":"Rate limit reached for model ` + "`llama-3.3-70b-versatile`" + ` on tokens per day (TPD): Limit 100000, Used 97050, Requested 3619. Please try again in 9m38.016s.","type":"tokens","code":"rate_limit_exceeded"}}`
	apimQuota        = `{"statusCode":403,"message":"Out of call volume quota. Quota will be replenished in 5.03:23:11."}`
	// echoedPerDay is OpenAI's 400 to {"model":"gpt-4o","messages":[],
	// "per day (try again in 744h":1}: words the client chose.
	echoedPerDay = `{"error":{"message":"Unrecognized request argument supplied: per day (try again in 744h","type":"invalid_request_error","param":null,"code":null}}`
)

// TestParseErrorQuotas: a day's limit spent and Azure API Management's
// quota are hard quotas, each with how it renews; the same words per
// minute, and a 403 that is about permission, are not.
func TestParseErrorQuotas(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   ErrorInfo
	}{
		{"gemini per day", 429, geminiPerDay,
			ErrorInfo{Kind: KindHardQuota, Type: "RESOURCE_EXHAUSTED", Code: "429", RetryIn: 59 * time.Second, HasRetryIn: true, renewal: renewsAtPacificMidnight}},
		{"gemini per day, OpenAI-compatible array", 429, "[" + geminiPerDay + "]",
			ErrorInfo{Kind: KindHardQuota, Type: "RESOURCE_EXHAUSTED", Code: "429", RetryIn: 59 * time.Second, HasRetryIn: true, renewal: renewsAtPacificMidnight}},
		{"gemini per day in the message", 429,
			`{"error":{"code":429,"message":"Quota exceeded for metric: GenerateRequestsPerDayPerProjectPerModel-FreeTier","status":"RESOURCE_EXHAUSTED"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "RESOURCE_EXHAUSTED", Code: "429", renewal: renewsAtPacificMidnight, worded: true}},
		{"google daily limit on a 429", 429,
			`{"error":{"code":429,"message":"Daily Limit Exceeded. The quota will be reset at midnight Pacific Time (PT)."}}`,
			ErrorInfo{Kind: KindHardQuota, Code: "429", renewal: renewsAtPacificMidnight, worded: true}},
		{"google daily limit on a 403 is words off the 429", 403,
			`{"error":{"code":403,"message":"Daily Limit Exceeded. The quota will be reset at midnight Pacific Time (PT)."}}`,
			ErrorInfo{Kind: KindOther, Code: "403"}},
		{"a per-day quotaId is read on any status", 400,
			`{"error":{"code":400,"status":"FAILED_PRECONDITION","details":[{"violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel"}]}]}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "FAILED_PRECONDITION", Code: "400", renewal: renewsAtPacificMidnight}},
		{"a structured quota keeps its fields' word", 429,
			`{"error":{"type":"insufficient_quota","message":"on requests per day (RPD)"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "insufficient_quota", renewal: renewsAsHinted}},
		// The reproduction of issue 49: OpenAI echoes an unknown field's
		// name in a 400, and the client chose the name.
		{"an echoed per day field in a 400", 400, echoedPerDay,
			ErrorInfo{Kind: KindOther, Type: "invalid_request_error", RetryIn: 744 * time.Hour, HasRetryIn: true}},
		{"an echoed perday field in a 400", 400,
			`{"error":{"message":"Unrecognized request argument supplied: perday midnight pacific","type":"invalid_request_error","param":null,"code":null}}`,
			ErrorInfo{Kind: KindOther, Type: "invalid_request_error"}},
		{"per day words on a 403", 403,
			`{"error":{"message":"quota on requests per day (RPD) reached","type":"invalid_request_error"}}`,
			ErrorInfo{Kind: KindOther, Type: "invalid_request_error"}},
		{"per day words on a 500", 500,
			`{"error":{"message":"perday quota","type":"server_error"}}`,
			ErrorInfo{Kind: KindOther, Type: "server_error"}},
		{"gemini per minute", 429, geminiPerMinute,
			ErrorInfo{Kind: KindRateLimit, Type: "RESOURCE_EXHAUSTED", Code: "429", RetryIn: 20 * time.Second, HasRetryIn: true}},
		{"groq requests per day", 429, groqPerDay,
			ErrorInfo{Kind: KindHardQuota, Type: "requests", Code: "rate_limit_exceeded", RetryIn: 86400 * time.Millisecond, HasRetryIn: true, renewal: renewsAsHinted, worded: true}},
		{"groq tokens per day", 429, groqTokensPerDay,
			ErrorInfo{Kind: KindHardQuota, Type: "tokens", Code: "rate_limit_exceeded", RetryIn: 9*time.Minute + 38016*time.Millisecond, HasRetryIn: true, renewal: renewsAsHinted, worded: true}},
		{"groq tokens per minute", 429,
			`{"error":{"message":"Rate limit reached for model x on tokens per minute (TPM): Limit 6000, Used 5000, Requested 1200. Please try again in 2s.","type":"tokens","code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindRateLimit, Type: "tokens", Code: "rate_limit_exceeded", RetryIn: 2 * time.Second, HasRetryIn: true}},
		{"too large for a day stays too large", 429,
			`{"error":{"message":"Request too large for model x on tokens per day (TPD): Limit 100, Requested 300.","type":"tokens","code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindTooLarge, Type: "tokens", Code: "rate_limit_exceeded"}},
		{"azure api management quota", 403, apimQuota,
			ErrorInfo{Kind: KindHardQuota, RetryIn: 5*24*time.Hour + 3*time.Hour + 23*time.Minute + 11*time.Second, HasRetryIn: true, renewal: renewsAsHinted, worded: true}},
		{"azure api management bandwidth quota", 403, `{"statusCode":403,"message":"Out of bandwidth quota. Quota will be replenished in 00:01:00."}`,
			ErrorInfo{Kind: KindHardQuota, RetryIn: time.Minute, HasRetryIn: true, renewal: renewsAsHinted, worded: true}},
		{"a 403 whose message speaks of a quota otherwise", 403, `{"error":{"message":"Your quota is not enough: out of call volume quota"}}`,
			ErrorInfo{Kind: KindOther}},
		{"a quota word on a 429 rate limit", 429,
			`{"error":{"message":"quota per minute reached","type":"requests","code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindRateLimit, Type: "requests", Code: "rate_limit_exceeded"}},
		{"a 403 about permission", 403,
			`{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}`,
			ErrorInfo{Kind: KindOther, Type: "permission_error"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseError(tt.status, []byte(tt.body))
			got.Message = ""
			if got != tt.want {
				t.Errorf("ParseError =\n  %+v\nwant\n  %+v", got, tt.want)
			}
		})
	}
}

// TestQuotaOf: whether an answer says a quota is spent, and when it
// renews, dialect by dialect.
func TestQuotaOf(t *testing.T) {
	now := time.Date(2026, 11, 27, 16, 0, 0, 0, time.UTC) // 08:00 PST
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	midnightPT := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		status int
		h      http.Header
		body   string
		want   Quota
	}{
		{"openai insufficient quota: renewal not said", 429, hdr(),
			`{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exceeded your current quota"}}`,
			Quota{Spent: true}},
		{"openai insufficient quota: Retry-After is not its renewal", 429, hdr("Retry-After", "20"),
			`{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}`, Quota{Spent: true}},
		{"anthropic spend cap", 429, hdr(),
			`{"type":"error","error":{"type":"rate_limit_error","message":"spend limit","details":{"error_code":"enforced_spend_limit_reached"}}}`,
			Quota{Spent: true}},
		{"openrouter 402", 402, hdr(), `{"error":{"code":402,"message":"Insufficient credits"}}`, Quota{Spent: true}},
		{"gemini per day: midnight Pacific, not its retryDelay", 429, hdr(), geminiPerDay, Quota{Spent: true, Renews: midnightPT}},
		{"gemini per day in a 429's words", 429, hdr(),
			`{"error":{"code":429,"message":"Quota exceeded for metric: GenerateRequestsPerDayPerProjectPerModel-FreeTier","status":"RESOURCE_EXHAUSTED"}}`,
			Quota{Spent: true, Renews: midnightPT, Worded: true}},
		{"groq per day: Retry-After", 429, hdr("Retry-After", "87", "X-Ratelimit-Remaining-Requests", "0",
			"X-Ratelimit-Limit-Requests", "1000", "X-Ratelimit-Reset-Requests", "23h59m"), groqPerDay,
			Quota{Spent: true, Renews: now.Add(87 * time.Second), Worded: true}},
		{"groq per day: the body's wait without Retry-After", 429, hdr(), groqPerDay,
			Quota{Spent: true, Renews: now.Add(86400 * time.Millisecond), Worded: true}},
		{"groq per day: a zero Retry-After gives way to the body", 429, hdr("Retry-After", "0"), groqPerDay,
			Quota{Spent: true, Renews: now.Add(86400 * time.Millisecond), Worded: true}},
		{"groq per day: a wait of zero is no renewal", 429, hdr(),
			`{"error":{"message":"Rate limit reached on requests per day (RPD). Please try again in 0s.","type":"requests","code":"rate_limit_exceeded"}}`,
			Quota{Spent: true, Worded: true}},
		{"groq per day: the request window's reset when nothing else says", 429,
			hdr("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Limit-Requests", "1000", "X-Ratelimit-Reset-Requests", "2m30s"),
			`{"error":{"message":"Rate limit reached on requests per day (RPD).","type":"requests","code":"rate_limit_exceeded"}}`,
			Quota{Spent: true, Renews: now.Add(150 * time.Second), Worded: true}},
		{"groq per day: a window with requests left is not the renewal", 429,
			hdr("X-Ratelimit-Remaining-Requests", "3", "X-Ratelimit-Limit-Requests", "1000", "X-Ratelimit-Reset-Requests", "2m30s"),
			`{"error":{"message":"Rate limit reached on requests per day (RPD).","type":"requests","code":"rate_limit_exceeded"}}`,
			Quota{Spent: true, Worded: true}},
		{"groq per day: a window reset already past is not the renewal", 429,
			hdr("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Limit-Requests", "1000", "X-Ratelimit-Reset-Requests", "0s"),
			`{"error":{"message":"Rate limit reached on requests per day (RPD).","type":"requests","code":"rate_limit_exceeded"}}`,
			Quota{Spent: true, Worded: true}},
		{"apim quota: Retry-After", 403, hdr("Retry-After", "3600"), apimQuota, Quota{Spent: true, Renews: now.Add(time.Hour), Worded: true}},
		{"apim quota: the body's renewal", 403, hdr(), apimQuota,
			Quota{Spent: true, Renews: now.Add(5*24*time.Hour + 3*time.Hour + 23*time.Minute + 11*time.Second), Worded: true}},
		// Issue 49: a header alone, or a body that is not the policy's,
		// is no quota, whatever it asks to wait.
		{"a 403 with Retry-After and a body of its own", 403, hdr("retry-after", "60"), `{"statusCode":403,"message":"Token limit exceeded."}`, Quota{}},
		{"a 403 with a month's Retry-After and a plain body", 403, hdr("Retry-After", "2678000"), `Forbidden`, Quota{}},
		{"an echoed per day field in a 400", 400, hdr("Retry-After", "2678000"), echoedPerDay, Quota{}},
		{"a 403 about permission", 403, hdr(),
			`{"type":"error","error":{"type":"permission_error","message":"no"}}`, Quota{}},
		{"a rate limit", 429, hdr("Retry-After", "5"),
			`{"error":{"type":"requests","code":"rate_limit_exceeded","message":"Please try again in 5s."}}`, Quota{}},
		{"gemini per minute", 429, hdr(), geminiPerMinute, Quota{}},
		{"a success", 200, hdr(), `{}`, Quota{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ParseError(tt.status, []byte(tt.body))
			if got := QuotaOf(tt.status, tt.h, e, now); got.Spent != tt.want.Spent || !got.Renews.Equal(tt.want.Renews) || got.Worded != tt.want.Worded {
				t.Errorf("QuotaOf = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestTimeSpan: Azure API Management's renewal, a .NET TimeSpan, read as
// a duration; anything not of its form is not read.
func TestTimeSpan(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"00:00:06", 6 * time.Second, true},
		{"01:02:03", time.Hour + 2*time.Minute + 3*time.Second, true},
		{"5.03:23:11", 5*24*time.Hour + 3*time.Hour + 23*time.Minute + 11*time.Second, true},
		{"00:00:01.5", 1500 * time.Millisecond, true},
		{"9999.00:00:00", 9999 * 24 * time.Hour, true},
		{"10000.00:00:00", 0, false},
		{"1.2.3:00:00", 0, false},
		{"00:00", 0, false},
		{"00::00", 0, false},
		{":00:00", 0, false},
		{"0a:00:00", 0, false},
		{"00:-1:00", 0, false},
		{"00:00:x", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := timeSpan(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("timeSpan(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// TestAReplenishmentBeyondAMonthIsNotRead: a quota that renews in more
// than 31 days has no renewal time the proxy believes.
func TestAReplenishmentBeyondAMonthIsNotRead(t *testing.T) {
	for body, want := range map[string]bool{
		`{"statusCode":403,"message":"Out of call volume quota. Quota will be replenished in 31.00:00:00."}`: true,
		`{"statusCode":403,"message":"Out of call volume quota. Quota will be replenished in 31.00:00:01."}`: false,
		`{"statusCode":403,"message":"Out of call volume quota. Quota will be replenished in soon."}`:        false,
	} {
		if got := ParseError(403, []byte(body)).HasRetryIn; got != want {
			t.Errorf("%s: HasRetryIn %v, want %v", body, got, want)
		}
	}
}
