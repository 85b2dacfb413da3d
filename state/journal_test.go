package state

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

func openJournal(t *testing.T, ttl time.Duration, maxBytes int64) (*Store, *Journal) {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	j, err := s.Journal(ttl, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return s, j
}

func entry(run string, key byte, occ uint32, at time.Time, body string) *Entry {
	e := &Entry{Run: run, Occurrence: occ, RecordedAt: at, Path: "/v1/chat/completions", Model: "m",
		Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Request: []byte(`{"model":"m"}`), Body: []byte(body)}
	e.Key[0] = key
	return e
}

func TestAnEntryComesBackAsItWasPut(t *testing.T) {
	_, j := openJournal(t, time.Hour, 0)
	now := time.Now()
	e := entry("run", 1, 2, now, "data: {\"x\":1}\n\n")
	e.Stream = true
	if err := j.Put(e); err != nil {
		t.Fatal(err)
	}
	got, ok, err := j.Lookup("run", e.Key, 2, now)
	if err != nil || !ok {
		t.Fatalf("lookup: %v %v", ok, err)
	}
	if !bytes.Equal(got.Body, e.Body) || !got.Stream || got.Status != 200 || got.Header.Get("Content-Type") != "application/json" ||
		string(got.Request) != `{"model":"m"}` || got.Path != e.Path || got.Model != "m" || !got.RecordedAt.Equal(now) {
		t.Fatalf("got %+v", got)
	}
	for _, miss := range []struct {
		run string
		key byte
		occ uint32
	}{{"other", 1, 2}, {"run", 2, 2}, {"run", 1, 1}, {"ru", 1, 2}} {
		var k [KeySize]byte
		k[0] = miss.key
		if _, ok, _ := j.Lookup(miss.run, k, miss.occ, now); ok {
			t.Errorf("%+v is a hit", miss)
		}
	}
}

func TestAnEntryExpiresAndIsSwept(t *testing.T) {
	_, j := openJournal(t, time.Minute, 0)
	now := time.Now()
	if err := j.Put(entry("r", 1, 1, now.Add(-2*time.Minute), "old")); err != nil {
		t.Fatal(err)
	}
	if err := j.Put(entry("r", 2, 1, now, "new")); err != nil {
		t.Fatal(err)
	}
	var k [KeySize]byte
	k[0] = 1
	if _, ok, _ := j.Lookup("r", k, 1, now); ok {
		t.Fatal("an entry older than its TTL is served")
	}
	n, err := j.Sweep(now)
	if err != nil || n != 1 {
		t.Fatalf("sweep removed %d (%v), want 1", n, err)
	}
	if st := j.Stats(); st.Entries != 1 || st.Bytes <= 0 {
		t.Fatalf("after the sweep: %+v", st)
	}
}

func TestTheJournalKeepsWithinItsBytesOldestGoingFirst(t *testing.T) {
	_, j := openJournal(t, 0, 4000)
	now := time.Now()
	for i := range 20 {
		if err := j.Put(entry("r", byte(i), 1, now.Add(time.Duration(i)*time.Second), string(bytes.Repeat([]byte("x"), 500)))); err != nil {
			t.Fatal(err)
		}
	}
	st := j.Stats()
	if st.Bytes > 4000 || st.Entries == 0 {
		t.Fatalf("%+v: past its bound of 4000 bytes, or empty", st)
	}
	var first byte = 255
	var n int64
	j.Each("r", func(e *Entry) bool {
		first = min(first, e.Key[0])
		n++
		return true
	})
	if n != st.Entries || first != byte(20-n) {
		t.Fatalf("kept %d entries from key %d: the newest %d should stay", n, first, st.Entries)
	}
}

func TestPuttingAnOccurrenceAgainReplacesIt(t *testing.T) {
	_, j := openJournal(t, 0, 0)
	now := time.Now()
	j.Put(entry("r", 1, 1, now, "first"))
	j.Put(entry("r", 1, 1, now.Add(time.Second), "second!"))
	e, _, _ := j.Lookup("r", entry("r", 1, 1, now, "").Key, 1, now)
	if string(e.Body) != "second!" {
		t.Fatalf("got %q", e.Body)
	}
	if st := j.Stats(); st.Entries != 1 {
		t.Fatalf("%d entries, want 1", st.Entries)
	}
	// The replaced entry's place by age went with it: a sweep past the
	// first time removes nothing.
	j2 := &Journal{s: j.s, ttl: time.Millisecond}
	if n, _ := j2.Sweep(now.Add(500 * time.Millisecond)); n != 0 {
		t.Fatalf("swept %d", n)
	}
}

func TestRunsAreListedAndRemovedApart(t *testing.T) {
	_, j := openJournal(t, 0, 0)
	now := time.Now()
	for i := range 3 {
		j.Put(entry("a", byte(i), 1, now, "x"))
	}
	j.Put(entry("b", 9, 1, now, "y"))
	runs, err := j.Runs()
	if err != nil || len(runs) != 2 || runs[0].Run != "a" || runs[0].Entries != 3 || runs[1].Entries != 1 {
		t.Fatalf("runs %+v %v", runs, err)
	}
	if n, err := j.Remove("a"); n != 3 || err != nil {
		t.Fatalf("removed %d %v", n, err)
	}
	if st := j.Stats(); st.Entries != 1 {
		t.Fatalf("%+v", st)
	}
	if n, _ := j.Remove(""); n != 1 {
		t.Fatalf("removing every run removed %d", n)
	}
}

func TestTheStateSurvivesReopening(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := s.Journal(0, 0)
	for i := range 5 {
		j.Put(entry("r", byte(i), 1, time.Now(), fmt.Sprint(i)))
	}
	if _, err := Open(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("a second open: %v, want ErrLocked", err)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	j, _ = s.Journal(0, 0)
	if st := j.Stats(); st.Entries != 5 {
		t.Fatalf("reopened: %+v", st)
	}
}

func TestAPutWithoutARunOrOccurrenceIsRefused(t *testing.T) {
	_, j := openJournal(t, 0, 0)
	for _, e := range []*Entry{entry("", 1, 1, time.Now(), ""), entry("r", 1, 0, time.Now(), ""), entry("a\x00b", 1, 1, time.Now(), "")} {
		if err := j.Put(e); err == nil {
			t.Errorf("%q/%d was put", e.Run, e.Occurrence)
		}
	}
}
