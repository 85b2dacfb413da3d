package redisstate

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/redis/go-redis/v9"
)

// shared is one limit group's state on Redis. It keeps the in-process
// state beside it: that one learns from this replica's answers (the
// learned figures are then pushed to Redis) and serves alone while Redis
// is unreachable.
type shared struct {
	st                              *Store
	local                           *limit.Memory
	cfg                             limit.Config
	state, leases, waiting, climits string
	raise, levels, groupSent        string
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
	// stated is the boundary of this replica's closure stated to the
	// millisecond, to which it paused the fleet (see learnArgsFor): until
	// then its knocks, the closure's tests, pass that pause.
	stated time.Time
	// aparts are the names (hashes) of the limits some replica took out
	// of the trial this state paces, each ended by a comma, as Redis had
	// them when it counted apartN (see Apart).
	aparts string
	apartN int64
	// joined is the name of the limit some replica found this one
	// shares, as the last answer's reply had it (see Joined).
	joined int64
}

func newShared(st *Store, key string, cfg limit.Config) *shared {
	// Keys hold a credential hash: keep them short. The braces make a
	// Redis Cluster keep the keys of every limit of a lanes' group in one
	// slot: a script touches one limit's and the group's count.
	group := sha256.Sum256([]byte(groupOf(key)))
	sum := sha256.Sum256([]byte(key))
	tag := st.cfg.Prefix + "{g:" + hex.EncodeToString(group[:12]) + "}"
	base := tag + hex.EncodeToString(sum[:12])
	return &shared{st: st, local: limit.NewMemory(cfg), cfg: cfg,
		state: base + ":state", leases: base + ":leases", waiting: base + ":waiting", climits: base + ":climits",
		raise: base + ":raise", levels: base + ":levels", groupSent: tag + ":sent"}
}

// groupOf is the lanes' group a limit key belongs to: lanequeue's keys
// begin with the group's route and credential hash, each ended by a NUL
// (lanequeue.Key); a key without them is a group of its own.
func groupOf(key string) string {
	route, rest, ok := strings.Cut(key, "\x00")
	if !ok {
		return key
	}
	cred, _, _ := strings.Cut(rest, "\x00")
	return route + "\x00" + cred
}

func (s *shared) Admit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	s.st.ask(now)
	if !s.st.up.Load() {
		return s.localAdmit(now, cost, alone)
	}
	s.share = nil
	if p := s.local.PausedUntil(); now.Before(p) {
		return limit.Ticket{}, p, false // learned while Redis was away, or a window's closure
	}
	// A fixed window's closure holds this replica's requests but for one
	// knock at a time, as it holds one process's; its allowance, not a
	// pace learned from refusals, paces the group.
	at, ok, knock, windowed := s.local.Fleet().WindowGate(now)
	if !ok {
		return limit.Ticket{}, at, false
	}
	// A run of refused Admits is one waiter asking again: its arrival
	// orders it against other replicas' waiters.
	if s.since.IsZero() || now.Sub(s.lastAsk) > time.Second {
		s.since = now
	}
	s.lastAsk = now
	lease := s.st.replica + "-" + strconv.FormatUint(s.st.seq.Add(1), 36)
	ctx, cancel := s.st.ctx()
	defer cancel()
	start := time.Now()
	// The group's permits given back and not yet removed by the writer
	// go with the admission: this replica's own returns never hold back
	// its next request.
	returned := s.st.takeReturns(s.leases)
	args := admitArgs{Now: s.st.scriptNow(), Cost: cost, Alone: alone, Lease: lease, LeaseTTL: s.st.cfg.LeaseTTL.Milliseconds(), Replica: s.st.replica,
		Age: max(now.Sub(s.since).Milliseconds(), 0), KeyTTL: s.st.cfg.KeyTTL.Milliseconds(), DefaultClimit: s.cfg.Concurrency,
		MaxClimit: s.cfg.MaxConcurrency, SlowStart: s.slowStart(), Windowed: windowed, Knock: knock && now.Before(s.stated), Returned: returned}
	res, err := admitScript.Run(ctx, s.st.rdb(), []string{s.state, s.leases, s.waiting, s.climits, s.groupSent}, argv(args)...).Int64Slice()
	s.st.commands.WithLabelValues("admit").Inc()
	s.st.took(start, err)
	var rep admitReply
	if err == nil {
		rep, err = decodeAdmit(res, now)
	}
	if err != nil {
		s.st.failed("admit", err)
		s.st.returnLater(lease, s.leases) // the script may have run
		for _, l := range returned {
			s.st.returnLater(l, s.leases)
		}
		return s.localAdmit(now, cost, alone)
	}
	if len(returned) > 0 {
		s.st.noteRemoved(s.leases, returned)
	}
	return s.admitted(now, cost, lease, rep)
}

