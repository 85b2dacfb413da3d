package lanequeue

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// TestAGroupAnsweredElsewhereDoesNotWaitForItsOwnFirstAnswer: while its
// first request is out, a new group's next request goes at once when
// another replica of the group has had an answer, instead of waiting for
// the first-answer window.
func TestAGroupAnsweredElsewhereDoesNotWaitForItsOwnFirstAnswer(t *testing.T) {
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	cfg := Config{Concurrency: 4, MaxConcurrency: 4, Clock: fc}
	var answered atomic.Bool
	tb := NewTable(TableConfig{Lane: cfg, Shared: func(_ string, c limit.Config) limit.Shared { return elsewhere{limit.NewMemory(c), &answered} }})
	l := tb.laneFor(Key{Path: "/p"})
	first, err := l.acquire(context.Background(), 1, High)
	if err != nil {
		t.Fatal(err)
	}
	defer first.release()
	answered.Store(true) // another replica's first answer came meanwhile
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	second, err := l.acquire(ctx, 1, High)
	if err != nil {
		t.Fatalf("the second request waited for the first answer though the group was answered elsewhere: %v", err)
	}
	second.release()
}

// fleetCounted is a limit's state as replicas sharing it see it: every
// admission carries the limit's and the group's dispatch counts, every
// replica's (seq and group, which a test may also move for dispatches
// made elsewhere).
type fleetCounted struct {
	*limit.Memory
	seq, group *atomic.Uint64
}

func (f fleetCounted) Admit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	t, at, ok := f.Memory.Admit(now, cost, alone)
	if ok {
		t.Seq, t.GroupSeq = f.seq.Add(1), f.group.Add(1)
	}
	return t, at, ok
}

// TestAReplicaSeesModelsShareALimitByEveryReplicasCounts: another replica
// sent two requests for each of two models of one key, then this one
// sends one for each: the window fell by all six. By its own counts
// alone (one request each) the fall is another client's; by every
// replica's it is the other model's, so the two lanes draw on one limit,
// the one every replica agrees on (the key that sorts first, though this
// replica made gpt-b's first).
func TestAReplicaSeesModelsShareALimitByEveryReplicasCounts(t *testing.T) {
	for _, fleet := range []bool{false, true} {
		var group atomic.Uint64
		seqs := map[string]*atomic.Uint64{}
		cfg := TableConfig{Lane: Config{Clock: clock.NewFake(t0)}}
		if fleet {
			cfg.Shared = func(key string, c limit.Config) limit.Shared {
				seqs[key] = new(atomic.Uint64)
				return fleetCounted{limit.NewMemory(c), seqs[key], &group}
			}
		}
		tb := NewTable(cfg)
		cred := HashCredential("sk-shared")
		b := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-b"})
		a := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-a"})
		for _, s := range seqs { // the other replica's a, b, a, b
			s.Add(2)
		}
		group.Add(4)
		firstAnswers(t, []*Lane{a, b}, func(i int) int64 { return int64(20 - 5 - i) })
		shared := limitOf(a) == limitOf(b)
		if shared != fleet {
			t.Fatalf("fleet counts %v: the lanes draw on one limit %v, want %v", fleet, shared, fleet)
		}
		if fleet && limitOf(a).key != a.key.limitKey(false) {
			t.Errorf("the shared limit is %q, not the one whose key sorts first (gpt-a's)", limitOf(a).key)
		}
	}
}

// outElsewhere is a fleetCounted state that shows permits out on other
// replicas (out) besides this one's.
type outElsewhere struct {
	fleetCounted
	out *atomic.Int64
}

func (o outElsewhere) View(now time.Time) limit.View {
	v := o.fleetCounted.View(now)
	v.InFlight += int(o.out.Load())
	return v
}

