package lanequeue

import (
	"context"
	"math"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// silentLanes makes a table whose lanes for the models share a credential
// and route, with cfg.
func silentLanes(t *testing.T, cfg Config, models ...string) []*Lane {
	t.Helper()
	cfg.Clock = clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: cfg})
	cred := HashCredential("sk-silent")
	var lanes []*Lane
	for _, m := range models {
		lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
	}
	return lanes
}

// answerEach has each lane admit a request (the first lane 1+extra, one
// after another), then sends one on each lane and refuses them all at one
// instant, saying lim every time.
func answerEach(t *testing.T, lanes []*Lane, extra int, lim headerparse.Limits) {
	t.Helper()
	answerApart(t, lanes, extra, lim, 0)
}

// answerApart is answerEach with the refusals gap apart, in lane order.
func answerApart(t *testing.T, lanes []*Lane, extra int, lim headerparse.Limits, gap time.Duration) {
	t.Helper()
	fc := lanes[0].g.clock.(*clock.Fake)
	get := func(l *Lane) *Slot { return sendOn(t, l) }
	for i, l := range lanes {
		n := 1
		if i == 0 {
			n += extra
		}
		for range n {
			s := get(l)
			report(s, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: lim})
			s.release()
		}
	}
	var slots []*Slot
	for _, l := range lanes {
		slots = append(slots, get(l))
	}
	for i, s := range slots {
		if i > 0 {
			fc.Advance(gap)
		}
		report(s, limit.Report{Status: 429, Verdict: limit.RateRefused, Limits: lim})
		s.release()
	}
}

// TestSilentModelsRefusedTogetherTakeTurnsOnOneLimit: two models of one
// key, each admitted, then refused within a second with nothing said of
// counts, asked as often: their lanes draw on one limit from then on, on
// trial, and say why.
func TestSilentModelsRefusedTogetherTakeTurnsOnOneLimit(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	answerEach(t, lanes, 0, headerparse.Limits{})
	a, b := limitOf(lanes[0]), limitOf(lanes[1])
	if a != b {
		t.Fatal("the lanes draw on limits of their own")
	}
	if a == lanes[0].lim || a == lanes[1].lim || a.trial == nil {
		t.Fatal("the joined limit is not a new one on trial")
	}
	st := lanes[0].State()
	if !slices.Equal(st.SharesLimitWith, []string{"gpt-b"}) || st.SharedBecause != refusedTogether {
		t.Fatalf("state says it shares with %v (%q)", st.SharesLimitWith, st.SharedBecause)
	}
}

