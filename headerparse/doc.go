// Package headerparse turns an upstream LLM API response into facts:
// the rate-limit budgets its headers report ([Parse], [Limits]), the
// explicit wait it asks for ([RetryAfter]) and what kind of error its body
// describes ([ParseError], [ErrorKind]).
//
// It owns the knowledge of every provider's header dialect and error-body
// shape (OpenAI and Azure OpenAI, Groq, Anthropic, Together, OpenRouter,
// Gemini, the IETF RateLimit drafts) and the scepticism needed to read them:
// a value that cannot be right is dropped rather than believed.
//
// It does not own any policy. It never decides whether to retry, how long a
// lane should pause or how to pace; lanequeue and upstream do that with what
// this package reports. Every function is pure: it depends only on its
// arguments, including the time "now" that anchors relative values, and
// never panics on any input.
package headerparse
