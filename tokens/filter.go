package tokens

import (
	"bytes"
	"io"
)

var (
	dataField  = []byte("data:")
	choicesKey = []byte(`"choices"`)
)

// UsageChunkFilter passes an OpenAI Chat Completions event stream on to W
// as it comes, less the usage chunk that stream_options.include_usage
// adds, for a client that did not ask for it when the proxy did (see
// IncludeUsage). That chunk is an event whose first line is "data:" and a
// JSON object with "choices":[] and a "usage" object (both keys as
// written, without escapes, the last of each counting), followed by the
// blank line that ends the event; both lines are dropped. An event with
// lines before the data line (other than comments), or with more lines
// after it, is passed on whole.
//
// Every other byte is passed on, in order. A line that starts an event
// with "data:" is held until it ends, then passed on or, for the usage
// chunk, held until the next line shows whether it ends the event; any
// other line is passed on as it comes. So an event is written by the
// Write that completes it. A line of more than 1 MiB is passed on
// unexamined. Lines end as in StreamScanner, and may be split across
// writes at any point: the output is the same.
//
// Close writes what is still held at the end of the stream. The zero value
// with W set is ready to use. A UsageChunkFilter is not safe for
// concurrent use.
type UsageChunkFilter struct {
	// W receives the stream.
	W io.Writer

	line    []byte     // the held line so far: a possible usage chunk, or one whole with its end when held
	mode    filterMode // where in a line the cursor is
	held    bool       // line holds a whole usage chunk, awaiting the blank line after it
	inEvent bool       // a line other than a comment came since the last blank line
	cr      fate       // what becomes of a '\n' right after the '\r' that ended the last line
	err     error      // W's first error
	c       cursor     // the write at hand
}

// filterMode is where in a line a UsageChunkFilter is.
type filterMode uint8

const (
	atLineStart filterMode = iota
	passing                // passing the line on
	holding                // holding the line, which may be a usage chunk
)

// fate is what becomes of bytes of the stream.
type fate uint8

const (
	noFate fate = iota
	passed
	kept // in UsageChunkFilter.line
	dropped
)

// cursor is a UsageChunkFilter's place in the write at hand.
type cursor struct {
	p        []byte
	i        int // the next byte to look at
	from     int // the first byte passed on but not yet written
	lineFrom int // where the held line's part in p starts
}

// Write passes p on to W, less what belongs to a usage chunk, and holds
// what may belong to one. It returns W's error, if any, with the bytes of
// p dealt with before it, and that error again ever after.
func (f *UsageChunkFilter) Write(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	f.c = cursor{p: p}
	for f.c.i < len(p) && f.err == nil {
		f.step()
	}
	if f.mode == holding && f.err == nil {
		f.flush(f.c.lineFrom)
		f.line = append(f.line, p[f.c.lineFrom:]...)
		f.c.from = len(p)
	}
	f.flush(len(p))
	n := f.c.from
	f.c = cursor{}
	if f.err != nil {
		return n, f.err
	}
	return len(p), nil
}

// Close writes on what is still held: an unfinished last line, or a usage
// chunk the stream did not end with a blank line. It does not close W.
// After it the filter is as new, for another stream to W, unless W has
// failed: then it returns that error, as Write does.
func (f *UsageChunkFilter) Close() error {
	if f.err == nil && len(f.line) > 0 {
		f.writeLine()
	}
	*f = UsageChunkFilter{W: f.W, line: f.line[:0], err: f.err}
	return f.err
}

// step moves the cursor on through a line's end, its start, or as much of
// it as the write holds.
func (f *UsageChunkFilter) step() {
	if cr := f.cr; cr != noFate {
		f.cr = noFate
		if f.c.p[f.c.i] == '\n' { // the rest of a "\r\n"
			f.take(cr)
			return
		}
	}
	switch f.mode {
	case passing:
		f.passLine()
	case holding:
		f.holdLine()
	default:
		f.lineStart()
	}
}

// lineStart starts the line at the cursor. A blank line after a held usage
// chunk ends its event, and both go; any other line after it is passed
// on, after the chunk.
func (f *UsageChunkFilter) lineStart() {
	c := f.c.p[f.c.i]
	blank := c == '\r' || c == '\n'
	if f.held {
		f.held = false
		if blank {
			f.line = f.line[:0]
			f.inEvent = false
			f.endLine(dropped)
			return
		}
		f.flush(f.c.i)
		f.writeLine()
		f.inEvent = true
	}
	switch {
	case blank:
		f.inEvent = false
		f.endLine(passed)
	case c == 'd' && !f.inEvent:
		f.mode, f.c.lineFrom, f.inEvent = holding, f.c.i, true
	default:
		f.mode = passing
		f.inEvent = f.inEvent || c != ':' // a comment is no part of an event
	}
}

