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
	// Worded: the message's words alone said so, no structured field (a
	// code, a type, a Gemini quotaId). A hold on words is probed and
	// capped (package lanequeue): words are the least sure evidence.
	Worded bool
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
// name none (a hard quota without a renewal is classify's). worded says
// the message alone named it. A message is read only on a 429, and on a
// 403 only in Azure API Management's form: other statuses' messages may
// echo what the client sent ("Unrecognized request argument supplied:
// perday").
func renewalOf(f errorFields, status int) (r renewal, worded bool) {
	if strings.Contains(strings.ToLower(f.quotaIDs), "perday") {
		return renewsAtPacificMidnight, false
	}
	message := strings.ToLower(f.message)
	if status == http.StatusForbidden && isAPIMQuota(message) {
		return renewsAsHinted, true
	}
	if status != http.StatusTooManyRequests {
		return renewsUnsaid, false
	}
	if strings.Contains(message, "perday") || strings.Contains(message, "midnight pacific") {
		return renewsAtPacificMidnight, true
	}
	if strings.Contains(message, "per day (") {
		return renewsAsHinted, true
	}
	return renewsUnsaid, false
}

// isAPIMQuota reports whether a 403's message, in lower case, is Azure API
// Management's quota policy's: "Out of call volume quota. Quota will be
// replenished in 5.03:23:11." (or of bandwidth quota).
func isAPIMQuota(message string) bool {
	return strings.HasPrefix(message, "out of call volume quota") || strings.HasPrefix(message, "out of bandwidth quota")
}

// QuotaOf reads whether an answer with status and headers h, whose error
// body ParseError read as e, says a quota is spent that waiting for a rate
// cannot renew, and when it renews, at now:
//
//   - a hard quota whose renewal is not said (KindHardQuota: OpenAI's
//     insufficient_quota and spend limits, Anthropic's spend cap and
//     billing_error, any 402): Renews is zero;
//   - a day's quota of Gemini (its QuotaFailure quotaId says PerDay, or a
//     429's message does): the next midnight Pacific time;
//   - a limit per day in a 429's words (OpenAI's and Groq's "on requests
//     per day (RPD)"): the answer's wait, Retry-After, else the body's
//     "try again in", else the reset of its exhausted request window;
//   - Azure API Management's quota, a 403 whose message is its policy's
//     ("Out of call volume quota ..."): Retry-After, else the body's
//     "replenished in d.hh:mm:ss".
//
// A header alone never says a quota is spent: a 403 with a long
// Retry-After and no such body is none. A wait of zero is no renewal
// time. Worded is set when the message alone said so.
func QuotaOf(status int, h http.Header, e ErrorInfo, now time.Time) Quota {
	if e.Kind != KindHardQuota {
		return Quota{}
	}
	q := Quota{Spent: true, Worded: e.worded}
	if e.renewal == renewsAtPacificMidnight {
		q.Renews = pacific.NextMidnight(now)
		return q
	}
	if e.renewal != renewsAsHinted {
		return q
	}
	h = canonical(h)
	wait, hasWait := retryAfter(h, now)
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
