package tokens

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func chatChunk(content string) string {
	return `data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":"` + content + `"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
}

// chatStream is an OpenAI Chat Completions stream of n content chunks with
// stream_options.include_usage set.
func chatStream(n int) string {
	var b strings.Builder
	b.WriteString(`data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	for i := range n {
		b.WriteString(chatChunk(fmt.Sprintf(" word%d", i)))
	}
	b.WriteString(`data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n")
	b.WriteString(`data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":1117,"completion_tokens":200,"total_tokens":1317,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// withoutUsage turns an include_usage chat stream into one without: no
// usage chunk, and no "usage":null in the others.
func withoutUsage(stream string) string {
	var b strings.Builder
	for _, e := range strings.SplitAfter(stream, "\n\n") {
		if !strings.Contains(e, `"choices":[]`) {
			b.WriteString(strings.ReplaceAll(e, `,"usage":null`, ""))
		}
	}
	return b.String()
}

const responsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","service_tier":"auto","output":[],"usage":null}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"The word \"usage\": {\"input_tokens\": 999} is just text"}

event: response.completed
data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","status":"completed","service_tier":"flex","output":[{"type":"message","content":[{"type":"output_text","text":"The word \"usage\": {\"input_tokens\": 999} is just text, and \"service_tier\":\"priority\" too"}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":32},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48},"user":null,"metadata":{}}}

`

const anthropicStream = "event: message_start\r\n" +
	`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1,"service_tier":"standard"}}}` + "\r\n\r\n" +
	"event: content_block_start\r\n" +
	`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\r\n\r\n" +
	"event: ping\r\n" +
	`data: {"type": "ping"}` + "\r\n\r\n" +
	"event: content_block_delta\r\n" +
	`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}` + "\r\n\r\n" +
	"event: message_delta\r\n" +
	`data: {"type":"message_delta","delta":{"stop_reason":null,"stop_sequence":null},"usage":{"output_tokens":7}}` + "\r\n\r\n" +
	"event: content_block_stop\r\n" +
	`data: {"type":"content_block_stop","index":0}` + "\r\n\r\n" +
	"event: message_delta\r\n" +
	`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage": {"output_tokens": 15}}` + "\r\n\r\n" +
	"event: message_stop\r\n" +
	`data: {"type":"message_stop"}` + "\r\n\r\n"

// scanWhole, scanBytes and scanChunks feed a stream in one write, a byte at
// a time, and in writes of size n.
func scanWhole(stream string) (Usage, bool) {
	var s StreamScanner
	s.Write([]byte(stream))
	return s.Usage()
}

func scanBytes(stream string) (Usage, bool) { return scanChunks(stream, 1) }

func scanChunks(stream string, n int) (Usage, bool) {
	var s StreamScanner
	for p := []byte(stream); len(p) > 0; {
		k := min(n, len(p))
		if got, err := s.Write(p[:k]); got != k || err != nil {
			panic(fmt.Sprintf("Write = %d, %v; want %d, nil", got, err, k))
		}
		p = p[k:]
	}
	return s.Usage()
}