// TestRefusalsAtALanesOwnUnreachedLimitJoinNothing: two silent models,
// each admitted, then each refused by a request that went at its lane's
// concurrency limit (1), at a number in flight the upstream admitted no
// more than it refused at (limit.Ticket.Overshot): a limit of each lane's
// own number in flight does that, so they are not joined. (Under a limit
// of 8 the same refusals join them: see
// TestSilentModelsRefusedTogetherTakeTurnsOnOneLimit.)
func TestRefusalsAtALanesOwnUnreachedLimitJoinNothing(t *testing.T) {
	lanes := silentLanes(t, Config{Concurrency: 1}, "gpt-a", "gpt-b")
	for _, l := range lanes {
		s := sendOn(t, l)
		report(s, limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
	}
	var slots []*Slot
	for _, l := range lanes {
		slots = append(slots, sendOn(t, l))
	}
	for _, s := range slots {
		report(s, limit.Report{Status: 429, Verdict: limit.RateRefused})
		if !s.ticket.Overshot {
			t.Fatal("the refusal at the lane's limit is not Overshot")
		}
		s.release()
	}
	if limitOf(lanes[0]) == limitOf(lanes[1]) || limitOf(lanes[0]).trial != nil {
		t.Fatal("refusals at each lane's own unreached limit joined the lanes")
	}
}

// TestLimitsThatSpeakOrAreAskedUnevenlyAreNotJoined: refused together is
// not enough when the answers state remaining counts (they tell sharing
// better, see sharing), when one model was asked twice as often as the
// other (a pace in turns would hold the busier one to the other's share),
// or when the route configures its limits.
func TestLimitsThatSpeakOrAreAskedUnevenlyAreNotJoined(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		extra int
		lim   headerparse.Limits
	}{
		{"headers", Config{}, 0, headerparse.Limits{Requests: win(20, 5, t0.Add(time.Second))}},
		{"uneven", Config{}, 14, headerparse.Limits{}}, // 16 against 2
		{"configured", Config{Limits: limit.Limits{RPM: 6000}}, 0, headerparse.Limits{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lanes := silentLanes(t, c.cfg, "gpt-a", "gpt-b")
			answerEach(t, lanes, c.extra, c.lim)
			if limitOf(lanes[0]) == limitOf(lanes[1]) {
				t.Fatal("joined")
			}
		})
	}
	// Even is within a third.
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b", "gpt-c", "gpt-d")
	answerEach(t, lanes, 1, headerparse.Limits{}) // 3 asked of gpt-a, 2 of the others
	if limitOf(lanes[0]) != limitOf(lanes[3]) {
		t.Fatal("limits asked 3 and 2 times not joined")
	}
	// Or short of a third by no more than chance moves the larger count
	// (its square root): early on, and among replicas, counts are few.
	lanes = silentLanes(t, Config{}, "gpt-a", "gpt-b")
	answerEach(t, lanes, 3, headerparse.Limits{}) // 5 against 2
	if limitOf(lanes[0]) != limitOf(lanes[1]) {
		t.Fatal("limits asked 5 and 2 times, as even as so few requests tell, not joined")
	}
	// At the edge: 3 and 9 (3 + √9 = ⅔ × 9).
	lanes = silentLanes(t, Config{}, "gpt-a", "gpt-b")
	s := sendOn(t, lanes[1])
	report(s, limit.Report{Status: 200, Verdict: limit.Accepted})
	s.release()
	answerEach(t, lanes, 7, headerparse.Limits{})
	if limitOf(lanes[0]) != limitOf(lanes[1]) {
		t.Fatal("limits asked 9 and 3 times, at the edge of even, not joined")
	}
}

// TestRefusalsMoreThanASecondApartOrOfModelsNeverAdmittedJoinNothing:
// limits are refused together when their refusals lie at most
// togetherSpan apart; further apart, each limit may simply be spent on
// its own. And an upstream that never admitted a model's request is down
// or closed to it, not sharing a spent limit.
func TestRefusalsMoreThanASecondApartOrOfModelsNeverAdmittedJoinNothing(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	answerApart(t, lanes, 0, headerparse.Limits{}, togetherSpan)
	if limitOf(lanes[0]) != limitOf(lanes[1]) {
		t.Fatal("refusals exactly togetherSpan apart were not joined")
	}
	lanes = silentLanes(t, Config{}, "gpt-a", "gpt-b")
	answerApart(t, lanes, 0, headerparse.Limits{}, togetherSpan+time.Millisecond)
	if limitOf(lanes[0]) == limitOf(lanes[1]) {
		t.Fatal("refusals more than togetherSpan apart were joined")
	}

	lanes = silentLanes(t, Config{}, "gpt-a", "gpt-b")
	for range 2 {
		var slots []*Slot
		for _, l := range lanes {
			slots = append(slots, mustGet(t, acquireAsync(context.Background(), l)))
		}
		for _, s := range slots {
			report(s, limit.Report{Status: 429, Verdict: limit.RateRefused})
			s.release()
		}
		lanes[0].g.clock.(*clock.Fake).Advance(time.Minute) // past any pause
	}
	if limitOf(lanes[0]) == limitOf(lanes[1]) {
		t.Fatal("models never admitted were joined")
	}
}

// refuseOnTrial counts n dispatches on trial for each lane in turn, own's
// first, and then a refusal of a dispatch of t's for a lane of own, with
// the lane waiting waiting (nil: none); it reports whether the limits
// changed.
func refuseOnTrial(lanes []*Lane, t, own *pool, n int, waiting *Lane) bool {
	g := lanes[0].g
	g.mu.Lock()
	defer g.mu.Unlock()
	for range n {
		t.sentOnTrialLocked(own)
		for _, l := range lanes {
			if l.lim != own {
				t.sentOnTrialLocked(l.lim)
			}
		}
	}
	if waiting != nil {
		g.turns.push(waiting)
		defer g.turns.remove(waiting)
	}
	return g.togetherLocked(own, t, limit.Report{Status: 429, Verdict: limit.RateRefused}, g.clock.Now(), false)
}

