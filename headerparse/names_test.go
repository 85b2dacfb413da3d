package headerparse

import "testing"

func TestIsWindowHeader(t *testing.T) {
	for _, name := range []string{
		"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Tokens", "x-ratelimit-limit-project-tokens",
		"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Priority-Input-Tokens-Limit", "anthropic-fast-output-tokens-limit",
		"X-Tokenlimit-Remaining", "Ratelimit", "RATELIMIT", "Ratelimit-Policy", "Ratelimit-Remaining", "X-Ratelimit-Limit",
		"X-Ratelimitbysize-Limit", "Ratelimitbysize-Remaining",
	} {
		if !IsWindowHeader(name) {
			t.Errorf("%s: not a window header", name)
		}
	}
	for _, name := range []string{"Retry-After", "Retry-After-Ms", "Content-Type", "X-Request-Id", "Openai-Processing-Ms",
		"", "X", "Ratelimits", "Anthropic-Version", "X-Ratelimit", "Request-Id"} {
		if IsWindowHeader(name) {
			t.Errorf("%q: a window header", name)
		}
	}
}
