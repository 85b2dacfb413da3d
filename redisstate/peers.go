package redisstate

// Peers: how many replicas share a group's limits. Each replica says it
// is alive, and whether it had requests to admit, in a heartbeat every
// heartbeatEvery (loop, in health.go, sends it), and reads back how many
// are alive and how many others are busy: while Redis is away or slow, a
// replica uses its share of the last shared limits, 1/sharers of them.

import "time"

// heartbeatEvery is how often a replica says it is alive.
const heartbeatEvery = 500 * time.Millisecond

// busyWindow is how long a replica counts as busy after a heartbeat
// that said so: a heartbeat may be missed.
const busyWindow = heartbeatEvery * 5 / 2

// heartbeat says this replica is alive, and busy if it had requests to
// admit since the last one, and learns how many replicas are of each.
func (s *Store) heartbeat(now time.Time) {
	ctx, cancel := s.ctx()
	defer cancel()
	busy := now.UnixNano()-s.asked.Load() < int64(heartbeatEvery)
	args := heartbeatArgs{Now: s.scriptNow(), Replica: s.replica, Busy: busy, Window: busyWindow.Milliseconds()}
	res, err := heartbeatScript.Run(ctx, s.rdb(), s.fleetKeys(), argv(args)...).Int64Slice()
	s.commands.WithLabelValues("heartbeat").Inc()
	var rep heartbeatWire
	if err == nil {
		rep, err = decodeHeartbeat(res)
	}
	if err == nil && rep.Alive > 0 {
		s.peers.Store(rep.Alive)
		s.busyPeers.Store(max(rep.Busy, 0))
		s.replicasGauge.Set(float64(rep.Alive))
	}
}

// fleetKeys are the sets of replicas alive and busy, in one hash slot
// (the braces): the heartbeat's script writes both.
func (s *Store) fleetKeys() []string {
	return []string{s.cfg.Prefix + "{fleet}replicas", s.cfg.Prefix + "{fleet}busy"}
}

// ask notes that the replica has a request to admit at now: busy, and
// since now if it was not (nothing to admit for a heartbeat).
func (s *Store) ask(now time.Time) {
	n := now.UnixNano()
	last := s.asked.Load()
	if n <= last {
		return
	}
	if n-last > int64(heartbeatEvery) {
		s.busySince.Store(n)
	}
	s.asked.Store(n)
}

// sharers is how many replicas share the group's limits at now while
// Redis is away or slow: this one and the others busy lately, as Redis
// last said. For busyWindow after this replica became busy it is every
// replica alive instead: replicas whose clients start together have not
// yet told each other, and a share must not take what theirs need.
func (s *Store) sharers(now time.Time) int {
	if now.UnixNano()-s.busySince.Load() < int64(busyWindow) {
		return s.Replicas()
	}
	return int(s.busyPeers.Load()) + 1
}

// Replicas is the number of replicas seen alive in the last minute, as
// Redis last said (this one included; 1 before it said anything).
func (s *Store) Replicas() int { return int(max(s.peers.Load(), 1)) }
