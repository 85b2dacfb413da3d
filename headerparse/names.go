package headerparse

import (
	"net/http"
	"strings"
)

// IsWindowHeader reports whether a response header describes the upstream's
// rate-limit windows (limit, remaining, reset, policy) in any dialect this
// package reads. Retry-After and retry-after-ms are not window headers.
func IsWindowHeader(name string) bool {
	n := strings.ToLower(name)
	switch {
	case strings.HasPrefix(n, "x-ratelimit-"),
		strings.HasPrefix(n, "anthropic-ratelimit-"),
		strings.HasPrefix(n, "anthropic-priority-"),
		strings.HasPrefix(n, "anthropic-fast-"),
		strings.HasPrefix(n, "x-tokenlimit-"),
		strings.HasPrefix(n, "ratelimit-"),
		strings.HasPrefix(n, "x-ratelimitbysize-"),
		strings.HasPrefix(n, "ratelimitbysize-"),
		n == "ratelimit":
		return true
	}
	return false
}

// DeleteWindowHeaders removes every rate-limit window header from h.
func DeleteWindowHeaders(h http.Header) {
	for name := range h {
		if IsWindowHeader(name) {
			delete(h, name)
		}
	}
}
