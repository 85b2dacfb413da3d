package redisstate

// Health: whether the replica shares its lanes' state through Redis
// (up) or uses its local limits (degraded). A call that fails, or recent
// calls whose 99th percentile is past Config.Slow, take it local at once
// (failed, took); loop pings, backing off, until Redis answers in time,
// and rejoin brings it back. loop also keeps the leases renewed and the
// heartbeat going, up or not, on the replica's clock (Config.Clock).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/clock"
)

func (s *Store) setUp(up bool) {
	if s.up.Swap(up) == up {
		return
	}
	if up {
		s.upGauge.Set(1)
		s.log.Info("redis reachable; lanes share state with the other replicas")
	} else {
		s.upGauge.Set(0)
	}
}

// failed notes a failed call: the replica goes local until a ping answers.
func (s *Store) failed(op string, err error) {
	s.why(err)
	s.failures.Inc()
	s.slow.Store(op == "slow")
	if s.up.Swap(false) {
		s.upGauge.Set(0)
		s.log.Warn("redis call failed; lanes use local limits until it answers again", "op", op, "err", err.Error())
	}
}

// why keeps err as the latest reason Redis is not shared, for Ready. The
// client's errors name addresses and what the server said (WRONGPASS, a
// certificate it could not verify), never a password.
func (s *Store) why(err error) {
	msg := err.Error()
	s.whyNot.Store(&msg)
}

// loop renews the leases this replica holds and, while degraded, pings
// until Redis answers.
func (s *Store) loop() {
	// The renewal and the heartbeat write times of the replica's clock,
	// and run on its timers; the rejoin pings time Redis' answers, and
	// run on the wall clock's.
	renew, beat := make(chan struct{}, 1), make(chan struct{}, 1)
	renewing := s.after(s.cfg.LeaseTTL/3, renew)
	// The heartbeat says the replica is alive and reads how many are:
	// often, so that replicas started together soon count each other
	// (a degraded replica's share divides by that count): at first an
	// eighth of heartbeatEvery after the start, then twice as long each
	// time, up to heartbeatEvery.
	every := heartbeatEvery / 8
	beating := s.after(every, beat)
	defer func() { renewing.Stop(); beating.Stop() }()
	// Rejoin attempts back off while Redis answers pings but keeps failing
	// calls (read-only, out of memory, no EVAL): no flapping every 500 ms.
	wait := minRejoinWait
	ping := time.NewTimer(wait)
	defer ping.Stop()
	var rejoined time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-renew:
			// Held leases are renewed while the replica is local too:
			// Redis may only be slow, and then its other replicas count
			// them still.
			renewing = s.after(s.cfg.LeaseTTL/3, renew)
			_ = s.renew()
		case <-beat:
			every = min(2*every, heartbeatEvery)
			beating = s.after(every, beat)
			// A replica local because Redis is slow still beats: the
			// busy count its share divides by must stay current.
			if s.up.Load() || s.slow.Load() {
				s.heartbeat(s.now())
			}
		case <-ping.C:
			if !s.up.Load() {
				wait = nextRejoinWait(wait, time.Since(rejoined), s.slow.Load())
				if s.pingToRejoin() {
					rejoined = time.Now()
				}
			}
			ping.Reset(wait)
		}
	}
}

// pingToRejoin pings Redis and, once it answers in time, rejoins; it
// reports whether the replica rejoined. A ping slower than the bound
// leaves the replica local: Redis is there but would hold up every
// request.
func (s *Store) pingToRejoin() bool {
	ctx, cancel := s.ctx()
	start := time.Now()
	err := s.reachable(ctx)
	cancel()
	if err == nil && s.cfg.Slow > 0 && time.Since(start) > s.cfg.Slow {
		err = errors.New("slow")
	}
	if err != nil {
		s.why(err)
		return false
	}
	return s.rejoin()
}

// reachable is nil when Redis answers as the store needs it (answers),
// in auto mode once the server said what kind it is (detect): the client
// that follows is the one asked.
func (s *Store) reachable(ctx context.Context) error {
	if err := s.detect(ctx); err != nil {
		return err
	}
	return s.answers(ctx)
}