// slowStart is the admit script's slow-start flag (see its spread): 1
// when the group starts slow, by the rule the in-process state follows
// (limit.Limits.SlowStart), else 0.
func (s *shared) slowStart() int {
	if s.cfg.Limits.SlowStart() {
		return 1
	}
	return 0
}

// admitted takes admitScript's reply rep for the request of cost and
// lease at now: the ticket, or when to ask again.
func (s *shared) admitted(now time.Time, cost int64, lease string, rep admitReply) (limit.Ticket, time.Time, bool) {
	s.st.sawClock(rep.redisNow)
	s.out, s.climit, s.paused = rep.out, rep.limits.concurrency, rep.paused
	s.answered = rep.answered
	s.seeLimits(rep.limits, rep.paceFromRefusals)
	if rep.apart != s.apartN {
		s.readAparts(rep.apart)
	}
	fleetPace := 0.0
	if rep.paceFromRefusals {
		fleetPace = rep.limits.reqRate
	}
	// The upstream is live when it admits any replica's requests: a
	// replica whose own first answer is a refusal does not take it for
	// an outage (and pause the fleet for it).
	s.local.Fleet().Said(rep.accepted, fleetPace, rep.refusals, rep.admitted, now)
	if !rep.ok {
		at := rep.retryAt
		if at.IsZero() {
			at = now.Add(s.st.cfg.Poll) // a permit may free on another replica
		} else if rep.paused.IsZero() && rep.paceFromRefusals {
			// The shared pace learned from refusals held it: this
			// replica's probe cycle may raise it (one replica at a time).
			s.local.Fleet().Held(now)
		}
		return limit.Ticket{}, at, false
	}
	s.since = time.Time{}
	s.st.hold(lease, s.leases)
	t := s.local.Fleet().Dispatched(now, rep.out, uint64(max(rep.reqSent, 0)), rep.lastSecond)
	s.out++
	s.remoteOut++
	t.Cost, t.Requests, t.Tokens, t.Limit = cost, float64(rep.reqSent), float64(rep.tokSent), rep.limits.concurrency
	t.Room, t.Paced, t.Lease, t.Refusals = rep.room, rep.paced, lease, rep.refusals+1
	t.GroupSeq = rep.groupSent
	return t, time.Time{}, true
}

// localAdmit admits from the local limits while Redis is away, within
// this replica's share of the last shared limits, counting the permits
// still out that Redis gave: the upstream sees those too.
func (s *shared) localAdmit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	v := s.local.View(now)
	if n := s.st.sharers(now); s.share == nil || s.share.n != n {
		// Made when Redis goes, and made again, carrying what the old
		// one had used, when the number of busy replicas changes.
		old := s.share
		s.share = newShare(s.shareLimits(), v, n)
		s.share.carry(old)
		s.st.log.Debug("redis away or slow: the group uses its share of the shared limits", "replicas", n,
			"concurrency", s.share.concurrency, "gap", s.share.gap, "tokens_per_second", s.share.tokens.Rate)
	}
	if v.InFlight+s.remoteOut >= min(v.Concurrency, s.share.concurrency) {
		return limit.Ticket{}, time.Time{}, false // a return dispatches again
	}
	if at, ok := s.share.admit(now, cost); !ok {
		return limit.Ticket{}, at, false
	}
	t, at, ok := s.local.Admit(now, cost, alone)
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

