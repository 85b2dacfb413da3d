package headerparse

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfter reads the server's explicit wait, in the order the official
// SDKs use: retry-after-ms (float milliseconds, sent by Azure), then
// Retry-After as float seconds, then Retry-After as an HTTP-date minus now.
//
// Negative, NaN, infinite and unparsable values are rejected, as is any wait
// longer than 31 days (ok=false). A date in the past gives 0. A
// retry-after-ms of 0 defers to a usable Retry-After, as the Anthropic
// TypeScript SDK does, since retrying at once is the costliest mistake.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	return retryAfter(canonical(h), now)
}

// retryAfter is RetryAfter of a header with canonical keys.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	ms, hasMS := parseDelay(get(h, "Retry-After-Ms"), time.Millisecond)
	if hasMS && ms > 0 {
		return ms, true
	}
	if d, ok := retryAfterSeconds(get(h, "Retry-After"), now); ok {
		return d, true
	}
	return ms, hasMS
}

func retryAfterSeconds(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if d, ok := parseDelay(v, time.Second); ok {
		return d, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	if d < 0 {
		return 0, true
	}
	if d > monthHorizon {
		return 0, false
	}
	return d, true
}

// parseDelay reads a plain non-negative decimal number of units, at most
// monthHorizon long.
func parseDelay(v string, unit time.Duration) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if !isDecimal(v) {
		return 0, false
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, false
	}
	return scaledDelay(n, unit, monthHorizon)
}
