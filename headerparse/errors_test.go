package headerparse

import (
	"strings"
	"testing"
	"time"
)

func TestParseError(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   ErrorInfo
	}{
		// Concurrency limits: refused for the number in flight, not a rate.
		{"concurrency in the message", 429,
			`{"error":{"message":"Rate limit reached for requests: too many concurrent requests for this key (concurrency limit 8). Please try again in 1s.","type":"requests","code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindConcurrency, Type: "requests", Code: "rate_limit_exceeded", RetryIn: time.Second, HasRetryIn: true}},
		{"parallel requests on a gateway", 429,
			`{"error":{"message":"Max parallel request limit reached for this key.","type":"rate_limit_error","code":"429"}}`,
			ErrorInfo{Kind: KindConcurrency, Type: "rate_limit_error", Code: "429"}},
		{"concurrency in the code", 529,
			`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"details":{"error_code":"concurrency_limit"}}`,
			ErrorInfo{Kind: KindConcurrency, Type: "overloaded_error", Code: "concurrency_limit"}},
		// Rate limits.
		{"openai tokens per minute", 429,
			`{"error":{"message":"Rate limit reached for o4-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 162960, Requested 42288. Please try again in 1.574s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindRateLimit, Type: "tokens", Code: "rate_limit_exceeded", RetryIn: 1574 * time.Millisecond, HasRetryIn: true}},
		{"openai requests in milliseconds", 429,
			`{"error":{"message":"Rate limit reached on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20ms.","type":"requests","code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindRateLimit, Type: "requests", Code: "rate_limit_exceeded", RetryIn: 20 * time.Millisecond, HasRetryIn: true}},
		{"openai wait in minutes, a day's limit", 429,
			`{"error":{"message":"Rate limit reached on requests per day (RPD). Please try again in 6m0s.","type":"requests","code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "requests", Code: "rate_limit_exceeded", RetryIn: 6 * time.Minute, HasRetryIn: true, renewal: renewsAsHinted, worded: true}},
		{"openai slow down", 429,
			`{"error":{"message":"Please reduce your rate of requests.","type":"invalid_request_error","code":"slow_down"}}`,
			ErrorInfo{Kind: KindRateLimit, Type: "invalid_request_error", Code: "slow_down"}},
		{"anthropic rate limit", 429,
			`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"},"request_id":"req_1"}`,
			ErrorInfo{Kind: KindRateLimit, Type: "rate_limit_error"}},
		{"together dynamic request limit", 429,
			`{"error":{"message":"You are being rate limited","type":"dynamic_request_limited"}}`,
			ErrorInfo{Kind: KindRateLimit, Type: "dynamic_request_limited"}},
		{"together top-level error_type", 429,
			`{"message":"slow down","error_type":"dynamic_token_limited"}`,
			ErrorInfo{Kind: KindRateLimit, Type: "dynamic_token_limited"}},
		{"gemini array with retry delay", 429,
			`[{"error":{"code":429,"message":"You exceeded your current quota. Please retry in 33.5s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"7s"}]}}]`,
			ErrorInfo{Kind: KindRateLimit, Type: "RESOURCE_EXHAUSTED", Code: "429", RetryIn: 7 * time.Second, HasRetryIn: true}},
		{"gemini message retry", 429,
			`{"error":{"code":429,"message":"Quota exceeded. Please retry in 33.5s.","status":"RESOURCE_EXHAUSTED"}}`,
			ErrorInfo{Kind: KindRateLimit, Type: "RESOURCE_EXHAUSTED", Code: "429", RetryIn: 33500 * time.Millisecond, HasRetryIn: true}},
		{"openrouter numeric 429", 429,
			`{"error":{"code":429,"message":"Rate limit exceeded: free-models-per-min.","metadata":{"headers":{"X-RateLimit-Reset":"1774047180000"}}}}`,
			ErrorInfo{Kind: KindRateLimit, Code: "429"}},

		// Overloaded.
		{"openai server overloaded", 503,
			`{"error":{"message":"The server is overloaded","type":"server_error","code":"server_is_overloaded"}}`,
			ErrorInfo{Kind: KindOverloaded, Type: "server_error", Code: "server_is_overloaded"}},
		{"anthropic overloaded", 529,
			`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			ErrorInfo{Kind: KindOverloaded, Type: "overloaded_error"}},
		{"anthropic overloaded mid-stream on 200", 200,
			`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			ErrorInfo{Kind: KindOverloaded, Type: "overloaded_error"}},

		// Hard quotas.
		{"openai insufficient quota", 429,
			`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "insufficient_quota", Code: "insufficient_quota"}},
		{"openai 2023 quota with null code", 429,
			`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":null}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "insufficient_quota"}},
		{"openai credit balance exhausted", 429,
			`{"error":{"type":"insufficient_quota","code":"credit_balance_exhausted"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "insufficient_quota", Code: "credit_balance_exhausted"}},
		{"openai organization spend limit", 429,
			`{"error":{"type":"requests","code":"organization_spend_limit_exceeded"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "requests", Code: "organization_spend_limit_exceeded"}},
		{"openai project spend limit", 429,
			`{"error":{"code":"project_spend_limit_exceeded"}}`,
			ErrorInfo{Kind: KindHardQuota, Code: "project_spend_limit_exceeded"}},
		{"openai organization usage limit", 429,
			`{"error":{"code":"organization_usage_limit_exceeded"}}`,
			ErrorInfo{Kind: KindHardQuota, Code: "organization_usage_limit_exceeded"}},
		{"anthropic spend cap under error", 429,
			`{"type":"error","error":{"type":"rate_limit_error","message":"spend limit","details":{"error_code":"enforced_spend_limit_reached"}}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "rate_limit_error", Code: "enforced_spend_limit_reached"}},
		{"anthropic spend cap at top level", 429,
			`{"type":"error","error":{"type":"rate_limit_error","message":"spend limit"},"details":{"error_code":"enforced_spend_limit_reached"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "rate_limit_error", Code: "enforced_spend_limit_reached"}},
		{"anthropic billing error", 402,
			`{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low"}}`,
			ErrorInfo{Kind: KindHardQuota, Type: "billing_error"}},
		// A 400's message may open with a field name the client chose:
		// Anthropic's user-set usage limit is passed on, not held.
		{"anthropic usage limit 400", 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2026-04-01 at 00:00 UTC."}}`,
			ErrorInfo{Kind: KindOther, Type: "invalid_request_error"}},
		{"openrouter 402 body", 402,
			`{"error":{"code":402,"message":"Insufficient credits"}}`,
			ErrorInfo{Kind: KindHardQuota, Code: "402"}},
		{"openrouter 402 plain text", 402, `Payment Required`, ErrorInfo{Kind: KindHardQuota}},

		// Too large.
		{"openai request too large", 429,
			`{"error":{"message":"Request too large for gpt-4 in organization org-x on tokens per min (TPM): Limit 30000, Requested 31538. The input or output tokens must be reduced in order to run successfully.","type":"tokens","code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindTooLarge, Type: "tokens", Code: "rate_limit_exceeded"}},
		{"anthropic request too large", 413,
			`{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}`,
			ErrorInfo{Kind: KindTooLarge, Type: "request_too_large"}},
		{"413 without body", 413, ``, ErrorInfo{Kind: KindTooLarge}},

		// Other and none.
		{"anthropic invalid request", 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}`,
			ErrorInfo{Kind: KindOther, Type: "invalid_request_error"}},
		{"openai authentication", 401,
			`{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`,
			ErrorInfo{Kind: KindOther, Type: "invalid_request_error", Code: "invalid_api_key"}},
		{"null error with top-level fields", 429, `{"error":null,"type":"rate_limit_error","message":"x"}`,
			ErrorInfo{Kind: KindRateLimit, Type: "rate_limit_error"}},
		{"error as a string", 500, `{"error":"upstream exploded"}`, ErrorInfo{Kind: KindOther}},
		{"html on 502", 502, `<html><body>Bad Gateway</body></html>`, ErrorInfo{Kind: KindOther}},
		{"empty 429", 429, ``, ErrorInfo{Kind: KindOther}},
		{"empty 200", 200, ``, ErrorInfo{}},
		{"success body", 200, `{"id":"msg_1","type":"message","content":[]}`, ErrorInfo{}},
		{"sse on 200", 200, "data: {\"choices\":[]}\n\n", ErrorInfo{}},
		{"empty array", 429, `[]`, ErrorInfo{Kind: KindOther}},
		{"truncated json", 429, `{"error":{"type":"rate_limit_error"`, ErrorInfo{Kind: KindOther}},
		{"wrong json types", 429, `{"error":{"type":7,"code":true,"message":["x"],"details":"y"}}`,
			ErrorInfo{Kind: KindOther, Type: "7"}},
		{"byte order mark", 429, "\ufeff" + `{"error":{"code":"rate_limit_exceeded"}}`,
			ErrorInfo{Kind: KindRateLimit, Code: "rate_limit_exceeded"}},
		{"negative retry ignored", 429, `{"error":{"code":"rate_limit_exceeded","message":"Please try again in -5s."}}`,
			ErrorInfo{Kind: KindRateLimit, Code: "rate_limit_exceeded"}},
		{"unparsable retry ignored", 429, `{"error":{"code":"rate_limit_exceeded","message":"Please try again in a minute."}}`,
			ErrorInfo{Kind: KindRateLimit, Code: "rate_limit_exceeded"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseError(tt.status, []byte(tt.body))
			got.Message = "" // checked by TestParseErrorMessage
			if got != tt.want {
				t.Errorf("ParseError =\n  %+v\nwant\n  %+v", got, tt.want)
			}
		})
	}
}

func TestParseErrorMessage(t *testing.T) {
	long := strings.Repeat("é", 400) // two bytes each: the cut must not split one
	tests := []struct {
		name, body, want string
	}{
		{"short", `{"error":{"message":"hi"}}`, "hi"},
		{"error string", `{"error":"upstream exploded"}`, "upstream exploded"},
		{"top-level message", `{"message":"slow down","error_type":"x"}`, "slow down"},
		{"truncated on a rune boundary", `{"error":{"message":"` + long + `"}}`, strings.Repeat("é", 150)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseError(429, []byte(tt.body)).Message; got != tt.want {
				t.Errorf("Message = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseErrorCapsBody(t *testing.T) {
	// The error object lies beyond the bytes examined, so it is not seen.
	body := `{"pad":"` + strings.Repeat("x", maxErrorBody) + `","error":{"type":"insufficient_quota"}}`
	if got := ParseError(429, []byte(body)); got.Kind != KindOther {
		t.Errorf("Kind = %v, want other", got.Kind)
	}
}

func TestErrorKind(t *testing.T) {
	tests := []struct {
		kind  ErrorKind
		name  string
		final bool
	}{
		{KindNone, "none", false},
		{KindRateLimit, "rate_limit", false},
		{KindOverloaded, "overloaded", false},
		{KindHardQuota, "hard_quota", true},
		{KindTooLarge, "too_large", true},
		{KindOther, "other", false},
		{KindConcurrency, "concurrency", false},
		{ErrorKind(42), "ErrorKind(42)", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.kind.String(); got != tt.name {
				t.Errorf("String = %q", got)
			}
			if got := tt.kind.Final(); got != tt.final {
				t.Errorf("Final = %v", got)
			}
		})
	}
}

// TestParseErrorTopLevelFieldsOn400: a 400 is an error status, so a body
// without an "error" member is read from its top level.
func TestParseErrorTopLevelFieldsOn400(t *testing.T) {
	got := ParseError(400, []byte(`{"type":"rate_limit_error","message":"slow down"}`))
	want := ErrorInfo{Kind: KindRateLimit, Type: "rate_limit_error", Message: "slow down"}
	if got != want {
		t.Errorf("ParseError =\n  %+v\nwant\n  %+v", got, want)
	}
}

// TestParseErrorTopLevelCode: a body with no "error" member on an error
// status takes its code from the top level.
func TestParseErrorTopLevelCode(t *testing.T) {
	got := ParseError(429, []byte(`{"code":"rate_limit_exceeded","message":"Too many requests"}`))
	want := ErrorInfo{Kind: KindRateLimit, Code: "rate_limit_exceeded", Message: "Too many requests"}
	if got != want {
		t.Errorf("ParseError =\n  %+v\nwant\n  %+v", got, want)
	}
}

// TestParseErrorDetailsArrayErrorCode: in an array of details, the first
// error_code found names the code, and a spend cap there is a hard quota.
func TestParseErrorDetailsArrayErrorCode(t *testing.T) {
	body := `{"error":{"type":"rate_limit_error","message":"spend limit","details":[` +
		`{"@type":"x"},{"error_code":"enforced_spend_limit_reached"},{"error_code":"rate_limit"}]}}`
	got := ParseError(429, []byte(body))
	want := ErrorInfo{Kind: KindHardQuota, Type: "rate_limit_error", Code: "enforced_spend_limit_reached", Message: "spend limit"}
	if got != want {
		t.Errorf("ParseError =\n  %+v\nwant\n  %+v", got, want)
	}
}

// TestParseErrorRetryIn: the wait a body asks for is read at the very start
// of the message too, and a zero or exactly 31-day wait is believed.
func TestParseErrorRetryIn(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		want   time.Duration
		wantOK bool
	}{
		{"phrase at message start", `{"error":{"code":"rate_limit_exceeded","message":"Try again in 2s."}}`, 2 * time.Second, true},
		{"zero wait in message", `{"error":{"code":"rate_limit_exceeded","message":"Please try again in 0s."}}`, 0, true},
		{"Azure's seconds", `{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded call rate limit of your current OpenAI S0 pricing tier. Please retry after 7 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."}}`, 7 * time.Second, true},
		{"one second", `{"error":{"code":"429","message":"Please retry after 1 second."}}`, time.Second, true},
		{"retry after a duration", `{"error":{"code":"429","message":"Please retry after 1.5s."}}`, 1500 * time.Millisecond, true},
		{"retry after no number", `{"error":{"code":"429","message":"Please retry after a while."}}`, 0, false},
		{"retry delay of exactly 31 days", `{"error":{"status":"RESOURCE_EXHAUSTED","details":[{"retryDelay":"744h"}]}}`, monthHorizon, true},
		{"retry delay just beyond 31 days", `{"error":{"status":"RESOURCE_EXHAUSTED","details":[{"retryDelay":"744h0m1s"}]}}`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseError(429, []byte(tt.body))
			if got.RetryIn != tt.want || got.HasRetryIn != tt.wantOK {
				t.Errorf("RetryIn = %v, %v; want %v, %v", got.RetryIn, got.HasRetryIn, tt.want, tt.wantOK)
			}
		})
	}
}

// TestParseErrorMessageCut: a message of exactly maxMessage bytes is kept
// whole, and a longer one is cut back to a rune boundary below maxMessage.
func TestParseErrorMessageCut(t *testing.T) {
	exact := strings.Repeat("x", maxMessage)
	if got := ParseError(429, []byte(`{"error":{"message":"`+exact+`"}}`)).Message; got != exact {
		t.Errorf("Message = %d bytes, want the %d-byte message whole", len(got), maxMessage)
	}
	// "a" then two-byte runes: byte maxMessage falls inside a rune.
	odd := "a" + strings.Repeat("é", 400)
	want := "a" + strings.Repeat("é", (maxMessage-1)/2)
	if got := ParseError(429, []byte(`{"error":{"message":"`+odd+`"}}`)).Message; got != want {
		t.Errorf("Message = %d bytes %q..., want %d bytes", len(got), got[len(got)-2:], len(want))
	}
}

// TestTruncateWithoutRuneStart: a string with no rune start before n bytes
// is cut to nothing rather than split or overrun.
func TestTruncateWithoutRuneStart(t *testing.T) {
	if got := truncate("\x80\x80\x80\x80", 2); got != "" {
		t.Errorf("truncate = %q, want empty", got)
	}
}
