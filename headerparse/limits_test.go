package headerparse

import (
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// now is 60s before the OpenRouter reset 1774047180000 seen in traffic.
var now = time.Date(2026, 3, 20, 22, 52, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return now.Add(d) }

func win(limit, remaining int64, reset time.Time) Window {
	return Window{Limit: limit, Remaining: remaining, HasRemaining: true, Reset: reset}
}

func sameWindow(a, b Window) bool {
	return a.Limit == b.Limit && a.Remaining == b.Remaining &&
		a.HasRemaining == b.HasRemaining && a.Reset.Equal(b.Reset)
}

func sameLimits(a, b Limits) bool {
	return sameWindow(a.Requests, b.Requests) && sameWindow(a.Tokens, b.Tokens) &&
		a.RetryAfter == b.RetryAfter && a.HasRetryAfter == b.HasRetryAfter
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want Limits
	}{
		{"empty", http.Header{}, Limits{}},
		{"nil", nil, Limits{}},

		// OpenAI, Groq and Azure.
		{"openai requests and tokens", http.Header{
			"X-Ratelimit-Limit-Requests":     {"60"},
			"X-Ratelimit-Remaining-Requests": {"59"},
			"X-Ratelimit-Reset-Requests":     {"1s"},
			"X-Ratelimit-Limit-Tokens":       {"150000"},
			"X-Ratelimit-Remaining-Tokens":   {"149984"},
			"X-Ratelimit-Reset-Tokens":       {"6m0s"},
		}, Limits{Requests: win(60, 59, at(time.Second)), Tokens: win(150000, 149984, at(6*time.Minute))}},
		{"openai millisecond resets", http.Header{
			"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests":     {"20ms"},
			"X-Ratelimit-Remaining-Tokens":   {"10"},
			"X-Ratelimit-Reset-Tokens":       {"9ms"},
		}, Limits{Requests: win(0, 0, at(20*time.Millisecond)), Tokens: win(0, 10, at(9*time.Millisecond))}},
		{"groq daily requests fractional duration", http.Header{
			"X-Ratelimit-Limit-Requests":     {"14400"},
			"X-Ratelimit-Remaining-Requests": {"14370"},
			"X-Ratelimit-Reset-Requests":     {"2m59.56s"},
			"X-Ratelimit-Limit-Tokens":       {"18000"},
			"X-Ratelimit-Remaining-Tokens":   {"17997"},
			"X-Ratelimit-Reset-Tokens":       {"7.66s"},
		}, Limits{
			Requests: win(14400, 14370, at(2*time.Minute+59560*time.Millisecond)),
			Tokens:   win(18000, 17997, at(7660*time.Millisecond)),
		}},
		{"openai project tokens more restrictive", http.Header{
			"X-Ratelimit-Limit-Tokens":             {"150000"},
			"X-Ratelimit-Remaining-Tokens":         {"149984"},
			"X-Ratelimit-Reset-Tokens":             {"6m0s"},
			"X-Ratelimit-Limit-Project-Tokens":     {"60000"},
			"X-Ratelimit-Remaining-Project-Tokens": {"57000"},
			"X-Ratelimit-Reset-Project-Tokens":     {"3s"},
		}, Limits{Tokens: win(60000, 57000, at(3*time.Second))}},
		{"openai project tokens less restrictive", http.Header{
			"X-Ratelimit-Limit-Tokens":             {"150000"},
			"X-Ratelimit-Remaining-Tokens":         {"100"},
			"X-Ratelimit-Reset-Tokens":             {"6m0s"},
			"X-Ratelimit-Limit-Project-Tokens":     {"60000"},
			"X-Ratelimit-Remaining-Project-Tokens": {"57000"},
			"X-Ratelimit-Reset-Project-Tokens":     {"3s"},
		}, Limits{Tokens: win(150000, 100, at(6*time.Minute))}},
		{"token tie goes to later reset", http.Header{
			"X-Ratelimit-Limit-Tokens":             {"150000"},
			"X-Ratelimit-Remaining-Tokens":         {"0"},
			"X-Ratelimit-Reset-Tokens":             {"2s"},
			"X-Ratelimit-Limit-Project-Tokens":     {"60000"},
			"X-Ratelimit-Remaining-Project-Tokens": {"0"},
			"X-Ratelimit-Reset-Project-Tokens":     {"30s"},
		}, Limits{Tokens: win(60000, 0, at(30*time.Second))}},
		{"window with a count beats one without", http.Header{
			"X-Ratelimit-Limit-Tokens":             {"100"},
			"X-Ratelimit-Limit-Project-Tokens":     {"60000"},
			"X-Ratelimit-Remaining-Project-Tokens": {"57000"},
		}, Limits{Tokens: win(60000, 57000, time.Time{})}},
		{"azure bare second resets", http.Header{
			"X-Ratelimit-Limit-Requests":     {"100"},
			"X-Ratelimit-Remaining-Requests": {"99"},
			"X-Ratelimit-Reset-Requests":     {"10"},
			"X-Ratelimit-Limit-Tokens":       {"100000"},
			"X-Ratelimit-Remaining-Tokens":   {"99000"},
			"X-Ratelimit-Reset-Tokens":       {"300"},
		}, Limits{Requests: win(100, 99, at(10*time.Second)), Tokens: win(100000, 99000, at(300*time.Second))}},
		{"azure responses api minus one is not reported", http.Header{
			"X-Ratelimit-Limit-Tokens":     {"-1"},
			"X-Ratelimit-Remaining-Tokens": {"-1"},
			"X-Ratelimit-Reset-Tokens":     {"0"},
		}, Limits{}},
		{"azure retry-after-ms", http.Header{
			"Retry-After-Ms":                 {"2000"},
			"X-Ratelimit-Remaining-Requests": {"0"},
		}, Limits{Requests: win(0, 0, time.Time{}), RetryAfter: 2 * time.Second, HasRetryAfter: true}},

		// Anthropic.
		{"anthropic every family", http.Header{
			"Anthropic-Ratelimit-Requests-Limit":          {"50"},
			"Anthropic-Ratelimit-Requests-Remaining":      {"49"},
			"Anthropic-Ratelimit-Requests-Reset":          {"2026-03-20T22:52:01Z"},
			"Anthropic-Ratelimit-Tokens-Limit":            {"90000"},
			"Anthropic-Ratelimit-Tokens-Remaining":        {"40000"},
			"Anthropic-Ratelimit-Tokens-Reset":            {"2026-03-20T22:52:30Z"},
			"Anthropic-Ratelimit-Input-Tokens-Limit":      {"80000"},
			"Anthropic-Ratelimit-Input-Tokens-Remaining":  {"40000"},
			"Anthropic-Ratelimit-Input-Tokens-Reset":      {"2026-03-20T22:52:40Z"},
			"Anthropic-Ratelimit-Output-Tokens-Limit":     {"16000"},
			"Anthropic-Ratelimit-Output-Tokens-Remaining": {"41000"},
			"Anthropic-Ratelimit-Output-Tokens-Reset":     {"2026-03-20T22:52:50Z"},
			"Retry-After": {"7"},
		}, Limits{
			Requests:   win(50, 49, at(time.Second)),
			Tokens:     win(80000, 40000, at(40*time.Second)), // ties with tokens, later reset
			RetryAfter: 7 * time.Second, HasRetryAfter: true,
		}},
		{"anthropic fractional seconds and offset", http.Header{
			"Anthropic-Ratelimit-Requests-Remaining": {"0"},
			"Anthropic-Ratelimit-Requests-Reset":     {"2026-03-20T23:52:01.5+01:00"},
		}, Limits{Requests: win(0, 0, at(1500*time.Millisecond))}},
		{"anthropic reset in the past is now", http.Header{
			"Anthropic-Ratelimit-Tokens-Remaining": {"1000"},
			"Anthropic-Ratelimit-Tokens-Reset":     {"2026-03-20T22:40:59Z"},
		}, Limits{Tokens: win(0, 1000, now)}},
		{"anthropic priority tier ignored", http.Header{
			"Anthropic-Priority-Input-Tokens-Limit":     {"1000"},
			"Anthropic-Priority-Input-Tokens-Remaining": {"0"},
		}, Limits{}},

		// Together and OpenRouter share the unsuffixed names.
		{"together requests and per-second tokens", http.Header{
			"X-Ratelimit-Limit":      {"60"},
			"X-Ratelimit-Remaining":  {"0"},
			"X-Ratelimit-Reset":      {"2"},
			"X-Tokenlimit-Limit":     {"2000"},
			"X-Tokenlimit-Remaining": {"1500"},
		}, Limits{Requests: win(60, 0, at(2*time.Second)), Tokens: win(2000, 1500, at(time.Second))}},
		{"together float seconds reset", http.Header{
			"X-Ratelimit-Remaining": {"3"},
			"X-Ratelimit-Reset":     {"0.5"},
		}, Limits{Requests: win(0, 3, at(500*time.Millisecond))}},
		{"openrouter epoch milliseconds", http.Header{
			"X-Ratelimit-Limit":     {"20"},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"1774047180000"},
		}, Limits{Requests: win(20, 0, at(time.Minute))}},
		{"epoch seconds", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"1774047180"},
		}, Limits{Requests: win(0, 0, at(time.Minute))}},
		{"epoch seconds slightly past is now", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"1774047000"},
		}, Limits{Requests: win(0, 0, now)}},

		// IETF drafts.
		{"ietf draft 06 split fields", http.Header{
			"Ratelimit-Limit":     {"100"},
			"Ratelimit-Remaining": {"50"},
			"Ratelimit-Reset":     {"50"},
			"Ratelimit-Policy":    {"100;w=10"},
		}, Limits{Requests: win(100, 50, at(50*time.Second))}},
		{"ietf draft 03 policies in limit", http.Header{
			"Ratelimit-Limit":     {"10, 10;w=1, 50;w=60"},
			"Ratelimit-Remaining": {"9"},
		}, Limits{Requests: win(10, 9, time.Time{})}},
		{"ietf old policy gives limit", http.Header{
			"Ratelimit-Remaining": {"9"},
			"Ratelimit-Policy":    {"100;w=10"},
		}, Limits{Requests: win(100, 9, time.Time{})}},
		{"ietf draft 07 dictionary", http.Header{
			"Ratelimit": {"limit=10, remaining=0, reset=10"},
		}, Limits{Requests: win(10, 0, at(10*time.Second))}},
		{"ietf draft 08 matched by name", http.Header{
			"Ratelimit":        {`"default";r=50;t=30`},
			"Ratelimit-Policy": {`"default";q=100;w=60`},
		}, Limits{Requests: win(100, 50, at(30*time.Second))}},
		{"ietf draft 08 most restrictive of several", http.Header{
			"Ratelimit":        {`"burst";r=50;t=30, "daily";r=5;t=43200`},
			"Ratelimit-Policy": {`"burst";q=100;w=60, "daily";q=1000;w=86400`},
		}, Limits{Requests: win(1000, 5, at(12*time.Hour))}},
		{"ietf draft 08 across field lines", http.Header{
			"Ratelimit":        {`"burst";r=50;t=30`, `"daily";r=5;t=43200`},
			"Ratelimit-Policy": {`"burst";q=100;w=60`, `"daily";q=1000;w=86400`},
		}, Limits{Requests: win(1000, 5, at(12*time.Hour))}},
		{"ietf draft 08 monthly reset believed", http.Header{
			"Ratelimit":        {`"monthly";r=0;t=1209600`},
			"Ratelimit-Policy": {`"monthly";q=10000;w=2592000`},
		}, Limits{Requests: win(10000, 0, at(14*24*time.Hour))}},
		{"ietf draft 08 units", http.Header{
			"Ratelimit":        {`"req";r=9;t=1, "tok";r=500;t=2, "bytes";r=0;t=3, "conc";r=0`},
			"Ratelimit-Policy": {`"req";q=10, "tok";q=1000;qu="tokens", "bytes";q=1;qu="content-bytes", "conc";q=2;qu="concurrent-requests"`},
		}, Limits{Requests: win(10, 9, at(time.Second)), Tokens: win(1000, 500, at(2*time.Second))}},
		{"ietf draft 08 member without policy", http.Header{
			"Ratelimit": {`"default";r=0;t=5`},
		}, Limits{Requests: win(0, 0, at(5*time.Second))}},
		{"ietf draft 08 policy alone gives limit", http.Header{
			"Ratelimit-Policy": {`"default";q=100;w=60`},
		}, Limits{Requests: Window{Limit: 100}}},
		{"ietf draft 08 unquoted name and escapes", http.Header{
			"Ratelimit":        {`"a\"b";r=1, burst;r=2`},
			"Ratelimit-Policy": {`"a\"b";q=4, burst;q=3`},
		}, Limits{Requests: win(4, 1, time.Time{})}},
		{"ietf with retry-after", http.Header{
			"Ratelimit":   {`"default";r=0;t=30`},
			"Retry-After": {"5"},
		}, Limits{Requests: win(0, 0, at(30*time.Second)), RetryAfter: 5 * time.Second, HasRetryAfter: true}},

		// Scepticism.
		{"negative counts and resets rejected", http.Header{
			"X-Ratelimit-Limit-Requests":     {"-60"},
			"X-Ratelimit-Remaining-Requests": {"-5"},
			"X-Ratelimit-Limit-Tokens":       {"100"},
			"X-Ratelimit-Remaining-Tokens":   {"10"},
			"X-Ratelimit-Reset-Tokens":       {"-1s"},
		}, Limits{Tokens: win(100, 10, time.Time{})}},
		{"negative bare reset rejected", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"-3"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"rfc 3339 reset a year away rejected", http.Header{
			"Anthropic-Ratelimit-Requests-Remaining": {"0"},
			"Anthropic-Ratelimit-Requests-Reset":     {"2027-03-20T22:52:00Z"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"rfc 3339 reset a year ago rejected", http.Header{
			"Anthropic-Ratelimit-Requests-Remaining": {"0"},
			"Anthropic-Ratelimit-Requests-Reset":     {"2025-03-20T22:52:00Z"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"epoch milliseconds a year away rejected", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"1805583180000"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"epoch seconds in 2001 rejected", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"1000000000"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"duration beyond a day rejected", http.Header{
			"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests":     {"25h"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"number too large for a delay too small for an epoch", http.Header{
			"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests":     {"100000"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"number that looks like a date", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"20260320"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"date without time rejected", http.Header{
			"Anthropic-Ratelimit-Requests-Remaining": {"0"},
			"Anthropic-Ratelimit-Requests-Reset":     {"2026-03-21"},
		}, Limits{Requests: win(0, 0, time.Time{})}},
		{"http-date reset", http.Header{
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"Fri, 20 Mar 2026 22:53:00 GMT"},
		}, Limits{Requests: win(0, 0, at(time.Minute))}},
		{"garbage", http.Header{
			"X-Ratelimit-Limit-Requests":     {"lots"},
			"X-Ratelimit-Remaining-Requests": {"NaN"},
			"X-Ratelimit-Limit-Tokens":       {"1e5"},
			"X-Ratelimit-Remaining-Tokens":   {"Inf"},
			"X-Ratelimit-Limit":              {"0x10"},
			"X-Ratelimit-Remaining":          {"+5"},
			"Ratelimit":                      {`;;,,"`},
			"Ratelimit-Policy":               {`"`},
			"Retry-After":                    {"soon"},
		}, Limits{}},
		{"garbage reset keeps the counts", http.Header{
			"X-Ratelimit-Limit-Tokens":     {"100"},
			"X-Ratelimit-Remaining-Tokens": {"5"},
			"X-Ratelimit-Reset-Tokens":     {"soon"},
		}, Limits{Tokens: win(100, 5, time.Time{})}},
		{"zero limit is not reported", http.Header{
			"X-Ratelimit-Limit-Requests": {"0"},
		}, Limits{}},
		{"reset alone is no window", http.Header{
			"X-Ratelimit-Reset-Requests":       {"1s"},
			"Anthropic-Ratelimit-Tokens-Reset": {"2026-03-20T22:52:30Z"},
		}, Limits{}},
		{"fraction truncated and huge saturated", http.Header{
			"X-Ratelimit-Limit-Tokens":     {"99999999999999999999999"},
			"X-Ratelimit-Remaining-Tokens": {"149984.7"},
		}, Limits{Tokens: win(math.MaxInt64, 149984, time.Time{})}},
		{"joined repeated header uses first", http.Header{
			"X-Ratelimit-Remaining-Requests": {"5, 7"},
			"X-Ratelimit-Reset-Requests":     {"1s, 2s"},
		}, Limits{Requests: win(0, 5, at(time.Second))}},

		// Separate clocks.
		{"request reset does not touch tokens", http.Header{
			"X-Ratelimit-Remaining-Requests": {"0"},
			"X-Ratelimit-Reset-Requests":     {"50s"},
			"X-Ratelimit-Remaining-Tokens":   {"9000"},
		}, Limits{Requests: win(0, 0, at(50*time.Second)), Tokens: win(0, 9000, time.Time{})}},
		{"request windows of two dialects: most restrictive", http.Header{
			"X-Ratelimit-Remaining-Requests": {"10"},
			"X-Ratelimit-Reset-Requests":     {"1s"},
			"Ratelimit":                      {"limit=10, remaining=2, reset=4"},
		}, Limits{Requests: win(10, 2, at(4*time.Second))}},
		{"lower-case keys of a hand-built header", http.Header{
			"x-ratelimit-remaining-requests": {"3"},
			"retry-after":                    {"2"},
		}, Limits{Requests: win(0, 3, time.Time{}), RetryAfter: 2 * time.Second, HasRetryAfter: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Parse(tt.h, now); !sameLimits(got, tt.want) {
				t.Errorf("Parse =\n  %+v\nwant\n  %+v", got, tt.want)
			}
		})
	}
}

func TestResumeAt(t *testing.T) {
	tests := []struct {
		name   string
		l      Limits
		want   time.Time
		wantOK bool
	}{
		{"nothing", Limits{}, time.Time{}, false},
		{"retry-after", Limits{RetryAfter: 3 * time.Second, HasRetryAfter: true}, at(3 * time.Second), true},
		{"zero retry-after is now", Limits{HasRetryAfter: true}, now, true},
		{"retry-after beats a later reset", Limits{
			Requests:   win(10, 0, at(time.Minute)),
			RetryAfter: time.Second, HasRetryAfter: true,
		}, at(time.Second), true},
		{"exhausted requests", Limits{Requests: win(10, 0, at(5*time.Second))}, at(5 * time.Second), true},
		{"latest of exhausted windows", Limits{
			Requests: win(10, 0, at(5*time.Second)),
			Tokens:   win(100, 0, at(9*time.Second)),
		}, at(9 * time.Second), true},
		{"window not exhausted is ignored", Limits{
			Requests: win(10, 0, at(5*time.Second)),
			Tokens:   win(100, 1, at(time.Minute)),
		}, at(5 * time.Second), true},
		{"exhausted without reset", Limits{Tokens: win(100, 0, time.Time{})}, time.Time{}, false},
		{"remaining without limit", Limits{Tokens: win(0, 1, at(time.Second))}, time.Time{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.l.ResumeAt(now)
			if ok != tt.wantOK || !got.Equal(tt.want) {
				t.Errorf("ResumeAt = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestWindow(t *testing.T) {
	tests := []struct {
		name             string
		w                Window
		known, exhausted bool
	}{
		{"zero", Window{}, false, false},
		{"limit only", Window{Limit: 5}, true, false},
		{"remaining zero", Window{HasRemaining: true}, true, true},
		{"remaining left", Window{Remaining: 3, HasRemaining: true}, true, false},
		{"remaining not reported", Window{Remaining: 0, Limit: 3}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.w.Known(); got != tt.known {
				t.Errorf("Known = %v", got)
			}
			if got := tt.w.Exhausted(); got != tt.exhausted {
				t.Errorf("Exhausted = %v", got)
			}
		})
	}
}

// TestResetEarly: a reset sent as a clock time already past reads as now,
// and says how far past it was; one ahead, or sent as a delay, is not early.
func TestResetEarly(t *testing.T) {
	for _, tt := range []struct {
		name  string
		reset string
		early time.Duration
	}{
		{"rfc 3339, 61 s past", "2026-03-20T22:50:59Z", 61 * time.Second},
		{"rfc 3339, ahead", "2026-03-20T22:52:01Z", 0},
		{"epoch seconds, 3 s past", "1774047117", 3 * time.Second},
		{"delay", "2", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := Parse(http.Header{"Anthropic-Ratelimit-Requests-Remaining": {"3"}, "Anthropic-Ratelimit-Requests-Reset": {tt.reset}}, now).Requests
			if w.ResetEarly != tt.early || w.Reset.Before(now) {
				t.Errorf("Reset %v ResetEarly %v, want %v and not before now", w.Reset, w.ResetEarly, tt.early)
			}
		})
	}
}

// TestResetGrain: a reset sent in whole seconds says so, since it may be
// off by up to a second (more when it is a time on another clock); finer
// values have no grain.
func TestResetGrain(t *testing.T) {
	for _, tt := range []struct {
		name  string
		h     http.Header
		grain time.Duration
	}{
		{"go duration", http.Header{"X-Ratelimit-Remaining-Requests": {"5"}, "X-Ratelimit-Reset-Requests": {"1s"}}, 0},
		{"go duration in ms", http.Header{"X-Ratelimit-Remaining-Requests": {"5"}, "X-Ratelimit-Reset-Requests": {"20ms"}}, 0},
		{"seconds (Azure)", http.Header{"X-Ratelimit-Remaining-Requests": {"5"}, "X-Ratelimit-Reset-Requests": {"10"}}, time.Second},
		{"fractional seconds", http.Header{"X-Ratelimit-Remaining-Requests": {"5"}, "X-Ratelimit-Reset-Requests": {"1.5"}}, 0},
		{"a fraction alone", http.Header{"X-Ratelimit-Remaining-Requests": {"5"}, "X-Ratelimit-Reset-Requests": {".5"}}, 0},
		{"epoch ms (OpenRouter)", http.Header{"X-Ratelimit-Remaining": {"5"}, "X-Ratelimit-Reset": {"1774047180000"}}, 0},
		{"RFC 3339 (Anthropic)", http.Header{"Anthropic-Ratelimit-Requests-Remaining": {"5"},
			"Anthropic-Ratelimit-Requests-Reset": {"2026-03-20T22:52:01Z"}}, time.Second},
		{"RFC 3339 with a fraction", http.Header{"Anthropic-Ratelimit-Requests-Remaining": {"5"},
			"Anthropic-Ratelimit-Requests-Reset": {"2026-03-20T22:52:01.250Z"}}, 0},
		{"IETF delay seconds", http.Header{"Ratelimit-Limit": {"10"}, "Ratelimit-Remaining": {"5"}, "Ratelimit-Reset": {"8"}}, time.Second},
		{"no reset", http.Header{"X-Ratelimit-Remaining-Requests": {"5"}}, 0},
		{"unreadable reset", http.Header{"X-Ratelimit-Remaining-Requests": {"5"}, "X-Ratelimit-Reset-Requests": {"soon"}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Parse(tt.h, now).Requests.ResetGrain; got != tt.grain {
				t.Errorf("ResetGrain = %v, want %v", got, tt.grain)
			}
		})
	}
}

// TestPeriod: an IETF policy's w is the span its q is stated over, in
// every draft that names one; other dialects state none.
func TestPeriod(t *testing.T) {
	for _, tt := range []struct {
		name   string
		h      http.Header
		period time.Duration
	}{
		{"draft 08", http.Header{"Ratelimit": {`"default";r=5;t=1`}, "Ratelimit-Policy": {`"default";q=6;w=1`}}, time.Second},
		{"draft 08 policy alone", http.Header{"Ratelimit-Policy": {`"default";q=100;w=60`}}, time.Minute},
		{"old-style policy", http.Header{"Ratelimit-Remaining": {"9"}, "Ratelimit-Policy": {"100;w=10"}}, 10 * time.Second},
		{"no w", http.Header{"Ratelimit": {`"req";r=9;t=1`}, "Ratelimit-Policy": {`"req";q=10`}}, 0},
		{"w not a count", http.Header{"Ratelimit": {`"req";r=9;t=1`}, "Ratelimit-Policy": {`"req";q=10;w=-5`}}, 0},
		{"w of 31 days, the longest believed", http.Header{"Ratelimit": {`"m";r=9;t=1`}, "Ratelimit-Policy": {`"m";q=10;w=2678400`}}, 31 * 24 * time.Hour},
		{"w past 31 days", http.Header{"Ratelimit": {`"m";r=9;t=1`}, "Ratelimit-Policy": {`"m";q=10;w=2678401`}}, 0},
		{"openai", http.Header{"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"5"}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Parse(tt.h, now).Requests.Period; got != tt.period {
				t.Errorf("Period = %v, want %v", got, tt.period)
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	h := http.Header{
		"X-Ratelimit-Limit-Requests":     {"60"},
		"X-Ratelimit-Remaining-Requests": {"59"},
		"X-Ratelimit-Reset-Requests":     {"1s"},
		"X-Ratelimit-Limit-Tokens":       {"150000"},
		"X-Ratelimit-Remaining-Tokens":   {"149984"},
		"X-Ratelimit-Reset-Tokens":       {"6m0s"},
		"Retry-After":                    {"1"},
	}
	b.ReportAllocs()
	for b.Loop() {
		Parse(h, now)
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

// TestParseSkipsOnlyDialectsThatAreAbsent: reading only the dialects an
// answer's names show gives what reading every dialect gives, on answers
// mixing the names of all of them.
func TestParseSkipsOnlyDialectsThatAreAbsent(t *testing.T) {
	names := []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", "X-Ratelimit-Limit",
		"X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Tokenlimit-Limit", "X-Tokenlimit-Remaining",
		"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset",
		"Anthropic-Ratelimit-Tokens-Remaining", "Ratelimit", "Ratelimit-Policy", "Ratelimit-Limit", "Ratelimit-Remaining",
		"Ratelimit-Reset", "Retry-After", "Content-Type"}
	values := []string{"10", "0", "3", "1s", "6m0s", "2026-11-26T10:00:30Z", `"default";r=5;t=30`, `"default";q=100;w=60`,
		"limit=10, remaining=0, reset=10", "1774047180000", "x"}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		h := http.Header{}
		for range 1 + rng.IntN(6) {
			h.Set(names[rng.IntN(len(names))], values[rng.IntN(len(values))])
		}
		var b budgets
		parseOpenAI(h, now, &b)
		parseAnthropic(h, now, &b)
		parseXRateLimit(h, now, &b)
		parseIETF(h, now, &b)
		want := Limits{Requests: b.requests, Tokens: b.tokens}
		want.RetryAfter, want.HasRetryAfter = retryAfter(h, now)
		if got := Parse(h, now); !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d, %v: Parse %+v, every dialect %+v", i, h, got, want)
		}
	}
}
