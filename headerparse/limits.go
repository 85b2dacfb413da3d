package headerparse

import (
	"net/http"
	"strings"
	"time"
)

// Window is one rate-limit budget (requests or tokens) as the upstream last
// reported it.
type Window struct {
	Limit        int64     // > 0 when reported, 0 when not
	Remaining    int64     // >= 0; meaningful only when HasRemaining
	HasRemaining bool      // the upstream reported Remaining
	Reset        time.Time // when the budget is fully replenished; zero when not reported
	// ResetGrain is Reset's precision as sent: a second for whole seconds
	// (a count of seconds, an RFC 3339 time or an HTTP-date without a
	// fraction), zero for finer values. A reset in whole seconds, and a
	// clock time read on another clock, may be off by that much or more.
	ResetGrain time.Duration
	// ResetEarly is how far before now a reset sent as a clock time lay
	// (Reset then reads as now): rounded down, or read on a clock ahead of
	// the upstream's. Zero when it was not past.
	ResetEarly time.Duration
	// Period is the span Limit is stated over, where the upstream says
	// (an IETF policy's w): Limit per Period is a rate it allows. Zero
	// when not stated.
	Period time.Duration
}

// Known reports whether the upstream reported this budget at all.
// A Window that is not Known is the zero Window: a reset on its own, with
// neither a limit nor a remaining count, says nothing about a budget.
func (w Window) Known() bool { return w.Limit > 0 || w.HasRemaining }

// Exhausted reports whether the budget has nothing left.
func (w Window) Exhausted() bool { return w.HasRemaining && w.Remaining <= 0 }

// moreRestrictive reports whether w leaves less room than than does, so
// that it should be reported in its place. A Known window beats an unknown
// one; a window with a remaining count beats one without; then the smaller
// Remaining wins (the smaller Limit when neither has a count); on a tie the
// later Reset wins, since it is the longer wait. Otherwise than is kept.
func (w Window) moreRestrictive(than Window) bool {
	switch {
	case !w.Known():
		return false
	case !than.Known():
		return true
	case w.HasRemaining != than.HasRemaining:
		return w.HasRemaining
	case w.HasRemaining && w.Remaining != than.Remaining:
		return w.Remaining < than.Remaining
	case !w.HasRemaining && w.Limit != than.Limit:
		return w.Limit < than.Limit
	}
	return w.Reset.After(than.Reset)
}

// Limits is what one response's headers say about the lane's budgets.
type Limits struct {
	// Requests is the most restrictive request budget reported.
	Requests Window
	// Tokens is the most restrictive token budget reported, among tokens,
	// project tokens, input tokens and output tokens. Requests and Tokens
	// have separate clocks and are never merged.
	Tokens Window
	// RetryAfter is the server's explicit wait, see [RetryAfter].
	RetryAfter    time.Duration
	HasRetryAfter bool
}

// budgets collects candidate windows, keeping the most restrictive of each kind.
type budgets struct {
	requests, tokens Window
}

func (b *budgets) addRequests(w Window) {
	if w.moreRestrictive(b.requests) {
		b.requests = w
	}
}

func (b *budgets) addTokens(w Window) {
	if w.moreRestrictive(b.tokens) {
		b.tokens = w
	}
}

// window builds a Window from a dialect's raw limit, remaining and reset
// values, any of which may be empty. Non-positive limits and negative
// counts (Azure's -1) are not reported; see parseReset for resets.
func window(limit, remaining, reset string, now time.Time, horizon time.Duration) Window {
	var w Window
	if n, ok := parseCount(limit); ok && n > 0 {
		w.Limit = n
	}
	w.Remaining, w.HasRemaining = parseCount(remaining)
	if !w.Known() {
		return Window{}
	}
	if reset != "" {
		if t, ok := parseReset(reset, now, horizon); ok {
			w.Reset, w.ResetGrain = t, resetGrain(reset)
			if t.Before(now) {
				// Already past: the budget is full again, by the
				// upstream's word.
				w.Reset, w.ResetEarly = now, now.Sub(t)
			}
		}
	}
	return w
}

