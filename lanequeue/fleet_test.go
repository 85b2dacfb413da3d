package lanequeue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
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