func TestStreamScanner(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   Usage
		wantOK bool
	}{
		{
			name:   "openai chat include_usage",
			stream: chatStream(20),
			want:   Usage{Input: 1117, Output: 200, Cached: 1024, Tier: "default"},
			wantOK: true,
		},
		{
			name:   "openai chat without include_usage",
			stream: withoutUsage(chatStream(20)),
			want:   Usage{Tier: "default"}, // the tier alone
			wantOK: false,
		},
		{
			name:   "openai chat cut before the usage chunk",
			stream: chatStream(20)[:strings.Index(chatStream(20), `"choices":[]`)],
			want:   Usage{Tier: "default"},
			wantOK: false,
		},
		{
			name:   "openai responses",
			stream: responsesStream,
			want:   Usage{Input: 37, Output: 11, Cached: 32, Tier: "flex"},
			wantOK: true,
		},
		{
			name:   "anthropic cumulative message_delta",
			stream: anthropicStream,
			want:   Usage{Input: 2125, Output: 15, Cached: 2000, Tier: "standard"},
			wantOK: true,
		},
		{
			name:   "anthropic message_delta restating input",
			stream: anthropicStream + `data: {"type":"message_delta","usage":{"input_tokens":30,"output_tokens":16}}` + "\n\n",
			want:   Usage{Input: 2130, Output: 16, Cached: 2000, Tier: "standard"},
			wantOK: true,
		},
		{
			name: "anthropic error mid-stream keeps what was seen",
			stream: anthropicStream[:strings.Index(anthropicStream, "event: message_delta")] +
				"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
			want:   Usage{Input: 2125, Output: 1, Cached: 2000, Tier: "standard"},
			wantOK: true,
		},
		{
			name:   "final line without newline",
			stream: `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`,
			want:   Usage{Input: 3, Output: 4},
			wantOK: true,
		},
		{
			name:   "truncated usage object",
			stream: `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_to`,
			wantOK: false,
		},
		{
			name:   "line longer than the limit keeps its tail",
			stream: `data: {"type":"response.completed","response":{"output":[{"text":"` + strings.Repeat("a", 3*maxLine) + `"}],"usage":{"input_tokens":5,"output_tokens":800000}}}` + "\n\n",
			want:   Usage{Input: 5, Output: 800000},
			wantOK: true,
		},
		{
			name:   "usage at the head of an over-long line is dropped",
			stream: `data: {"usage":{"input_tokens":5,"output_tokens":6},"text":"` + strings.Repeat("a", maxLine) + `"}` + "\n\n",
			wantOK: false,
		},
		{name: "empty", stream: ``},
		{name: "not sse", stream: "<html>\n<body>502</body>\n</html>\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, feed := range []struct {
				name string
				scan func(string) (Usage, bool)
			}{
				{"whole", scanWhole},
				{"bytes", scanBytes},
				{"chunks of 7", func(s string) (Usage, bool) { return scanChunks(s, 7) }},
				{"chunks of 4096", func(s string) (Usage, bool) { return scanChunks(s, 4096) }},
			} {
				if len(tt.stream) > 1<<20 && feed.name == "bytes" {
					continue // slow, and chunks of 7 cover it
				}
				got, ok := feed.scan(tt.stream)
				if got != tt.want || ok != tt.wantOK {
					t.Errorf("%s: Usage = %+v, %v; want %+v, %v", feed.name, got, ok, tt.want, tt.wantOK)
				}
			}
		})
	}
}

func TestStreamScannerUsageMidStream(t *testing.T) {
	var s StreamScanner
	i := strings.Index(anthropicStream, "event: content_block_start")
	s.Write([]byte(anthropicStream[:i]))
	if got, ok := s.Usage(); !ok || got != (Usage{Input: 2125, Output: 1, Cached: 2000, Tier: "standard"}) {
		t.Errorf("after message_start: Usage = %+v, %v", got, ok)
	}
	s.Write([]byte(anthropicStream[i:]))
	if got, ok := s.Usage(); !ok || got != (Usage{Input: 2125, Output: 15, Cached: 2000, Tier: "standard"}) {
		t.Errorf("at the end: Usage = %+v, %v", got, ok)
	}
}

func TestStreamScannerBoundedBuffer(t *testing.T) {
	var s StreamScanner
	chunk := []byte(strings.Repeat("x", 32<<10))
	for range 10 << 20 / len(chunk) {
		s.Write(chunk)
	}
	if c := cap(s.line); c > 2*maxLine {
		t.Errorf("holding %d bytes of one unfinished line, want at most %d", c, 2*maxLine)
	}
	s.Write([]byte("\n"))
	if c := cap(s.line); c > lineTail {
		t.Errorf("after the line ended, still holding %d bytes", c)
	}
	s.Write(make([]byte, 100<<20)) // one huge write with no newline
	if c := cap(s.line); c > 2*maxLine {
		t.Errorf("holding %d bytes of one huge write, want at most %d", c, 2*maxLine)
	}
}

func TestStreamScannerSkipsContentChunks(t *testing.T) {
	chunk := []byte(chatChunk(" hello"))
	var s StreamScanner
	if a := testing.AllocsPerRun(100, func() { s.Write(chunk) }); a != 0 {
		t.Errorf("Write of a content chunk allocates %v times, want 0", a)
	}
}

func FuzzStreamScanner(f *testing.F) {
	f.Add([]byte(chatStream(3)), uint64(1))
	f.Add([]byte(responsesStream), uint64(7))
	f.Add([]byte(anthropicStream), uint64(12345))
	f.Add([]byte("data: {\"usage\":{\"input_tokens\":1}}\r\ndata: {\"usage\": {\"output_tokens\":2e3}}"), uint64(3))
	f.Fuzz(func(t *testing.T, stream []byte, seed uint64) {
		want, wantOK := scanWhole(string(stream))
		if want.Input < 0 || want.Output < 0 {
			t.Fatalf("negative usage %+v", want)
		}
		// Cut the stream at pseudo-random points drawn from seed.
		var s StreamScanner
		x := seed | 1
		for p := stream; len(p) > 0; {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			k := min(int(x%16), len(p))
			s.Write(p[:k])
			p = p[k:]
		}
		if got, ok := s.Usage(); got != want || ok != wantOK {
			t.Fatalf("fragmented: %+v, %v; whole: %+v, %v", got, ok, want, wantOK)
		}
	})
}

