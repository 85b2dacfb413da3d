package redisstate

// Write-behind: what needs no answer on a request's path goes to Redis
// from one writer goroutine, never from the request. Permits given back
// (returnLater), permits taken on the local limits to count in Redis
// (addLater) and the budgets' give-backs and charges (giveLater) wait
// here; the writer sends them when woken, and rejoin sends the leases
// Redis did not take while it was away.

import (
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// returnLater keeps a lease to remove from Redis: the writer sends it,
// or the rejoin when Redis is away.
func (s *Store) returnLater(lease, key string) {
	s.mu.Lock()
	if _, pending := s.adds[lease]; pending {
		delete(s.adds, lease) // never sent: nothing to remove
	} else {
		s.returns[lease] = key
	}
	s.mu.Unlock()
	s.wake()
}

// addLater counts in Redis, through the writer, a permit this replica
// took on its local limits: while it is local for a slow Redis, or until
// Redis is back, the other replicas see it. The lease is held (renewed)
// until returned.
func (s *Store) addLater(lease, key string) {
	s.mu.Lock()
	s.adds[lease] = key
	s.leases[lease] = key
	s.mu.Unlock()
	s.wake()
}

// flushAdds sends the leases of permits taken locally; false when Redis
// did not take them (those still held are kept for later).
func (s *Store) flushAdds() bool {
	s.mu.Lock()
	adds := s.adds
	s.adds = map[string]string{}
	s.mu.Unlock()
	if len(adds) == 0 {
		return true
	}
	exp := float64(s.now().UnixMilli() + s.clockOffset.Load() + s.cfg.LeaseTTL.Milliseconds())
	ctx, cancel := s.ctx()
	defer cancel()
	start := time.Now()
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		for l, k := range adds {
			p.ZAdd(ctx, k, redis.Z{Score: exp, Member: l})
			p.PExpire(ctx, k, max(s.cfg.KeyTTL, s.cfg.LeaseTTL))
		}
		return nil
	})
	s.commands.WithLabelValues("count").Inc()
	s.took(start, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	for l, k := range adds {
		// A call that failed may have reached Redis in part (a cluster's
		// live nodes, a pipeline cut short): a lease still held is no
		// longer pending but renewed (renew puts back what Redis lacks),
		// and one given back is removed, as one that did reach it.
		if _, held := s.leases[l]; !held {
			s.returns[l] = k // returned while on its way: remove it again
		}
	}
	return err == nil
}

// flushReturns removes from Redis the leases given back while it was
// away; false when Redis did not take them (they are kept for later).
func (s *Store) flushReturns() bool {
	s.mu.Lock()
	returns := s.returns
	s.returns = map[string]string{}
	s.mu.Unlock()
	if len(returns) == 0 {
		return true
	}
	ctx, cancel := s.ctx()
	defer cancel()
	start := time.Now()
	_, err := s.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		for l, k := range returns {
			p.ZRem(ctx, k, l)
		}
		return nil
	})
	s.commands.WithLabelValues("return").Inc()
	s.took(start, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for l, k := range returns {
		if err != nil {
			s.returns[l] = k
		} else {
			s.noteRemovedLocked(l, k, now)
		}
	}
	return err == nil
}

// takeReturns takes the leases of one leases key waiting to be removed
// (at most 64), for the caller to remove.
func (s *Store) takeReturns(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ls []string
	for l, k := range s.returns {
		if k == key {
			ls = append(ls, l)
			delete(s.returns, l)
			if len(ls) == 64 {
				break
			}
		}
	}
	return ls
}

// give is a give-back to a group's budgets (see giveBackScript).
type give struct {
	op, state                    string
	requests, tokens, mark, used float64
}

// giveLater queues a give-back for the writer.
func (s *Store) giveLater(g give) {
	s.mu.Lock()
	if len(s.gives) < maxGives {
		s.gives = append(s.gives, g)
	}
	s.mu.Unlock()
	s.wake()
}

// maxGives bounds the give-backs waiting: past it, while Redis is slow,
// they are dropped (the budgets then hold back a little more than needed).
const maxGives = 4096

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// writer sends what needs no answer on a request's path: permits given
// back and the budgets' give-backs. A request never waits for Redis to
// take them.
func (s *Store) writer() {
	for {
		select {
		case <-s.stop:
			s.write()
			return
		case <-s.kick:
			s.write()
		case done := <-s.flushes:
			s.write()
			close(done)
		}
	}
}

// flush waits until what was given back before it has been sent (or
// kept for the rejoin).
func (s *Store) flush() {
	done := make(chan struct{})
	select {
	case s.flushes <- done:
		<-done
	case <-s.done:
	}
}

// write sends the leases of permits taken locally, the returns and the
// budgets' give-backs and charges waiting. They are tried while the
// replica is local too: Redis may only be slow, and the other replicas
// share through it still. Leases and returns Redis does not take wait
// for the next try or the rejoin; give-backs and charges are dropped
// (once Redis is gone, the budgets are relearned from the answers).
func (s *Store) write() {
	s.mu.Lock()
	gives := s.gives
	s.gives = nil
	s.mu.Unlock()
	if !s.flushAdds() {
		s.failed("count", errors.New("counting local permits failed"))
	}
	if !s.flushReturns() {
		s.failed("return", errors.New("returning permits failed"))
		return
	}
	for _, g := range gives {
		ctx, cancel := s.ctx()
		start := time.Now()
		err := giveBackScript.Run(ctx, s.rdb(), []string{g.state}, argv(giveBackArgs{Now: s.scriptNow(), Requests: g.requests, Tokens: g.tokens, Mark: g.mark, Used: g.used})...).Err()
		cancel()
		s.commands.WithLabelValues(g.op).Inc()
		s.took(start, err)
		if err != nil {
			s.failed(g.op, err)
			return
		}
	}
}
