package headerparse

import (
	"net/http"
	"time"
)

func anthropicNames(kind string) windowNames {
	prefix := "Anthropic-Ratelimit-" + kind + "-"
	return windowNames{prefix + "Limit", prefix + "Remaining", prefix + "Reset"}
}

var (
	anthropicRequests     = anthropicNames("Requests")
	anthropicTokens       = anthropicNames("Tokens")
	anthropicInputTokens  = anthropicNames("Input-Tokens")
	anthropicOutputTokens = anthropicNames("Output-Tokens")
)

// parseAnthropic reads anthropic-ratelimit-{requests,tokens,input-tokens,
// output-tokens}-{limit,remaining,reset}. Resets are RFC 3339 times; token
// remaining counts are rounded to the nearest thousand by Anthropic.
//
// The Priority Tier and fast-mode families (anthropic-priority-*,
// anthropic-fast-*) apply only to requests made in those modes and are
// ignored.
func parseAnthropic(h http.Header, now time.Time, b *budgets) {
	b.addRequests(anthropicRequests.read(h, now, dayHorizon))
	b.addTokens(anthropicTokens.read(h, now, dayHorizon))
	b.addTokens(anthropicInputTokens.read(h, now, dayHorizon))
	b.addTokens(anthropicOutputTokens.read(h, now, dayHorizon))
}
