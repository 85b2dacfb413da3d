package tokens

import (
	"bytes"
	"encoding/json"
	"io"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// walker reads JSON one value at a time, from a body in memory or from a
// stream, and checks it as it goes, as strictly as encoding/json: its
// first fault ends the walk. It does not decode: a string is measured
// where it lies, and nothing is copied out but what is asked for, so a
// large body costs one pass, and in memory no allocation.
//
// newWalker makes one for a stream, which it reads through a window of
// 16 KiB whatever the stream's size; ReadRequest, FromBody and
// StreamScanner walk bodies and lines in memory. A walker reads its
// input once: firstString leaves it at the end.
type walker struct {
	b     []byte    // what is at hand: the whole body, or a window of the stream
	i     int       // the cursor, in b
	src   io.Reader // the rest of the stream; nil when b is all there is
	off   int       // where b starts in the input
	keep  int       // where in the input the key or value being held starts; -1 for none
	depth int       // objects and arrays open
	bad   bool
}

const (
	// window is the most of a stream a walker holds; a key or value of up
	// to half of it is held whole while it is read.
	window = 16 << 10
	// maxDepth is encoding/json's bound on nesting.
	maxDepth = 10000
)

// newWalker returns a walker that reads the JSON in src.
func newWalker(src io.Reader) *walker {
	return &walker{b: make([]byte, 0, window), src: src, keep: -1}
}

// FirstString reads the JSON object at the start of src, through a window
// of 16 KiB whatever its size, on to its first member named key (see
// walker.firstString).
func FirstString(src io.Reader, key string, max int) (string, bool) {
	return newWalker(src).firstString(key, max)
}

// firstString reads the object at the start of the input on to its first
// member named key, matched as encoding/json matches a key to a struct
// field's name (escapes decoded, in any case), and returns that member's
// value when it is a string of at most max bytes as written, its quotes
// included, decoded; a max of more than 8 KiB counts as 8 KiB. It reads
// on no further than the window past that value's end. ok is false when
// the object ends with no such member, when the member's value is not
// such a string, or when the JSON is not valid up to there.
func (w *walker) firstString(key string, max int) (s string, ok bool) {
	if w.peek() != '{' {
		return "", false
	}
	max = min(max, window/2) // held whole, however the window falls
	w.members(func(quoted []byte, _ int64) {
		// No key longer than key written with every byte escaped (\u
		// and four digits) can match it.
		if quoted == nil || len(quoted) > 6*len(key)+2 || !keyIs(quoted, key) {
			w.skip()
			return
		}
		if w.peek() == '"' {
			if raw := w.value(); !w.bad && len(raw) > 0 && len(raw) <= max {
				s, ok = decodeString(raw), true
			}
		}
		w.fail() // the first one counts: read no further
	})
	return s, ok
}

// more reads on into the window and reports whether there was more to
// read. The window keeps the bytes after the cursor, and those of the key
// or value being held when they are at most half of it so far.
func (w *walker) more() bool {
	if w.src == nil {
		return false
	}
	from := w.i
	if k := w.keep - w.off; k >= 0 && w.i-k <= window/2 {
		from = k
	}
	n := copy(w.b[:cap(w.b)], w.b[from:])
	w.off += from
	w.i -= from
	m, err := io.ReadAtLeast(w.src, w.b[n:cap(w.b)], 1)
	if err != nil {
		w.src = nil
	}
	w.b = w.b[:n+m]
	return m > 0
}

// ensure reads on until n bytes are at hand from the cursor, or the
// input ends.
func (w *walker) ensure(n int) {
	for len(w.b)-w.i < n && w.more() {
	}
}

// at is the byte at the cursor, 0 at the input's end.
func (w *walker) at() byte {
	if w.i < len(w.b) || w.more() {
		return w.b[w.i]
	}
	return 0
}

// peek moves the cursor past white space and returns the byte there.
func (w *walker) peek() byte {
	for {
		switch c := w.at(); c {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return c
		}
	}
}

// fail marks the input bad and moves the cursor to the end of what is at
// hand, where every walk stops.
func (w *walker) fail() {
	w.bad = true
	w.i, w.src = len(w.b), nil
}

// hold starts holding what is read from the cursor on, unless something
// that started earlier is held already; release gives what was read since
// start.
func (w *walker) hold() (start, outer int) {
	start, outer = w.off+w.i, w.keep
	if outer < 0 {
		w.keep = start
	}
	return start, outer
}

// release ends a hold, and returns what was read since start: nil when
// its start has left the window.
func (w *walker) release(start, outer int) []byte {
	w.keep = outer
	if start < w.off {
		return nil
	}
	return w.b[start-w.off : w.i]
}

// object walks the whole input as one JSON object, calling f with each
// member as members does, and reports whether the input is that and
// nothing else.
func (w *walker) object(f func(quoted []byte, keyLen int64)) bool {
	if w.peek() != '{' {
		return false
	}
	w.members(f)
	w.peek()
	return !w.bad && w.i == len(w.b)
}

// value checks the value at the cursor and returns it as written (nil
// when it was too long for a stream's window).
func (w *walker) value() []byte {
	w.peek()
	start, outer := w.hold()
	w.skip()
	return w.release(start, outer)
}

// skip checks the value at the cursor and moves past it.
func (w *walker) skip() {
	switch w.peek() {
	case '"':
		w.str()
	case '{':
		w.members(func([]byte, int64) { w.skip() })
	case '[':
		w.elements(w.skip)
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		w.number()
	case 't':
		w.literal("true")
	case 'f':
		w.literal("false")
	case 'n':
		w.literal("null")
	default:
		w.fail()
	}
}

// members calls f with each member of the object at the cursor: its key,
// quoted as written (nil when it was too long for a stream's window), and
// the key's length decoded. f reads the member's value, at the cursor.
func (w *walker) members(f func(quoted []byte, keyLen int64)) {
	for ok := w.open('}'); ok; ok = w.another('}') {
		if w.peek() != '"' {
			w.fail()
			return
		}
		start, outer := w.hold()
		n := w.str()
		quoted := w.release(start, outer)
		if w.peek() != ':' {
			w.fail()
			return
		}
		w.i++
		f(quoted, n)
	}
}

// elements calls f with the cursor at each element of the array there; f
// reads it.
func (w *walker) elements(f func()) {
	for ok := w.open(']'); ok; ok = w.another(']') {
		f()
	}
}

// open enters the object or array at the cursor, and reports whether a
// member or element follows: not when it closes at once (end) or is
// nested too deep.
func (w *walker) open(end byte) bool {
	if w.depth++; w.depth > maxDepth {
		w.fail()
		return false
	}
	w.i++
	if w.peek() == end {
		w.i++
		w.depth--
		return false
	}
	return true
}

// another moves past what follows a member or element, and reports
// whether it was a comma, so another comes; not when it was end, which
// closes the object or array, or a fault.
func (w *walker) another(end byte) bool {
	switch w.peek() {
	case ',':
		w.i++
		return true
	case end:
		w.i++
		w.depth--
	default:
		w.fail()
	}
	return false
}

// literal checks that word is at the cursor, and moves past it.
func (w *walker) literal(word string) {
	w.ensure(len(word))
	if !bytes.HasPrefix(w.b[w.i:], []byte(word)) {
		w.fail()
		return
	}
	w.i += len(word)
}

// number checks the JSON number at the cursor, and moves past it.
func (w *walker) number() {
	if w.at() == '-' {
		w.i++
	}
	if w.at() == '0' {
		w.i++ // and no digit after it, which the caller refuses
	} else if !w.digits() {
		w.fail()
		return
	}
	if w.at() == '.' {
		w.i++
		if !w.digits() {
			w.fail()
			return
		}
	}
	if c := w.at(); c == 'e' || c == 'E' {
		w.i++
		if c := w.at(); c == '+' || c == '-' {
			w.i++
		}
		if !w.digits() {
			w.fail()
		}
	}
}

// digits moves past the digits at the cursor, and reports whether there
// were any.
func (w *walker) digits() bool {
	some := false
	for c := w.at(); c >= '0' && c <= '9'; c = w.at() {
		w.i++
		some = true
	}
	return some
}

// str checks the JSON string at the cursor, moves past it and returns
// its length in UTF-8 bytes once decoded, as encoding/json decodes it:
// escapes resolved, a surrogate pair joined, a lone surrogate or a byte
// that is not UTF-8 replaced by U+FFFD.
func (w *walker) str() (n int64) {
	w.i++ // the opening quote
	for w.i < len(w.b) || w.more() {
		b, i := w.b, w.i
		for i < len(b) {
			c := b[i]
			if c < ' ' {
				w.fail()
				return 0
			}
			if c == '"' {
				w.i = i + 1
				return n
			}
			if c != '\\' && c < utf8.RuneSelf {
				n++
				i++
				continue
			}
			w.i = i
			if c == '\\' {
				n += w.escape()
			} else {
				n += w.char()
			}
			b, i = w.b, w.i
		}
		w.i = i
	}
	w.fail()
	return 0
}

// char moves past the character at the cursor, beyond ASCII, and returns
// its length in UTF-8 bytes once decoded: 3 for a byte that is not UTF-8,
// which decodes to U+FFFD.
func (w *walker) char() int64 {
	w.ensure(utf8.UTFMax) // it may go on past the window
	rn, size := utf8.DecodeRune(w.b[w.i:])
	w.i += size
	if rn == utf8.RuneError && size == 1 {
		return 3
	}
	return int64(size)
}

// escape checks the escape at the cursor ('\\'), moves past it and
// returns the UTF-8 bytes it decodes to; a \u escape of a high surrogate
// takes the low one that follows it.
func (w *walker) escape() int64 {
	w.ensure(len(`\ud83d\ude00`))
	b := w.b[w.i:]
	switch byteAt(b, 1) {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		w.i += 2
		return 1
	case 'u':
	default:
		w.fail()
		return 0
	}
	rn := hex4(b[2:])
	if rn < 0 {
		w.fail()
		return 0
	}
	w.i += 6
	if !utf16.IsSurrogate(rn) {
		return int64(utf8.RuneLen(rn))
	}
	if byteAt(b, 6) == '\\' && byteAt(b, 7) == 'u' && utf16.DecodeRune(rn, hex4(b[8:])) != unicode.ReplacementChar {
		w.i += 6
		return 4
	}
	return 3 // U+FFFD
}

// byteAt is b[i], or 0 past its end.
func byteAt(b []byte, i int) byte {
	if i < len(b) {
		return b[i]
	}
	return 0
}

// hex4 is the rune of a \u escape's four hex digits at the start of s,
// -1 when they are not four hex digits.
func hex4(s []byte) rune {
	var r rune
	for k := range 4 {
		d := unhex(byteAt(s, k))
		if d < 0 {
			return -1
		}
		r = r*16 + d
	}
	return r
}

// unhex is the value of the hex digit c, -1 when it is none.
func unhex(c byte) rune {
	if '0' <= c && c <= '9' {
		return rune(c - '0')
	}
	if c |= 0x20; 'a' <= c && c <= 'f' { // 'A' to 'F' as lower case
		return rune(c-'a') + 10
	}
	return -1
}

// decodeString is a string value the walk checked, decoded.
func decodeString(raw []byte) string {
	if inner := raw[1 : len(raw)-1]; isPlainASCII(inner) {
		return string(inner)
	}
	var s string
	_ = json.Unmarshal(raw, &s) // valid: the walk checked it
	return s
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
