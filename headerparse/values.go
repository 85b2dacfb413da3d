package headerparse

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Bounds on what a reset or a wait can plausibly be. A value beyond them is
// a misreading (a wrong unit, an epoch taken for a delay) or garbage, and is
// dropped rather than pausing a lane for a year.
const (
	// dayHorizon bounds resets of the provider dialects: their windows are
	// per second, per minute or per day (Groq's request budget is per day),
	// so a full reset is never more than a day away.
	dayHorizon = 24 * time.Hour
	// monthHorizon bounds resets of the IETF RateLimit fields, whose
	// policies may declare any window (daily and monthly quotas are common),
	// and any explicit Retry-After.
	monthHorizon = 31 * 24 * time.Hour
	// pastSlack is how far in the past an absolute reset may lie and still
	// be believed (as "now"): beyond it the clock or the value is wrong.
	pastSlack = 24 * time.Hour
)

// isDecimal reports whether s is a plain non-negative decimal number:
// digits with at most one dot. It rejects signs, exponents, hex, NaN and Inf,
// none of which a rate-limit header sends on purpose.
func isDecimal(s string) bool {
	digits, dots := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return false
		}
	}
	return digits > 0 && dots <= 1
}

// firstMember returns the first member of a comma-separated header value,
// trimmed: a proxy on the way may have joined repeated headers.
func firstMember(v string) string {
	if i := strings.IndexByte(v, ','); i >= 0 {
		v = v[:i]
	}
	return strings.TrimSpace(v)
}

// parseCount reads a limit or remaining count. Negative values (Azure's -1
// for "no such limit") and garbage are not reported. A fraction is
// truncated and a count beyond int64 saturates.
func parseCount(v string) (int64, bool) {
	v = firstMember(v)
	if !isDecimal(v) {
		return 0, false
	}
	if strings.IndexByte(v, '.') >= 0 {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, false
		}
		if f >= math.MaxInt64 {
			return math.MaxInt64, true
		}
		return int64(f), true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil { // only a range error can remain: saturate
		return math.MaxInt64, true
	}
	return n, true
}

// scaledDelay converts a non-negative number of units to a duration,
// refusing anything longer than horizon (which also rules out overflow).
func scaledDelay(n float64, unit, horizon time.Duration) (time.Duration, bool) {
	if !(n >= 0) || n*float64(unit) > float64(horizon) {
		return 0, false
	}
	return time.Duration(n * float64(unit)), true
}

// parseReset reads a reset value into the absolute time a budget is fully
// replenished. It accepts, in this order:
//
//   - a bare number (int or float): seconds from now when it is at most
//     horizon; otherwise epoch seconds or epoch milliseconds, when that lands
//     near now (see absoluteReset); anything else is not believed;
//   - a Go duration with units ("1s", "6m0s", "2m59.56s"), from now;
//   - an RFC 3339 time or an HTTP-date.
//
// Negative values and resets more than horizon ahead are rejected.
func parseReset(v string, now time.Time, horizon time.Duration) (time.Time, bool) {
	v = strings.TrimSpace(v)
	if t, ok := parseResetValue(v, now, horizon); ok {
		return t, true
	}
	if first := firstMember(v); first != v {
		return parseResetValue(first, now, horizon)
	}
	return time.Time{}, false
}

func parseResetValue(v string, now time.Time, horizon time.Duration) (time.Time, bool) {
	if v == "" || v[0] == '-' {
		return time.Time{}, false
	}
	if isDecimal(v) {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return time.Time{}, false
		}
		if d, ok := scaledDelay(n, time.Second, horizon); ok {
			return now.Add(d), true
		}
		// Too large to be a delay: an epoch in seconds or milliseconds?
		// The two ranges cannot both land near now, so there is no ambiguity.
		if t, ok := absoluteReset(unixFloat(n), now, horizon); ok {
			return t, true
		}
		return absoluteReset(unixFloat(n/1000), now, horizon)
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 || d > horizon {
			return time.Time{}, false
		}
		return now.Add(d), true
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return absoluteReset(t, now, horizon)
	}
	if t, err := http.ParseTime(v); err == nil {
		return absoluteReset(t, now, horizon)
	}
	return time.Time{}, false
}

// resetGrain is the precision of a reset value parseReset read: a second
// for whole seconds (a count with no fraction, small enough to be seconds
// rather than epoch milliseconds; an RFC 3339 time or an HTTP-date with
// none), zero otherwise.
func resetGrain(v string) time.Duration {
	v = firstMember(strings.TrimSpace(v))
	switch {
	case isDecimal(v):
		if strings.IndexByte(v, '.') < 0 && len(v) < 13 { // not epoch ms
			return time.Second
		}
	case strings.Contains(v, "T"): // RFC 3339
		if strings.IndexByte(v, '.') < 0 {
			return time.Second
		}
	case strings.Contains(v, "GMT"): // an HTTP-date
		return time.Second
	}
	return 0
}

// absoluteReset believes an absolute reset time only near now: no more than
// horizon ahead and no more than pastSlack behind. A past one is returned
// as it is; window reads it as now and says how early it was.
func absoluteReset(t, now time.Time, horizon time.Duration) (time.Time, bool) {
	if t.IsZero() || t.After(now.Add(horizon)) || t.Before(now.Add(-pastSlack)) {
		return time.Time{}, false
	}
	return t.In(now.Location()), true
}

// unixFloat is the time sec seconds after the Unix epoch, or the zero time
// when sec is outside anything a header could mean.
func unixFloat(sec float64) time.Time {
	if !(sec >= 0) || sec > 1e13 {
		return time.Time{}
	}
	whole := math.Floor(sec)
	return time.Unix(int64(whole), int64((sec-whole)*1e9))
}
