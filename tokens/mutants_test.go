package tokens

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// scanWithin feeds writes to a fresh StreamScanner, one Write each, and
// returns its Usage. If that does not finish within a second it panics: a
// scanner stuck in a loop cannot be stopped, and would hang every later
// test and example of the binary, so the whole run fails fast instead.
func scanWithin(t *testing.T, writes ...string) (Usage, bool) {
	t.Helper()
	type result struct {
		u  Usage
		ok bool
	}
	done := make(chan result, 1)
	go func() {
		var s StreamScanner
		for _, w := range writes {
			s.Write([]byte(w))
		}
		u, ok := s.Usage()
		done <- result{u, ok}
	}()
	select {
	case r := <-done:
		return r.u, r.ok
	case <-time.After(time.Second):
		panic(fmt.Sprintf("%s: StreamScanner did not finish within a second on %d writes", t.Name(), len(writes)))
	}
}

// A short stream of ordinary lines, one carrying usage, is scanned promptly
// and its usage found: Write moves past every line and every "usage" key.
// It comes first so that a scanner stuck on a line fails here, fast.
func TestStreamScannerFinishesPromptly(t *testing.T) {
	stream := "event: x\n" +
		`data: {"choices":[],"usage":null}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}` + "\n\n" +
		"data: [DONE]\n\n"
	if got, ok := scanWithin(t, stream); !ok || got != (Usage{Input: 3, Output: 4}) {
		t.Errorf("Usage = %+v, %v; want {3 4}, true", got, ok)
	}
}

// A brace inside an escaped string of a usage object does not end the
// object early: the backslash skips the quote after it, and the scan goes on.
func TestStreamScannerEscapedQuoteInUsage(t *testing.T) {
	line := `data: {"usage":{"note":"a\"}b\\","input_tokens":3,"output_tokens":4}}` + "\n"
	if got, ok := scanWithin(t, line); !ok || got != (Usage{Input: 3, Output: 4}) {
		t.Errorf("Usage = %+v, %v; want {3 4}, true", got, ok)
	}
}

// A newline that begins a write ends the line carried over from earlier
// writes there; it is not joined to the text after it, even when a CR
// follows later in the same write.
func TestStreamScannerNewlineAtWriteStartEndsCarriedLine(t *testing.T) {
	got, ok := scanWithin(t,
		`data: {"usage":{"input_tokens":1,`,
		"\n"+`"output_tokens":2}}`+"\r\n")
	if ok {
		t.Errorf("Usage = %+v, true; want none: the usage object was cut by a newline", got)
	}
}

// A CR that begins a write ends the line carried over from earlier writes,
// even with no newline anywhere in that write.
func TestStreamScannerCRAtWriteStartEndsCarriedLine(t *testing.T) {
	got, ok := scanWithin(t,
		`data: {"usage":{"input_tokens":1,`,
		"\r"+`"output_tokens":2}}`)
	if ok {
		t.Errorf("Usage = %+v, true; want none: the usage object was cut by a CR", got)
	}
}

// A line of exactly maxLine bytes is examined whole, so usage at its head
// is found; only longer lines are cut to their tail.
func TestStreamScannerLineOfMaxLineIsWhole(t *testing.T) {
	head := `data: {"usage":{"input_tokens":5,"output_tokens":6},"text":"`
	tail := `"}`
	line := head + strings.Repeat("a", maxLine-len(head)-len(tail)) + tail
	if len(line) != maxLine {
		t.Fatalf("test line is %d bytes, want %d", len(line), maxLine)
	}
	want := Usage{Input: 5, Output: 6}
	if got, ok := scanWithin(t, line+"\n"); !ok || got != want {
		t.Errorf("whole: Usage = %+v, %v; want %+v, true", got, ok, want)
	}
	if got, ok := scanChunks(line+"\n", 4096); !ok || got != want {
		t.Errorf("chunks of 4096: Usage = %+v, %v; want %+v, true", got, ok, want)
	}
	if got, ok := scanWithin(t, line); !ok || got != want {
		t.Errorf("unfinished: Usage = %+v, %v; want %+v, true", got, ok, want)
	}
}

