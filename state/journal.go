package state

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The journal's buckets: entries by run, request and occurrence; the
// same keys by the time they were recorded (for expiry and the size
// bound, oldest first); and the totals.
var (
	journalBucket = []byte("journal")
	ageBucket     = []byte("journal-age")
	metaBucket    = []byte("meta")
	entriesKey    = []byte("journal-entries")
	bytesKey      = []byte("journal-bytes")
)

// KeySize is the length of a request's key: a SHA-256 of what names the
// request (see proxy's journal): its credential, method, path and
// canonical body.
const KeySize = 32

// Entry is one recorded answer: the Occurrence-th request of its run
// with its key.
type Entry struct {
	Run        string
	Key        [KeySize]byte
	Occurrence uint32 // from 1
	RecordedAt time.Time
	// Path and Model name the request for people (ls, show, export);
	// Stream says its answer is a stream, stored raw.
	Path   string
	Model  string
	Stream bool
	Status int
	Header http.Header // the answer's headers that are replayed
	// Request is the request's canonical body, Body the answer's bytes
	// as the client got them.
	Request []byte
	Body    []byte
}

// meta is what an entry's value holds besides its times and answer body.
type meta struct {
	Path    string      `json:"path"`
	Model   string      `json:"model,omitempty"`
	Stream  bool        `json:"stream,omitempty"`
	Status  int         `json:"status"`
	Header  http.Header `json:"header,omitempty"`
	Request []byte      `json:"request,omitempty"`
}

// Journal is the store's record of complete answers.
type Journal struct {
	s        *Store
	ttl      time.Duration // 0: entries never expire
	maxBytes int64         // 0: no bound

	mu      sync.Mutex // the totals as last written
	entries int64
	bytes   int64

	queue  chan queued
	closed bool // under mu: the store is closing, puts are refused
}

// errClosed is a put's error once the store is closing.
var errClosed = errors.New("journal: the state file is closing")

// Journal returns the store's journal: entries older than ttl are not
// served and are swept; past maxBytes of entries the oldest go.
func (s *Store) Journal(ttl time.Duration, maxBytes int64) (*Journal, error) {
	j := &Journal{s: s, ttl: ttl, maxBytes: maxBytes, queue: make(chan queued, writeQueue)}
	go j.writer()
	s.closers = append(s.closers, func() {
		j.mu.Lock()
		j.closed = true
		j.mu.Unlock()
		s.writes.Wait()
		close(j.queue)
	})
	err := s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(metaBucket)
		j.entries, j.bytes = getInt(m, entriesKey), getInt(m, bytesKey)
		return nil
	})
	return j, err
}

// entryKey is where an entry is kept: its run, a 0 byte (no run name
// holds one), its key and its occurrence.
func entryKey(run string, key [KeySize]byte, occurrence uint32) []byte {
	b := make([]byte, 0, len(run)+1+KeySize+4)
	b = append(append(append(b, run...), 0), key[:]...)
	return binary.BigEndian.AppendUint32(b, occurrence)
}

func splitKey(k []byte) (run string, key [KeySize]byte, occ uint32, ok bool) {
	i := bytes.IndexByte(k, 0)
	if i < 0 || len(k) != i+1+KeySize+4 {
		return "", key, 0, false
	}
	copy(key[:], k[i+1:])
	return string(k[:i]), key, binary.BigEndian.Uint32(k[i+1+KeySize:]), true
}

// Lookup returns the recording of the occurrence-th request with key in
// run, unless there is none or it expired by now.
func (j *Journal) Lookup(run string, key [KeySize]byte, occurrence uint32, now time.Time) (*Entry, bool, error) {
	var e *Entry
	err := j.s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(journalBucket).Get(entryKey(run, key, occurrence))
		if v == nil {
			return nil
		}
		got, err := decode(v)
		if err != nil {
			return err
		}
		if j.ttl > 0 && now.Sub(got.RecordedAt) > j.ttl {
			return nil
		}
		got.Run, got.Key, got.Occurrence = run, key, occurrence
		e = got
		return nil
	})
	return e, e != nil, err
}

// Put records e, in place of an earlier recording of its occurrence.
func (j *Journal) Put(e *Entry) error { return j.putAll([]*Entry{e}) }

func checkEntry(e *Entry) error {
	if e.Occurrence == 0 || e.Run == "" || bytes.IndexByte([]byte(e.Run), 0) >= 0 {
		return errors.New("journal: an entry needs a run without a 0 byte and an occurrence from 1")
	}
	return nil
}

