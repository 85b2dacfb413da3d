package state

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
)

// The journal as people read it (llmproxy journal show and export, and
// the admin listener's /journal/show and /journal/export): one JSON
// object a line per entry. A key shows as its first 12 hex digits (see
// shortKey); an entry holds no credential, only that hash of one.

// shortKey is the first 12 hex digits of key: enough to tell a run's
// requests apart, and no more of the hash than that.
func shortKey(key [KeySize]byte) string { return hex.EncodeToString(key[:6]) }

// named is what names an entry, as a listing and an export show it.
type named struct {
	Run        string    `json:"run"`
	Occurrence uint32    `json:"occurrence"`
	RecordedAt time.Time `json:"recorded_at"`
	Path       string    `json:"path"`
	Model      string    `json:"model"`
	Stream     bool      `json:"stream"`
	Status     int       `json:"status"`
	Key        string    `json:"key"`
}

func (e *Entry) naming() named {
	return named{Run: e.Run, Occurrence: e.Occurrence, RecordedAt: e.RecordedAt.UTC(), Path: e.Path,
		Model: e.Model, Stream: e.Stream, Status: e.Status, Key: shortKey(e.Key)}
}

// Summary is an entry as a listing shows it: what names it, and the
// sizes of its request and answer.
type Summary struct {
	named
	RequestBytes int `json:"request_bytes"`
	AnswerBytes  int `json:"answer_bytes"`
}

// Summary is e as a listing shows it, its time in UTC.
func (e *Entry) Summary() Summary {
	return Summary{named: e.naming(), RequestBytes: len(e.Request), AnswerBytes: len(e.Body)}
}

// exported is an entry as Export writes it. Request is the canonical
// request body as JSON when it is JSON, else as a string; Answer is a
// JSON answer as JSON, any other (a stream's events) as a string. Bytes
// that are not UTF-8 go as base64 under the _base64 names instead.
type exported struct {
	named
	ContentEncoding string `json:"content_encoding,omitempty"`
	Request         any    `json:"request,omitempty"`
	RequestBase64   string `json:"request_base64,omitempty"`
	Answer          any    `json:"answer,omitempty"`
	AnswerBase64    string `json:"answer_base64,omitempty"`
}

// readable is b as a person reads it in JSON: itself when asJSON and it
// is JSON, a string when it is UTF-8, else (v nil) base64.
func readable(b []byte, asJSON bool) (v any, b64 string) {
	switch {
	case asJSON && len(bytes.TrimSpace(b)) > 0 && json.Valid(b):
		return json.RawMessage(b), ""
	case utf8.Valid(b):
		return string(b), ""
	}
	return nil, base64.StdEncoding.EncodeToString(b)
}

func exportOf(e *Entry) exported {
	x := exported{named: e.naming(), ContentEncoding: e.Header.Get("Content-Encoding")}
	x.Request, x.RequestBase64 = readable(e.Request, true)
	x.Answer, x.AnswerBase64 = readable(e.Body, !e.Stream)
	return x
}

// Export writes run's entries (every run's when run is ""), in key
// order, as JSON lines with their requests and answers (see exported).
func (j *Journal) Export(w io.Writer, run string) error {
	return j.writeLines(w, run, func(e *Entry) any { return exportOf(e) })
}

// List writes run's entries (every run's when run is ""), in key order,
// as JSON lines of their Summary.
func (j *Journal) List(w io.Writer, run string) error {
	return j.writeLines(w, run, func(e *Entry) any { return e.Summary() })
}

func (j *Journal) writeLines(w io.Writer, run string, line func(*Entry) any) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	err := j.paged(run, func(e *Entry) error { return enc.Encode(line(e)) })
	if err != nil {
		return err
	}
	return bw.Flush()
}

// A page of entries read in one transaction: paged calls its fn outside
// of it, so that a slow reader (a client of the admin listener) holds no
// read transaction, which would keep the file from growing.
const (
	pageEntries = 64
	pageBytes   = 4 << 20
)

// paged calls fn with run's entries (every run's when run is ""), in key
// order, a page at a time, until fn returns an error. Entries put or
// removed meanwhile may or may not be seen.
func (j *Journal) paged(run string, fn func(*Entry) error) error {
	var prefix []byte
	if run != "" {
		prefix = append([]byte(run), 0)
	}
	from := append([]byte{}, prefix...) // not nil: nil is the end
	for from != nil {
		var page []*Entry
		var err error
		if page, from, err = j.page(prefix, from); err != nil {
			return err
		}
		for _, e := range page {
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// page reads the entries under prefix from the key from on, up to a
// page's worth; next is the key to go on from (nil: no more).
func (j *Journal) page(prefix, from []byte) (page []*Entry, next []byte, err error) {
	err = j.s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(journalBucket).Cursor()
		size := 0
		for k, v := c.Seek(from); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if len(page) == pageEntries || size >= pageBytes {
				next = bytes.Clone(k)
				return nil
			}
			e, err := decode(v)
			if err != nil {
				return err
			}
			var ok bool
			if e.Run, e.Key, e.Occurrence, ok = splitKey(k); !ok {
				return fmt.Errorf("journal: a key of %d bytes is not an entry's", len(k))
			}
			page = append(page, e)
			size += len(v)
		}
		return nil
	})
	return page, next, err
}
