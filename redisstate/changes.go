package redisstate

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// The fleet's run-time changes (an operator's, made through a replica's
// admin endpoints) are one hash under the prefix, {changes}: field →
// value, as the proxy writes them; the store reads neither. Each replica
// polls the hash every ChangesEvery and hands the proxy the fields whose
// values are new to it, so a change reaches every replica within that
// time; a replica started later finds the changes in force there. The
// hash expires KeyTTL after the last replica's last poll.

// DefaultChangesEvery is Config.ChangesEvery's default: 250 ms (written
// in nanoseconds, so that the constant holds no arithmetic for a mutant).
const DefaultChangesEvery time.Duration = 250_000_000

// changesKey is the fleet's changes hash; its hash tag keeps it apart
// from every group's slot.
func (s *Store) changesKey() string { return s.cfg.Prefix + "{changes}" }

// PutChange sets field of the fleet's changes to value, for every
// replica, and its own polls take it as seen. Its error is Redis': the
// other replicas then do not hear of the change.
func (s *Store) PutChange(ctx context.Context, field, value string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	// A poll between the write and the note would read the old value
	// as another replica's.
	s.changesMu.Lock()
	defer s.changesMu.Unlock()
	s.changesSeen[field] = value
	key := s.changesKey()
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, field, value)
		p.PExpire(ctx, key, s.cfg.KeyTTL)
		return nil
	})
	s.commands.WithLabelValues("change").Inc()
	return err
}

// WatchChanges hands apply each field of the fleet's changes whose value
// is new to this replica: those in force at once (first set: the changes
// made before this replica started, or before Redis first answered it),
// then every ChangesEvery until Close. apply runs on one goroutine, one
// field at a time, and must not call PutChange.
func (s *Store) WatchChanges(apply func(field, value string, first bool)) {
	polled := s.pollChanges(apply, true)
	s.watching.Add(1)
	go func() {
		defer s.watching.Done()
		tick := time.NewTicker(s.cfg.ChangesEvery)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
				if s.pollChanges(apply, !polled) {
					polled = true
				}
			}
		}
	}()
}

// pollChanges reads the fleet's changes and hands apply the fields new
// to this replica, and keeps the hash alive another KeyTTL; it reports
// whether Redis answered. While the replica is local it asks nothing.
func (s *Store) pollChanges(apply func(field, value string, first bool), first bool) bool {
	if !s.up.Load() {
		return false
	}
	s.changesMu.Lock()
	defer s.changesMu.Unlock()
	ctx, cancel := s.ctx()
	defer cancel()
	key := s.changesKey()
	var all *redis.MapStringStringCmd
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, key)
		p.PExpire(ctx, key, s.cfg.KeyTTL)
		return nil
	})
	s.commands.WithLabelValues("changes").Inc()
	if err != nil {
		s.failed("changes", err)
		return false
	}
	for field, value := range all.Val() {
		seen, ok := s.changesSeen[field]
		s.changesSeen[field] = value
		if !ok || seen != value {
			apply(field, value, first)
		}
	}
	return true
}
