package tokens

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

const usageEvent = `data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":1117,"completion_tokens":200,"total_tokens":1317,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}` + "\n\n"

// crlf writes a stream's line ends as "\r\n".
func crlf(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }

// filterIn feeds stream to a UsageChunkFilter in writes of the sizes drawn
// from next, then closes it, and returns what came out.
func filterIn(t *testing.T, stream string, next func() int) string {
	t.Helper()
	var out bytes.Buffer
	f := UsageChunkFilter{W: &out}
	for p := []byte(stream); len(p) > 0; {
		k := min(max(next(), 1), len(p))
		if n, err := f.Write(p[:k]); n != k || err != nil {
			t.Fatalf("Write = %d, %v; want %d, nil", n, err, k)
		}
		p = p[k:]
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	return out.String()
}

// feeds are the ways a test feeds a stream to a filter.
var feeds = []struct {
	name string
	next func() func() int
}{
	{"whole", func() func() int { return func() int { return 1 << 30 } }},
	{"bytes", func() func() int { return func() int { return 1 } }},
	{"chunks of 7", func() func() int { return func() int { return 7 } }},
	{"random", func() func() int { x := uint64(88172645463325252); return func() int { return int(xorshift(&x) % 40) } }},
}

// xorshift steps x and returns it.
func xorshift(x *uint64) uint64 {
	*x ^= *x << 13
	*x ^= *x >> 7
	*x ^= *x << 17
	return *x
}

func TestUsageChunkFilter(t *testing.T) {
	stream := chatStream(5)
	without := strings.Replace(stream, usageEvent, "", 1)
	if without == stream {
		t.Fatal("the test stream has no usage event")
	}
	chunk := func(s string) string { return "data: " + s + "\n\n" }
	big := `{"choices":[],"usage":{"prompt_tokens":1},"pad":"` + strings.Repeat("p", maxLine) + `"}`
	// 1 MiB with "data: ", and a byte more.
	mib := `{"choices":[],"usage":{},"pad":"` + strings.Repeat("p", maxLine-len(`data: {"choices":[],"usage":{},"pad":""}`)) + `"}`
	for _, tt := range []struct {
		name, in, want string
	}{
		{"include_usage stream", stream, without},
		{"CRLF", crlf(stream), crlf(without)},
		{"CR", strings.ReplaceAll(stream, "\n", "\r"), strings.ReplaceAll(without, "\n", "\r")},
		{"stream without the usage chunk", withoutUsage(stream), withoutUsage(stream)},
		{"no space after data:", chunk("x") + `data:{"choices":[ ],"usage":{}}` + "\n\n" + "data: [DONE]\n\n", chunk("x") + "data: [DONE]\n\n"},
		{"first event", chunk(`{"choices":[],"usage":{"prompt_tokens":1}}`) + chunk("[DONE]"), chunk("[DONE]")},
		{"last, unended", chunk("x") + `data: {"choices":[],"usage":{}}` + "\n", chunk("x") + `data: {"choices":[],"usage":{}}` + "\n"},
		{"last, unfinished", chunk("x") + `data: {"choices":[],"usage":{}}`, chunk("x") + `data: {"choices":[],"usage":{}}`},
		{"choices not empty", chunk(`{"choices":[{"index":0}],"usage":{"prompt_tokens":1}}`), chunk(`{"choices":[{"index":0}],"usage":{"prompt_tokens":1}}`)},
		{"usage null", chunk(`{"choices":[],"usage":null}`), chunk(`{"choices":[],"usage":null}`)},
		{"no choices", chunk(`{"usage":{"prompt_tokens":1}}`), chunk(`{"usage":{"prompt_tokens":1}}`)},
		{"the last choices count", chunk(`{"choices":[],"choices":[1],"usage":{}}`), chunk(`{"choices":[],"choices":[1],"usage":{}}`)},
		{"the last usage counts", chunk(`{"choices":[],"usage":{},"usage":null}`), chunk(`{"choices":[],"usage":{},"usage":null}`)},
		{"escaped key", chunk(`{"choices":[],"\u0075sage":{}}`), chunk(`{"choices":[],"\u0075sage":{}}`)},
		{"not JSON", chunk(`{"choices":[],"usage":{}`), chunk(`{"choices":[],"usage":{}`)},
		{"an array", chunk(`[{"choices":[],"usage":{}}]`), chunk(`[{"choices":[],"usage":{}}]`)},
		{"another field", "event: x\n" + chunk(`{"choices":[],"usage":{}}`), "event: x\n" + chunk(`{"choices":[],"usage":{}}`)},
		{"a field name like data", `datum: {"choices":[],"usage":{}}` + "\n\n", `datum: {"choices":[],"usage":{}}` + "\n\n"},
		{"a second data line", `data: {"choices":[],"usage":{}}` + "\ndata: x\n\n", `data: {"choices":[],"usage":{}}` + "\ndata: x\n\n"},
		{"a comment before", ": hi\n" + chunk(`{"choices":[],"usage":{}}`) + chunk("[DONE]"), ": hi\n" + chunk("[DONE]")},
		{"a comment after", `data: {"choices":[],"usage":{}}` + "\n: hi\n\n", `data: {"choices":[],"usage":{}}` + "\n: hi\n\n"},
		{"two in a row", strings.Repeat(chunk(`{"choices":[],"usage":{}}`), 2) + chunk("[DONE]"), chunk("[DONE]")},
		{"blank lines", "\n\n\r\n" + chunk(`{"choices":[],"usage":{}}`) + "\n", "\n\n\r\n\n"},
		{"CR then CRLF", `data: {"choices":[],"usage":{}}` + "\r\r\n" + chunk("x"), chunk("x")},
		{"over 1 MiB", "data: " + big + "\n\n", "data: " + big + "\n\n"},
		{"1 MiB", "data: " + mib + "\n\n" + chunk("[DONE]"), chunk("[DONE]")},
		{"1 MiB and a byte", "data:  " + mib + "\n\n", "data:  " + mib + "\n\n"},
		{"not SSE", "<html>\n<body>502</body>\n</html>\n", "<html>\n<body>502</body>\n</html>\n"},
		{"empty", "", ""},
	} {
		for _, feed := range feeds {
			if len(tt.in) > 1<<20 && feed.name == "bytes" {
				continue // slow, and chunks of 7 cover it
			}
			if got := filterIn(t, tt.in, feed.next()); got != tt.want {
				t.Errorf("%s, %s: got %.200q; want %.200q", tt.name, feed.name, got, tt.want)
			}
			if want := filterWhole(tt.in); want != tt.want {
				t.Errorf("%s: the reference gives %.200q", tt.name, want)
			}
		}
	}
}

// filterWhole is UsageChunkFilter over a whole stream, done plainly: the
// reference its fuzz target checks it against.
func filterWhole(stream string) string {
	var lines []string
	for len(stream) > 0 {
		i := strings.IndexAny(stream, "\r\n")
		switch {
		case i < 0:
			i = len(stream)
		case strings.HasPrefix(stream[i:], "\r\n"):
			i += 2
		default:
			i++
		}
		lines, stream = append(lines, stream[:i]), stream[i:]
	}
	blank := func(k int) bool { return k < len(lines) && strings.TrimRight(lines[k], "\r\n") == "" }
	var b strings.Builder
	inEvent := false
	for k := 0; k < len(lines); k++ {
		text := strings.TrimRight(lines[k], "\r\n")
		if !inEvent && blank(k+1) && len(text) <= maxLine && isUsageChunk([]byte(text)) {
			k++ // the chunk, and the blank line after it
			continue
		}
		b.WriteString(lines[k])
		switch {
		case text == "":
			inEvent = false
		case text[0] != ':':
			inEvent = true
		}
	}
	return b.String()
}

// TestUsageChunkFilterPassesEventsAtOnce: each event is written by the
// Write that completes it, and a line that cannot be a usage chunk is
// written as it comes.
func TestUsageChunkFilterPassesEventsAtOnce(t *testing.T) {
	var out bytes.Buffer
	f := UsageChunkFilter{W: &out}
	write := func(s, want string) {
		t.Helper()
		out.Reset()
		f.Write([]byte(s))
		if out.String() != want {
			t.Errorf("after writing %.60q: out %.60q, want %.60q", s, out.String(), want)
		}
	}
	for _, e := range strings.SplitAfter(chatStream(3), "\n\n") {
		if e == usageEvent {
			write(e, "")
		} else {
			write(e, e)
		}
	}
	content := chatChunk("hi")
	write(content[:10], "")
	write(content[10:len(content)-1], content[:len(content)-1])
	write("\n", "\n")
	write("event: ", "event: ")
	write("x\n", "x\n")
	write("da", "da") // in an event begun by another line
	write("ta: 1\n", "ta: 1\n")
	write("\n", "\n")
	write("da", "")
	write("ta: [DONE]", "")
	write("\r", "data: [DONE]\r")
	write("\n", "\n")
	write("\n", "\n")
	write("dat", "")
	write("um: 1", "datum: 1")
	write("\n\n", "\n\n")
	write(": ping", ": ping")
	write("\n", "\n")
	write(`data: {"choices":[],"usage":{}}`, "")
	write("\r\n", "")
	write("\r", "")
	write("\n", "")
	write(`data: {"choices":[],"usage":{}}`+"\n", "")
	write("data: x\n", `data: {"choices":[],"usage":{}}`+"\ndata: x\n")
}

// TestUsageChunkFilterWriteErrors: an error from W is returned by that
// Write, and by every later Write and Close.
func TestUsageChunkFilterWriteErrors(t *testing.T) {
	boom := errors.New("boom")
	for _, tt := range []struct {
		name, first string
	}{
		{"a held line", "data: x"},
		{"the chunk held", `data: {"choices":[],"usage":{}}` + "\n"},
	} {
		w := &failingWriter{err: boom}
		f := UsageChunkFilter{W: w}
		if _, err := f.Write([]byte(tt.first)); err != nil {
			t.Fatalf("%s: Write = %v, want nil: nothing is written yet", tt.name, err)
		}
		n, err := f.Write([]byte("data: y\n\n"))
		if !errors.Is(err, boom) || n == len("data: y\n\n") {
			t.Errorf("%s: Write = %d, %v; want fewer, %v", tt.name, n, err, boom)
		}
		if _, err := f.Write([]byte("\n")); !errors.Is(err, boom) {
			t.Errorf("%s: a later Write = %v, want %v", tt.name, err, boom)
		}
		if err := f.Close(); !errors.Is(err, boom) {
			t.Errorf("%s: Close = %v, want %v", tt.name, err, boom)
		}
	}
	w := &failingWriter{err: boom}
	f := UsageChunkFilter{W: w}
	if n, err := f.Write([]byte("event: x\n")); n != 0 || !errors.Is(err, boom) {
		t.Errorf("Write = %d, %v; want 0, %v: W took none of it", n, err, boom)
	}
	short := UsageChunkFilter{W: shortWriter{}}
	if _, err := short.Write([]byte("event: x\n")); err == nil {
		t.Errorf("a short write: Write = nil error")
	}
	f = UsageChunkFilter{W: &failingWriter{err: boom}}
	f.Write([]byte("data: x"))
	if err := f.Close(); !errors.Is(err, boom) {
		t.Errorf("Close writing the held line = %v, want %v", err, boom)
	}
}

// TestUsageChunkFilterWritesNoEmptySlice: W is never called with nothing
// to write (a zero-length Write to an http.ResponseWriter still sends its
// header), so Close with nothing held does not call it, and reports no
// error even from a W that would fail.
func TestUsageChunkFilterWritesNoEmptySlice(t *testing.T) {
	for _, stream := range []string{chatStream(3), crlf(chatStream(2)), "datum: 1\n\ndata: x\n\n: c\n\n", "dx\r\rdata: [DONE]\n\n"} {
		for _, feed := range feeds {
			var w noEmptyWriter
			f := UsageChunkFilter{W: &w}
			next := feed.next()
			for p := []byte(stream); len(p) > 0; {
				k := min(max(next(), 1), len(p))
				f.Write(p[:k])
				p = p[k:]
			}
			f.Close()
			if w.empty > 0 || w.out.String() != filterWhole(stream) {
				t.Errorf("%.40q, %s: %d empty writes, out %.60q; want none, %.60q", stream, feed.name, w.empty, w.out.String(), filterWhole(stream))
			}
		}
	}
	f := UsageChunkFilter{W: &failingWriter{err: errors.New("boom")}}
	if err := f.Close(); err != nil {
		t.Errorf("Close with nothing held = %v, want nil: nothing is written", err)
	}
}

// noEmptyWriter keeps what is written to it, and counts the writes of
// nothing.
type noEmptyWriter struct {
	out   bytes.Buffer
	empty int
}

func (w *noEmptyWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		w.empty++
	}
	return w.out.Write(p)
}