// TestAtALimitsFirstAnswerAmongReplicasALimitWithPermitsOutElsewhereSharesIt:
// another replica holds gpt-b's first request; this one sends gpt-a's,
// the first of the group's, and its answer says the window fell by two.
// By the counts alone nothing else of the group went before it, but
// gpt-b's state had a permit out: that request may have been counted
// first, so the two draw on one limit. With nothing of gpt-b's out, the
// second request counted is another client's, and each keeps its own.
func TestAtALimitsFirstAnswerAmongReplicasALimitWithPermitsOutElsewhereSharesIt(t *testing.T) {
	for _, out := range []int64{1, 0} {
		var group atomic.Uint64
		elsewhere := map[string]*atomic.Int64{}
		tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}, Shared: func(key string, c limit.Config) limit.Shared {
			elsewhere[key] = new(atomic.Int64)
			return outElsewhere{fleetCounted{limit.NewMemory(c), new(atomic.Uint64), &group}, elsewhere[key]}
		}})
		cred := HashCredential("sk-shared")
		a := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-a"})
		b := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-b"})
		// gpt-c has nothing out: whatever else shows, it sent nothing.
		c := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-c"})
		elsewhere[b.key.limitKey(false)].Store(out)
		s := mustGet(t, acquireAsync(context.Background(), a))
		accept(s, headerparse.Limits{Requests: win(20, 18, t0.Add(time.Second))})
		s.release()
		if shared := limitOf(a) == limitOf(b); shared != (out > 0) {
			t.Errorf("gpt-b with %d out elsewhere: the lanes draw on one limit %v, want %v", out, shared, out > 0)
		}
		if limitOf(c) == limitOf(a) {
			t.Errorf("gpt-b with %d out elsewhere: gpt-c, with nothing out, joined gpt-a's limit", out)
		}
	}
}

// TestAfterALimitsFirstRequestAmongReplicasPermitsOutElsewhereTellNothing:
// another replica sent gpt-a's first request; this one's is its second,
// and the window fell by three. gpt-b's state has a permit out, but the
// third request counted may as well be gpt-a's own, sent from another
// replica just after this one: the lanes keep their own limits.
func TestAfterALimitsFirstRequestAmongReplicasPermitsOutElsewhereTellNothing(t *testing.T) {
	var group atomic.Uint64
	seqs, elsewhere := map[string]*atomic.Uint64{}, map[string]*atomic.Int64{}
	tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}, Shared: func(key string, c limit.Config) limit.Shared {
		seqs[key], elsewhere[key] = new(atomic.Uint64), new(atomic.Int64)
		return outElsewhere{fleetCounted{limit.NewMemory(c), seqs[key], &group}, elsewhere[key]}
	}})
	cred := HashCredential("sk-shared")
	a := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-a"})
	b := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-b"})
	seqs[a.key.limitKey(false)].Add(1) // gpt-a's first, from another replica
	group.Add(1)
	elsewhere[b.key.limitKey(false)].Store(1)
	s := mustGet(t, acquireAsync(context.Background(), a))
	accept(s, headerparse.Limits{Requests: win(20, 17, t0.Add(time.Second))})
	s.release()
	if limitOf(a) == limitOf(b) {
		t.Error("gpt-a's second request of all read gpt-b's permit out elsewhere as counted before it: the lanes draw on one limit")
	}
}

// TestFirstAnswersAmongReplicasReadTheLimitsWhileNewModelsArrive: the
// table adds a new model's limit to its group holding the group's limit
// lock only; a first answer among replicas, which reads the group's
// limits, must take it too (the race detector, or Go's map check, tells).
func TestFirstAnswersAmongReplicasReadTheLimitsWhileNewModelsArrive(t *testing.T) {
	var group atomic.Uint64
	tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}, Shared: func(key string, c limit.Config) limit.Shared {
		return outElsewhere{fleetCounted{limit.NewMemory(c), new(atomic.Uint64), &group}, new(atomic.Int64)}
	}})
	cred := HashCredential("sk-shared")
	key := func(m string) Key { return Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m} }
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			tb.laneFor(key("new-" + strconv.Itoa(i)))
		}
	}()
	for i := range 200 {
		l := tb.laneFor(key("first-" + strconv.Itoa(i))) // each one's first request of all
		s := mustGet(t, acquireAsync(context.Background(), l))
		accept(s, headerparse.Limits{Requests: win(20, 19, t0.Add(time.Second))})
		s.release()
	}
	<-done
}

// joinNoting is a fleet's shared state that keeps, by limit key, the
// limit some replica found it shares, as redisstate's does in Redis.
type joinNoting struct {
	fleetCounted
	key    string
	joined map[string]string // nil: the store keeps none
}

func (j joinNoting) PutJoined(root string) {
	if j.joined != nil {
		j.joined[j.key] = root
	}
}

func (j joinNoting) Joined(root string) bool { return j.joined[j.key] == root }

