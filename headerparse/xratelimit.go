package headerparse

import (
	"net/http"
	"time"
)

// tokenLimitPeriod is the window of Together's x-tokenlimit-* budget: it is
// per second, and the headers carry no reset of their own.
const tokenLimitPeriod = time.Second

// parseXRateLimit reads the unsuffixed X-RateLimit-{Limit,Remaining,Reset},
// a request budget, and Together's x-tokenlimit-{limit,remaining}.
//
// Together sends the reset as seconds and OpenRouter as epoch milliseconds
// (1774047180000) under the same name; parseReset tells them apart by
// magnitude, and also accepts epoch seconds, which other APIs send there.
func parseXRateLimit(h http.Header, now time.Time, b *budgets) {
	b.addRequests(window(
		get(h, "X-Ratelimit-Limit"),
		get(h, "X-Ratelimit-Remaining"),
		get(h, "X-Ratelimit-Reset"),
		now, dayHorizon))
	tokens := window(get(h, "X-Tokenlimit-Limit"), get(h, "X-Tokenlimit-Remaining"), "", now, dayHorizon)
	if tokens.Known() {
		tokens.Reset = now.Add(tokenLimitPeriod)
	}
	b.addTokens(tokens)
}
