package tokens

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Request is what the proxy reads of a request body before sending it.
type Request struct {
	// Model is the body's top-level "model" as a decoder into a struct
	// field would read it: the key in any case, the last one given;
	// "" when there is none, when one is not a string or null, or when
	// the body is not a JSON object.
	Model string
	// Cost is the tokens to reserve for it (see Estimate).
	Cost int64
	// Output is the part of Cost reserved for its output (max_tokens and
	// the like, times the choices); the rest is its prompt.
	Output int64
	// OutputLimited: the body sets max_completion_tokens, max_tokens or
	// max_output_tokens, so Output is its limit, not DefaultMaxOutput's
	// guess.
	OutputLimited bool
}

// ReadRequest reads body once for its model and its estimated cost. The
// body is walked, not decoded: the strings that count are measured where
// they lie (their length as decoded UTF-8), and the walk checks the JSON
// as it goes, as strictly as encoding/json, so a large prompt costs one
// pass and no allocation but the model's name. A body that is not valid JSON has no model and
// the estimate of a body of no known API.
//
// A key given twice in one object is read twice for its text (the
// upstream reads all of the text it is sent); for a number or the model,
// the last one counts. A number beyond float64's range, which JSON allows
// and encoding/json refuses to decode into a float64, is skipped like
// any other: the body is still read.
func ReadRequest(path string, body []byte) Request {
	fallback := Request{Cost: ceilQuarter(int64(len(body))) + DefaultMaxOutput, Output: DefaultMaxOutput}
	r := reader{walker: walker{b: body}, kind: apiOf(path)}
	if !r.object(r.topLevel) {
		return fallback
	}
	out := fallback
	if !r.modelBad {
		out.Model = r.model
	}
	if r.kind != apiUnknown {
		out.Cost, out.Output = r.cost()
		out.OutputLimited = r.limits[0].ok || r.limits[1].ok || r.limits[2].ok
	}
	return out
}

// reader walks one JSON request body for what ReadRequest reads of it.
// The walk's first fault sends it to the body's end.
type reader struct {
	walker
	kind     api
	c        counter
	model    string
	modelBad bool // a model key held something other than a string or null
	// limits are max_completion_tokens, max_tokens, max_output_tokens, n
	// and best_of, each its last value when that is a number of at least 1.
	limits [5]struct {
		n  int64
		ok bool
	}
}

// limitKeys name reader.limits, in order.
var limitKeys = [...]string{"max_completion_tokens", "max_tokens", "max_output_tokens", "n", "best_of"}

// topLevel reads one member of the body's object: the value at the
// cursor, under the quoted key.
func (r *reader) topLevel(quoted []byte, _ int64) {
	if keyIs(quoted, "model") {
		r.readModel()
		return
	}
	name := unquotedKey(quoted)
	for i, k := range limitKeys {
		if string(name) == k {
			f, ok := number(r.value())
			r.limits[i].n, r.limits[i].ok = clampCount(f), ok && f >= 1
			return
		}
	}
	r.prompt(name)
}

// prompt reads the value of the top-level member named name, at the
// cursor, for the text it adds to the prompt, if any.
func (r *reader) prompt(name []byte) {
	is := func(kind api, key string) bool { return r.kind == kind && string(name) == key }
	tools := r.kind != apiEmbeddings && (string(name) == "tools" || string(name) == "functions" || string(name) == "response_format")
	switch c := &r.c; {
	case is(apiChat, "messages"), is(apiResponses, "input"), is(apiMessages, "messages"):
		r.messages(c)
	case is(apiCompletions, "prompt"), is(apiEmbeddings, "input"):
		r.tokenInput(c)
	case is(apiResponses, "instructions"), is(apiMessages, "system"):
		r.message(c)
	case is(apiResponses, "text"), tools: // text may hold a JSON schema for the output
		r.everything(c)
	default:
		r.skip()
	}
}

// readModel reads a model key's value, at the cursor.
func (r *reader) readModel() {
	raw := r.value()
	if r.bad {
		return
	}
	switch raw[0] {
	case 'n': // null leaves the model as it was
	case '"':
		r.model = decodeString(raw)
	default:
		r.modelBad = true
	}
}

