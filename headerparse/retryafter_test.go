package headerparse

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		name   string
		h      http.Header
		want   time.Duration
		wantOK bool
	}{
		{"absent", http.Header{}, 0, false},
		{"integer seconds", http.Header{"Retry-After": {"56"}}, 56 * time.Second, true},
		{"float seconds", http.Header{"Retry-After": {"1.5"}}, 1500 * time.Millisecond, true},
		{"zero seconds", http.Header{"Retry-After": {"0"}}, 0, true},
		{"padded", http.Header{"Retry-After": {" 3 "}}, 3 * time.Second, true},
		{"milliseconds first", http.Header{"Retry-After-Ms": {"2000"}, "Retry-After": {"9"}}, 2 * time.Second, true},
		{"float milliseconds", http.Header{"Retry-After-Ms": {"1500.5"}}, 1500500 * time.Microsecond, true},
		{"zero milliseconds defers to seconds", http.Header{"Retry-After-Ms": {"0"}, "Retry-After": {"4"}}, 4 * time.Second, true},
		{"zero milliseconds alone", http.Header{"Retry-After-Ms": {"0"}}, 0, true},
		{"bad milliseconds falls back", http.Header{"Retry-After-Ms": {"-5"}, "Retry-After": {"4"}}, 4 * time.Second, true},
		{"http-date", http.Header{"Retry-After": {"Fri, 20 Mar 2026 22:52:30 GMT"}}, 30 * time.Second, true},
		{"http-date in the past", http.Header{"Retry-After": {"Fri, 20 Mar 2026 22:00:00 GMT"}}, 0, true},
		{"http-date a year away", http.Header{"Retry-After": {"Sat, 20 Mar 2027 22:52:30 GMT"}}, 0, false},
		{"negative", http.Header{"Retry-After": {"-1"}}, 0, false},
		{"NaN", http.Header{"Retry-After": {"NaN"}}, 0, false},
		{"Inf", http.Header{"Retry-After-Ms": {"Inf"}}, 0, false},
		{"exponent", http.Header{"Retry-After": {"1e3"}}, 0, false},
		{"absurd seconds", http.Header{"Retry-After": {"99999999999"}}, 0, false},
		{"absurd milliseconds", http.Header{"Retry-After-Ms": {"1e400"}}, 0, false},
		{"go duration is not a retry-after", http.Header{"Retry-After": {"5s"}}, 0, false},
		{"garbage", http.Header{"Retry-After": {"soon"}}, 0, false},
		{"lower-case key", http.Header{"retry-after-ms": {"250"}}, 250 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RetryAfter(tt.h, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("RetryAfter = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
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
