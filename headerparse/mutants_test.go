package headerparse

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Tests pinning boundaries and edge cases of the header and error-body
// readers: exact horizons, zero waits, leading separators, SF escapes.

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

// TestRetryAfterMonthHorizon: a wait of exactly 31 days, as seconds or as an
// HTTP-date, is believed; one second more is not.
func TestRetryAfterMonthHorizon(t *testing.T) {
	tests := []struct {
		name   string
		v      string
		want   time.Duration
		wantOK bool
	}{
		{"seconds exactly 31 days", "2678400", monthHorizon, true},
		{"seconds beyond 31 days", "2678401", 0, false},
		{"http-date exactly 31 days ahead", "Mon, 20 Apr 2026 22:52:00 GMT", monthHorizon, true},
		{"http-date beyond 31 days", "Mon, 20 Apr 2026 22:52:01 GMT", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RetryAfter(http.Header{"Retry-After": {tt.v}}, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("RetryAfter = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestParseEdgeValues: counts and resets at their edges (leading dot, 2^63,
// zero and exactly-a-day resets, fractional epochs) and IETF names and
// parameters that are quoted oddly.
func TestParseEdgeValues(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want Limits
	}{
		{"leading-dot fraction truncates to zero", http.Header{
			"X-Ratelimit-Remaining-Tokens": {".5"},
		}, Limits{Tokens: win(0, 0, time.Time{})}},
		{"fractional count of 2^63 saturates", http.Header{
			"X-Ratelimit-Remaining-Tokens": {"9223372036854775808.0"},
		}, Limits{Tokens: win(0, math.MaxInt64, time.Time{})}},
		{"zero duration reset is now", http.Header{
			"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests":     {"0s"},
		}, Limits{Requests: win(0, 0, now)}},
		{"duration reset of exactly a day believed", http.Header{
			"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests":     {"24h"},
		}, Limits{Requests: win(0, 0, at(24*time.Hour))}},
		{"bare-second reset of exactly a day believed", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"86400"},
		}, Limits{Requests: win(0, 0, at(24*time.Hour))}},
		{"fractional epoch seconds keep the fraction", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"1774047180.5"},
		}, Limits{Requests: win(0, 0, at(60500*time.Millisecond))}},
		{"ietf policy named like a version is a name", http.Header{
			"Ratelimit":        {`"1.2.3";r=5;t=10`},
			"Ratelimit-Policy": {`"1.2.3";q=100;w=60`},
		}, Limits{Requests: win(100, 5, at(10*time.Second))}},
		{"ietf empty quoted quota unit means requests", http.Header{
			"Ratelimit-Policy": {`"default";q=100;qu=""`},
		}, Limits{Requests: Window{Limit: 100}}},
		{"ietf policy ending in an escaped quote is ignored", http.Header{
			"Ratelimit-Policy": {`"a\"`},
		}, Limits{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Parse(tt.h, now); !sameLimits(got, tt.want) {
				t.Errorf("Parse =\n  %+v\nwant\n  %+v", got, tt.want)
			}
		})
	}
}

// TestUnquote: an SF string loses its quotes and backslash escapes wherever
// they sit; a dangling backslash is kept; anything else is left alone.
func TestUnquote(t *testing.T) {
	tests := []struct{ in, want string }{
		{`""`, ``},
		{`"`, `"`},
		{`"abc"`, `abc`},
		{`abc`, `abc`},
		{`"\"a"`, `"a`},
		{`"a\"b"`, `a"b`},
		{`"a\\b"`, `a\b`},
		{`"a\"`, `a\`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := unquote(tt.in); got != tt.want {
				t.Errorf("unquote(%s) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}