// passLine passes on the line at the cursor up to its end, or to the
// write's end.
func (f *UsageChunkFilter) passLine() {
	j := lineEnd(f.c.p[f.c.i:])
	if j < 0 {
		f.c.i = len(f.c.p)
		return
	}
	f.c.i += j
	f.endLine(passed)
}

// holdLine moves on through the held line to its end, where it is held
// whole if it is a usage chunk and passed on if not, or to the write's
// end. A line seen not to start with "data:", or longer than maxLine, is
// passed on from there.
func (f *UsageChunkFilter) holdLine() {
	p := f.c.p
	end := len(p)
	if j := lineEnd(p[f.c.i:]); j >= 0 {
		end = f.c.i + j
	}
	part := p[f.c.lineFrom:end]
	if !mayStart(f.line, part, dataField) || len(f.line)+len(part) > maxLine {
		f.release()
		return
	}
	if f.c.i = end; end == len(p) {
		return // Write keeps the rest
	}
	held := len(f.line)
	f.line = append(f.line, part...)
	if !isUsageChunk(f.line) {
		f.line = f.line[:held]
		f.release()
		f.endLine(passed)
		return
	}
	f.flush(f.c.lineFrom)
	f.c.from, f.held = end, true
	f.endLine(kept)
}

// release passes on the held line, and the rest of it as it comes: what
// earlier writes held is written, and the part in the write at hand joins
// what it passes on, which starts there.
func (f *UsageChunkFilter) release() {
	f.mode = passing
	if len(f.line) > 0 {
		f.writeLine()
	}
}

// endLine moves the cursor past the line end there, giving it fate, and
// to the start of the next line.
func (f *UsageChunkFilter) endLine(fa fate) {
	if f.c.p[f.c.i] == '\r' {
		f.cr = fa
	}
	f.mode = atLineStart
	f.take(fa)
}

// take moves the cursor past the byte there, giving it fate.
func (f *UsageChunkFilter) take(fa fate) {
	if fa != passed {
		f.flush(f.c.i)
		if fa == kept {
			f.line = append(f.line, f.c.p[f.c.i])
		}
		f.c.from = f.c.i + 1
	}
	f.c.i++
}

// flush writes on what the write at hand passes on up to to.
func (f *UsageChunkFilter) flush(to int) {
	if f.err != nil || to <= f.c.from {
		return
	}
	if f.write(f.c.p[f.c.from:to]) {
		f.c.from = to
	}
}

// writeLine writes on the held line, and lets it go.
func (f *UsageChunkFilter) writeLine() {
	f.write(f.line)
	f.line = f.line[:0]
	if cap(f.line) > lineTail {
		f.line = nil // do not keep a long line's buffer for the rest of the stream
	}
}

// write writes b to W, and reports whether it all went.
func (f *UsageChunkFilter) write(b []byte) bool {
	if f.err != nil {
		return false
	}
	n, err := f.W.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	f.err = err
	return err == nil
}

// mayStart reports whether a line that starts with a and then b may start
// with prefix: it does, or it is a part of it so far.
func mayStart(a, b, prefix []byte) bool {
	k := 0
	for _, part := range [2][]byte{a, b} {
		n := min(len(part), len(prefix)-k)
		if !bytes.Equal(part[:n], prefix[k:k+n]) {
			return false
		}
		k += n
	}
	return true
}

// isUsageChunk reports whether line, a whole line of an event stream
// without its end, is "data:" and a JSON object with "choices":[] and a
// "usage" object: the chunk include_usage adds.
func isUsageChunk(line []byte) bool {
	data, ok := bytes.CutPrefix(line, dataField)
	if !ok {
		return false
	}
	choices, usage := false, false
	w := walker{b: data}
	valid := w.object(func(quoted []byte, _ int64) {
		switch {
		case bytes.Equal(quoted, choicesKey):
			from, to := w.span()
			choices = !w.bad && isEmptyArray(data[from:to])
		case bytes.Equal(quoted, usageKey):
			usage = w.peek() == '{'
			w.skip()
		default:
			w.skip()
		}
	})
	return valid && choices && usage
}

// isEmptyArray reports whether raw, a JSON value, is an empty array.
func isEmptyArray(raw []byte) bool {
	return len(raw) >= 2 && raw[0] == '[' && len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0
}