// Parse reads every known rate-limit dialect from h (see the dialect files:
// openai.go, anthropic.go, xratelimit.go, ietf.go) and the explicit wait.
// now anchors relative resets. Header names are matched case-insensitively,
// even in a hand-built Header whose keys are not canonical.
//
// When several dialects or several token windows are present, each of
// Requests and Tokens is the most restrictive window: the smallest Remaining
// (windows without a count lose to windows with one), ties going to the
// later Reset, then to the first found.
//
// Resets are believed only within bounds: at most 24h ahead for the provider
// dialects, whose windows are at most a day, and 31 days for the IETF fields,
// whose policies may be monthly; an absolute reset up to 24h in the past
// reads as now (ResetEarly says by how much), one further back is dropped,
// as are negative values. A dropped reset leaves the rest of its Window
// intact.
func Parse(h http.Header, now time.Time) Limits {
	h = canonical(h)
	var b budgets
	d := dialectsOf(h)
	if d&xRateLimit != 0 {
		parseOpenAI(h, now, &b)
		parseXRateLimit(h, now, &b)
	}
	if d&anthropic != 0 {
		parseAnthropic(h, now, &b)
	}
	if d&ietf != 0 {
		parseIETF(h, now, &b)
	}
	l := Limits{Requests: b.requests, Tokens: b.tokens}
	l.RetryAfter, l.HasRetryAfter = retryAfter(h, now)
	return l
}

// ResumeAt is when the lane may send again: now+RetryAfter when the server
// gave an explicit wait (it takes precedence over every reset, as the IETF
// draft requires); otherwise the latest Reset among exhausted windows.
// ok is false when neither says anything, including when a window is
// exhausted but its reset was not reported: the caller falls back to backoff.
func (l Limits) ResumeAt(now time.Time) (t time.Time, ok bool) {
	if l.HasRetryAfter {
		return now.Add(l.RetryAfter), true
	}
	for _, w := range [...]Window{l.Requests, l.Tokens} {
		if w.Exhausted() && !w.Reset.IsZero() && (!ok || w.Reset.After(t)) {
			t, ok = w.Reset, true
		}
	}
	return t, ok
}

// dialect is a family of window headers, by the start of their names.
type dialect uint8

const (
	xRateLimit dialect = 1 << iota // X-Ratelimit-* (OpenAI's and the unsuffixed) and X-Tokenlimit-*
	anthropic                      // Anthropic-Ratelimit-*
	ietf                           // Ratelimit and Ratelimit-*
)

// dialectsOf is the dialects whose headers h holds, found in one pass over
// its names, so an answer is read only for the dialects it speaks.
func dialectsOf(h http.Header) dialect {
	var d dialect
	for k := range h {
		switch {
		case strings.HasPrefix(k, "X-Ratelimit-"), strings.HasPrefix(k, "X-Tokenlimit-"):
			d |= xRateLimit
		case strings.HasPrefix(k, "Anthropic-Ratelimit-"):
			d |= anthropic
		case strings.HasPrefix(k, "Ratelimit"):
			d |= ietf
		}
	}
	return d
}

// canonical returns h itself when its keys are canonical, as they are in
// anything net/http produced, or else a canonicalised copy, so that a
// hand-built http.Header{"retry-after": ...} is still read.
func canonical(h http.Header) http.Header {
	for k := range h {
		if !isCanonical(k) {
			c := make(http.Header, len(h))
			for k, vs := range h {
				ck := http.CanonicalHeaderKey(k)
				c[ck] = append(c[ck], vs...)
			}
			return c
		}
	}
	return h
}

// isCanonical reports whether the name is in canonical form: each letter
// at the start or after a hyphen in upper case, the others in lower case.
// It checks the cases only, not that the name is a valid token, which
// http.CanonicalHeaderKey also does on every call.
func isCanonical(name string) bool {
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return false
		}
		upper = c == '-'
	}
	return true
}
