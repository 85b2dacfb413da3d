// Package tokens estimates what an LLM API request will cost in tokens
// before it is sent, and reads what it did cost from the response's usage
// afterwards, for plain JSON bodies and for server-sent event streams.
//
// It does not tokenize: an estimate is the request's text bytes divided by
// four plus fixed overheads, meant to be reserved against a tokens-per-minute
// budget and settled from the reported usage once the response is in. It
// holds no budgets and makes no pacing decisions; that is the caller's.
package tokens

import (
	"bytes"
	"encoding/json"
	"strings"
)

// maxCount bounds every count read from a request or response, so sums and
// products of them cannot overflow an int64.
const maxCount = 1 << 40

// Usage is the token count a response reports.
type Usage struct {
	// Input is the prompt's tokens: prompt_tokens (OpenAI Chat and
	// embeddings) or input_tokens (Responses), and for Anthropic the sum of
	// input_tokens, cache_creation_input_tokens and cache_read_input_tokens.
	Input int64
	// Output is the generated tokens, reasoning included:
	// completion_tokens or output_tokens. Zero for embeddings.
	Output int64
	// Cached is the part of Input read from the provider's prompt cache:
	// prompt_tokens_details.cached_tokens (OpenAI Chat),
	// input_tokens_details.cached_tokens (Responses) or
	// cache_read_input_tokens (Anthropic). Zero when not reported.
	Cached int64
	// Tier is the service tier the answer says served it, as the
	// provider names it (OpenAI's top-level service_tier, Anthropic's
	// usage.service_tier); "" when it says none.
	Tier string
}

// Total returns Input + Output.
func (u Usage) Total() int64 { return u.Input + u.Output }

// FromBody reads the top-level "usage" object of a non-streaming JSON
// response: OpenAI Chat Completions, Responses and embeddings, and Anthropic
// Messages. ok is false when the body is not JSON or its usage is missing,
// null or holds none of the known fields.
//
// When total_tokens exceeds input plus output, the difference is counted as
// output, so tokens a provider bills but does not break down are not lost.
//
// Tier is the top-level "service_tier" (OpenAI) or else the usage's own
// (Anthropic), when it is a tier name (see tierOf); it is filled even when
// ok is false, as long as the body is a JSON object.
//
// The body is walked, not decoded, with the checks ReadRequest makes (a
// body that is not valid JSON has no usage), and only the usage value and
// the tier are read: an answer of many kilobytes costs one pass and no
// allocation.
func FromBody(body []byte) (u Usage, ok bool) {
	w := walker{b: body}
	var f usageFields
	var top string // the top-level service_tier
	valid := w.object(func(quoted []byte, _ int64) {
		switch {
		case keyIs(quoted, "usage"):
			// The last one counts, as in a decoder.
			if ok = w.peek() == '{'; ok {
				f = w.usageObject()
			} else {
				w.skip()
			}
		case keyIs(quoted, "service_tier"):
			w.tier(&top)
		default:
			w.skip()
		}
	})
	if !valid {
		return Usage{}, false
	}
	if ok {
		u, ok = f.usage()
	}
	if top != "" {
		u.Tier = top
	}
	return u, ok
}

// usageObject reads the usage object at the cursor as encoding/json
// decodes it into usageFields: keys matched in any case, escapes decoded,
// the last one counting; a value that is not a number (a tier name for
// service_tier, an object for a details member) leaves its field as it
// was. It allocates nothing.
func (w *walker) usageObject() (f usageFields) {
	w.members(func(quoted []byte, _ int64) {
		switch {
		case keyIs(quoted, "prompt_tokens_details"):
			w.cachedTokens(&f.PromptCached)
		case keyIs(quoted, "input_tokens_details"):
			w.cachedTokens(&f.InputCached)
		case keyIs(quoted, "service_tier"):
			w.tier(&f.Tier)
		default:
			w.readCount(f.field(quoted))
		}
	})
	return f
}

// readCount reads the value at the cursor into c when c is not nil and the
// value is a number; else c stays as it was.
func (w *walker) readCount(c *count) {
	raw := w.value()
	if c != nil && !w.bad {
		if n, ok := number(raw); ok {
			c.n, c.ok = clampCount(n), true
		}
	}
}

// cachedTokens reads a usage details object at the cursor
// (prompt_tokens_details, input_tokens_details) for its cached_tokens,
// into c; a value that is not an object is skipped.
func (w *walker) cachedTokens(c *count) {
	if w.peek() != '{' {
		w.skip()
		return
	}
	w.members(func(quoted []byte, _ int64) {
		if keyIs(quoted, "cached_tokens") {
			w.readCount(c)
			return
		}
		w.skip()
	})
}

// tier reads the value at the cursor into dst when it is a tier name (see
// tierOf); else dst stays as it was.
func (w *walker) tier(dst *string) {
	raw := w.value()
	if w.bad {
		return
	}
	if t, ok := tierOf(raw); ok {
		*dst = t
	}
}

// maxTier is the longest service tier name read.
const maxTier = 32

// knownTiers are the tier names providers send, returned as they are so
// that reading one allocates nothing.
var knownTiers = [...]string{"default", "auto", "flex", "priority", "scale", "standard", "batch", "on_demand", "standard_only"}

