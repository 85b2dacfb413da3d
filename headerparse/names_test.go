package headerparse

import (
	"net/http"
	"testing"
)

func TestDeleteWindowHeaders(t *testing.T) {
	h := http.Header{}
	for _, name := range []string{
		"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Tokens", "x-ratelimit-limit-project-tokens",
		"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Priority-Input-Tokens-Limit",
		"X-Tokenlimit-Remaining", "Ratelimit", "Ratelimit-Policy", "Ratelimit-Remaining", "X-Ratelimit-Limit",
	} {
		h.Set(name, "1")
	}
	keep := []string{"Retry-After", "Retry-After-Ms", "Content-Type", "X-Request-Id", "Openai-Processing-Ms"}
	for _, name := range keep {
		h.Set(name, "1")
	}
	DeleteWindowHeaders(h)
	if len(h) != len(keep) {
		t.Fatalf("left %v", h)
	}
	for _, name := range keep {
		if h.Get(name) == "" {
			t.Errorf("%s removed", name)
		}
	}
}
