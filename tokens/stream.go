package tokens

import (
	"bytes"
)

const (
	// maxLine is the longest line examined whole.
	maxLine = 1 << 20
	// lineTail is how much of a longer line is kept and examined: usage
	// comes last in every event that carries it, so it survives.
	lineTail = 64 << 10
)

var (
	usageKey = []byte(`"usage"`)
	tierKey  = []byte(`"service_tier"`)
)

// StreamScanner picks the token usage out of a server-sent event stream as
// the stream is copied to the client; it is an io.Writer meant for an
// io.MultiWriter or a tee. It understands:
//
//   - OpenAI Chat Completions with stream_options.include_usage: the last
//     chunk's "usage".
//   - OpenAI Responses: "response.usage" of response.completed (or
//     response.incomplete / response.failed).
//   - Anthropic Messages: "message.usage" of message_start for the input and
//     cache fields, then "usage" of each message_delta, whose output_tokens
//     is cumulative.
//
// It finds every non-null "usage" object on each line and keeps the latest
// value of each field, the cached tokens included (see Usage.Cached). The
// tier is the latest "service_tier" string anywhere on a line that is a
// tier name: OpenAI Chat's on every chunk, the Responses' in the response
// object of response.completed (after that of response.created, which
// echoes the request's), Anthropic's in message_start's usage. Lines may
// arrive split across writes at any point; the result is the same.
// Ordinary content lines are only searched for the "usage" and
// "service_tier" keys, not decoded. At most 1 MiB of an unfinished line is
// held; of a longer line only its last 64 KiB is examined.
//
// The zero value is ready to use. A StreamScanner is not safe for
// concurrent use.
type StreamScanner struct {
	line   []byte // the unfinished line carried over from earlier writes
	long   bool   // line overflowed maxLine and holds only its tail
	fields usageFields
}

// Write scans p. It always returns len(p), nil.
func (s *StreamScanner) Write(p []byte) (int, error) {
	n := len(p)
	for {
		i := lineEnd(p)
		if i < 0 {
			s.carry(p)
			return n, nil
		}
		if len(s.line) == 0 && !s.long {
			scanLine(&s.fields, p[:i]) // whole line in p: no copy
		} else {
			s.carry(p[:i])
			scanLine(&s.fields, s.line)
			s.line, s.long = s.line[:0], false
			if cap(s.line) > lineTail {
				s.line = nil // do not keep a long line's buffer for the rest of the stream
			}
		}
		p = p[i+1:]
	}
}

// Usage returns the usage seen so far. ok is false when the stream has
// carried none; the Usage then has only the tier, if one was seen. An
// unfinished last line counts, as if the stream ended there.
func (s *StreamScanner) Usage() (u Usage, ok bool) {
	f := s.fields
	scanLine(&f, s.line)
	return f.usage()
}

// lineEnd returns the index of the first line terminator in p (\n or \r;
// \r\n then ends a line and an empty one), or -1.
func lineEnd(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	head := p
	if n >= 0 {
		head = p[:n]
	}
	if r := bytes.IndexByte(head, '\r'); r >= 0 {
		return r
	}
	return n
}

// carry appends p to the unfinished line, keeping only the last lineTail
// bytes once the line grows past maxLine.
func (s *StreamScanner) carry(p []byte) {
	if !s.long && len(s.line)+len(p) <= maxLine {
		s.line = append(s.line, p...)
		return
	}
	s.long = true
	if len(p) >= lineTail {
		s.line = append(s.line[:0], p[len(p)-lineTail:]...)
		return
	}
	keep := min(len(s.line), lineTail-len(p))
	s.line = append(s.line[:copy(s.line, s.line[len(s.line)-keep:])], p...)
}

// scanLine merges into f every usage object on line, up to one that is
// not valid JSON or does not close within the line: there the scan for
// usage stops. Then it takes the line's last service_tier that is a tier
// name. A line longer than maxLine is cut to its tail first, as carry
// does when it arrives in pieces.
func scanLine(f *usageFields, line []byte) {
	if len(line) > maxLine {
		line = line[len(line)-lineTail:]
	}
	scanUsage(f, line)
	for rest := line; ; {
		var ok bool
		if rest, ok = afterKey(rest, tierKey); !ok {
			return
		}
		if t, ok := tierOf(rest); ok {
			f.Tier = t
		}
	}
}

// scanUsage merges into f every usage object on line, up to one that is
// not valid JSON or does not close within the line.
func scanUsage(f *usageFields, line []byte) {
	for {
		var ok bool
		if line, ok = afterKey(line, usageKey); !ok {
			return
		}
		if len(line) == 0 || line[0] != '{' {
			continue // "usage":null in every OpenAI chunk but the last
		}
		w := walker{b: line}
		g := w.usageObject()
		if w.bad {
			return
		}
		f.merge(&g)
		line = line[w.i:]
	}
}

// afterKey finds the next key on line that is quoted, as written, and
// followed by a colon, and returns the rest of the line from its value
// (spaces skipped); ok is false when there is none. A quote inside a JSON
// string is escaped, and in valid JSON no key follows a backslash, so what
// it finds is a key.
func afterKey(line, quoted []byte) (rest []byte, ok bool) {
	for {
		i := bytes.Index(line, quoted)
		if i < 0 {
			return nil, false
		}
		escaped := i > 0 && line[i-1] == '\\'
		line = skipSpace(line[i+len(quoted):])
		if !escaped && len(line) > 0 && line[0] == ':' {
			return skipSpace(line[1:]), true
		}
	}
}

// skipSpace is b without its leading spaces and tabs.
func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}
