package redisstate

// Leases: every permit this replica holds, whether Redis gave it or it
// was taken locally and counted in Redis after, is a member of its
// group's leases set, scored by its expiry. Held leases are renewed
// every third of the lease TTL (see loop in health.go), and put back if
// Redis lost them; a replica that dies stops renewing, and its permits
// lapse within a TTL. Giving one back goes through the writer
// (writebehind.go).

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// renew pushes the expiry of every held lease forward, and puts back any
// that Redis lost (a restart without data).
func (s *Store) renew() error {
	s.mu.Lock()
	held := make(map[string]string, len(s.leases))
	for l, k := range s.leases {
		// A permit taken locally whose lease the writer has yet to add:
		// the writer adds it. Written here, it would stay in Redis if
		// given back before the writer sent it (returnLater then drops
		// it, as never sent) until it expired.
		if _, pending := s.adds[l]; !pending {
			held[l] = k
		}
	}
	s.mu.Unlock()
	if len(held) == 0 {
		return nil
	}
	if s.renewCopied != nil {
		s.renewCopied()
	}
	// On Redis' clock, as the scripts that count leases read it.
	exp := float64(s.now().UnixMilli() + s.clockOffset.Load() + s.cfg.LeaseTTL.Milliseconds())
	ctx, cancel := s.ctx()
	defer cancel()
	start := time.Now()
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		keys := map[string]bool{}
		for l, k := range held {
			p.ZAdd(ctx, k, redis.Z{Score: exp, Member: l})
			keys[k] = true
		}
		for k := range keys {
			p.PExpire(ctx, k, max(s.cfg.KeyTTL, s.cfg.LeaseTTL))
		}
		return nil
	})
	s.commands.WithLabelValues("renew").Inc()
	s.took(start, err)
	if err != nil {
		s.failed("renew", err)
		// The renewal may have reached Redis in part (a cluster's live
		// nodes, a pipeline cut short): leases given back meanwhile are
		// removed again, now or at the rejoin.
		_ = s.removeReturned(held)
		return err
	}
	return s.removeReturned(held)
}

// removeReturned removes from Redis the leases of held given back while
// their renewal was on its way: the return may have removed them before
// the renewal added them again, and they would count a permit nobody
// holds for a whole TTL.
func (s *Store) removeReturned(held map[string]string) error {
	s.mu.Lock()
	var gone []string
	for l := range held {
		if _, ok := s.leases[l]; !ok {
			gone = append(gone, l)
		}
	}
	s.mu.Unlock()
	if len(gone) == 0 {
		return nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, l := range gone {
			p.ZRem(ctx, held[l], l)
		}
		return nil
	})
	s.commands.WithLabelValues("return").Inc()
	if err != nil {
		for _, l := range gone {
			s.returnLater(l, held[l])
		}
		s.failed("return", err)
		return err
	}
	s.mu.Lock()
	now := s.now()
	for _, l := range gone {
		s.noteRemovedLocked(l, held[l], now)
	}
	s.mu.Unlock()
	return nil
}

func (s *Store) hold(lease, key string) {
	s.mu.Lock()
	s.leases[lease] = key
	s.mu.Unlock()
}

func (s *Store) drop(lease string) {
	s.mu.Lock()
	delete(s.leases, lease)
	s.mu.Unlock()
}

// Held is the number of leases this replica holds.
func (s *Store) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases)
}

// removal is a lease whose removal Redis took, at when.
type removal struct {
	lease, key string
	at         time.Time
}

// maxRemovals bounds the removals kept for a rejoin to send again.
const maxRemovals = 1 << 14

// noteRemovedLocked keeps the removal of lease from key, which Redis took
// at now. A primary answers a write before its replicas copy it: one lost
// before they copied a removal, and the replica promoted in its place,
// count the lease until it expires, a permit nobody holds. The rejoin
// that follows the failover sends the removals of the last lease TTL
// again (removeAgain); older leases have expired wherever they are.
// Requires s.mu held.
func (s *Store) noteRemovedLocked(lease, key string, now time.Time) {
	cut, i := now.Add(-s.cfg.LeaseTTL), 0
	for i < len(s.removed) && (s.removed[i].at.Before(cut) || len(s.removed)-i >= maxRemovals) {
		i++
	}
	s.removed = s.removed[i:] // append copies what is left when it grows
	s.removed = append(s.removed, removal{lease: lease, key: key, at: now})
}

// noteRemoved keeps the removals of leases from key that Redis took.
func (s *Store) noteRemoved(key string, leases []string) {
	s.mu.Lock()
	now := s.now()
	for _, l := range leases {
		s.noteRemovedLocked(l, key, now)
	}
	s.mu.Unlock()
}

// removeAgain removes from Redis once more the leases removed within the
// last lease TTL (see noteRemovedLocked). A lease is never held again once
// given back, so this removes no permit anyone holds. It is one call of up
// to maxRemovals commands, not timed as a request's would be: a slow one
// says nothing of Redis' answers to requests.
func (s *Store) removeAgain() {
	s.mu.Lock()
	cut := s.now().Add(-s.cfg.LeaseTTL)
	var again []removal
	for _, r := range s.removed {
		if !r.at.Before(cut) {
			again = append(again, r)
		}
	}
	s.mu.Unlock()
	if len(again) == 0 {
		return
	}
	ctx, cancel := s.ctx()
	defer cancel()
	_, _ = s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range again {
			p.ZRem(ctx, r.key, r.lease)
		}
		return nil
	})
	s.commands.WithLabelValues("return").Inc()
}
