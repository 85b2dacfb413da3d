package tokens

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
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
	fallback := Request{Cost: ceilQuarter(int64(len(body))) + DefaultMaxOutput}
	r := reader{b: body, kind: apiOf(path)}
	if !r.object(r.topLevel) {
		return fallback
	}
	out := fallback
	if !r.modelBad {
		out.Model = r.model
	}
	if r.kind != apiUnknown {
		out.Cost = r.cost()
	}
	return out
}

// reader walks one JSON request body. Every step checks what it reads;
// the first fault sets bad and sends the walk to the body's end.
type reader struct {
	b        []byte
	kind     api
	bad      bool
	depth    int // objects and arrays open
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

// topLevel reads one member of the body's object: the value at v under
// the quoted key; it returns the value's end.
func (r *reader) topLevel(quoted []byte, _ int64, v int) int {
	if keyIs(quoted, "model") {
		return r.readModel(v)
	}
	name := unquotedKey(quoted)
	for i, k := range limitKeys {
		if string(name) == k {
			end := r.skip(v)
			f, ok := number(r.b[v:end])
			r.limits[i].n, r.limits[i].ok = clampCount(f), ok && f >= 1
			return end
		}
	}
	c := &r.c
	switch r.kind {
	case apiChat:
		if string(name) == "messages" {
			return r.messages(c, v)
		}
	case apiCompletions:
		if string(name) == "prompt" {
			return r.tokenInput(c, v)
		}
	case apiResponses:
		switch string(name) {
		case "instructions":
			return r.message(c, v)
		case "input":
			return r.messages(c, v)
		case "text": // may hold a JSON schema for the output
			return r.everything(c, v)
		}
	case apiEmbeddings:
		if string(name) == "input" {
			return r.tokenInput(c, v)
		}
	case apiMessages:
		switch string(name) {
		case "system":
			return r.message(c, v)
		case "messages":
			return r.messages(c, v)
		}
	}
	if r.kind != apiEmbeddings {
		switch string(name) {
		case "tools", "functions", "response_format":
			return r.everything(c, v)
		}
	}
	return r.skip(v)
}

// readModel reads a model key's value at v.
func (r *reader) readModel(v int) int {
	end := r.skip(v)
	if r.bad {
		return end
	}
	switch r.b[v] {
	case 'n': // null leaves the model as it was
	case '"':
		raw := r.b[v:end]
		if inner := raw[1 : len(raw)-1]; isPlainASCII(inner) {
			r.model = string(inner)
		} else {
			var s string
			_ = json.Unmarshal(raw, &s) // valid: skip checked it
			r.model = s
		}
	default:
		r.modelBad = true
	}
	return end
}

// cost is the estimate from what was read (see Estimate).
func (r *reader) cost() int64 {
	c := r.c
	prompt := ceilQuarter(c.bytes) + c.messageCount*MessageOverhead + c.media*MediaTokens + c.exact
	var output int64
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
	return max(1, prompt+output)
}

// number is a value skip checked, as a float64 when it is a number within
// float64's range: a string keeps its quotes, and what else ParseFloat
// reads (Inf, NaN) is not JSON, so nothing else parses.
func number(raw []byte) (float64, bool) {
	f, err := strconv.ParseFloat(string(raw), 64)
	return f, err == nil
}

// object walks the whole of r.b as one JSON object, calling f with each
// member as members does, and reports whether r.b is that and nothing
// else.
func (r *reader) object(f func(quoted []byte, keyLen int64, v int) int) bool {
	i := spaceEnd(r.b, 0)
	if r.byteAt(i) != '{' {
		return false
	}
	end := r.members(i, f)
	return !r.bad && spaceEnd(r.b, end) == len(r.b)
}

// skip checks the value at i and returns its end.
func (r *reader) skip(i int) int {
	switch c := r.byteAt(i); {
	case c == '"':
		end, _ := r.str(i)
		return end
	case c == '{':
		return r.members(i, func(_ []byte, _ int64, v int) int { return r.skip(v) })
	case c == '[':
		return r.elements(i, r.skip)
	case c == '-' || c >= '0' && c <= '9':
		return r.number(i)
	case c == 't':
		return r.literal(i, "true")
	case c == 'f':
		return r.literal(i, "false")
	case c == 'n':
		return r.literal(i, "null")
	}
	return r.fail()
}

// fail marks the body bad and returns its end, where every walk stops.
func (r *reader) fail() int {
	r.bad = true
	return len(r.b)
}

// byteAt is b[i], or 0 past the end.
func (r *reader) byteAt(i int) byte {
	if i < len(r.b) {
		return r.b[i]
	}
	return 0
}

// maxDepth is encoding/json's bound on nesting.
const maxDepth = 10000

// members calls f with each member of the object at b[i] (its key,
// quoted as it came, the key's length decoded, and where its value
// starts), and returns the object's end. f returns its value's end.
func (r *reader) members(i int, f func(quoted []byte, keyLen int64, v int) int) int {
	if r.depth++; r.depth > maxDepth {
		return r.fail()
	}
	b := r.b
	if i = spaceEnd(b, i+1); r.byteAt(i) == '}' {
		r.depth--
		return i + 1
	}
	for {
		if r.byteAt(i) != '"' {
			return r.fail()
		}
		kend, keyLen := r.str(i)
		colon := spaceEnd(b, kend)
		if r.bad || r.byteAt(colon) != ':' {
			return r.fail()
		}
		if i = spaceEnd(b, f(b[i:kend], keyLen, spaceEnd(b, colon+1))); r.bad {
			return i
		}
		switch r.byteAt(i) {
		case '}':
			r.depth--
			return i + 1
		case ',':
			i = spaceEnd(b, i+1)
		default:
			return r.fail()
		}
	}
}

// elements calls f with where each element of the array at b[i] starts,
// and returns the array's end. f returns its element's end.
func (r *reader) elements(i int, f func(v int) int) int {
	if r.depth++; r.depth > maxDepth {
		return r.fail()
	}
	b := r.b
	if i = spaceEnd(b, i+1); r.byteAt(i) == ']' {
		r.depth--
		return i + 1
	}
	for {
		if i = spaceEnd(b, f(i)); r.bad {
			return i
		}
		switch r.byteAt(i) {
		case ']':
			r.depth--
			return i + 1
		case ',':
			i = spaceEnd(b, i+1)
		default:
			return r.fail()
		}
	}
}

// literal checks that b[i:] starts with word and returns its end.
func (r *reader) literal(i int, word string) int {
	if !bytes.HasPrefix(r.b[i:], []byte(word)) {
		return r.fail()
	}
	return i + len(word)
}

// number checks the JSON number at b[i] and returns its end.
func (r *reader) number(i int) int {
	digits := func(i int) int {
		for c := r.byteAt(i); c >= '0' && c <= '9'; c = r.byteAt(i) {
			i++
		}
		return i
	}
	if r.byteAt(i) == '-' {
		i++
	}
	switch c := r.byteAt(i); {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		i = digits(i)
	default:
		return r.fail()
	}
	if r.byteAt(i) == '.' {
		if j := digits(i + 1); j > i+1 {
			i = j
		} else {
			return r.fail()
		}
	}
	if c := r.byteAt(i); c == 'e' || c == 'E' {
		i++
		if c := r.byteAt(i); c == '+' || c == '-' {
			i++
		}
		if j := digits(i); j > i {
			i = j
		} else {
			return r.fail()
		}
	}
	return i
}

// str checks the JSON string at b[i] and returns its end and its length
// in UTF-8 bytes once decoded, as encoding/json decodes it: escapes
// resolved, a surrogate pair joined, a lone surrogate or a byte that is
// not UTF-8 replaced by U+FFFD.
func (r *reader) str(i int) (end int, n int64) {
	b := r.b
	for i++; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			return i + 1, n
		case c == '\\':
			var w int64
			if i, w = r.escape(i); r.bad {
				return i, 0
			}
			n += w
		case c < ' ':
			return r.fail(), 0
		case c < utf8.RuneSelf:
			n++
			i++
		default:
			rn, w := utf8.DecodeRune(b[i:])
			if rn == utf8.RuneError && w == 1 {
				n += 3 // replaced by U+FFFD
			} else {
				n += int64(w)
			}
			i += w
		}
	}
	return r.fail(), 0
}

