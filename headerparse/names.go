package headerparse

import "strings"

// IsWindowHeader reports whether a response header describes the upstream's
// rate-limit windows (limit, remaining, reset, policy) in any dialect this
// package reads. Retry-After and retry-after-ms are not window headers.
func IsWindowHeader(name string) bool {
	if name == "" {
		return false
	}
	switch name[0] | 0x20 { // every such name starts with a, r or x
	case 'a', 'r', 'x':
	default:
		return false
	}
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
