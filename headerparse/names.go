package headerparse

import (
	"net/http"
	"strings"
)

// IsWindowHeader reports whether a response header describes the upstream's
// rate-limit windows (limit, remaining, reset, policy) in any dialect this
// package reads. Retry-After and retry-after-ms are not window headers.
func IsWindowHeader(name string) bool {
	for _, p := range windowPrefixes {
		if len(name) >= len(p) && strings.EqualFold(name[:len(p)], p) {
			return true
		}
	}
	return strings.EqualFold(name, "ratelimit")
}

// windowPrefixes start the names of window headers, matched in any case.
var windowPrefixes = [...]string{"x-ratelimit-", "anthropic-ratelimit-", "anthropic-priority-", "anthropic-fast-",
	"x-tokenlimit-", "ratelimit-", "x-ratelimitbysize-", "ratelimitbysize-"}

// DeleteWindowHeaders removes every rate-limit window header from h.
func DeleteWindowHeaders(h http.Header) {
	for name := range h {
		if IsWindowHeader(name) {
			delete(h, name)
		}
	}
}