// escape checks the escape at b[i] ('\\') and returns its end and the
// UTF-8 bytes it decodes to; a \u escape of a high surrogate takes the
// low one that follows it.
func (r *reader) escape(i int) (end int, n int64) {
	switch r.byteAt(i + 1) {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2, 1
	case 'u':
	default:
		return r.fail(), 0
	}
	rn := hex4(r.b[i+2:])
	if rn < 0 {
		return r.fail(), 0
	}
	i += 6
	if !utf16.IsSurrogate(rn) {
		return i, int64(utf8.RuneLen(rn))
	}
	if r.byteAt(i) == '\\' && r.byteAt(i+1) == 'u' {
		if utf16.DecodeRune(rn, hex4(r.b[i+2:])) != unicode.ReplacementChar {
			return i + 6, 4
		}
	}
	return i, 3 // U+FFFD
}

// messages counts each element of an array as a message, or the value as
// a single message when it is not an array (a Responses input string).
func (r *reader) messages(c *counter, i int) int {
	if r.byteAt(i) == '[' {
		return r.elements(i, func(v int) int { return r.message(c, v) })
	}
	return r.message(c, i)
}

func (r *reader) message(c *counter, i int) int {
	if r.byteAt(i) == 'n' {
		return r.literal(i, "null")
	}
	c.messageCount++
	return r.text(c, i)
}

