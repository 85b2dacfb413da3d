package headerparse

import (
	"net/http"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/internal/pacific"
)

// Quota is what an answer says of a quota that waiting for a rate cannot
// renew: a day's requests spent, a spend cap, credits run out. The zero
// Quota is none.
type Quota struct {
	Spent bool
	// Renews is when the quota renews, by the answer's word; zero when it
	// does not say.
	Renews time.Time
}

// renewal is how a quota named by an error body renews (ErrorInfo.renewal).
type renewal uint8

const (
	// renewsUnsaid: the body does not say (OpenAI's insufficient_quota and
	// spend limits, Anthropic's spend cap, a 402), or names no quota.
	renewsUnsaid renewal = iota
	// renewsAtPacificMidnight: a day's quota of Gemini (a QuotaFailure
	// quotaId such as GenerateRequestsPerDayPerProjectPerModel-FreeTier),
	// which renews at midnight Pacific time whatever its retryDelay says,
	// or of another Google API ("The quota will be reset at midnight
	// Pacific Time").
	renewsAtPacificMidnight
	// renewsAsHinted: a quota whose answer names its wait: a limit per day
	// in OpenAI's and Groq's words ("on requests per day (RPD)", "tokens
	// per day (TPD)"; Groq refills it through the day), or Azure API
	// Management's quota 403 ("Out of call volume quota. Quota will be
	// replenished in 5.03:23:11.").
	renewsAsHinted
)

// renewalOf tells from an error body's fields whether they name a quota a
// wait for a rate cannot renew, and how it renews; renewsUnsaid when they
// name none (a hard quota without a renewal is classify's).
func renewalOf(f errorFields, status int) renewal {
	message := strings.ToLower(f.message)
	if strings.Contains(strings.ToLower(f.quotaIDs), "perday") || strings.Contains(message, "perday") ||
		strings.Contains(message, "midnight pacific") {
		return renewsAtPacificMidnight
	}
	if strings.Contains(message, "per day (") || status == http.StatusForbidden && strings.Contains(message, "quota") {
		return renewsAsHinted
	}
	return renewsUnsaid
}

// QuotaOf reads whether an answer with status and headers h, whose error
// body ParseError read as e, says a quota is spent that waiting for a rate
// cannot renew, and when it renews, at now:
//
//   - a hard quota whose renewal is not said (KindHardQuota: OpenAI's
//     insufficient_quota and spend limits, Anthropic's spend cap and usage
//     limits, any 402): Renews is zero;
//   - a day's quota of Gemini (its QuotaFailure quotaId says PerDay): the
//     next midnight Pacific time;
//   - a limit per day in OpenAI's and Groq's words ("on requests per day
//     (RPD)"): the answer's wait, Retry-After, else the body's "try again
//     in", else the reset of its exhausted request window;
//   - Azure API Management's quota: a 403 that carries Retry-After, or
//     whose message speaks of a quota: Retry-After, else the body's
//     "replenished in d.hh:mm:ss".
//
// A wait of zero is no renewal time.
func QuotaOf(status int, h http.Header, e ErrorInfo, now time.Time) Quota {
	h = canonical(h)
	wait, hasWait := retryAfter(h, now)
	apim := status == http.StatusForbidden && hasWait
	if e.Kind != KindHardQuota && !apim {
		return Quota{}
	}
	q := Quota{Spent: true}
	if e.renewal == renewsAtPacificMidnight {
		q.Renews = pacific.NextMidnight(now)
		return q
	}
	if e.renewal != renewsAsHinted && !apim {
		return q
	}
	if !hasWait || wait <= 0 {
		wait, hasWait = e.RetryIn, e.HasRetryIn
	}
	if hasWait && wait > 0 {
		q.Renews = now.Add(wait)
	} else if w := Parse(h, now).Requests; w.Exhausted() && w.Reset.After(now) {
		q.Renews = w.Reset
	}
	return q
}