func (s *shared) Learn(t *limit.Ticket, r limit.Report, now time.Time) {
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
	args := s.learnArgsFor(t, r, v, now)
	ctx, cancel := s.st.ctx()
	defer cancel()
	start := time.Now()
	res, err := learnScript.Run(ctx, s.st.rdb(), []string{s.state, s.leases, s.climits, s.raise, s.levels}, argv(args)...).Int64Slice()
	s.st.commands.WithLabelValues("learn").Inc()
	s.st.took(start, err)
	var rep learnReply
	if err == nil {
		rep, err = decodeLearn(res, now)
	}
	if err != nil {
		s.st.failed("learn", err)
		return
	}
	s.st.sawClock(rep.redisNow)
	s.out, s.paused, s.joined = rep.out, rep.paused, rep.joined
	if v.FromRefusals() {
		s.local.Fleet().Raiser(probeSeen(rep.raiser, s.last.reqRate, v.Requests.PerSecond))
	}
	if args.Kind != answerUncounted {
		s.local.Fleet().Levels(rep.admitted, rep.refused, now)
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

// learnArgsFor are learnScript's arguments for t's answer r, this
// replica's state v after learning from it.
func (s *shared) learnArgsFor(t *limit.Ticket, r limit.Report, v limit.View, now time.Time) learnArgs {
	syn := v.FromRefusals()
	// Only a ticket Redis gave has marks from Redis' running totals: an
	// answer to one taken while Redis was away teaches the rate, the
	// window and the pause, not what is left.
	remote := t.Lease != ""
	reqMode, reqValue := leftUnchanged, 0.0
	switch {
	case remote && r.Limits.Requests.HasRemaining:
		reqMode, reqValue = leftCounted, float64(r.Limits.Requests.Remaining)
	case syn && r.Verdict == limit.RateRefused && v.Window == nil:
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
	// A rate refusal whose wait is stated to the millisecond, in a group
	// that has seen a fixed window's closure.
	msHint := r.Verdict == limit.RateRefused && r.Hint%time.Second != 0 && v.Window != nil
	if msHint && v.Window.Closed && v.Window.Stated {
		// A closure the hints state, to the millisecond: this replica
		// holds only until its test, but the rest of the fleet waits
		// for the boundary, or what it sent meanwhile would be refused
		// with the test. The test itself goes (admitArgs.Knock).
		pause = clock.Later(pause, now.Add(r.Hint))
		s.stated = now.Add(r.Hint)
	}
	kind := answerKindOf(remote, r.Verdict)
	reply := int64(0) // an accepted answer's time to its headers, for the slow start's spread
	if kind == answerAdmitted {
		reply = max(now.Sub(t.Dispatched).Milliseconds(), 1)
	}
	// A refusal in a fixed window's closure whose boundary the upstream
	// stated to the millisecond teaches the fleet's window (windows.refused).
	bound, sent := int64(0), 0.0
	if remote {
		sent = t.Requests
	}
	if remote && msHint && v.Window.ClosedUntil.After(now) {
		bound = max(v.Window.ClosedUntil.Sub(now).Milliseconds(), 1)
	}
	// The pause travels as a length: a replica's clock moves only its own
	// deadlines.
	return learnArgs{Now: s.st.scriptNow(), KeyTTL: s.st.cfg.KeyTTL.Milliseconds(), Pause: max(pause.Sub(now).Milliseconds(), 0), Climit: v.Concurrency,
		Replica: s.st.replica, Req: newBudgetArgs(v.Requests, syn, reqMode, reqValue, t.Requests),
		Tok: newBudgetArgs(v.Tokens, false, tokMode, tokValue, t.Tokens), Lowered: v.ConcurrencyLowered, Level: t.Level,
		Kind: kind, ConcurrencyBound: v.Bound == limit.BoundConcurrency, Refusal: r.Verdict.Refusal(), Reply: reply, Bound: bound, Sent: sent}
}

// answerKindOf is how an answer of verdict counts toward the levels every
// replica judges the bound from: only when Redis gave its permit
// (remote), since only then is its level the fleet's.
func answerKindOf(remote bool, verdict limit.Verdict) answerKind {
	if !remote || verdict == limit.Failed || verdict == limit.NotSent {
		return answerUncounted
	}
	if verdict == limit.Accepted {
		return answerAdmitted
	}
	return answerRefused
}

func (s *shared) Refund(t *limit.Ticket) {
	if t.Lease == "" {
		s.local.Refund(t)
		return
	}
	s.giveBack("refund", 1, float64(t.Cost), 0, 0)
}

func (s *shared) Settle(t *limit.Ticket, usedTokens int64) {
	if t.Lease == "" {
		s.local.Settle(t, usedTokens)
		return
	}
	if usedTokens != t.Cost {
		// t.Tokens is Redis' running total right after t's dispatch: an
		// answer whose count covered it already holds what t used.
		s.giveBack("settle", 0, float64(t.Cost), float64(usedTokens), t.Tokens)
	}
}

// giveBack adds requests and tokens back to the shared budgets, through
// the writer, less the tokens used (a settle's: tokens is its estimate);
// a positive mark (a settle's) skips what an answer's count already
// covered.
func (s *shared) giveBack(op string, requests, tokens, used, mark float64) {
	if !s.st.up.Load() {
		return
	}
	s.st.giveLater(give{op: op, state: s.state, requests: requests, tokens: tokens, mark: mark, used: used})
}

func (s *shared) Return(t *limit.Ticket, now time.Time) {
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
	s.local.Fleet().Returned(t, now)
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

func (s *shared) View(now time.Time) limit.View {
	v := s.local.View(now)
	v.Shared = s.st.Status()
	if !s.st.up.Load() && s.share != nil {
		v.Share = s.share.view()
	}
	if s.st.up.Load() {
		if s.climit > 0 {
			v.Concurrency = s.climit
		}
		v.InFlight = s.out
		if s.paused.After(now) && s.paused.After(v.PausedUntil) {
			v = v.PausedElsewhere(s.paused)
		}
	}
	return v
}

var _ limit.Shared = (*shared)(nil)

// Configure takes cfg as the group's configuration from now on: the
// concurrency bounds the admit script is given (a lower highest holds
// every replica at once; a raised one counts once this replica's next
// answer reports its limit), and this replica's own state's.
func (s *shared) Configure(cfg limit.Config) {
	s.cfg = cfg.WithDefaults()
	s.local.Configure(cfg)
	s.climit = 0 // the shared limit of the last reply was the old bounds': the next says
}

// Forget drops what the group learned: this replica's state, what it kept
// of Redis' replies, and in Redis what every replica learned
// (forgetScript); the permits out stay counted. Each replica that hears
// of the clear runs it: learning in between is lost, as if the clear came
// a moment later. While Redis is away only this replica forgets.
func (s *shared) Forget() {
	s.local.Forget()
	s.climit, s.paused, s.last, s.answered, s.share = 0, time.Time{}, limits{}, false, nil
	s.reqRates, s.tokRates = readings{}, readings{}
	if !s.st.up.Load() {
		return
	}
	ctx, cancel := s.st.ctx()
	defer cancel()
	start := time.Now()
	err := forgetScript.Run(ctx, s.st.rdb(), []string{s.state, s.climits, s.raise, s.levels}).Err()
	s.st.commands.WithLabelValues("forget").Inc()
	s.st.took(start, err)
	if err != nil {
		s.st.failed("forget", err)
	}
}

// AnsweredElsewhere reports whether a replica learned from an answer of
// the group lately: this one's first request need not wait for its own.
func (s *shared) AnsweredElsewhere() bool { return s.st.up.Load() && s.answered }

// Knows reports whether this replica's state has learned a limit (see
// limit.Memory.Knows).
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

// Among replicas a group's silent limits that are refused together are
// joined on one trial, which every replica names alike; each replica
// judges from its own part of the refusals whether a limit is refused
// apart, and the first to judge so tells the others through the trial's
// state, so that no replica keeps a limit on the trial that the others
// pace on its own state (two paces on one upstream limit refuse each
// other, and the pace learned from those refusals is far too slow).
// lanequeue's trial finds these methods on the trial's Shared.

// PutApart notes in the trial's state this one paces that the limit
// named member (lanequeue's key of it) left the trial. Redis keeps a hash
// of the name, not the name (it holds the credential's hash). While
// Redis is away it does nothing: the other replicas judge from their own
// refusals, as before.
func (s *shared) PutApart(member string) {
	if !s.st.up.Load() {
		return
	}
	ctx, cancel := s.st.ctx()
	defer cancel()
	start := time.Now()
	args := apartArgs{Member: apartName(member), KeyTTL: s.st.cfg.KeyTTL.Milliseconds()}
	ap, err := apartScript.Run(ctx, s.st.rdb(), []string{s.state}, argv(args)...).Text()
	s.st.commands.WithLabelValues("apart").Inc()
	s.st.took(start, err)
	if err != nil {
		s.st.failed("apart", err)
		return
	}
	s.aparts, s.apartN = ap, int64(strings.Count(ap, ","))
}

// Apart reports whether some replica noted the limit named member apart
// from the trial this state paces, as the last admission here saw.
func (s *shared) Apart(member string) bool {
	return s.aparts != "" && strings.Contains(s.aparts, apartName(member)+",")
}

// readAparts reads the names of the limits taken out of the trial once
// an admission's reply counted n of them, not the number it knew.
func (s *shared) readAparts(n int64) {
	ctx, cancel := s.st.ctx()
	defer cancel()
	start := time.Now()
	ap, err := s.st.rdb().HGet(ctx, s.state, "ap").Result()
	s.st.commands.WithLabelValues("apart").Inc()
	s.st.took(start, err)
	if err != nil && !errors.Is(err, redis.Nil) {
		s.st.failed("apart", err)
		return // the next admission asks again
	}
	s.aparts, s.apartN = ap, n
}

// apartName is the name Redis keeps of a limit taken out of its trial.
func apartName(member string) string {
	sum := sha256.Sum256([]byte(member))
	return hex.EncodeToString(sum[:8])
}

// Among replicas each reads its own part of the first answers, so each
// finds a part of the limits that move together: the fleet pools what
// any replica found (lanequeue's joinSharer).

// PutJoined notes in this limit's state that it shares the limit named
// root (lanequeue's key of it), so that every replica pacing it on its
// own state learns so from its next answer. Redis keeps a hash of the
// name. While Redis is away it does nothing.
func (s *shared) PutJoined(root string) {
	if !s.st.up.Load() {
		return
	}
	ctx, cancel := s.st.ctx()
	defer cancel()
	start := time.Now()
	_, err := s.st.rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, s.state, "jn", joinName(root))
		p.PExpire(ctx, s.state, s.st.cfg.KeyTTL)
		return nil
	})
	s.st.commands.WithLabelValues("join").Inc()
	s.st.took(start, err)
	if err != nil {
		s.st.failed("join", err)
	}
}

// Joined reports whether some replica noted this limit sharing the limit
// named root, as the last answer's reply saw.
func (s *shared) Joined(root string) bool { return s.joined != 0 && s.joined == joinName(root) }

// joinName is the name Redis keeps of a limit another joined: 48 bits of
// its key's hash, a number Lua holds exactly.
func joinName(root string) int64 {
	sum := sha256.Sum256([]byte(root))
	return int64(binary.BigEndian.Uint64(sum[:8]) >> 16)
}
