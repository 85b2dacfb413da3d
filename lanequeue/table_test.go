package lanequeue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

func TestTableReturnsSameLaneForSameKey(t *testing.T) {
	tb := NewTable(TableConfig{})
	k := Key{Route: "", CredentialHash: HashCredential("sk-a"), Path: "/v1/chat/completions", Model: "gpt"}
	first, second := tb.laneFor(k), tb.laneFor(k)
	if first != second {
		t.Fatal("two lanes for one key")
	}
	k2 := k
	k2.Model = "other"
	if tb.laneFor(k) == tb.laneFor(k2) {
		t.Fatal("one lane for two models")
	}
	if tb.laneCount() != 2 {
		t.Fatalf("len = %d", tb.laneCount())
	}
}

func TestTableEvictsIdleLanesOnly(t *testing.T) {
	fc := clock.NewFake(t0)
	var evicted []string
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, IdleTTL: time.Minute, onEvict: func(l *Lane) { evicted = append(evicted, l.Key().Path) }})
	idle := tb.laneFor(Key{Path: "/idle"})
	busy := tb.laneFor(Key{Path: "/busy"})
	s, err := busy.acquire(context.Background(), 1, High)
	if err != nil {
		t.Fatal(err)
	}
	_ = idle
	fc.Advance(2 * time.Minute)
	tb.sweep()
	if len(evicted) != 1 || evicted[0] != "/idle" {
		t.Fatalf("evicted = %v, want [/idle]", evicted)
	}
	if _, ok := tb.lookup(busy.ID()); !ok {
		t.Fatal("busy lane was evicted")
	}
	s.release()
	fc.Advance(2 * time.Minute)
	tb.sweep()
	if tb.laneCount() != 0 || len(evicted) != 2 {
		t.Fatalf("len = %d, evicted = %v", tb.laneCount(), evicted)
	}
}

func TestTableBoundedByMaxLanes(t *testing.T) {
	var n int
	tb := NewTable(TableConfig{MaxLanes: 3, onEvict: func(*Lane) { n++ }})
	for i := 0; i < 10; i++ {
		tb.laneFor(Key{Path: string(rune('a' + i))})
	}
	if tb.laneCount() != 3 || n != 7 {
		t.Fatalf("len = %d, evicted = %d", tb.laneCount(), n)
	}
}

func TestKeyNeverHoldsRawCredential(t *testing.T) {
	k := Key{CredentialHash: HashCredential("sk-secret-123"), Path: "/p"}
	for _, s := range []string{k.ID(), k.shortKeyHash(), k.String(), k.CredentialHash} {
		if contains(s, "sk-secret") {
			t.Fatalf("%q holds the raw key", s)
		}
	}
	if len(k.shortKeyHash()) != 12 || len(k.ID()) != 12 {
		t.Fatalf("short forms: %q %q", k.shortKeyHash(), k.ID())
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestGetAfterIdleTTLKeepsTheLaneItReturns(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, IdleTTL: time.Minute})
	k := Key{Path: "/p"}
	first := tb.laneFor(k)
	fc.Advance(2 * time.Minute)
	again := tb.laneFor(k)
	held, _ := tb.lookup(again.ID())
	if again != first || held != again || tb.laneCount() != 1 {
		t.Fatalf("Get returned a lane the table no longer holds (same=%v held=%v len=%d)", again == first, held == again, tb.laneCount())
	}
}

func TestLanesOfOneLimitGroupShareBudgets(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
	cred := HashCredential("sk-shared")
	chat := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt"})
	resp := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/responses", Model: "gpt"})
	other := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "other-model"})
	if limitOf(chat) != limitOf(resp) || limitOf(chat) == limitOf(other) || chat.g != other.g {
		t.Fatal("limits: want chat and responses of one model to share, another model not, all in one group")
	}
	// Chat learns that one request is left in a window that resets in 10s.
	s, err := chat.acquire(context.Background(), 1, High)
	if err != nil {
		t.Fatal(err)
	}
	accept(s, headerparse.Limits{Requests: headerparse.Window{Limit: 10, Remaining: 1, HasRemaining: true, Reset: t0.Add(10 * time.Second)}})
	s.release()
	pastFirstAnswer(other)
	// The responses lane may send that one, not more.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := mustGet(t, acquireAsync(ctx, resp))
	second := acquireAsync(ctx, resp)
	mustBlock(t, second)
	// Another model's lane is not held back.
	mustGet(t, acquireAsync(ctx, other)).release()
	first.release()
	cancel()
	<-second
	// Evicting every lane of a group drops the group.
	fc.Advance(time.Hour)
	tb.sweep()
	tb.mu.Lock()
	n := len(tb.groups)
	tb.mu.Unlock()
	if n != 0 || tb.laneCount() != 0 {
		t.Fatalf("after eviction: %d groups, %d lanes", n, tb.laneCount())
	}
}