// answers is nil when Redis answers a ping; a cluster must also say its
// slots are all served: while a failed primary's replica is not yet
// promoted, the groups on it would fail again at once.
func (s *Store) answers(ctx context.Context) error {
	c, ok := s.rdb().(*redis.ClusterClient)
	if !ok {
		return s.rdb().Ping(ctx).Err()
	}
	// The client's map of slots to nodes is read again (in the
	// background, for the next call), whatever the answer: go-redis reads
	// it again on MOVED, and a minute on, but not when the node it sends
	// to is gone, and a primary that failed over to its replica is gone.
	// Read again only on an error here, the map taken while the failover
	// was under way stayed, and every rejoin went to the dead node for a
	// minute (TestAClusterPrimaryKilledMidRunFailsOverToItsReplica).
	c.ReloadState(ctx)
	info, err := c.ClusterInfo(ctx).Result()
	var reply redis.Error
	if errors.As(err, &reply) { // not allowed to ask (an ACL): a ping will do
		return c.Ping(ctx).Err()
	}
	if err == nil && !strings.Contains(info, "cluster_state:ok") {
		err = errors.New("the cluster does not serve every slot yet")
	}
	return err
}

// after sends on c, which holds one, once d has passed on the replica's
// clock; a send c has no room for is dropped, as a ticker drops a tick.
func (s *Store) after(d time.Duration, c chan struct{}) clock.Timer {
	return s.cfg.Clock.AfterFunc(d, func() {
		select {
		case c <- struct{}{}:
		default:
		}
	})
}

// rejoin brings the replica back to the shared state: permits given back
// while Redis was away are removed, held ones renewed (and put back, if
// Redis lost them), then admission goes through Redis again.
func (s *Store) rejoin() bool {
	if !s.flushAdds() || !s.flushReturns() {
		return false
	}
	// A failover may have lost removals the old primary took. Best
	// effort: a lease it misses lapses within its TTL, as it would have.
	s.removeAgain()
	if s.renew() != nil {
		return false
	}
	s.heartbeat(s.now())
	if s.rejoinHook != nil {
		s.rejoinHook()
	}
	s.latency.reset()
	s.setUp(true)
	// Returns made while this rejoin was under way went to the map (the
	// store was not up yet): send them now, or they would wait for the
	// next time Redis goes away and comes back.
	if !s.flushReturns() {
		s.failed("return", errors.New("returns after rejoin failed"))
	}
	return true
}

// nextRejoinWait is how long a degraded replica waits before it tries
// Redis again, after waiting wait last time, since the last rejoin, and
// whether Redis was only slow. A replica that failed soon after its last
// rejoin waits twice as long each time, up to maxRejoinWait, or up to
// maxSlowRejoinWait when Redis answered, only slowly: the replica's share
// leaves unused time that Redis would share out.
func nextRejoinWait(wait, sinceRejoin time.Duration, slow bool) time.Duration {
	if sinceRejoin >= maxRejoinWait {
		return minRejoinWait
	}
	wait = min(2*wait, maxRejoinWait)
	if slow {
		wait = min(wait, maxSlowRejoinWait)
	}
	return wait
}

// How soon a degraded replica tries Redis again: every minRejoinWait, and
// up to maxRejoinWait apart while rejoining keeps failing soon after.
const (
	minRejoinWait = 500 * time.Millisecond
	maxRejoinWait = 30 * time.Second
	// maxSlowRejoinWait bounds the wait when Redis answered, only slowly.
	maxSlowRejoinWait = 2 * time.Second
)

// latencies keeps the duration of recent calls.
type latencies struct {
	mu   sync.Mutex
	last [128]time.Duration
	n    int // calls recorded since the last reset
}

func (l *latencies) reset() {
	l.mu.Lock()
	l.n = 0
	l.mu.Unlock()
}

// add records d and returns the 99th percentile of the recent calls once
// there are enough of them to tell (every 8th call), else 0.
func (l *latencies) add(d time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last[l.n%len(l.last)] = d
	l.n++
	if l.n < 32 || l.n%8 != 0 {
		return 0
	}
	k := min(l.n, len(l.last))
	recent := make([]time.Duration, k)
	copy(recent, l.last[:k])
	slices.Sort(recent)
	return recent[(k*99+99)/100-1]
}

// took records a call that began at start; a replica whose recent calls
// are too slow goes local (see Config.Slow).
func (s *Store) took(start time.Time, err error) {
	if err != nil || s.cfg.Slow <= 0 {
		return
	}
	if p99 := s.latency.add(time.Since(start)); p99 > s.cfg.Slow {
		s.latency.reset()
		s.failed("slow", fmt.Errorf("p99 of recent calls %v, over %v", p99.Round(time.Millisecond), s.cfg.Slow))
	}
}