// TestALimitRefusedMoreThanItsTurnsLeavesTheTrial: on trial, refusals fall
// on the lanes as their dispatches do when the limit is shared; one that
// takes every refusal while it sent half the dispatches, and the other
// lane waits too, has a limit of its own. It leaves the trial at the
// refusal that makes that less likely than splitChance (the tenth: 1 in
// 1,024), to learn it afresh, and the group starts no trial again.
func TestALimitRefusedMoreThanItsTurnsLeavesTheTrial(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	answerEach(t, lanes, 0, headerparse.Limits{})
	trialLim := limitOf(lanes[0])
	b := lanes[1].lim
	before := b.shared
	for i := 1; i <= 10; i++ {
		split := refuseOnTrial(lanes, trialLim, b, 2, lanes[0])
		if split != (i == 10) {
			t.Fatalf("refusal %d: split %v", i, split)
		}
	}
	if limitOf(lanes[1]) != b || b.shared == before {
		t.Fatal("gpt-b does not draw on a limit of its own, learned afresh")
	}
	if limitOf(lanes[0]) != trialLim || trialLim.trial != nil {
		t.Fatal("gpt-a does not keep the trial's limit, alone")
	}
	if st := lanes[0].State(); len(st.SharesLimitWith) != 0 || st.SharedBecause != "" {
		t.Fatalf("gpt-a still says it shares with %v (%q)", st.SharesLimitWith, st.SharedBecause)
	}
	// No trial again.
	answerEach(t, lanes, 0, headerparse.Limits{})
	if limitOf(lanes[0]) == limitOf(lanes[1]) {
		t.Fatal("joined again")
	}
}

// TestRefusalsInTurnOrAloneKeepTheTrial: refusals that fall on the lanes
// in turn, as a shared limit's do, never end the trial; nor do refusals of
// one lane while no other lane of the trial waits (no turns to compare
// with); nor refusals of requests sent before the trial. (Each of the last
// two, 40 in a row on one lane, ends it at the tenth when counted.)
func TestRefusalsInTurnOrAloneKeepTheTrial(t *testing.T) {
	cases := []struct {
		name   string
		refuse func(lanes []*Lane, trialLim *pool, i int) bool
	}{
		{"in turn", func(lanes []*Lane, trialLim *pool, i int) bool {
			return refuseOnTrial(lanes, trialLim, lanes[i%2].lim, 2, lanes[(i+1)%2])
		}},
		{"alone", func(lanes []*Lane, trialLim *pool, i int) bool {
			return refuseOnTrial(lanes, trialLim, lanes[1].lim, 2, nil)
		}},
		{"sent before", func(lanes []*Lane, trialLim *pool, i int) bool {
			g := lanes[0].g
			g.mu.Lock()
			defer g.mu.Unlock()
			for range 2 {
				trialLim.sentOnTrialLocked(lanes[1].lim)
				trialLim.sentOnTrialLocked(lanes[0].lim)
			}
			g.turns.push(lanes[0])
			defer g.turns.remove(lanes[0])
			own := lanes[1].lim
			return g.togetherLocked(own, own, limit.Report{Status: 429, Verdict: limit.RateRefused}, g.clock.Now(), false)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
			answerEach(t, lanes, 0, headerparse.Limits{})
			trialLim := limitOf(lanes[0])
			for i := range 40 {
				if c.refuse(lanes, trialLim, i) {
					t.Fatalf("refusal %d split the trial", i+1)
				}
			}
			if limitOf(lanes[1]) != trialLim || limitOf(lanes[0]) != trialLim {
				t.Fatal("the trial ended")
			}
		})
	}
}