func TestLimitGroupWithoutModelIsPerPath(t *testing.T) {
	tb := NewTable(TableConfig{})
	cred := HashCredential("sk-azure")
	a := tb.laneFor(Key{CredentialHash: cred, Path: "/openai/deployments/a/chat/completions"})
	b := tb.laneFor(Key{CredentialHash: cred, Path: "/openai/deployments/b/chat/completions"})
	if limitOf(a) == limitOf(b) {
		t.Fatal("two model-less paths share one budget")
	}
}

func TestBusyLaneEvictedKeepsItsGroupUntilIdle(t *testing.T) {
	tb := NewTable(TableConfig{MaxLanes: 1})
	cred := HashCredential("sk-busy")
	chat := Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "m"}
	busy := tb.laneFor(chat)
	pastFirstAnswer(busy)
	s, err := busy.acquire(context.Background(), 1, High)
	if err != nil {
		t.Fatal(err)
	}
	// Another key pushes the busy lane out of the one-lane table.
	tb.laneFor(Key{CredentialHash: HashCredential("sk-other"), Path: "/x", Model: "m"})
	again := tb.laneFor(chat)
	if again == busy || limitOf(again) != limitOf(busy) {
		t.Fatal("a new lane for the busy lane's key must share its budget while the old one still serves")
	}
	s.release()
	tb.laneFor(Key{CredentialHash: HashCredential("sk-third"), Path: "/y", Model: "m"}) // evicts `again` (idle)
	tb.mu.Lock()
	_, kept := tb.groups[chat.groupKey()]
	tb.mu.Unlock()
	if kept {
		t.Fatal("the group outlived every lane that used it")
	}
}

func TestBoundedKeepsShortValuesAndShortensLongOnes(t *testing.T) {
	if bounded("gpt-4o-mini") != "gpt-4o-mini" || bounded("") != "" {
		t.Fatal("a short value changed")
	}
	a, b := strings.Repeat("ü", 200)+"a", strings.Repeat("ü", 200)+"b"
	ba, bb := bounded(a), bounded(b)
	if ba == bb || len(ba) > 100 || !utf8.ValidString(ba) || !strings.HasPrefix(a, strings.Split(ba, "…")[0]) {
		t.Fatalf("bounded: %q and %q", ba, bb)
	}
	if bounded(a) != ba {
		t.Fatal("not stable")
	}
}

// TestBusiestPagesTheLanes: at most n lanes, the one with work first, then
// the most recently used; the total counts them all.
func TestBusiestPagesTheLanes(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
	for i := range 5 {
		tb.laneFor(Key{Path: fmt.Sprint("/", i)})
		fc.Advance(time.Second)
	}
	busy := tb.laneFor(Key{Path: "/0"})
	fc.Advance(time.Second)
	tb.laneFor(Key{Path: "/4"}) // most recently used of the idle ones
	s, err := busy.acquire(context.Background(), 1, High)
	if err != nil {
		t.Fatal(err)
	}
	defer s.release()
	got, total := tb.Busiest(2, true)
	if total != 5 || len(got) != 2 || got[0].Path != "/0" || got[1].Path != "/4" || got[0].History == nil {
		t.Fatalf("Busiest(2): %d of %d: %+v", len(got), total, got)
	}
	if all, _ := tb.Busiest(100, false); len(all) != 5 || all[0].History != nil {
		t.Fatalf("Busiest(100): %d", len(all))
	}
}