// failingWriter fails every write.
type failingWriter struct{ err error }

func (w *failingWriter) Write(p []byte) (int, error) { return 0, w.err }

// shortWriter writes less than it is given, with no error.
type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

// TestUsageChunkFilterBoundedBuffer: a line of no end is passed through
// once it is over 1 MiB, and no more of it is held.
func TestUsageChunkFilterBoundedBuffer(t *testing.T) {
	var out countingWriter
	f := UsageChunkFilter{W: &out}
	f.Write([]byte("data: "))
	chunk := []byte(strings.Repeat("x", 32<<10))
	for range 10 << 20 / len(chunk) {
		f.Write(chunk)
		if c := cap(f.line); c > 2*maxLine {
			t.Fatalf("holding %d bytes of one unfinished line, want at most %d", c, 2*maxLine)
		}
	}
	if want := len("data: ") + 10<<20; out.n != want {
		t.Errorf("passed on %d bytes, want %d", out.n, want)
	}
	f.Write([]byte("\n"))
	if f.line != nil {
		t.Errorf("after the line ended, still holding a buffer of %d bytes", cap(f.line))
	}
}

// TestUsageChunkFilterKeepsAShortBuffer: the buffer of a held line of up
// to lineTail bytes is kept for the next, so holding one again, split
// across writes, allocates nothing; a longer one's is let go (see
// TestUsageChunkFilterBoundedBuffer).
func TestUsageChunkFilterKeepsAShortBuffer(t *testing.T) {
	line := []byte("data: " + strings.Repeat("x", lineTail-len("data: ")))
	end := []byte("\n\n")
	f := UsageChunkFilter{W: &countingWriter{}}
	if a := testing.AllocsPerRun(20, func() { f.Write(line); f.Write(end) }); a != 0 {
		t.Errorf("holding a line of %d bytes again allocates %v times, want 0", len(line), a)
	}
	if cap(f.line) != lineTail {
		t.Errorf("after the line, a buffer of %d bytes is kept, want %d", cap(f.line), lineTail)
	}
}

