// Package state is llmproxy's embedded store: one file (LLMPROXY_STATE)
// that outlives the process. It keeps the journal, the complete answers
// of runs, for replay (see Journal).
//
// The file is a bbolt database: pure Go, so the static binary stays
// static. One process opens it at a time; a second waits up to a few
// seconds and then fails with a clear error.
package state

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Store is the open state file.
type Store struct {
	db   *bolt.DB
	path string
	// writes are the puts under way that Close waits for.
	writes sync.WaitGroup
	// closers end what writes to the file on its own (the book's
	// flushes), first thing in Close.
	closers []func()
	closing sync.Once
}

// ErrLocked is returned by Open when another process holds the file.
var ErrLocked = errors.New("the state file is open in another process")

// Open opens (or makes, mode 0600: answers can hold what clients asked)
// the state file at path, waiting up to 3 s for another process to let
// go of it.
func Open(path string) (*Store, error) { return OpenTimeout(path, 3*time.Second) }

// OpenTimeout is Open waiting up to wait for another process to let go
// of the file; it tries once at least (a wait of 0 or less tries once).
func OpenTimeout(path string, wait time.Duration) (*Store, error) {
	// bbolt's Timeout of 0 waits for ever.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: max(wait, time.Nanosecond)})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("state %s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{journalBucket, ageBucket, metaBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	return &Store{db: db, path: path}, nil
}

// Path is the file's name, as given to Open.
func (s *Store) Path() string { return s.path }

// Close closes the file. Writes already returned are on disk.
// Puts started with PutLater end first, and the book of learned limits
// writes what changed last.
func (s *Store) Close() error {
	s.closing.Do(func() {
		for _, c := range s.closers {
			c()
		}
	})
	s.writes.Wait()
	return s.db.Close()
}

// FileBytes is the file's size on disk.
func (s *Store) FileBytes() int64 {
	fi, err := os.Stat(s.path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