// TestEveryKeyFieldSeparatesLanes: keys that differ in the route, the
// credential, the path or the model get lanes of their own with IDs of
// their own; only the path is left out of the limit group when a model
// is named.
func TestEveryKeyFieldSeparatesLanes(t *testing.T) {
	base := Key{Route: "r", CredentialHash: HashCredential("sk-a"), Path: "/v1/chat/completions", Model: "gpt"}
	variants := map[string]Key{}
	for name, mod := range map[string]func(*Key){
		"route":      func(k *Key) { k.Route = "other" },
		"credential": func(k *Key) { k.CredentialHash = HashCredential("sk-b") },
		"no key":     func(k *Key) { k.CredentialHash = "" },
		"path":       func(k *Key) { k.Path = "/v1/embeddings" },
		"model":      func(k *Key) { k.Model = "other" },
	} {
		k := base
		mod(&k)
		variants[name] = k
	}
	tb := NewTable(TableConfig{})
	baseLane := tb.laneFor(base)
	for name, k := range variants {
		if k.ID() == base.ID() {
			t.Errorf("%s: the same lane ID %s", name, k.ID())
		}
		if tb.laneFor(k) == baseLane {
			t.Errorf("%s: the same lane", name)
		}
		if same := k.limitKey(false) == base.limitKey(false); same != (name == "path") {
			t.Errorf("%s: same limit = %v", name, same)
		}
		if same := k.groupKey() == base.groupKey(); same != (name == "path" || name == "model") {
			t.Errorf("%s: same group = %v", name, same)
		}
	}
	// The fields are kept apart: moving text from one to the next is
	// another key.
	a := Key{Route: "ab", Path: "/c"}
	b := Key{Route: "a", CredentialHash: "b", Path: "/c"}
	if a.ID() == b.ID() || a.limitKey(false) == b.limitKey(false) || a.groupKey() == b.groupKey() {
		t.Error("fields run together in the lane ID, limit or group")
	}
}

// stallingShared is the in-process state with an Admit that waits until
// released: a shared store gone slow, with its group's lock held.
type stallingShared struct {
	*limit.Memory
	entered chan struct{}
	release chan struct{}
}

func (s stallingShared) Admit(now time.Time, cost int64, alone bool) (limit.Ticket, time.Time, bool) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	return s.Memory.Admit(now, cost, alone)
}

func TestTableNotHeldUpByAGroupWaitingOnItsStore(t *testing.T) {
	fc := clock.NewFake(t0)
	stall := stallingShared{entered: make(chan struct{}, 1), release: make(chan struct{})}
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, IdleTTL: time.Minute,
		Shared: func(group string, cfg limit.Config) limit.Shared {
			if strings.Contains(group, HashCredential("slow")) {
				stall.Memory = limit.NewMemory(cfg)
				return stall
			}
			return limit.NewMemory(cfg)
		}})
	slowKey := Key{CredentialHash: HashCredential("slow"), Path: "/v1/chat/completions"}
	slow := tb.laneFor(slowKey)
	stuck := make(chan error, 1)
	go func() {
		s, err := slow.acquire(context.Background(), 1, High)
		if err == nil {
			s.release()
		}
		stuck <- err
	}()
	<-stall.entered // the slow group now holds its lock in Admit

	done := make(chan string, 1)
	go func() {
		if tb.laneFor(slowKey) != slow {
			done <- "a second lane for the slow key"
			return
		}
		fast := tb.laneFor(Key{CredentialHash: HashCredential("fast"), Path: "/v1/chat/completions"})
		s, err := fast.acquire(context.Background(), 1, High)
		if err != nil {
			done <- err.Error()
			return
		}
		s.release()
		fc.Advance(2 * time.Minute) // every lane is stale: the sweep visits the slow one
		tb.sweep()
		done <- ""
	}()
	select {
	case msg := <-done:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(5 * time.Second):
		close(stall.release)
		t.Fatal("the table waited for a group held up by its shared store")
	}
	if _, ok := tb.lookup(slow.ID()); !ok {
		t.Fatal("the sweep dropped the busy lane")
	}
	close(stall.release)
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
}

