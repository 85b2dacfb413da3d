package redisstate

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
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
	local                           *lanequeue.Memory
	cfg                             lanequeue.Config
	state, leases, waiting, climits string
	raise, levels                   string
	out                             int       // permits out, all replicas, at the last reply
	climit                          int       // the shared concurrency limit at the last reply
	paused                          time.Time // the shared pause at the last reply
	since                           time.Time // when the current run of refused Admits began
	lastAsk                         time.Time
	// remoteOut counts this replica's permits from Redis still out: while
	// Redis is away they count against the local limits.
	remoteOut int
	// last are the shared limits at the last reply: while Redis is away
	// the replica uses its share of them (see share).
	last limits
	// reqRates and tokRates are the refill rates Redis gave lately (see
	// shareLimits).
	reqRates, tokRates readings
	// share is what this replica may use while Redis is away; nil while
	// it is up.
	share *share
	// answered: some replica learned from an answer of the group lately,
	// so this one need not wait for an answer of its own to go on.
	answered bool
	// localLeases are the leases that count, in Redis, the permits this
	// replica took on its local limits and still holds.
	localLeases []string
}

func newShared(st *Store, group string, cfg lanequeue.Config) *shared {
	sum := sha256.Sum256([]byte(group)) // the group key holds a credential hash: keep keys short
	// The braces make a Redis Cluster keep a group's keys in one slot, as
	// its scripts need.
	base := st.cfg.Prefix + "{g:" + hex.EncodeToString(sum[:12]) + "}"

	return &shared{st: st, local: lanequeue.NewMemory(cfg), cfg: cfg,
		state: base + ":state", leases: base + ":leases", waiting: base + ":waiting", climits: base + ":climits",
		raise: base + ":raise", levels: base + ":levels"}
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
	s.st.ask(now)
	if !s.st.up.Load() {
		return s.localAdmit(now, cost, probe)
	}
	s.share = nil
	if p := s.local.PausedUntil(); now.Before(p) {
		return lanequeue.Ticket{}, p, false // learned while Redis was away, or a window's closure
	}
	// A fixed window's closure holds this replica's requests but for one
	// knock at a time, as it holds one process's; its allowance, not a
	// pace learned from refusals, paces the group.
	at, ok, windowed := s.local.WindowGate(now)
	if !ok {
		return lanequeue.Ticket{}, at, false
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
	start := time.Now()
	// The group's permits given back and not yet removed by the writer
	// go with the admission: this replica's own returns never hold back
	// its next request.
	returned := s.st.takeReturns(s.leases)
	args := []any{0, cost, p, lease, s.st.cfg.LeaseTTL.Milliseconds(), s.st.replica, max(now.Sub(s.since).Milliseconds(), 0),
		s.st.cfg.KeyTTL.Milliseconds(), s.cfg.Concurrency, s.cfg.MaxConcurrency, s.slowStart(), boolInt(windowed)}
	for _, l := range returned {
		args = append(args, l)
	}
	res, err := admitScript.Run(ctx, s.st.rdb, []string{s.state, s.leases, s.waiting, s.climits}, args...).Int64Slice()
	s.st.commands.WithLabelValues("admit").Inc()
	s.st.took(start, err)
	rep, ok := decodeAdmit(res, now)
	if err != nil || !ok {
		s.st.failed("admit", errOr(err))
		s.st.returnLater(lease, s.leases) // the script may have run
		for _, l := range returned {
			s.st.returnLater(l, s.leases)
		}
		return s.localAdmit(now, cost, probe)
	}
	return s.admitted(now, cost, lease, rep)
}

// slowStart is the admit script's slow-start flag (see its spread): 0
// when the group's limits are configured, which has none.
func (s *shared) slowStart() int {
	if l := s.cfg.Limits; l.Concurrency > 0 || l.RPM > 0 || l.TPM > 0 {
		return 0
	}
	return 1
}

// admitted takes admitScript's reply rep for the request of cost and
// lease at now: the ticket, or when to ask again.
func (s *shared) admitted(now time.Time, cost int64, lease string, rep admitReply) (lanequeue.Ticket, time.Time, bool) {
	s.st.sawClock(rep.redisNow)
	s.out, s.climit, s.paused = rep.out, rep.limits.concurrency, rep.paused
	s.answered = rep.answered
	// The upstream is live when it admits any replica's requests: a
	// replica whose own first answer is a refusal does not take it for
	// an outage (and pause the fleet for it).
	s.local.NoteAccepted(rep.accepted)
	s.seeLimits(rep.limits, rep.paceFromRefusals)
	fleetPace := 0.0
	if rep.paceFromRefusals {
		fleetPace = rep.limits.reqRate
	}
	s.local.NoteFleet(fleetPace, rep.refusals, now)
	if !rep.ok {
		at := rep.retryAt
		if at.IsZero() {
			at = now.Add(s.st.cfg.Poll) // a permit may free on another replica
		} else if rep.paused.IsZero() && rep.paceFromRefusals {
			// The shared pace learned from refusals held it: this
			// replica's probe cycle may raise it (one replica at a time).
			s.local.NoteHeld(now)
		}
		return lanequeue.Ticket{}, at, false
	}
	s.since = time.Time{}
	s.st.hold(lease, s.leases)
	seq, level, probe := s.local.NoteDispatch(now, rep.out, uint64(max(rep.reqSent, 0)), rep.lastSecond)
	s.out++
	s.remoteOut++
	return lanequeue.Ticket{Dispatched: now, Cost: cost, Requests: float64(rep.reqSent), Tokens: float64(rep.tokSent),
		InFlight: rep.out, Limit: rep.limits.concurrency, Room: rep.room, Paced: rep.paced, Lease: lease, Seq: seq,
		Level: level, Probe: probe, Refusals: rep.refusals + 1}, time.Time{}, true
}

// admitReply is admitScript's reply, its times on this replica's clock.
type admitReply struct {
	ok bool
	// retryAt is when to ask again (zero: when a permit frees).
	retryAt time.Time
	// out is the permits out before this one, all replicas.
	out int
	// reqSent and tokSent are the group's running totals of requests
	// and tokens sent, this dispatch included (0 when refused).
	reqSent, tokSent int64
	// room: the budgets known had room for it; paced: the pace learned
	// from refusals admitted it.
	room, paced bool
	paused      time.Time
	redisNow    int64 // Redis' clock (ms) when it ran
	// answered: some replica learned from an answer in the last minute.
	answered bool
	limits   limits
	// paceFromRefusals: the shared request pace was learned from refusals.
	paceFromRefusals bool
	// accepted is when some replica last had an answer the upstream
	// accepted (zero: none).
	accepted time.Time
	// refusals counts the refusals every replica learned from so far.
	refusals uint64
	// lastSecond is the group's dispatches in the last second, all
	// replicas, this one included (0 when refused).
	lastSecond int
}

// decodeAdmit reads admitScript's reply at now; false for a short one.
func decodeAdmit(res []int64, now time.Time) (admitReply, bool) {
	if len(res) < 19 {
		return admitReply{}, false
	}
	at := func(v int64) time.Time { return local(v, res[9], now) }
	return admitReply{ok: res[0] == 1, retryAt: at(res[1]), out: int(res[2]), reqSent: res[4], tokSent: res[5],
		room: res[6] == 1, paced: res[7] == 1, paused: at(res[8]), redisNow: res[9], answered: res[10] == 1,
		limits: limits{concurrency: int(res[3]), reqRate: float64(res[11]) / 1000, tokSize: float64(res[12]),
			tokRate: float64(res[13]) / 1000, reqSize: float64(res[14])},
		paceFromRefusals: res[15] == 1, accepted: at(res[16]), refusals: uint64(max(res[17], 0)), lastSecond: int(res[18])}, true
}

// localAdmit admits from the local limits while Redis is away, within
// this replica's share of the last shared limits, counting the permits
// still out that Redis gave: the upstream sees those too.
func (s *shared) localAdmit(now time.Time, cost int64, probe bool) (lanequeue.Ticket, time.Time, bool) {
	v := s.local.View(now)
	if n := s.st.sharers(now); s.share == nil || s.share.n != n {
		// Made when Redis goes, and made again, carrying what the old
		// one had used, when the number of busy replicas changes.
		old := s.share
		s.share = newShare(s.shareLimits(), v, n)
		s.share.carry(old)
		s.st.log.Debug("redis away or slow: the group uses its share of the shared limits", "replicas", n,
			"concurrency", s.share.concurrency, "gap", s.share.gap, "tokens_per_second", s.share.tokRate)
	}
	if v.InFlight+s.remoteOut >= min(v.Concurrency, s.share.concurrency) {
		return lanequeue.Ticket{}, time.Time{}, false // a return dispatches again
	}
	if at, ok := s.share.admit(now, cost); !ok {
		return lanequeue.Ticket{}, at, false
	}
	t, at, ok := s.local.Admit(now, cost, probe)
	if ok {
		s.share.take(now, cost)
		if n := s.st.sharers(now); n > 1 {
			// The level it goes at is the fleet's: each replica sends
			// about as many as this one. A refusal that names the
			// number in flight must not teach the group a limit of one
			// because this replica had one out.
			t.InFlight = (t.InFlight+s.remoteOut+1)*n - 1
		}
		// Counted in Redis too, as soon as it takes it: the replicas
		// still sharing (Redis may only be slow for this one) see it.
		l := s.st.replica + "-l" + strconv.FormatUint(s.st.seq.Add(1), 36)
		s.localLeases = append(s.localLeases, l)
		s.st.addLater(l, s.leases)
		// And its charge to the shared budgets, or the replicas still
		// sharing would see room this one used, be refused, and take
		// the window for smaller than it is.
		s.st.giveLater(give{op: "charge", state: s.state, requests: -1, tokens: -float64(cost)})
	}
	return t, at, ok
}

// budgetArgs are a budget's fields for learnScript.
// How learnScript sets what is left of a budget from an answer (the
// mode among its budget arguments).
type leftMode int

const (
	leftUnchanged leftMode = 0 // the answer says nothing of what is left
	leftCounted   leftMode = 1 // the upstream's remaining count (value), less what was sent after mark
	leftCapped    leftMode = 2 // at most value
)

func budgetArgs(b lanequeue.BudgetView, syn bool, mode leftMode, value, mark float64) []any {
	if !b.Known {
		return []any{0, 0, 0, 0, 0, 0, 0}
	}
	return []any{1, boolInt(syn), b.Limit, b.PerSecond, int(mode), value, mark}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *shared) Learn(t *lanequeue.Ticket, r lanequeue.Report, now time.Time) {
	if t.Lease != "" {
		// At least the number in flight it went at: the count from this
		// replica's last reply may be old (it has been local meanwhile).
		t.OutNow = max(s.out, t.Level)
	} else if n := s.st.sharers(now); n > 1 {
		// A permit taken while Redis was away: the upstream saw about
		// this replica's permits out times the replicas, each using its
		// share. A refusal at 3 of this replica's must not teach the
		// group a concurrency of 2.
		t.OutNow = (s.local.View(now).InFlight + s.remoteOut) * n
	}
	s.local.Learn(t, r, now)
	if !s.st.up.Load() {
		return
	}
	v := s.local.View(now)
	args, kind := s.learnArgs(t, r, v, now)
	ctx, cancel := s.st.ctx()
	defer cancel()
	start := time.Now()
	res, err := learnScript.Run(ctx, s.st.rdb, []string{s.state, s.leases, s.climits, s.raise, s.levels}, args...).Int64Slice()
	s.st.commands.WithLabelValues("learn").Inc()
	s.st.took(start, err)
	rep, ok := decodeLearn(res, now)
	if err != nil || !ok {
		s.st.failed("learn", errOr(err))
		return
	}
	s.st.sawClock(rep.redisNow)
	s.out, s.paused = rep.out, rep.paused
	if v.FromRefusals() {
		s.local.NoteRaiser(probeSeen(rep.raiser, s.last.reqRate, v.Requests.PerSecond))
	}
	if kind >= 0 {
		s.local.ShareLevels(rep.admitted, rep.refused, now)
	}
}

// probeSeen reports whether the upstream saw this replica's pace, a
// probe's when it probes: it holds the raise lease (raiser), or the
// fleet's pace is at least its own. A probe made above the fleet's pace
// without the lease moves only this replica's figure, and cannot come
// back clean.
func probeSeen(raiser bool, fleetPace, ownPace float64) bool {
	return raiser || fleetPace >= ownPace
}

// learnArgs are learnScript's arguments for t's answer r, this replica's
// state v after learning from it; kind is the answer's kind among the
// counts by level (0 admitted, 1 refused, -1 neither).
func (s *shared) learnArgs(t *lanequeue.Ticket, r lanequeue.Report, v lanequeue.View, now time.Time) (args []any, kind int) {
	syn := v.FromRefusals()
	// Only a ticket Redis gave has marks from Redis' running totals: an
	// answer to one taken while Redis was away teaches the rate, the
	// window and the pause, not what is left.
	remote := t.Lease != ""
	reqMode, reqValue := leftUnchanged, 0.0
	switch {
	case remote && r.Limits.Requests.HasRemaining:
		reqMode, reqValue = leftCounted, float64(r.Limits.Requests.Remaining)
	case syn && r.Verdict == lanequeue.RateRefused && v.Window == nil:
		// At 0: a refusal empties the pace learned from refusals (a
		// window's closure refuses whatever the pace).
		reqMode = leftCapped
	}
	tokMode, tokValue := leftUnchanged, 0.0
	if remote && r.Limits.Tokens.HasRemaining {
		tokMode, tokValue = leftCounted, float64(r.Limits.Tokens.Remaining)
	}
	// The pause this replica took, not the report's: learning from the
	// behaviour of an upstream without headers may decline a refusal's
	// wait, when the learned pace or concurrency limit holds the group;
	// the fleet must not idle for what one replica declined.
	pause := s.local.PausedUntil()
	// The pause travels as a length: a replica's clock moves only its own
	// deadlines.
	args = []any{0, s.st.cfg.KeyTTL.Milliseconds(), max(pause.Sub(now).Milliseconds(), 0), v.Concurrency, s.st.replica}
	args = append(args, budgetArgs(v.Requests, syn, reqMode, reqValue, t.Requests)...)
	args = append(args, budgetArgs(v.Tokens, false, tokMode, tokValue, t.Tokens)...)
	args = append(args, boolInt(v.ConcurrencyLowered))
	// The answer counts toward the levels every replica judges the bound
	// from, when Redis gave its permit (its level is the fleet's).
	kind = -1
	switch {
	case !remote || r.Verdict == lanequeue.Failed || r.Verdict == lanequeue.NotSent:
	case r.Verdict == lanequeue.Accepted:
		kind = 0
	default:
		kind = 1
	}
	reply := int64(0) // an accepted answer's time to its headers, for the slow start's spread
	if kind == 0 {
		reply = max(now.Sub(t.Dispatched).Milliseconds(), 1)
	}
	return append(args, t.Level, kind, boolInt(v.Bound == lanequeue.BoundConcurrency), boolInt(r.Verdict.Refusal()), reply), kind
}

// learnReply is learnScript's reply, its times on this replica's clock.
type learnReply struct {
	out      int // permits out, all replicas
	paused   time.Time
	redisNow int64 // Redis' clock (ms) when it ran
	// raiser: this replica holds the raise lease, so its probes above a
	// pace learned from refusals are the fleet's.
	raiser bool
	// admitted and refused count every replica's answers by the number
	// in flight they went at (index: level).
	admitted, refused []float64
}

// decodeLearn reads learnScript's reply at now; false for a short one.
func decodeLearn(res []int64, now time.Time) (learnReply, bool) {
	if len(res) < 4 {
		return learnReply{}, false
	}
	rep := learnReply{out: int(res[0]), paused: local(res[1], res[2], now), redisNow: res[2], raiser: res[3] == 1}
	for i := 4; i+2 < len(res); i += 3 {
		level := int(res[i])
		if level <= 0 || level > 4096 {
			continue
		}
		for len(rep.admitted) <= level {
			rep.admitted, rep.refused = append(rep.admitted, 0), append(rep.refused, 0)
		}
		if res[i+1] == 1 {
			rep.refused[level] = float64(res[i+2]) / 1000
		} else {
			rep.admitted[level] = float64(res[i+2]) / 1000
		}
	}
	return rep, true
}

func (s *shared) Refund(t *lanequeue.Ticket) {
	if t.Lease == "" {
		s.local.Refund(t)
		return
	}
	s.giveBack("refund", 1, float64(t.Cost), 0)
}

func (s *shared) Settle(t *lanequeue.Ticket, usedTokens int64) {
	if t.Lease == "" {
		s.local.Settle(t, usedTokens)
		return
	}
	if usedTokens != t.Cost {
		// t.Tokens is Redis' running total right after t's dispatch: an
		// answer whose count covered it already holds what t used.
		s.giveBack("settle", 0, float64(t.Cost-usedTokens), t.Tokens)
	}
}

// giveBack adds requests and tokens back to the shared budgets, through
// the writer; a positive mark (a settle's) skips what an answer's count
// already covered.
func (s *shared) giveBack(op string, requests, tokens, mark float64) {
	if !s.st.up.Load() {
		return
	}
	s.st.giveLater(give{op: op, state: s.state, requests: requests, tokens: tokens, mark: mark})
}

func (s *shared) Return(t *lanequeue.Ticket, now time.Time) {
	if t.Lease == "" {
		// A permit taken while Redis was away; once Redis is back a lease
		// counts it there (see localAdmit), and goes with it.
		if len(s.localLeases) > 0 {
			l := s.localLeases[len(s.localLeases)-1]
			s.localLeases = s.localLeases[:len(s.localLeases)-1]
			s.st.drop(l)
			s.st.returnLater(l, s.leases)
		}
		s.local.Return(t, now)
		return
	}
	s.remoteOut--
	s.local.NoteReturn(t, now)
	s.st.drop(t.Lease)
	if s.out > 0 {
		s.out--
	}
	// The writer removes the lease from Redis (or the rejoin, when Redis
	// is away): the request does not wait for it.
	s.st.returnLater(t.Lease, s.leases)
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

var (
	_ lanequeue.Fleet  = (*shared)(nil)
	_ lanequeue.Knower = (*shared)(nil)
)

// AnsweredElsewhere reports whether a replica learned from an answer of
// the group lately: this one's first request need not wait for its own.
func (s *shared) AnsweredElsewhere() bool { return s.st.up.Load() && s.answered }

// Knows reports whether this replica's state has learned a limit (see
// lanequeue.Memory.Knows).
func (s *shared) Knows() bool { return s.local.Knows() }

// seeLimits keeps l, Redis' latest limits, and its rates among the
// readings the replica's share is paced by, should Redis go away (see
// shareLimits). A pace learned from refusals lowers on evidence, and a
// window found smaller than it said (a correction lowers its size) is
// new: either starts the readings anew.
func (s *shared) seeLimits(l limits, syn bool) {
	s.reqRates.add(l.reqRate, syn || l.reqSize < s.last.reqSize)
	s.tokRates.add(l.tokRate, l.tokSize < s.last.tokSize)
	s.last = l
}

// shareLimits are the limits a share comes from: the latest, with each
// rate the median of its recent readings. A refill rate read from headers
// swings with each answer: it reads low while the window is nearly full
// (the answer's latency counts in the window's reset) and, now and then,
// high. Worked out only when a share is made, not at every admission.
func (s *shared) shareLimits() limits {
	l := s.last
	l.reqRate, l.tokRate = s.reqRates.median(), s.tokRates.median()
	return l
}

// readings are the recent readings of a rate, one per admission.
type readings struct {
	v [31]float64
	n int
}

// add keeps v, after forgetting every earlier reading if restart.
func (r *readings) add(v float64, restart bool) {
	if restart {
		r.n = 0
	}
	r.v[r.n%len(r.v)] = v
	r.n++
}

// median is the median of the readings kept (the upper one of an even
// count), 0 with none.
func (r *readings) median() float64 {
	k := min(r.n, len(r.v))
	if k == 0 {
		return 0
	}
	var sorted [len(r.v)]float64
	copy(sorted[:], r.v[:k])
	slices.Sort(sorted[:k])
	return sorted[k/2]
}