// tierOf reads the JSON string at the start of b as a service tier name:
// ok when it is 1 to maxTier bytes of ASCII letters, digits, '_' and '-'
// as written, an escape making it none. A known name is returned without
// allocating.
func tierOf(b []byte) (string, bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", false
	}
	for i := 1; i < len(b) && i <= maxTier+1; i++ {
		switch c := b[i]; {
		case c == '"' && i > 1:
			return tierName(b[1:i]), true
		case !isTierByte(c):
			return "", false
		}
	}
	return "", false
}

// isTierByte reports whether c may be part of a tier name.
func isTierByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// tierName is name as a string: one of knownTiers when it is one.
func tierName(name []byte) string {
	for _, k := range knownTiers {
		if string(name) == k {
			return k
		}
	}
	return string(name)
}

// field is f's field for the quoted key, nil for none.
func (f *usageFields) field(quoted []byte) *count {
	for _, c := range [...]struct {
		name string
		dst  *count
	}{
		{"prompt_tokens", &f.Prompt},
		{"completion_tokens", &f.Completion},
		{"total_tokens", &f.Total},
		{"input_tokens", &f.Input},
		{"output_tokens", &f.Output},
		{"cache_creation_input_tokens", &f.CacheCreation},
		{"cache_read_input_tokens", &f.CacheRead},
	} {
		if keyIs(quoted, c.name) {
			return c.dst
		}
	}
	return nil
}

// keyIs reports whether the quoted JSON string name matches key.
func keyIs(name []byte, key string) bool {
	inner := name[1 : len(name)-1]
	if !bytes.ContainsRune(inner, '\\') {
		return strings.EqualFold(string(inner), key)
	}
	var s string
	return json.Unmarshal(name, &s) == nil && strings.EqualFold(s, key)
}

// usageFields is a usage object as any of the providers spell it. A field
// that is absent, null or not a number stays unset. The fields without a
// JSON name are nested or not counts; the fuzz targets' oracles decode
// them apart.
type usageFields struct {
	Prompt        count `json:"prompt_tokens"`
	Completion    count `json:"completion_tokens"`
	Total         count `json:"total_tokens"`
	Input         count `json:"input_tokens"`
	Output        count `json:"output_tokens"`
	CacheCreation count `json:"cache_creation_input_tokens"`
	CacheRead     count `json:"cache_read_input_tokens"`
	// PromptCached is prompt_tokens_details.cached_tokens (OpenAI Chat).
	PromptCached count `json:"-"`
	// InputCached is input_tokens_details.cached_tokens (Responses).
	InputCached count `json:"-"`
	// Tier is service_tier (Anthropic), "" when none was read; a stream
	// sets it from any service_tier key (see StreamScanner).
	Tier string `json:"-"`
}

// merge overwrites f's fields with those set in g. Streams report usage in
// pieces (Anthropic's message_start carries the input, each message_delta
// the cumulative output), and the latest value of each field is the true one.
func (f *usageFields) merge(g *usageFields) {
	for _, p := range [...]struct{ dst, src *count }{
		{&f.Prompt, &g.Prompt},
		{&f.Completion, &g.Completion},
		{&f.Total, &g.Total},
		{&f.Input, &g.Input},
		{&f.Output, &g.Output},
		{&f.CacheCreation, &g.CacheCreation},
		{&f.CacheRead, &g.CacheRead},
		{&f.PromptCached, &g.PromptCached},
		{&f.InputCached, &g.InputCached},
	} {
		if p.src.ok {
			*p.dst = *p.src
		}
	}
	if g.Tier != "" {
		f.Tier = g.Tier
	}
}

// usage is the Usage f reports; ok is false when f holds no count, and
// then the Usage has only its Tier. Cached is at most Input.
func (f *usageFields) usage() (u Usage, ok bool) {
	u.Tier = f.Tier
	haveIn := f.Prompt.ok || f.Input.ok || f.CacheCreation.ok || f.CacheRead.ok
	haveOut := f.Completion.ok || f.Output.ok
	if !haveIn && !haveOut && !f.Total.ok {
		return u, false
	}
	if f.Prompt.ok {
		// OpenAI-style prompt_tokens already include cached tokens; some
		// gateways add Anthropic's cache fields beside it as a breakdown.
		u.Input = f.Prompt.n
	} else {
		u.Input = f.Input.n + f.CacheCreation.n + f.CacheRead.n
	}
	if f.Completion.ok {
		u.Output = f.Completion.n
	} else {
		u.Output = f.Output.n
	}
	if f.Total.ok && f.Total.n > u.Total() {
		if haveIn {
			u.Output = f.Total.n - u.Input
		} else {
			u.Input = f.Total.n - u.Output
		}
	}
	u.Cached = min(f.cached(), u.Input)
	return u, true
}

// cached is the cached part of the input as the provider reports it:
// OpenAI's details first, then Anthropic's cache reads; 0 for none.
func (f *usageFields) cached() int64 {
	switch {
	case f.PromptCached.ok:
		return f.PromptCached.n
	case f.InputCached.ok:
		return f.InputCached.n
	}
	return f.CacheRead.n
}

// count is a token count from a usage object.
type count struct {
	n  int64
	ok bool
}

// clampCount converts f to an int64 in [0, maxCount].
func clampCount(f float64) int64 {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f > maxCount:
		return maxCount
	}
	return int64(f)
}
