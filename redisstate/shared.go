package redisstate

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// shared is one limit group's state on Redis. It keeps the in-process
// state beside it: that one learns from this replica's answers (the
// learned figures are then pushed to Redis) and serves alone while Redis
// is unreachable.
type shared struct {
	st                              *Store
	local                           *lanequeue.Local
	cfg                             lanequeue.Config
	state, leases, waiting, climits string
	out                             int       // permits out, all replicas, at the last reply
	climit                          int       // the shared concurrency limit at the last reply
	paused                          time.Time // the shared pause at the last reply
	since                           time.Time // when the current run of refused Admits began
	lastAsk                         time.Time
	// remoteOut counts this replica's permits from Redis still out: while
	// Redis is away they count against the local limits.
	remoteOut int
}

func newShared(st *Store, group string, cfg lanequeue.Config) *shared {
	sum := sha256.Sum256([]byte(group)) // the group key holds a credential hash: keep keys short
	// The braces make a Redis Cluster keep a group's keys in one slot, as
	// its scripts need.
	base := st.cfg.Prefix + "{g:" + hex.EncodeToString(sum[:12]) + "}"

	return &shared{st: st, local: lanequeue.NewLocal(cfg), cfg: cfg,
		state: base + ":state", leases: base + ":leases", waiting: base + ":waiting", climits: base + ":climits"}
}

// local is a time on Redis' clock (ms), read as the replica's: redisNow
// on Redis' clock is localNow on the replica's. Zero stays zero.
func local(v, redisNow int64, localNow time.Time) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return localNow.Add(time.Duration(v-redisNow) * time.Millisecond)
}

func (s *shared) Admit(now time.Time, cost int64, probe bool) (lanequeue.Ticket, time.Time, bool) {
	if !s.st.up.Load() {
		return s.localAdmit(now, cost, probe)
	}
	if p := s.local.PausedUntil(); now.Before(p) {
		return lanequeue.Ticket{}, p, false // learned while Redis was away
	}
	// A run of refused Admits is one waiter asking again: its arrival
	// orders it against other replicas' waiters.
	if s.since.IsZero() || now.Sub(s.lastAsk) > time.Second {
		s.since = now
	}
	s.lastAsk = now
	lease := s.st.replica + "-" + strconv.FormatUint(s.st.seq.Add(1), 36)
	p := "0"
	if probe {
		p = "1"
	}
	ctx, cancel := s.st.ctx()
	defer cancel()
	res, err := admitScript.Run(ctx, s.st.rdb, []string{s.state, s.leases, s.waiting, s.climits},
		0, cost, p, lease, s.st.cfg.LeaseTTL.Milliseconds(), s.st.replica, max(now.Sub(s.since).Milliseconds(), 0),
		s.st.cfg.KeyTTL.Milliseconds(), s.cfg.Concurrency, s.cfg.MaxConcurrency).Int64Slice()
	s.st.commands.WithLabelValues("admit").Inc()
	if err != nil || len(res) < 10 {
		s.st.failed("admit", errOr(err))
		s.st.returnLater(lease, s.leases) // the script may have run
		return s.localAdmit(now, cost, probe)
	}
	s.st.sawClock(res[9])
	s.out, s.climit, s.paused = int(res[2]), int(res[3]), local(res[8], res[9], now)
	if res[0] != 1 {
		at := local(res[1], res[9], now)
		if at.IsZero() {
			at = now.Add(s.st.cfg.Poll) // a permit may free on another replica
		}
		return lanequeue.Ticket{}, at, false
	}
	s.since = time.Time{}
	s.st.hold(lease, s.leases)
	seq := s.local.NoteDispatch(now)
	s.out++
	s.remoteOut++
	return lanequeue.Ticket{Dispatched: now, Cost: cost, Requests: float64(res[4]), Tokens: float64(res[5]),
		InFlight: int(res[2]), Limit: int(res[3]), Room: res[6] == 1, Paced: res[7] == 1, Lease: lease, Seq: seq}, time.Time{}, true
}

// localAdmit admits from the local limits while Redis is away, counting
// the permits still out that Redis gave: the upstream sees those too.
func (s *shared) localAdmit(now time.Time, cost int64, probe bool) (lanequeue.Ticket, time.Time, bool) {
	if s.remoteOut > 0 {
		if v := s.local.View(now); v.InFlight+s.remoteOut >= v.Concurrency {
			return lanequeue.Ticket{}, time.Time{}, false // a return dispatches again
		}
	}
	return s.local.Admit(now, cost, probe)
}