// A line that begins with the "usage" key itself (no "data: " prefix) is
// still read.
func TestStreamScannerUsageKeyAtLineStart(t *testing.T) {
	want := Usage{Input: 2, Output: 3}
	if got, ok := scanWithin(t, `"usage":{"input_tokens":2,"output_tokens":3}`+"\n"); !ok || got != want {
		t.Errorf("finished line: Usage = %+v, %v; want %+v, true", got, ok, want)
	}
	if got, ok := scanWithin(t, `"usage":{"input_tokens":2,"output_tokens":3}`); !ok || got != want {
		t.Errorf("unfinished line: Usage = %+v, %v; want %+v, true", got, ok, want)
	}
}

// A line cut right after the "usage" key, or after its colon and spaces,
// carries no usage and is passed over without a panic.
func TestStreamScannerLineEndsAfterUsageKey(t *testing.T) {
	for _, line := range []string{`data: {"usage"`, `data: {"usage":`, `data: {"usage": 	`} {
		for _, end := range []string{"\n", ""} {
			if got, ok := scanWithin(t, line+end); ok {
				t.Errorf("%q: Usage = %+v, true; want none", line+end, got)
			}
		}
	}
}

// A usage object that does not close within its line yields nothing, and
// the scan of that line stops: a complete "usage" nested inside the
// unclosed one is not taken for the answer's usage.
func TestStreamScannerUnclosedUsageStopsLine(t *testing.T) {
	line := `data: {"usage":{"input_tokens":5,"details":{"usage":{"output_tokens":9}}`
	for _, end := range []string{"\n", ""} {
		if got, ok := scanWithin(t, line+end); ok {
			t.Errorf("%q: Usage = %+v, true; want none", line+end, got)
		}
	}
}

// Once a line ends, a line buffer of at most lineTail bytes is kept for the
// next split line; only larger ones are let go.
func TestStreamScannerKeepsLineTailBuffer(t *testing.T) {
	s := StreamScanner{line: make([]byte, 0, lineTail)}
	s.Write([]byte("data: {"))
	s.Write([]byte("}\n"))
	if c := cap(s.line); c != lineTail {
		t.Errorf("after the line ended, buffer capacity %d, want %d kept", c, lineTail)
	}
	s = StreamScanner{line: make([]byte, 0, lineTail+1)}
	s.Write([]byte("data: {"))
	s.Write([]byte("}\n"))
	if s.line != nil {
		t.Errorf("after the line ended, buffer of capacity %d kept, want it let go", cap(s.line))
	}
}

// When total_tokens exceeds the output and no input field is given, the
// difference is the input.
func TestFromBodyTotalWithOutputOnly(t *testing.T) {
	for _, body := range []string{
		`{"usage":{"completion_tokens":5,"total_tokens":40}}`,
		`{"usage":{"output_tokens":5,"total_tokens":40}}`,
	} {
		if got, ok := FromBody([]byte(body)); !ok || got != (Usage{Input: 35, Output: 5}) {
			t.Errorf("FromBody(%s) = %+v, %v; want {35 5}, true", body, got, ok)
		}
	}
}

// A query string is cut off before the API is recognised, even when the
// path is nothing but a query.
func TestAPIOfQueryOnlyPath(t *testing.T) {
	for _, path := range []string{"?/v1/chat/completions", "?x=/messages"} {
		if got := apiOf(path); got != apiUnknown {
			t.Errorf("apiOf(%q) = %d, want apiUnknown", path, got)
		}
	}
	if got := apiOf("/v1/messages?beta=true"); got != apiMessages {
		t.Errorf("apiOf with a query = %d, want apiMessages", got)
	}
}
