package headerparse

import (
	"net/http"
	"time"
)

// windowNames are the canonical header names of one budget's limit,
// remaining count and reset, built once rather than on every response.
type windowNames struct{ limit, remaining, reset string }

func (n windowNames) read(h http.Header, now time.Time, horizon time.Duration) Window {
	return window(get(h, n.limit), get(h, n.remaining), get(h, n.reset), now, horizon)
}

func openAINames(kind string) windowNames {
	return windowNames{"X-Ratelimit-Limit-" + kind, "X-Ratelimit-Remaining-" + kind, "X-Ratelimit-Reset-" + kind}
}

var (
	openAIRequests      = openAINames("Requests")
	openAITokens        = openAINames("Tokens")
	openAIProjectTokens = openAINames("Project-Tokens")
)

// parseOpenAI reads the x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// family used by OpenAI, Azure OpenAI and Groq, plus OpenAI's
// -project-tokens variant.
//
// OpenAI and Groq send resets as Go durations ("1s", "6m0s", "2m59.56s");
// Azure sends bare seconds ("10", "300"), and its Responses API sends -1 for
// every count and 0 for the reset, which parseCount reads as not reported.
// Groq's request budget is per day, hence the day horizon.
func parseOpenAI(h http.Header, now time.Time, b *budgets) {
	b.addRequests(openAIRequests.read(h, now, dayHorizon))
	b.addTokens(openAITokens.read(h, now, dayHorizon))
	b.addTokens(openAIProjectTokens.read(h, now, dayHorizon))
}

// get is h.Get for a name already in canonical form: the map is read
// directly, without canonicalising the name on every answer.
func get(h http.Header, canonical string) string {
	if v := h[canonical]; len(v) > 0 {
		return v[0]
	}
	return ""
}