// budgetArgs are a budget's fields for learnScript.
func budgetArgs(b lanequeue.BudgetView, syn bool, mode int, value, mark float64) []any {
	if !b.Known {
		return []any{0, 0, 0, 0, 0, 0, 0}
	}
	return []any{1, boolInt(syn), b.Limit, b.PerSecond, mode, value, mark}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *shared) Learn(t *lanequeue.Ticket, r lanequeue.Report, now time.Time) {
	if t.Lease != "" {
		t.OutNow = s.out
		if r.Verdict == lanequeue.NotSent {
			s.Refund(t) // in Redis, where it was charged; the local refund is then skipped
		}
	}
	s.local.Learn(t, r, now)
	if !s.st.up.Load() {
		return
	}
	v := s.local.View(now)
	syn := v.Learned == "refusals"
	// Only a ticket Redis gave has marks from Redis' running totals: an
	// answer to one taken while Redis was away teaches the rate, the
	// window and the pause, not what is left.
	remote := t.Lease != ""
	reqMode, reqValue := 0, 0.0
	switch {
	case remote && r.Limits.Requests.HasRemaining:
		reqMode, reqValue = 1, float64(r.Limits.Requests.Remaining)
	case syn && r.Verdict == lanequeue.RateRefused:
		reqMode = 2 // a refusal empties the pace learned from refusals
	}
	tokMode, tokValue := 0, 0.0
	if remote && r.Limits.Tokens.HasRemaining {
		tokMode, tokValue = 1, float64(r.Limits.Tokens.Remaining)
	}
	pause := r.PauseUntil
	if p := s.local.PausedUntil(); p.After(pause) && p.After(now) {
		pause = p
	}
	// The pause travels as a length: a replica's clock moves only its own
	// deadlines.
	args := []any{0, s.st.cfg.KeyTTL.Milliseconds(), max(pause.Sub(now).Milliseconds(), 0), v.Concurrency, s.st.replica}
	args = append(args, budgetArgs(v.Requests, syn, reqMode, reqValue, t.Requests)...)
	args = append(args, budgetArgs(v.Tokens, false, tokMode, tokValue, t.Tokens)...)
	args = append(args, boolInt(v.ConcurrencyLowered))
	ctx, cancel := s.st.ctx()
	defer cancel()
	res, err := learnScript.Run(ctx, s.st.rdb, []string{s.state, s.leases, s.climits}, args...).Int64Slice()
	s.st.commands.WithLabelValues("learn").Inc()
	if err != nil || len(res) < 3 {
		s.st.failed("learn", errOr(err))
		return
	}
	s.st.sawClock(res[2])
	s.out, s.paused = int(res[0]), local(res[1], res[2], now)
}

func (s *shared) Refund(t *lanequeue.Ticket) {
	if t.Lease == "" {
		s.local.Refund(t)
		return
	}
	if t.Refunded {
		return
	}
	t.Refunded = true
	s.giveBack("refund", 1, float64(t.Cost), 0)
}

func (s *shared) Settle(t *lanequeue.Ticket, usedTokens int64) {
	if t.Lease == "" {
		s.local.Settle(t, usedTokens)
		return
	}
	if !t.Refunded && usedTokens != t.Cost {
		// t.Tokens is Redis' running total right after t's dispatch: an
		// answer whose count covered it already holds what t used.
		s.giveBack("settle", 0, float64(t.Cost-usedTokens), t.Tokens)
	}
}

// giveBack adds requests and tokens back to the shared budgets; a
// positive mark (a settle's) skips what an answer's count already covered.
func (s *shared) giveBack(op string, requests, tokens, mark float64) {
	if !s.st.up.Load() {
		return
	}
	ctx, cancel := s.st.ctx()
	defer cancel()
	err := giveBackScript.Run(ctx, s.st.rdb, []string{s.state}, 0, requests, tokens, mark).Err()
	s.st.commands.WithLabelValues(op).Inc()
	if err != nil {
		s.st.failed(op, err)
	}
}

func (s *shared) Return(t *lanequeue.Ticket, now time.Time) {
	if t.Lease == "" {
		s.local.Return(t, now) // a permit taken while Redis was away
		return
	}
	if t.Returned {
		return
	}
	t.Returned = true
	s.remoteOut--
	s.local.NoteReturn(t, now)
	s.st.drop(t.Lease)
	if s.out > 0 {
		s.out--
	}
	if !s.st.up.Load() {
		s.st.returnLater(t.Lease, s.leases) // sent when Redis answers again
		return
	}
	ctx, cancel := s.st.ctx()
	defer cancel()
	err := s.st.rdb.ZRem(ctx, s.leases, t.Lease).Err()
	s.st.commands.WithLabelValues("return").Inc()
	if err != nil {
		s.st.failed("return", err)
		s.st.returnLater(t.Lease, s.leases)
	}
}

func (s *shared) PausedUntil() time.Time {
	p := s.local.PausedUntil()
	if s.st.up.Load() && s.paused.After(p) {
		return s.paused
	}
	return p
}

func (s *shared) View(now time.Time) lanequeue.View {
	v := s.local.View(now)
	v.Shared = s.st.Status()
	if s.st.up.Load() {
		if s.climit > 0 {
			v.Concurrency = s.climit
		}
		v.InFlight = s.out
		if s.paused.After(now) && s.paused.After(v.PausedUntil) {
			v.PausedUntil, v.PauseReason = s.paused, "shared"
		}
	}
	return v
}

type errString string

func (e errString) Error() string { return string(e) }

func errOr(err error) error {
	if err != nil {
		return err
	}
	return errString("short reply")
}

// Knows reports whether this replica's state has learned a limit (see
// lanequeue.Local.Knows).
func (s *shared) Knows() bool { return s.local.Knows() }