// countingWriter counts what is written to it.
type countingWriter struct{ n int }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}

// TestUsageChunkFilterCloseStartsAfresh: after Close, the filter takes a
// new stream from its start.
func TestUsageChunkFilterCloseStartsAfresh(t *testing.T) {
	var out bytes.Buffer
	f := UsageChunkFilter{W: &out}
	f.Write([]byte("event: x\ndata: {\"cho"))
	f.Close()
	f.Write([]byte(`data: {"choices":[],"usage":{}}` + "\n\n"))
	f.Close()
	if want := "event: x\ndata: {\"cho"; out.String() != want {
		t.Errorf("out = %q, want %q", out.String(), want)
	}
}

// TestUsageChunkFilterContentDoesNotAllocate: passing a content chunk
// allocates nothing.
func TestUsageChunkFilterContentDoesNotAllocate(t *testing.T) {
	chunk := []byte(chatChunk(" hello"))
	f := UsageChunkFilter{W: &countingWriter{}}
	if a := testing.AllocsPerRun(100, func() { f.Write(chunk) }); a != 0 {
		t.Errorf("Write of a content chunk allocates %v times, want 0", a)
	}
}

// FuzzUsageChunkFilter: in writes of any sizes, the filter gives what the
// plain reference gives over the whole stream.
func FuzzUsageChunkFilter(f *testing.F) {
	f.Add([]byte(chatStream(2)), uint64(1))
	f.Add([]byte(crlf(chatStream(1))), uint64(7))
	f.Add([]byte(": c\r\ndata: {\"choices\":[],\"usage\":{}}\r\r\ndata: [DONE]\n\n"), uint64(3))
	f.Add([]byte("event: x\ndata: {\"choices\":[],\"usage\":{}}\n\n\ndata:{\"choices\":[],\"usage\":{}}\ndata: x"), uint64(5))
	f.Fuzz(func(t *testing.T, stream []byte, seed uint64) {
		x := seed | 1
		got := filterIn(t, string(stream), func() int { return int(xorshift(&x) % 16) })
		if want := filterWhole(string(stream)); got != want {
			t.Fatalf("filter(%q) = %q; the reference gives %q", stream, got, want)
		}
	})
}

// BenchmarkUsageChunkFilter passes a chat stream one event a write.
func BenchmarkUsageChunkFilter(b *testing.B) {
	stream := chatStream(200)
	var events [][]byte
	for _, e := range strings.SplitAfter(stream, "\n\n") {
		events = append(events, []byte(e))
	}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		f := UsageChunkFilter{W: &countingWriter{}}
		for _, e := range events {
			f.Write(e)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