// TestOfThreeLimitsOnTrialTheOneRefusedApartLeavesAndTwoStay: with three
// lanes on trial, eight refusals in a row on one of them (a third of the
// dispatches: a chance of about 1 in 6,500) end its part at the eighth,
// the fewest a split is judged on; the other two go on sharing the
// trial's limit, still on trial.
func TestOfThreeLimitsOnTrialTheOneRefusedApartLeavesAndTwoStay(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b", "gpt-c")
	answerEach(t, lanes, 0, headerparse.Limits{})
	trialLim := limitOf(lanes[0])
	for i := 1; i <= splitRefusals; i++ {
		if split := refuseOnTrial(lanes, trialLim, lanes[2].lim, 2, lanes[0]); split != (i == splitRefusals) {
			t.Fatalf("refusal %d: split %v", i, split)
		}
	}
	if limitOf(lanes[2]) != lanes[2].lim {
		t.Fatal("gpt-c still draws on the trial's limit")
	}
	if limitOf(lanes[0]) != trialLim || limitOf(lanes[1]) != trialLim || trialLim.trial == nil {
		t.Fatal("gpt-a and gpt-b no longer share the trial's limit on trial")
	}
	if st := lanes[1].State(); !slices.Equal(st.SharesLimitWith, []string{"gpt-a"}) || st.SharedBecause != refusedTogether {
		t.Fatalf("gpt-b says it shares with %v (%q)", st.SharesLimitWith, st.SharedBecause)
	}
}

// TestATrialJudgesItsLatestRefusals: the counts a trial is judged on halve
// when its refusals reach trialMemory, so that what the lanes did lately
// decides, not what they did at its start.
func TestATrialJudgesItsLatestRefusals(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	answerEach(t, lanes, 0, headerparse.Limits{})
	trialLim := limitOf(lanes[0])
	for i := 1; i <= trialMemory; i++ {
		refuseOnTrial(lanes, trialLim, lanes[i%2].lim, 2, lanes[(i+1)%2])
		if got := trialLim.trial.refusals; got >= trialMemory {
			t.Fatalf("after %d refusals the trial counts %v, want under %d", i, got, trialMemory)
		}
	}
	if got := trialLim.trial.refusals; got != trialMemory/2 {
		t.Fatalf("after trialMemory refusals the trial counts %v, want %d", got, trialMemory/2)
	}
}

// TestTail checks the binomial tail against sums worked by hand.
func TestTail(t *testing.T) {
	for _, c := range []struct {
		n, k int
		p    float64
		want float64
	}{
		{10, 10, 0.5, 1.0 / 1024},
		{4, 2, 0.5, 11.0 / 16},
		{3, 1, 0.25, 1 - 27.0/64},
		{5, 0, 0.3, 1},
		{5, 6, 0.3, 0},
		{5, 1, 0, 0},
		{5, 5, 1, 1},
	} {
		if got := tail(c.n, c.k, c.p); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("tail(%d, %d, %g) = %g, want %g", c.n, c.k, c.p, got, c.want)
		}
	}
}

// TestReplicasJoinOneTrialWhicheverModelsEachFoundRefusedTogether: each
// replica sees its own part of the refusals, so one joins gpt-a and gpt-b
// on trial and another gpt-b and gpt-c; both pace on the one state the
// group's trial has among replicas. A refused model joins the group's
// trial, or the group's other models admitted without a word, with no
// other refused beside it: the refusals that would show them sharing may
// have come to the other replicas.
func TestReplicasJoinOneTrialWhicheverModelsEachFoundRefusedTogether(t *testing.T) {
	var group atomic.Uint64
	replica := func() *Table {
		return NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)},
			Shared: func(_ string, c limit.Config) limit.Shared {
				return fleetCounted{limit.NewMemory(c), new(atomic.Uint64), &group}
			}})
	}
	cred := HashCredential("sk-silent")
	lanesOf := func(tb *Table, models ...string) []*Lane {
		var lanes []*Lane
		for _, m := range models {
			lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
		}
		return lanes
	}
	one, two := replica(), replica()
	ab, bc := lanesOf(one, "gpt-a", "gpt-b"), lanesOf(two, "gpt-b", "gpt-c")
	answerEach(t, ab, 0, headerparse.Limits{})
	answerEach(t, bc, 0, headerparse.Limits{})
	first, second := limitOf(ab[0]), limitOf(bc[0])
	if first.trial == nil || second.trial == nil || limitOf(ab[1]) != first || limitOf(bc[1]) != second {
		t.Fatal("a replica did not join its models refused together on trial")
	}
	if first.key != second.key {
		t.Fatalf("the replicas' trials pace on different states: %q and %q", first.key, second.key)
	}
	ab[0].g.clock.(*clock.Fake).Advance(2 * togetherSpan) // the first refusals are long past
	cd := lanesOf(one, "gpt-c", "gpt-d")
	answerApart(t, cd, 0, headerparse.Limits{}, 2*togetherSpan)
	if limitOf(cd[0]) != first || limitOf(cd[1]) != first {
		t.Fatal("models refused apart did not join the group's trial, each at its refusal")
	}
	// A third replica whose gpt-a was only ever admitted: gpt-b's first
	// refusal joins the two, on the group's trial.
	three := lanesOf(replica(), "gpt-a", "gpt-b")
	for _, l := range []*Lane{three[0], three[0], three[1]} { // asked as often
		s := sendOn(t, l)
		report(s, limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
	}
	s := sendOn(t, three[1])
	report(s, limit.Report{Status: 429, Verdict: limit.RateRefused})
	s.release()
	if j := limitOf(three[0]); j != limitOf(three[1]) || j.trial == nil || j.key != first.key {
		t.Fatal("a replica that saw one model refused kept the group's models apart from the others' trial")
	}
}

