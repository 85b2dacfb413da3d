package tokens

import (
	"encoding/json"
	"errors"
	"strconv"
)

// estimateByDecoding is Estimate as it was before ReadRequest: the body
// decoded into a map[string]any and walked. It is the oracle of
// FuzzReadRequestAgreesWithDecoding.
func estimateByDecoding(path string, body []byte) int64 {
	kind := apiOf(path)
	var req map[string]any
	if kind == apiUnknown || json.Unmarshal(body, &req) != nil || req == nil {
		return ceilQuarter(int64(len(body))) + DefaultMaxOutput
	}

	var c decodedCounter
	switch kind {
	case apiChat:
		c.messages(req["messages"])
	case apiCompletions:
		c.tokenInput(req["prompt"])
	case apiResponses:
		c.message(req["instructions"])
		c.messages(req["input"])
		c.everything(req["text"]) // may hold a JSON schema for the output
	case apiEmbeddings:
		c.tokenInput(req["input"])
	case apiMessages:
		c.message(req["system"])
		c.messages(req["messages"])
	}
	if kind != apiEmbeddings {
		c.everything(req["tools"])
		c.everything(req["functions"])
		c.everything(req["response_format"])
	}
	prompt := ceilQuarter(c.bytes) + c.messageCount*MessageOverhead + c.media*MediaTokens + c.exact

	var output int64
	if kind != apiEmbeddings {
		output = DefaultMaxOutput
		for _, k := range [...]string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
			if v, ok := positive(req[k]); ok {
				output = v
				break
			}
		}
		choices := int64(1)
		for _, k := range [...]string{"n", "best_of"} {
			if v, ok := positive(req[k]); ok && v > choices {
				choices = min(v, maxChoices)
			}
		}
		output *= choices
	}
	return max(1, prompt+output)
}

// positive returns v as a count when it is a JSON number of at least 1.
func positive(v any) (int64, bool) {
	f, ok := v.(float64)
	if !ok || !(f >= 1) {
		return 0, false
	}
	return clampCount(f), true
}

// decodedCounter is counter over decoded values.
type decodedCounter struct{ counter }

// messages counts each element of an array as a message, or v as a single
// message when it is not an array (a Responses input string).
func (c *decodedCounter) messages(v any) {
	if list, ok := v.([]any); ok {
		for _, m := range list {
			c.message(m)
		}
		return
	}
	c.message(v)
}

func (c *decodedCounter) message(v any) {
	if v == nil {
		return
	}
	c.messageCount++
	c.text(v)
}

// text counts the text in a message, content part or item. In objects it
// follows only the keys that carry text the model reads, leaving out ids,
// roles, signatures, encrypted reasoning and base64 data.
func (c *decodedCounter) text(v any) {
	switch v := v.(type) {
	case string:
		c.bytes += int64(len(v))
	case []any:
		for _, e := range v {
			c.text(e)
		}
	case map[string]any:
		if t, _ := v["type"].(string); isMedia(t) {
			c.media++
			return
		}
		for k, e := range v {
			switch k {
			case "content", "text", "refusal", "thinking", "summary", "output",
				"tool_calls", "function", "function_call":
				c.text(e)
			case "arguments", "input": // tool arguments, as a string or an object
				c.everything(e)
			}
		}
	}
}

// everything counts every string in v, object keys included, for values
// such as tool definitions and JSON schemas that reach the model whole.
func (c *decodedCounter) everything(v any) {
	switch v := v.(type) {
	case string:
		c.bytes += int64(len(v))
	case []any:
		for _, e := range v {
			c.everything(e)
		}
	case map[string]any:
		for k, e := range v {
			c.bytes += int64(len(k))
			c.everything(e)
		}
	}
}

// tokenInput counts an embeddings input or completions prompt: a string, an
// array of strings, an array of token IDs or an array of such arrays.
func (c *decodedCounter) tokenInput(v any) {
	switch v := v.(type) {
	case string:
		c.bytes += int64(len(v))
	case []any:
		for _, e := range v {
			switch e := e.(type) {
			case string:
				c.bytes += int64(len(e))
			case float64:
				c.exact++
			case []any:
				c.exact += int64(len(e))
			}
		}
	}
}

// UnmarshalJSON lets the fuzz targets' oracles decode usage with
// encoding/json: a count never fails to decode, so one odd field cannot
// hide the others; a value that does not parse as a number leaves it as
// it was.
func (c *count) UnmarshalJSON(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return nil // null, a string, an object: not a count
	}
	c.n, c.ok = clampCount(f), true
	return nil
}

// usageByDecoding is FromBody by encoding/json: the body decoded into
// decodedAnswer. A value of the wrong type for its field (a usage that is
// not an object) leaves the field unset, as the decoder does, and the
// rest is still decoded.
func usageByDecoding(body []byte) (Usage, bool) {
	var a decodedAnswer
	var typeErr *json.UnmarshalTypeError
	if err := json.Unmarshal(body, &a); err != nil && !errors.As(err, &typeErr) {
		return Usage{}, false
	}
	var u Usage
	ok := false
	if a.Usage != nil {
		f := a.Usage.usageFields
		f.PromptCached = a.Usage.PromptDetails.Cached
		f.InputCached = a.Usage.InputDetails.Cached
		f.Tier = string(a.Usage.Tier)
		u, ok = f.usage()
	}
	if a.Tier != "" {
		u.Tier = string(a.Tier)
	}
	return u, ok
}

// decodedAnswer is what FromBody reads of an answer, for encoding/json.
type decodedAnswer struct {
	Usage *decodedUsage `json:"usage"`
	Tier  decodedTier   `json:"service_tier"`
}

// decodedUsage is a usage object, with the members usageFields leaves to
// its oracles.
type decodedUsage struct {
	usageFields
	PromptDetails decodedDetails `json:"prompt_tokens_details"`
	InputDetails  decodedDetails `json:"input_tokens_details"`
	Tier          decodedTier    `json:"service_tier"`
}

// decodedDetails is a usage details object's cached_tokens.
type decodedDetails struct {
	Cached count `json:"cached_tokens"`
}

// UnmarshalJSON decodes a details object into d; what is not an object
// leaves d as it was.
func (d *decodedDetails) UnmarshalJSON(b []byte) error {
	type plain decodedDetails
	_ = json.Unmarshal(b, (*plain)(d)) // on a type error, nothing is set
	return nil
}

// decodedTier is a service tier: a value that is not a tier name (see
// tierOf) leaves it as it was.
type decodedTier string

// UnmarshalJSON sets t to b when b is a tier name.
func (t *decodedTier) UnmarshalJSON(b []byte) error {
	if s, ok := tierOf(b); ok && len(s)+2 == len(b) {
		*t = decodedTier(s)
	}
	return nil
}
