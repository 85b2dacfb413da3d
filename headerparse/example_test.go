package headerparse_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

func ExampleParse() {
	now := time.Date(2026, 3, 20, 22, 52, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("x-ratelimit-limit-requests", "60")
	h.Set("x-ratelimit-remaining-requests", "0")
	h.Set("x-ratelimit-reset-requests", "20s")
	h.Set("x-ratelimit-limit-tokens", "150000")
	h.Set("x-ratelimit-remaining-tokens", "149984")
	h.Set("x-ratelimit-reset-tokens", "6m0s")

	l := headerparse.Parse(h, now)
	fmt.Println("requests:", l.Requests.Remaining, "of", l.Requests.Limit, "exhausted:", l.Requests.Exhausted())
	fmt.Println("tokens:", l.Tokens.Remaining, "of", l.Tokens.Limit, "reset in", l.Tokens.Reset.Sub(now))
	if t, ok := l.ResumeAt(now); ok {
		fmt.Println("resume in", t.Sub(now))
	}
	// Output:
	// requests: 0 of 60 exhausted: true
	// tokens: 149984 of 150000 reset in 6m0s
	// resume in 20s
}

func ExampleParseError() {
	body := []byte(`{"error":{"message":"Rate limit reached for o4-mini on tokens per min (TPM). Please try again in 1.574s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`)
	info := headerparse.ParseError(429, body)
	fmt.Println(info.Kind, info.Code, info.RetryIn, info.Kind.Final())

	quota := headerparse.ParseError(429, []byte(`{"error":{"type":"insufficient_quota","code":"credit_balance_exhausted"}}`))
	fmt.Println(quota.Kind, quota.Code, quota.Kind.Final())
	// Output:
	// rate_limit rate_limit_exceeded 1.574s false
	// hard_quota credit_balance_exhausted true
}

func ExampleRetryAfter() {
	now := time.Date(2026, 3, 20, 22, 52, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("Retry-After", "Fri, 20 Mar 2026 22:52:30 GMT")
	d, ok := headerparse.RetryAfter(h, now)
	fmt.Println(d, ok)
	// Output:
	// 30s true
}