// TestALaneWithAnOpenSessionIsNotSweptAsIdle: a lane whose only use is an
// open session (no queue, no permit) stays past the idle TTL, shows the
// session in its state, and is swept once the session closes (closing
// twice counts once).
func TestALaneWithAnOpenSessionIsNotSweptAsIdle(t *testing.T) {
	fc := clock.NewFake(t0)
	var evicted []string
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, IdleTTL: time.Minute, onEvict: func(l *Lane) { evicted = append(evicted, l.Key().Path) }})
	l := tb.laneFor(Key{Path: "/v1/realtime"})
	closed := l.openSession()
	if got := l.State().Sessions; got != 1 {
		t.Fatalf("sessions in the state: %d, want 1", got)
	}
	fc.Advance(2 * time.Minute)
	tb.sweep()
	if len(evicted) != 0 {
		t.Fatalf("a lane with an open session was swept: %v", evicted)
	}
	closed()
	closed()
	if got := l.State().Sessions; got != 0 {
		t.Fatalf("sessions after closing (twice): %d, want 0", got)
	}
	fc.Advance(2 * time.Minute)
	tb.sweep()
	if len(evicted) != 1 {
		t.Fatalf("the lane was not swept once its session closed: %v", evicted)
	}
}

// TestZeroConfigTakesTheDocumentedDefaults: concurrency 8, bounds 1 and
// 1024, a queue of 10000.
func TestZeroConfigTakesTheDocumentedDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.Concurrency != 8 || c.MinConcurrency != 1 || c.MaxConcurrency != 1024 || c.MaxQueue != 10000 || c.Clock == nil {
		t.Fatalf("defaults %+v, want concurrency 8, min 1, max 1024, queue 10000, a clock", c)
	}
	if c := (Config{Concurrency: 16}).withDefaults(); c.Concurrency != 16 || c.MaxConcurrency != 1024 {
		t.Fatalf("concurrency 16 with zero bounds became %+v, want 16 under a max of 1024", c)
	}
	// The limit never falls below the default minimum of 1.
	fc := clock.NewFake(t0)
	l := newLane(Key{Path: "/d"}, Config{Concurrency: 1, MaxConcurrency: 4, Clock: fc})
	pastFirstAnswer(l)
	s := acquireN(t, l, 1)[0]
	refuseConc(s)
	wantLimit(t, l, 1)
	s.release()
}

// TestGetSweepsEveryEighthOfTheTTLAndDropsLanesUnusedThatLong: a Get an
// eighth of IdleTTL after the last sweep sweeps again, and drops an idle
// lane unused for exactly IdleTTL.
func TestGetSweepsEveryEighthOfTheTTLAndDropsLanesUnusedThatLong(t *testing.T) {
	fc := clock.NewFake(t0)
	const ttl = 80 * time.Second
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, IdleTTL: ttl})
	a := tb.laneFor(Key{Path: "/a"}) // sweeps at t0
	fc.Set(at(ttl - ttl/8))
	tb.laneFor(Key{Path: "/b"}) // sweeps; /a is not stale yet
	if _, ok := tb.lookup(a.ID()); !ok {
		t.Fatal("/a dropped before its TTL")
	}
	fc.Set(at(ttl))
	tb.laneFor(Key{Path: "/b"}) // an eighth of the TTL since the last sweep
	if _, ok := tb.lookup(a.ID()); ok || tb.laneCount() != 1 {
		t.Fatalf("/a unused for the whole TTL is still there (%d lanes)", tb.laneCount())
	}
}

// TestNoTwoLanesShareAnID: when a new lane's short ID is taken by another
// lane of the table, it takes more digits of its key's digest; a lane that
// leaves the table gives its ID back. IDs are 1 hex digit here, so 40
// keys collide.
func TestNoTwoLanesShareAnID(t *testing.T) {
	tb := NewTable(TableConfig{idDigits: 1, MaxLanes: 30})
	longer := 0
	for i := range 40 {
		key := Request{Credential: "sk-" + strconv.Itoa(i), Path: "/v1/chat/completions", Model: "m"}
		s, err := tb.Acquire(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		s.Done(200, "ok", -1)
		if l, ok := tb.lookup(s.ID()); !ok || l != s.lane {
			t.Fatalf("lane %d: its ID %s does not find it", i, s.ID())
		}
		if len(s.ID()) > 1 {
			longer++
		}
		ids := map[string]bool{}
		for _, st := range tb.States() {
			if ids[st.ID] {
				t.Fatalf("after lane %d, two lanes of the table are %s", i, st.ID)
			}
			ids[st.ID] = true
		}
	}
	if longer == 0 {
		t.Fatal("40 keys on 16 one-digit IDs, and no ID grew")
	}
	if n := len(tb.States()); n != 30 || len(tb.ids) != n {
		t.Fatalf("%d lanes, %d IDs taken; want 30 of each (a lane that left gives its ID back)", n, len(tb.ids))
	}
}
