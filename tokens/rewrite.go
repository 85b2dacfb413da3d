package tokens

import (
	"bytes"
	"encoding/json"
)

// SetServiceTier returns a copy of body, a JSON object, with its top-level
// member key set to the JSON string tier: the value of every top-level
// member named key (exactly, escapes decoded) is replaced, so the last one
// a decoder takes says tier too; with none, "key":"tier" is put first in
// the object. ok is false, and body is returned as it is, when body is not
// a valid JSON object. body itself is never changed: the caller may keep
// it to send again.
func SetServiceTier(body []byte, key, tier string) ([]byte, bool) {
	value := quote(tier)
	var edits []edit
	members := 0
	w := walker{b: body}
	valid := w.object(func(quoted []byte, _ int64) {
		members++
		if string(unquotedKey(quoted)) != key {
			w.skip()
			return
		}
		from, to := w.span()
		edits = append(edits, edit{from, to, value})
	})
	if !valid {
		return body, false
	}
	if len(edits) == 0 {
		member := append(append(quote(key), ':'), value...)
		edits = append(edits, insertion(openingBrace(body), member, members > 0))
	}
	return applyEdits(body, edits), true
}

// IncludeUsage makes a streamed OpenAI Chat Completions or Completions
// request ask for usage in its stream's last chunk: for a body, a JSON
// object, whose top-level "stream" is true, it returns a copy with
// stream_options.include_usage set true, and added true. Every top-level
// stream_options is changed so: an object gets include_usage true, in
// place of each include_usage it has or put first; null becomes
// {"include_usage":true}; with none, "stream_options":{"include_usage":true}
// is put first in the body.
//
// It returns body as it is and added false when the body does not stream,
// when the last stream_options already has include_usage true (the client
// asked for the usage chunk itself) or is neither an object nor null, and
// when body is not a valid JSON object. Keys are matched exactly, escapes
// decoded, and the last one counts, as in a decoder; an earlier
// stream_options that is neither an object nor null is left as it is.
// body itself is never changed.
func IncludeUsage(body []byte) (out []byte, added bool) {
	var o streamOptions
	w := walker{b: body}
	valid := w.object(func(quoted []byte, _ int64) {
		switch string(unquotedKey(quoted)) {
		case "stream":
			from, to := w.span()
			o.stream = !w.bad && string(body[from:to]) == "true"
		case "stream_options":
			o.given = true
			w.streamOptions(&o)
		default:
			w.skip()
		}
	})
	if !valid || !o.stream || o.on || o.odd {
		return body, false
	}
	if !o.given {
		// The body has members: "stream" is one.
		member := []byte(`"stream_options":{"include_usage":true}`)
		o.edits = append(o.edits, insertion(openingBrace(body), member, true))
	}
	return applyEdits(body, o.edits), true
}

// streamOptions is what IncludeUsage reads of a request body.
type streamOptions struct {
	stream bool   // the last "stream" is true
	given  bool   // there is a "stream_options"
	on     bool   // the last one has include_usage true, its last one counting
	odd    bool   // the last one is neither an object nor null
	edits  []edit // what sets include_usage true in each
}

// streamOptions reads a stream_options value at the cursor into o, with
// the edits that set its include_usage true.
func (w *walker) streamOptions(o *streamOptions) {
	o.on, o.odd = false, false
	switch w.peek() {
	case 'n':
		from, to := w.span()
		o.edits = append(o.edits, edit{from, to, []byte(`{"include_usage":true}`)})
		return
	case '{':
	default:
		w.skip()
		o.odd = true
		return
	}
	brace, members, found := w.i, 0, false
	w.members(func(quoted []byte, _ int64) {
		members++
		if string(unquotedKey(quoted)) != "include_usage" {
			w.skip()
			return
		}
		from, to := w.span()
		o.on, found = !w.bad && string(w.b[from:to]) == "true", true
		o.edits = append(o.edits, edit{from, to, []byte("true")})
	})
	if !found {
		o.edits = append(o.edits, insertion(brace, []byte(`"include_usage":true`), members > 0))
	}
}

// span checks the value at the cursor, moves past it and returns where it
// lies in the input, which must be all in memory.
func (w *walker) span() (from, to int) {
	w.peek()
	from = w.i
	w.skip()
	return from, w.i
}

// edit is a change to a body: the bytes from from to to replaced by text.
type edit struct {
	from, to int
	text     []byte
}

// insertion is the edit that puts member first in the object whose
// opening brace is at brace, with a comma after it when the object has
// members.
func insertion(brace int, member []byte, comma bool) edit {
	if comma {
		member = append(member, ',')
	}
	return edit{brace + 1, brace + 1, member}
}

// openingBrace is where the JSON object body starts.
func openingBrace(body []byte) int {
	return len(body) - len(bytes.TrimLeft(body, " \t\r\n"))
}

// applyEdits returns a new body: body with edits made, which are in order
// and do not overlap.
func applyEdits(body []byte, edits []edit) []byte {
	n := len(body)
	for _, e := range edits {
		n += len(e.text) - (e.to - e.from)
	}
	out := make([]byte, 0, n)
	at := 0
	for _, e := range edits {
		out = append(append(out, body[at:e.from]...), e.text...)
		at = e.to
	}
	return append(out, body[at:]...)
}

// quote is s as a JSON string.
func quote(s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}