// TestAmongReplicasLimitsOneReplicaFoundSharedArePooledOnEvery: replica
// one finds gpt-a and gpt-b on one limit from every replica's counts and
// notes gpt-b joined to gpt-a (the key that sorts first); replica two,
// which read none of it, pools gpt-b with gpt-a at gpt-b's next answer,
// whatever it said, and gpt-c, noted nowhere, keeps its own. Where the
// store keeps no such note, replica two keeps them apart.
func TestAmongReplicasLimitsOneReplicaFoundSharedArePooledOnEvery(t *testing.T) {
	for _, noted := range []bool{true, false} {
		var joined map[string]string
		if noted {
			joined = map[string]string{}
		}
		var group atomic.Uint64
		seqs := map[string]*atomic.Uint64{}
		replica := func() *Table {
			return NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}, Shared: func(key string, c limit.Config) limit.Shared {
				if seqs[key] == nil {
					seqs[key] = new(atomic.Uint64)
				}
				return joinNoting{fleetCounted{limit.NewMemory(c), seqs[key], &group}, key, joined}
			}})
		}
		one, two := replica(), replica()
		cred := HashCredential("sk-shared")
		key := func(model string) Key { return Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: model} }
		b1, a1 := one.laneFor(key("gpt-b")), one.laneFor(key("gpt-a"))
		a2, b2, c2 := two.laneFor(key("gpt-a")), two.laneFor(key("gpt-b")), two.laneFor(key("gpt-c"))
		for _, s := range seqs {
			s.Add(2)
		}
		group.Add(4)
		firstAnswers(t, []*Lane{a1, b1}, func(i int) int64 { return int64(20 - 5 - i) })
		if limitOf(a1) != limitOf(b1) {
			t.Fatal("replica one did not find gpt-a and gpt-b on one limit")
		}
		if want := a1.key.limitKey(false); noted && joined[b1.key.limitKey(false)] != want {
			t.Fatalf("replica one noted gpt-b joined to %q, want gpt-a's %q", joined[b1.key.limitKey(false)], want)
		}
		for _, l := range []*Lane{b2, c2} {
			s := sendOn(t, l)
			report(s, limit.Report{Status: 200, Verdict: limit.Accepted})
			s.release()
		}
		if pooled := limitOf(b2) == limitOf(a2); pooled != noted {
			t.Errorf("noted %v: replica two draws gpt-b on gpt-a's limit %v, want %v", noted, pooled, noted)
		}
		if limitOf(c2) == limitOf(a2) {
			t.Errorf("noted %v: gpt-c, noted nowhere, joined gpt-a's limit", noted)
		}
	}
}

// noted is one process's state that keeps, by limit key, the limit it was
// found to share, for the process after it (state's file does).
type noted struct {
	*limit.Memory
	key    string
	joined map[string]string
}

func (n noted) PutJoined(root string)   { n.joined[n.key] = root }
func (n noted) Joined(root string) bool { return n.joined[n.key] == root }

// TestARestartedProcessPoolsTheLimitsItsPredecessorFoundShared: one
// process finds gpt-b and gpt-a on one limit (gpt-b's lane came first and
// takes gpt-a's); the next, whose lanes come in the other order, pools
// gpt-a with gpt-b at gpt-a's first answer, on gpt-b's limit as the note
// says, whatever that answer showed; gpt-c, noted nowhere, keeps its own.
func TestARestartedProcessPoolsTheLimitsItsPredecessorFoundShared(t *testing.T) {
	joined := map[string]string{}
	process := func() *Table {
		return NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}, Shared: func(key string, c limit.Config) limit.Shared {
			return noted{limit.NewMemory(c), key, joined}
		}})
	}
	cred := HashCredential("sk-shared")
	key := func(model string) Key { return Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: model} }
	one := process()
	b1, a1 := one.laneFor(key("gpt-b")), one.laneFor(key("gpt-a"))
	firstAnswers(t, []*Lane{b1, a1}, func(i int) int64 { return int64(19 - i) })
	if limitOf(a1) != limitOf(b1) || joined[a1.key.limitKey(false)] != b1.key.limitKey(false) {
		t.Fatalf("the first process did not pool gpt-a on gpt-b's limit and note it: %v", joined)
	}
	two := process()
	a2, b2, c2 := two.laneFor(key("gpt-a")), two.laneFor(key("gpt-b")), two.laneFor(key("gpt-c"))
	bLimit := limitOf(b2)
	for _, l := range []*Lane{a2, c2} {
		s := sendOn(t, l)
		report(s, limit.Report{Status: 200, Verdict: limit.Accepted})
		s.release()
	}
	if limitOf(a2) != bLimit {
		t.Error("the restarted process draws gpt-a on a limit of its own, not gpt-b's as noted")
	}
	if limitOf(c2) == bLimit {
		t.Error("gpt-c, noted nowhere, joined gpt-b's limit")
	}
}