// putAll records es in one transaction: one write to the disk for all.
func (j *Journal) putAll(es []*Entry) error {
	vs := make([][]byte, len(es))
	for i, e := range es {
		if err := checkEntry(e); err != nil {
			return err
		}
		v, err := encode(e)
		if err != nil {
			return err
		}
		vs[i] = v
	}
	err := j.s.db.Update(func(tx *bolt.Tx) error {
		b, age, m := tx.Bucket(journalBucket), tx.Bucket(ageBucket), tx.Bucket(metaBucket)
		entries, size := getInt(m, entriesKey), getInt(m, bytesKey)
		for i, e := range es {
			k := entryKey(e.Run, e.Key, e.Occurrence)
			if old := b.Get(k); old != nil {
				if err := age.Delete(ageKey(recordedAt(old), k)); err != nil {
					return err
				}
				entries, size = entries-1, size-int64(len(old))
			}
			if err := b.Put(k, vs[i]); err != nil {
				return err
			}
			if err := age.Put(ageKey(e.RecordedAt, k), nil); err != nil {
				return err
			}
			entries, size = entries+1, size+int64(len(vs[i]))
		}
		if j.maxBytes > 0 && size > j.maxBytes {
			need := size - j.maxBytes
			n, freed, err := dropOldest(b, age, func(_ []byte, freed int64) bool { return freed < need })
			if err != nil {
				return err
			}
			entries, size = entries-n, size-freed
		}
		return j.setTotals(m, entries, size)
	})
	return j.noted(err)
}

// dropOldest deletes entries oldest first while more says to go on
// (given the next one's age key and the bytes freed so far); it returns
// how many and their bytes.
func dropOldest(b, age *bolt.Bucket, more func(ak []byte, freed int64) bool) (n, freed int64, err error) {
	c := age.Cursor()
	for ak, _ := c.First(); ak != nil && more(ak, freed); ak, _ = c.First() {
		k := bytes.Clone(ak[8:])
		if v := b.Get(k); v != nil {
			freed += int64(len(v))
			n++
			if err := b.Delete(k); err != nil {
				return n, freed, err
			}
		}
		if err := age.Delete(ak); err != nil {
			return n, freed, err
		}
	}
	return n, freed, nil
}

// queued is a put waiting for the journal's writer.
type queued struct {
	e    *Entry
	then func(error)
}

// writeQueue bounds the puts waiting for the writer: past it PutLater
// waits, so that a run faster than the disk slows to it rather than
// holding its answers in memory; writeBatch is the most one transaction
// writes.
const (
	writeQueue = 1024
	writeBatch = 256
)

// PutLater hands e to the journal's writer, which puts it with the puts
// waiting beside it in one transaction and then calls then with the
// error; it waits while writeQueue puts wait. The store's Close waits
// for them.
func (j *Journal) PutLater(e *Entry, then func(error)) {
	if err := checkEntry(e); err != nil {
		then(err)
		return
	}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		then(errClosed)
		return
	}
	j.s.writes.Add(1)
	j.mu.Unlock()
	j.queue <- queued{e, then}
}

func (j *Journal) writer() {
	for q := range j.queue {
		batch := []queued{q}
	more:
		for len(batch) < writeBatch {
			select {
			case q, ok := <-j.queue:
				if !ok {
					break more
				}
				batch = append(batch, q)
			default:
				break more
			}
		}
		es := make([]*Entry, len(batch))
		for i, q := range batch {
			es[i] = q.e
		}
		err := j.putAll(es)
		for _, q := range batch {
			q.then(err)
			j.s.writes.Done()
		}
	}
}

// Sweep deletes the entries that expired by now, and returns how many.
func (j *Journal) Sweep(now time.Time) (int, error) {
	if j.ttl <= 0 {
		return 0, nil
	}
	cut := ageKey(now.Add(-j.ttl), nil)
	var n int
	var entries, size int64
	err := j.s.db.Update(func(tx *bolt.Tx) error {
		b, age, m := tx.Bucket(journalBucket), tx.Bucket(ageBucket), tx.Bucket(metaBucket)
		entries, size = getInt(m, entriesKey), getInt(m, bytesKey)
		dropped, freed, err := dropOldest(b, age, func(ak []byte, _ int64) bool { return bytes.Compare(ak[:8], cut) < 0 })
		if err != nil {
			return err
		}
		n, entries, size = int(dropped), entries-dropped, size-freed
		return j.setTotals(m, entries, size)
	})
	return n, j.noted(err)
}

// Remove deletes run's entries (every run's when run is ""), and returns
// how many.
func (j *Journal) Remove(run string) (int, error) {
	var n int
	var entries, size int64
	err := j.s.db.Update(func(tx *bolt.Tx) error {
		b, age, m := tx.Bucket(journalBucket), tx.Bucket(ageBucket), tx.Bucket(metaBucket)
		entries, size = getInt(m, entriesKey), getInt(m, bytesKey)
		var prefix []byte
		if run != "" {
			prefix = append([]byte(run), 0)
		}
		c := b.Cursor()
		var doomed [][2][]byte
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			doomed = append(doomed, [2][]byte{bytes.Clone(k), ageKey(recordedAt(v), k)})
			entries, size = entries-1, size-int64(len(v))
		}
		for _, d := range doomed {
			if err := b.Delete(d[0]); err != nil {
				return err
			}
			if err := age.Delete(d[1]); err != nil {
				return err
			}
		}
		n = len(doomed)
		return j.setTotals(m, entries, size)
	})
	return n, j.noted(err)
}

