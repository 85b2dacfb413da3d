package headerparse

import (
	"net/http"
	"strings"
	"time"
)

// parseIETF reads the IETF RateLimit header fields in all their drafts
// (ietf-wg-httpapi/ratelimit-headers):
//
//   - drafts -00 to -06: RateLimit-Limit, RateLimit-Remaining,
//     RateLimit-Reset (delay seconds) and RateLimit-Policy: 100;w=10;
//   - draft -07: RateLimit: limit=10, remaining=0, reset=10;
//   - draft -08 and later: RateLimit: "default";r=50;t=30, each member
//     matched by name to RateLimit-Policy: "default";q=100;w=60, whose q is
//     the limit and whose qu the unit.
//
// Every budget is a request budget, except a policy with qu=tokens (not in
// the drafts, but the obvious reading) which is a token budget. Policies
// counting content-bytes or concurrent-requests are not rate budgets this
// package models and are ignored. Policies may be daily or monthly, so
// resets are believed up to monthHorizon ahead. The draft's rule that
// Retry-After takes precedence is applied by [Limits.ResumeAt].
func parseIETF(h http.Header, now time.Time, b *budgets) {
	policies := parseSFList(strings.Join(h["Ratelimit-Policy"], ","))
	parseIETFSplit(h, policies, now, b)
	rateLimit := h["Ratelimit"]
	if len(rateLimit) == 0 {
		parseIETFPolicies(policies, nil, now, b)
		return
	}
	members := parseSFList(strings.Join(rateLimit, ","))
	if parseIETFDictionary(members, now, b) {
		return
	}
	parseIETFPolicies(policies, members, now, b)
}

// parseIETFSplit reads drafts -00 to -06, one field per value.
func parseIETFSplit(h http.Header, policies []sfMember, now time.Time, b *budgets) {
	var limit string
	// Draft -03 lists the policies inside the limit: "10, 10;w=1, 50;w=60".
	if members := parseSFList(get(h, "Ratelimit-Limit")); len(members) > 0 {
		limit = members[0].item
	} else if len(policies) > 0 && isDecimal(policies[0].item) {
		limit = policies[0].item // old-style policy: 100;w=10
	}
	w := window(limit, get(h, "Ratelimit-Remaining"), get(h, "Ratelimit-Reset"), now, monthHorizon)
	if len(policies) > 0 && isDecimal(policies[0].item) {
		w.Period = period(policies[0].param("w"))
	}
	b.addRequests(w)
}

// period reads a policy's w, in whole seconds up to monthHorizon; zero
// when absent, not a count, or longer.
func period(w string) time.Duration {
	if n, ok := parseCount(w); ok && n <= int64(monthHorizon/time.Second) {
		return time.Duration(n) * time.Second
	}
	return 0
}

// parseIETFDictionary reads draft -07's RateLimit: limit=10, remaining=0,
// reset=10, reporting whether members were in that form.
func parseIETFDictionary(members []sfMember, now time.Time, b *budgets) bool {
	var limit, remaining, reset string
	found := false
	for _, m := range members {
		key, value, ok := strings.Cut(m.item, "=")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch strings.ToLower(strings.TrimSpace(key)) {
		case "limit":
			limit, found = value, true
		case "remaining":
			remaining, found = value, true
		case "reset":
			reset, found = value, true
		}
	}
	if found {
		b.addRequests(window(limit, remaining, reset, now, monthHorizon))
	}
	return found
}

// parseIETFPolicies reads draft -08 and later: each RateLimit member with
// its policy of the same name, then each policy no member named, which
// reports a limit alone.
func parseIETFPolicies(policies, members []sfMember, now time.Time, b *budgets) {
	used := make([]bool, len(policies))
	for _, m := range members {
		var policy sfMember
		for i, p := range policies {
			if !isDecimal(p.item) && p.item == m.item {
				policy, used[i] = p, true
				break
			}
		}
		w := window(policy.param("q"), m.param("r"), m.param("t"), now, monthHorizon)
		w.Period = period(policy.param("w"))
		addIETF(policy.param("qu"), w, b)
	}
	for i, p := range policies {
		if !used[i] && !isDecimal(p.item) {
			w := window(p.param("q"), "", "", now, monthHorizon)
			w.Period = period(p.param("w"))
			addIETF(p.param("qu"), w, b)
		}
	}
}

// addIETF files w under the budget its quota unit names.
func addIETF(unit string, w Window, b *budgets) {
	switch strings.ToLower(unit) {
	case "", "requests":
		b.addRequests(w)
	case "tokens":
		b.addTokens(w)
	}
}
