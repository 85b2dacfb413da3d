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
// The body is walked, not decoded, with the checks ReadRequest makes (a
// body that is not valid JSON has no usage), and only the usage value is
// read: an answer of many kilobytes costs one pass and no allocation.
func FromBody(body []byte) (u Usage, ok bool) {
	w := walker{b: body}
	var f usageFields
	valid := w.object(func(quoted []byte, _ int64) {
		if !keyIs(quoted, "usage") {
			w.skip()
			return
		}
		// The last one counts, as in a decoder.
		if ok = w.peek() == '{'; ok {
			f = w.usageObject()
		} else {
			w.skip()
		}
	})
	if !valid || !ok {
		return Usage{}, false
	}
	return f.usage()
}

// usageObject reads the usage object at the cursor as encoding/json
// decodes it into usageFields: keys matched in any case, escapes decoded,
// the last one counting; a value that is not a number leaves its field as
// it was. It allocates nothing.
func (w *walker) usageObject() (f usageFields) {
	w.members(func(quoted []byte, _ int64) {
		c := f.field(quoted)
		raw := w.value()
		if c != nil && !w.bad {
			if n, ok := number(raw); ok {
				c.n, c.ok = clampCount(n), true
			}
		}
	})
	return f
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
// that is absent, null or not a number stays unset.
type usageFields struct {
	Prompt        count `json:"prompt_tokens"`
	Completion    count `json:"completion_tokens"`
	Total         count `json:"total_tokens"`
	Input         count `json:"input_tokens"`
	Output        count `json:"output_tokens"`
	CacheCreation count `json:"cache_creation_input_tokens"`
	CacheRead     count `json:"cache_read_input_tokens"`
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
	} {
		if p.src.ok {
			*p.dst = *p.src
		}
	}
}

func (f *usageFields) usage() (Usage, bool) {
	haveIn := f.Prompt.ok || f.Input.ok || f.CacheCreation.ok || f.CacheRead.ok
	haveOut := f.Completion.ok || f.Output.ok
	if !haveIn && !haveOut && !f.Total.ok {
		return Usage{}, false
	}
	var u Usage
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
	return u, true
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