// TestAmongReplicasModelsAdmittedOnlyElsewhereJoinTheTrial: a replica
// whose answers for gpt-a and gpt-b are all refusals, while the store
// says the upstream admitted the other replicas' requests lately: each
// refusal teaches the model's state a pace (a refusal while the upstream
// admits some is a limit's), and the two join the group's trial as they
// would had this replica seen an admission. With nothing admitted
// anywhere the refusals may be a closed door's, and nothing joins.
func TestAmongReplicasModelsAdmittedOnlyElsewhereJoinTheTrial(t *testing.T) {
	for _, elsewhere := range []bool{true, false} {
		var group atomic.Uint64
		states := map[string]*limit.Memory{}
		tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)},
			Shared: func(key string, c limit.Config) limit.Shared {
				states[key] = limit.NewMemory(c)
				return fleetCounted{states[key], new(atomic.Uint64), &group}
			}})
		cred := HashCredential("sk-silent")
		var lanes []*Lane
		for _, m := range []string{"gpt-a", "gpt-b"} {
			lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
		}
		if elsewhere {
			for _, st := range states { // as a store tells of the other replicas' answers
				st.Fleet().Said(t0, 0, 0, 1, t0)
			}
		}
		var slots []*Slot
		for _, l := range lanes {
			slots = append(slots, sendOn(t, l))
		}
		for _, s := range slots {
			report(s, limit.Report{Status: 429, Verdict: limit.RateRefused})
			s.release()
		}
		joined := limitOf(lanes[0]) == limitOf(lanes[1]) && limitOf(lanes[0]).trial != nil
		if joined != elsewhere {
			t.Errorf("states taught elsewhere %v: the models joined on trial %v", elsewhere, joined)
		}
	}
}

// apartNoting is a fleet's shared state that keeps the limits noted apart
// from a trial, by the trial's key, as redisstate's does in Redis.
type apartNoting struct {
	fleetCounted
	key   string
	apart map[string]map[string]bool // nil: the store keeps none
}

func (a apartNoting) PutApart(member string) {
	if a.apart == nil {
		return
	}
	if a.apart[a.key] == nil {
		a.apart[a.key] = map[string]bool{}
	}
	a.apart[a.key][member] = true
}

func (a apartNoting) Apart(member string) bool { return a.apart[a.key][member] }