func BenchmarkStreamScanner(b *testing.B) {
	stream := chatStream(200)
	var events [][]byte
	for _, e := range strings.SplitAfter(stream, "\n\n") {
		if e != "" {
			events = append(events, []byte(e))
		}
	}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		var s StreamScanner
		for _, e := range events {
			s.Write(e) // one write per event, as a flushing proxy copies them
		}
		if _, ok := s.Usage(); !ok {
			b.Fatal("no usage")
		}
	}
}

// Whether a line is over the limit, and which tail of it is kept, must not
// depend on how it was split.
func TestStreamScannerLineLimitFragmentation(t *testing.T) {
	usage := `"usage":{"input_tokens":5,"output_tokens":6}`
	for _, n := range []int{maxLine - 1, maxLine, maxLine + 1, maxLine + lineTail} {
		for _, at := range []int{0, n - lineTail - 1, n - lineTail, n - len(usage)} {
			line := []byte(strings.Repeat("a", n))
			copy(line[at:], usage)
			stream := string(line) + "\n" + string(line)
			want, wantOK := scanWhole(stream)
			for _, size := range []int{7, 4096, lineTail + 1, maxLine + 3} {
				if got, ok := scanChunks(stream, size); got != want || ok != wantOK {
					t.Errorf("line of %d with usage at %d, writes of %d: %+v, %v; whole: %+v, %v", n, at, size, got, ok, want, wantOK)
				}
			}
		}
	}
}

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

// A usage object that is not valid JSON yields nothing, and the scan of
// its line stops there, as at one that does not close: a later "usage"
// on the line is not taken for the answer's usage either.
func TestStreamScannerInvalidUsageStopsLine(t *testing.T) {
	line := `data: {"usage":{"input_tokens":5,"note":tru},"usage":{"output_tokens":9}}`
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

// TestStreamScannerTier: the latest service_tier on any line that is a
// tier name, found by its key as written; the cached tokens from each
// provider's usage.
func TestStreamScannerTier(t *testing.T) {
	for _, tt := range []struct {
		name, stream string
		want         Usage
		ok           bool
	}{
		{"the latest", `data: {"service_tier":"auto"}` + "\n" + `data: {"service_tier":"flex"}` + "\n", Usage{Tier: "flex"}, false},
		{"spaces", `data: {"service_tier" : 	"priority"}`, Usage{Tier: "priority"}, false},
		{"null keeps the earlier", `data: {"service_tier":"flex"}` + "\n" + `data: {"service_tier":null}` + "\n", Usage{Tier: "flex"}, false},
		{"too long", `data: {"service_tier":"` + strings.Repeat("x", 33) + `"}`, Usage{}, false},
		{"unclosed", `data: {"service_tier":"flex`, Usage{}, false},
		{"in a string", `data: {"text":"\"service_tier\":\"flex\""}`, Usage{}, false},
		{"key with an escaped quote", `data: {"a\"service_tier":"flex"}`, Usage{}, false},
		{"a value, not a key", `data: {"a":"service_tier","b":"flex"}`, Usage{}, false},
		{"last on the line", `data: {"service_tier":"flex","usage":{"prompt_tokens":3,"service_tier":"batch"}}`, Usage{Input: 3, Tier: "batch"}, true},
		{"chat cached", `data: {"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":20}}}`, Usage{Input: 30, Output: 2, Cached: 20}, true},
		{"usage without cached", `data: {"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2}}`, Usage{Input: 30, Output: 2}, true},
		{"a later usage without cached keeps the earlier", `data: {"usage":{"prompt_tokens":30,"prompt_tokens_details":{"cached_tokens":20}}}` + "\n" +
			`data: {"usage":{"prompt_tokens":40}}`, Usage{Input: 40, Cached: 20}, true},
		{"anthropic restating cache reads", `data: {"usage":{"input_tokens":1,"cache_read_input_tokens":20}}` + "\n" +
			`data: {"usage":{"output_tokens":5,"cache_read_input_tokens":30}}`, Usage{Input: 31, Output: 5, Cached: 30}, true},
		{"unknown name", `data: {"service_tier":"gold-2"}`, Usage{Tier: "gold-2"}, false},
	} {
		for _, n := range []int{1, 5, 1 << 20} {
			if got, ok := scanChunks(tt.stream, n); got != tt.want || ok != tt.ok {
				t.Errorf("%s, writes of %d: Usage = %+v, %v; want %+v, %v", tt.name, n, got, ok, tt.want, tt.ok)
			}
		}
	}
}