// cost is the estimate from what was read (see Estimate), and the part of
// it reserved for output.
func (r *reader) cost() (cost, output int64) {
	c := r.c
	prompt := ceilQuarter(c.bytes) + c.messageCount*MessageOverhead + c.media*MediaTokens + c.exact
	output = 0
	if r.kind != apiEmbeddings {
		output = DefaultMaxOutput
		for _, l := range r.limits[:3] {
			if l.ok {
				output = l.n
				break
			}
		}
		choices := int64(1)
		for _, l := range r.limits[3:] {
			if l.ok && l.n > choices {
				choices = min(l.n, maxChoices)
			}
		}
		output *= choices
	}
	return max(1, prompt+output), output
}

// number is a value the walk checked, as a float64 when it is a number
// within float64's range: a string keeps its quotes, and what else
// ParseFloat reads (Inf, NaN) is not JSON, so nothing else parses.
func number(raw []byte) (float64, bool) {
	f, err := strconv.ParseFloat(string(raw), 64)
	return f, err == nil
}

// messages counts each element of an array as a message, or the value as
// a single message when it is not an array (a Responses input string).
func (r *reader) messages(c *counter) {
	if r.peek() == '[' {
		r.elements(func() { r.message(c) })
		return
	}
	r.message(c)
}

func (r *reader) message(c *counter) {
	if r.peek() == 'n' {
		r.literal("null")
		return
	}
	c.messageCount++
	r.text(c)
}

// text counts the text in a message, content part or item. In objects it
// follows only the keys that carry text the model reads, leaving out ids,
// roles, signatures, encrypted reasoning and base64 data; an object whose
// type is a medium counts as one medium and nothing else.
func (r *reader) text(c *counter) {
	switch r.peek() {
	case '"':
		c.bytes += r.str()
	case '[':
		r.elements(func() { r.text(c) })
	case '{':
		var inner counter
		media := false
		r.members(func(quoted []byte, _ int64) {
			switch string(unquotedKey(quoted)) {
			case "type":
				raw := r.value()
				media = !r.bad && raw[0] == '"' && isMedia(string(unquotedKey(raw)))
			case "content", "text", "refusal", "thinking", "summary", "output",
				"tool_calls", "function", "function_call":
				r.text(&inner)
			case "arguments", "input": // tool arguments, as a string or an object
				r.everything(&inner)
			default:
				r.skip()
			}
		})
		if media {
			c.media++
		} else {
			c.add(inner)
		}
	default:
		r.skip()
	}
}

// everything counts every string in the value at the cursor, object keys
// included, for values such as tool definitions and JSON schemas that
// reach the model whole.
func (r *reader) everything(c *counter) {
	switch r.peek() {
	case '"':
		c.bytes += r.str()
	case '[':
		r.elements(func() { r.everything(c) })
	case '{':
		r.members(func(_ []byte, keyLen int64) {
			c.bytes += keyLen
			r.everything(c)
		})
	default:
		r.skip()
	}
}

// tokenInput counts an embeddings input or completions prompt: a string,
// an array of strings, an array of token IDs or an array of such arrays.
func (r *reader) tokenInput(c *counter) {
	switch r.peek() {
	case '"':
		r.text(c)
	case '[':
		r.elements(func() { r.tokenItem(c) })
	default:
		r.skip()
	}
}

// tokenItem counts an element of a token input: a string, a token ID or
// an array of token IDs.
func (r *reader) tokenItem(c *counter) {
	switch b := r.peek(); {
	case b == '"':
		r.text(c)
	case b == '-' || b >= '0' && b <= '9':
		if r.number(); !r.bad {
			c.exact++
		}
	case b == '[':
		r.elements(func() {
			c.exact++
			r.skip()
		})
	default:
		r.skip()
	}
}

// add counts o's tallies in c.
func (c *counter) add(o counter) {
	c.bytes += o.bytes
	c.messageCount += o.messageCount
	c.media += o.media
	c.exact += o.exact
}

// unquotedKey is a quoted JSON string's content, its escapes decoded
// when it has any (which costs an allocation; keys seldom have them).
func unquotedKey(quoted []byte) []byte {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner
	}
	var s string
	_ = json.Unmarshal(quoted, &s)
	return []byte(s)
}