// Each calls fn with run's entries (every run's when run is ""), in key
// order, until fn returns false. Expired entries not yet swept are
// included.
func (j *Journal) Each(run string, fn func(*Entry) bool) error {
	return j.s.db.View(func(tx *bolt.Tx) error {
		var prefix []byte
		if run != "" {
			prefix = append([]byte(run), 0)
		}
		c := tx.Bucket(journalBucket).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			e, err := decode(v)
			if err != nil {
				return err
			}
			var ok bool
			if e.Run, e.Key, e.Occurrence, ok = splitKey(k); !ok {
				return fmt.Errorf("journal: a key of %d bytes is not an entry's", len(k))
			}
			if !fn(e) {
				return nil
			}
		}
		return nil
	})
}

// RunStats is one run's entries in the journal.
type RunStats struct {
	Run     string    `json:"run"`
	Entries int       `json:"entries"`
	Bytes   int64     `json:"bytes"`
	First   time.Time `json:"first"`
	Last    time.Time `json:"last"`
}

// Runs lists the runs with entries, by name.
func (j *Journal) Runs() ([]RunStats, error) {
	var runs []RunStats
	err := j.s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(journalBucket).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			run, _, _, ok := splitKey(k)
			if !ok {
				continue
			}
			if len(runs) == 0 || runs[len(runs)-1].Run != run {
				runs = append(runs, RunStats{Run: run})
			}
			r := &runs[len(runs)-1]
			at := recordedAt(v)
			r.Entries++
			r.Bytes += int64(len(v))
			if r.First.IsZero() || at.Before(r.First) {
				r.First = at
			}
			if at.After(r.Last) {
				r.Last = at
			}
		}
		return nil
	})
	return runs, err
}

// Stats is the journal's size.
type Stats struct {
	Entries   int64 `json:"entries"`
	Bytes     int64 `json:"bytes"`
	MaxBytes  int64 `json:"max_bytes,omitempty"`
	FileBytes int64 `json:"file_bytes"`
}

// Stats says how many entries the journal keeps and their bytes, as last
// written.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return Stats{Entries: j.entries, Bytes: j.bytes, MaxBytes: j.maxBytes, FileBytes: j.s.FileBytes()}
}

func (j *Journal) setTotals(m *bolt.Bucket, entries, size int64) error {
	if err := m.Put(entriesKey, binary.BigEndian.AppendUint64(nil, uint64(entries))); err != nil {
		return err
	}
	if err := m.Put(bytesKey, binary.BigEndian.AppendUint64(nil, uint64(size))); err != nil {
		return err
	}
	return nil
}

// noted reads the totals again for Stats once a transaction committed
// (err nil): transactions batched together end in any order.
func (j *Journal) noted(err error) error {
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(metaBucket)
		j.entries, j.bytes = getInt(m, entriesKey), getInt(m, bytesKey)
		return nil
	})
}

func getInt(b *bolt.Bucket, k []byte) int64 {
	if v := b.Get(k); len(v) == 8 {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

func ageKey(at time.Time, k []byte) []byte {
	return append(binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano())), k...)
}

// An entry's value: its recording time (8 bytes, Unix nanoseconds), its
// meta's length (4 bytes), the meta as JSON and the answer's body.
func encode(e *Entry) ([]byte, error) {
	m, err := json.Marshal(meta{Path: e.Path, Model: e.Model, Stream: e.Stream, Status: e.Status, Header: e.Header, Request: e.Request})
	if err != nil {
		return nil, err
	}
	v := make([]byte, 0, 12+len(m)+len(e.Body))
	v = binary.BigEndian.AppendUint64(v, uint64(e.RecordedAt.UnixNano()))
	v = binary.BigEndian.AppendUint32(v, uint32(len(m)))
	return append(append(v, m...), e.Body...), nil
}

func recordedAt(v []byte) time.Time {
	if len(v) < 8 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v)))
}

func decode(v []byte) (*Entry, error) {
	if len(v) < 12 {
		return nil, errors.New("journal: an entry too short")
	}
	n := int(binary.BigEndian.Uint32(v[8:]))
	if 12+n > len(v) {
		return nil, errors.New("journal: an entry's meta runs past its end")
	}
	var m meta
	if err := json.Unmarshal(v[12:12+n], &m); err != nil {
		return nil, fmt.Errorf("journal: an entry's meta: %w", err)
	}
	return &Entry{RecordedAt: recordedAt(v), Path: m.Path, Model: m.Model, Stream: m.Stream,
		Status: m.Status, Header: m.Header, Request: m.Request,
		Body: bytes.Clone(v[12+n:])}, nil
}
