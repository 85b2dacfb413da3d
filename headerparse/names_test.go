package headerparse

import (
	"net/http"
	"testing"
)

func TestIsWindowHeader(t *testing.T) {
	for _, name := range []string{
		"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Tokens", "x-ratelimit-limit-project-tokens",
		"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Priority-Input-Tokens-Limit", "anthropic-fast-output-tokens-limit",
		"X-Tokenlimit-Remaining", "Ratelimit", "RATELIMIT", "Ratelimit-Policy", "Ratelimit-Remaining", "X-Ratelimit-Limit",
		"X-Ratelimitbysize-Limit", "Ratelimitbysize-Remaining", "X-Ratelimit-", "ratelimit-",
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

// TestIsCanonicalAgreesWithNetHTTP: for names that are valid tokens,
// isCanonical is whether http.CanonicalHeaderKey leaves the name as it is.
func TestIsCanonicalAgreesWithNetHTTP(t *testing.T) {
	for _, name := range []string{"Content-Type", "content-type", "X-Ratelimit-Limit", "X-RateLimit-Limit", "Www-Authenticate",
		"WWW-Authenticate", "A", "a", "-a", "-A", "x--y", "X--Y", "Te", "TE", "Retry-After-Ms", "Retry-After-MS", "1a", "A1b-2c", "A1B",
		"z", "Z", "Za", "Zz", "ZZ", "ZA", "AZ", "Aa", "Az", "aA", "A-a", "A-z", "A-Z", "Z-A"} {
		if got, want := isCanonical(name), name == http.CanonicalHeaderKey(name); got != want {
			t.Errorf("isCanonical(%q) = %v, net/http says %v", name, got, want)
		}
	}
}