// TestAmongReplicasALimitOneReplicaTakesOffTheTrialLeavesItOnEveryReplica:
// two replicas join gpt-a and gpt-b on the group's trial; the first judges
// gpt-b apart from its own refusals, and notes it in the trial's state.
// The second, whose part of the refusals is too small to judge yet, takes
// gpt-b off the trial at its next answer of the trial, whatever the
// answer: else it would pace gpt-b on the trial while the first paces it
// on gpt-b's state, each refused for what the other sends. Both learn
// gpt-b afresh, on one state they name alike, not on gpt-b's state from
// before the trial: a pace measured there from its last refusal then
// counted the trial's time as time nothing went. Where the store keeps no
// such note, the second keeps gpt-b on trial.
func TestAmongReplicasALimitOneReplicaTakesOffTheTrialLeavesItOnEveryReplica(t *testing.T) {
	for _, noted := range []bool{true, false} {
		var group atomic.Uint64
		var apart map[string]map[string]bool
		if noted {
			apart = map[string]map[string]bool{}
		}
		replica := func() []*Lane {
			tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)},
				Shared: func(key string, c limit.Config) limit.Shared {
					return apartNoting{fleetCounted{limit.NewMemory(c), new(atomic.Uint64), &group}, key, apart}
				}})
			cred := HashCredential("sk-silent")
			var lanes []*Lane
			for _, m := range []string{"gpt-a", "gpt-b"} {
				lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
			}
			answerEach(t, lanes, 0, headerparse.Limits{})
			if limitOf(lanes[0]).trial == nil || limitOf(lanes[1]) != limitOf(lanes[0]) {
				t.Fatal("a replica did not join its models refused together on trial")
			}
			return lanes
		}
		one, two := replica(), replica()
		trialOne, bOne := limitOf(one[0]), one[1].lim
		before := bOne.shared.(apartNoting).key
		for i := 1; i <= 10; i++ {
			if split := refuseOnTrial(one, trialOne, bOne, 2, one[0]); split != (i == 10) {
				t.Fatalf("refusal %d of gpt-b alone: split %v", i, split)
			}
		}
		if limitOf(one[1]) != bOne {
			t.Fatal("the first replica kept gpt-b on trial after ten refusals of it alone")
		}
		if k := bOne.shared.(apartNoting).key; k == before {
			t.Fatal("gpt-b left the trial for its state from before the trial, not a fresh one")
		}
		if noted && !apart[trialOne.key][bOne.key] {
			t.Fatal("the first replica took gpt-b off the trial without noting it in the trial's state")
		}
		trialTwo, bTwo := limitOf(two[0]), two[1].lim
		s := sendOn(t, two[0]) // gpt-a's, on the trial
		report(s, limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
		if left := limitOf(two[1]) == bTwo; left != noted {
			t.Errorf("noted in the trial's state %v: the second replica took gpt-b off the trial %v", noted, left)
		}
		if noted && (limitOf(two[0]) != trialTwo || trialTwo.trial != nil) {
			t.Error("gpt-a left the limit it was on, or the trial of one limit went on")
		}
		if k1, k2 := bOne.shared.(apartNoting).key, bTwo.shared.(apartNoting).key; noted && k1 != k2 {
			t.Errorf("the replicas learn gpt-b afresh on states named %q and %q", k1, k2)
		}
	}
}

// TestATrialStartsFromWhatItsLimitsHadOut: limits joined on trial were
// refused for the rate they sent together, not for their number in
// flight: the trial's concurrency limit starts at what they had out
// together (here 7 each), not at the configured start of 8, from which
// long answers would take many answer times to grow back.
func TestATrialStartsFromWhatItsLimitsHadOut(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	fc := lanes[0].g.clock.(*clock.Fake)
	for i, l := range lanes {
		s := sendOn(t, l)
		fc.Advance(time.Duration(i+1) * 400 * time.Millisecond) // answers of 0.4 s and 0.8 s
		accept(s, headerparse.Limits{})
		s.release()
	}
	var out []*Slot
	for range 7 {
		for _, l := range lanes {
			out = append(out, sendOn(t, l))
		}
	}
	for _, s := range out[len(out)-2:] {
		report(s, limit.Report{Status: 429, Verdict: limit.RateRefused})
	}
	tr := limitOf(lanes[0])
	if tr.trial == nil || limitOf(lanes[1]) != tr {
		t.Fatal("the limits were not joined on trial")
	}
	v := tr.shared.View(fc.Now())
	if v.Concurrency != 14 {
		t.Errorf("the trial's concurrency limit is %d, want the 14 its limits had out", v.Concurrency)
	}
	// Its mean answer time is theirs, weighted by what each had out (7
	// each): 0.6 s.
	if v.AnswerSeconds < 0.59 || v.AnswerSeconds > 0.61 {
		t.Errorf("the trial's mean answer time is %.3f s, want its limits' 0.6 s", v.AnswerSeconds)
	}
	releaseAll(out)
}
