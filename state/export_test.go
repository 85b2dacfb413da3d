package state

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// exportLines exports run and reads each line back as a JSON object.
func exportLines(t *testing.T, j *Journal, run string) []map[string]any {
	t.Helper()
	var b bytes.Buffer
	if err := j.Export(&b, run); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(&b)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d is not one JSON object: %v\n%s", len(out)+1, err, sc.Bytes())
		}
		out = append(out, m)
	}
	return out
}

// TestExportWritesAnEntryALineForPeople: a JSON answer and request are
// JSON in the line, a stream's events a string, bytes that are not UTF-8
// base64; the key shows as 12 hex digits, the time in RFC 3339.
func TestExportWritesAnEntryALineForPeople(t *testing.T) {
	_, j := openJournal(t, time.Hour, 0)
	at := time.Date(2026, 3, 1, 12, 0, 0, 500, time.UTC)
	plain := entry("a", 0xab, 1, at, "{\n  \"id\": \"x\", \"text\": \"<b>\"\n}")
	stream := entry("a", 0xab, 2, at.Add(time.Second), "data: {\"x\":1}\n\ndata: [DONE]\n\n")
	stream.Stream = true
	binary := entry("b", 0xcd, 1, at, "\x1f\x8b\x08\xff")
	binary.Header.Set("Content-Encoding", "gzip")
	binary.Request = []byte("not json")
	for _, e := range []*Entry{plain, stream, binary} {
		if err := j.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	lines := exportLines(t, j, "")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %v", len(lines), lines)
	}
	first := lines[0]
	if first["run"] != "a" || first["occurrence"] != 1.0 || first["key"] != "ab0000000000" || first["recorded_at"] != "2026-03-01T12:00:00.0000005Z" ||
		first["path"] != "/v1/chat/completions" || first["model"] != "m" || first["stream"] != false || first["status"] != 200.0 {
		t.Errorf("first line: %v", first)
	}
	if a, ok := first["answer"].(map[string]any); !ok || a["id"] != "x" || a["text"] != "<b>" {
		t.Errorf("a JSON answer is not JSON: %#v", first["answer"])
	}
	if r, ok := first["request"].(map[string]any); !ok || r["model"] != "m" {
		t.Errorf("a JSON request is not JSON: %#v", first["request"])
	}
	if lines[1]["answer"] != string(stream.Body) || lines[1]["stream"] != true {
		t.Errorf("a stream's answer: %#v", lines[1]["answer"])
	}
	third := lines[2]
	if _, ok := third["answer"]; ok || third["answer_base64"] != base64.StdEncoding.EncodeToString(binary.Body) ||
		third["content_encoding"] != "gzip" || third["request"] != "not json" {
		t.Errorf("bytes that are not UTF-8: %v", third)
	}
	if got := exportLines(t, j, "b"); len(got) != 1 || got[0]["run"] != "b" {
		t.Errorf("run b alone: %v", got)
	}
	if got := exportLines(t, j, "nobody"); len(got) != 0 {
		t.Errorf("a run without entries: %v", got)
	}
}

// TestListGivesSizesNotBodies: a listing names each entry and gives the
// sizes of its request and answer, and holds neither.
func TestListGivesSizesNotBodies(t *testing.T) {
	_, j := openJournal(t, time.Hour, 0)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.Local)
	e := entry("run", 7, 3, at, `{"secret-answer":1}`)
	if err := j.Put(e); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := j.List(&b, "run"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "secret-answer") || strings.Count(b.String(), "\n") != 1 {
		t.Fatalf("listing: %s", b.String())
	}
	var s Summary
	if err := json.Unmarshal(b.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	want := Summary{named: named{Run: "run", Occurrence: 3, RecordedAt: at.UTC(), Path: e.Path, Model: "m", Status: 200,
		Key: "070000000000"}, RequestBytes: len(e.Request), AnswerBytes: len(e.Body)}
	if s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
}

// TestExportGoesPastAPage: a run of more entries (and bytes) than a page
// comes out whole, in key order, once each; an error of the writer ends
// it.
func TestExportGoesPastAPage(t *testing.T) {
	_, j := openJournal(t, 0, 0)
	at := time.Now()
	big := strings.Repeat("x", pageBytes/2)
	n := pageEntries*2 + 5
	errs := make(chan error, n)
	for i := range n { // at once: the puts share the disk's writes
		body := `{"n":1}`
		if i < 2 { // two fill a page's bytes
			body = `"` + big + `"`
		}
		go func() { errs <- j.Put(entry("r", byte(i), uint32(i+1), at, body)) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Put(entry("s", 1, 1, at, "{}")); err != nil {
		t.Fatal(err)
	}
	if page, next, err := j.page([]byte("r\x00"), []byte("r\x00")); err != nil || len(page) != 2 || next == nil {
		t.Fatalf("the first page: %d entries, next %x (%v); want the two that fill its bytes", len(page), next, err)
	}
	lines := exportLines(t, j, "r")
	if len(lines) != n {
		t.Fatalf("%d lines, want %d", len(lines), n)
	}
	for i, l := range lines {
		if l["occurrence"] != float64(i+1) {
			t.Fatalf("line %d is occurrence %v", i, l["occurrence"])
		}
	}
	if all := exportLines(t, j, ""); len(all) != n+1 {
		t.Fatalf("every run: %d lines, want %d", len(all), n+1)
	}
	boom := errors.New("boom")
	if err := j.Export(failingWriter{boom}, "r"); !errors.Is(err, boom) {
		t.Fatalf("a writer's error: %v", err)
	}
}

type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) { return 0, f.err }

// TestOpenTimeoutTriesOnce: a file another open holds is ErrLocked at
// once with a wait of 0, not after Open's seconds.
func TestOpenTimeoutTriesOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	if _, err := OpenTimeout(path, 0); !errors.Is(err, ErrLocked) {
		t.Fatalf("a held file: %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}