// text counts the text in a message, content part or item. In objects it
// follows only the keys that carry text the model reads, leaving out ids,
// roles, signatures, encrypted reasoning and base64 data; an object whose
// type is a medium counts as one medium and nothing else.
func (r *reader) text(c *counter, i int) int {
	switch r.byteAt(i) {
	case '"':
		end, n := r.str(i)
		c.bytes += n
		return end
	case '[':
		return r.elements(i, func(v int) int { return r.text(c, v) })
	case '{':
		var inner counter
		media := false
		end := r.members(i, func(quoted []byte, _ int64, v int) int {
			switch string(unquotedKey(quoted)) {
			case "type":
				end := r.skip(v)
				media = !r.bad && r.b[v] == '"' && isMedia(string(unquotedKey(r.b[v:end])))
				return end
			case "content", "text", "refusal", "thinking", "summary", "output",
				"tool_calls", "function", "function_call":
				return r.text(&inner, v)
			case "arguments", "input": // tool arguments, as a string or an object
				return r.everything(&inner, v)
			}
			return r.skip(v)
		})
		if media {
			c.media++
		} else {
			c.add(inner)
		}
		return end
	}
	return r.skip(i)
}

// everything counts every string in the value at i, object keys
// included, for values such as tool definitions and JSON schemas that
// reach the model whole.
func (r *reader) everything(c *counter, i int) int {
	switch r.byteAt(i) {
	case '"':
		end, n := r.str(i)
		c.bytes += n
		return end
	case '[':
		return r.elements(i, func(v int) int { return r.everything(c, v) })
	case '{':
		return r.members(i, func(_ []byte, keyLen int64, v int) int {
			c.bytes += keyLen
			return r.everything(c, v)
		})
	}
	return r.skip(i)
}

// tokenInput counts an embeddings input or completions prompt: a string,
// an array of strings, an array of token IDs or an array of such arrays.
func (r *reader) tokenInput(c *counter, i int) int {
	switch r.byteAt(i) {
	case '"':
		return r.text(c, i)
	case '[':
		return r.elements(i, func(v int) int {
			switch b := r.byteAt(v); {
			case b == '"':
				return r.text(c, v)
			case b == '-' || b >= '0' && b <= '9':
				if end := r.number(v); !r.bad {
					c.exact++
					return end
				}
			case b == '[':
				return r.elements(v, func(e int) int {
					c.exact++
					return r.skip(e)
				})
			}
			return r.skip(v)
		})
	}
	return r.skip(i)
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

// isPlainASCII reports whether a string's raw content is the same
// decoded: no escapes and no bytes beyond ASCII.
func isPlainASCII(s []byte) bool {
	for _, c := range s {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// hex4 is the rune of a \u escape's four hex digits, -1 when they are
// not four hex digits.
func hex4(s []byte) rune {
	if len(s) < 4 {
		return -1
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
