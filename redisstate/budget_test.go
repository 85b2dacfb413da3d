package redisstate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/cost"
)

// budgetOp is one step of a ledger's run: a reservation, a settle or a
// read of a scope's spend.
type budgetOp struct {
	op     string // "reserve", "settle", "spent"
	id     string // the hold's
	amount cost.Amount
	scopes []cost.Scope
	actual cost.Amount // a settle's
	key    string      // spent's
}

// outcome is what a ledger answered to op, written so two ledgers'
// answers compare.
func outcome(ctx context.Context, l cost.Ledger, holds map[string]cost.Hold, op budgetOp) string {
	switch op.op {
	case "reserve":
		h := cost.Hold{ID: op.id, Amount: op.amount, Scopes: op.scopes}
		err := l.TryReserve(ctx, h)
		var ex *cost.Exhausted
		switch {
		case err == nil:
			holds[op.id] = h
			return "taken"
		case errors.Is(err, cost.ErrFull):
			return "full"
		case errors.As(err, &ex):
			return fmt.Sprintf("exhausted %q spent %d cap %d", ex.Key, ex.Spent, ex.Cap)
		default:
			return "error " + err.Error()
		}
	case "settle":
		h, ok := holds[op.id]
		if !ok { // a hold never taken, or settled already: its scopes are the op's
			h = cost.Hold{ID: op.id, Amount: op.amount, Scopes: op.scopes}
		}
		delete(holds, op.id)
		if err := l.Settle(ctx, h, op.actual); err != nil {
			return "error " + err.Error()
		}
		return "settled"
	case "spent":
		spent, held, err := l.Spent(ctx, op.key)
		if err != nil {
			return "error " + err.Error()
		}
		return fmt.Sprintf("spent %d held %d", spent, held)
	}
	panic("no op " + op.op)
}

// conform runs ops on a cost.Local and on l, and fails t where their
// answers differ; after each op it compares the spend of every key the
// ops named.
func conform(t *testing.T, l cost.Ledger, ops []budgetOp) {
	t.Helper()
	ctx := context.Background()
	local := cost.NewLocal()
	lh, rh := map[string]cost.Hold{}, map[string]cost.Hold{}
	keys := map[string]bool{}
	for i, op := range ops {
		for _, sc := range op.scopes {
			keys[sc.Key] = true
		}
		want, got := outcome(ctx, local, lh, op), outcome(ctx, l, rh, op)
		if got != want {
			t.Fatalf("op %d %+v: redis %s, local %s", i, op, got, want)
		}
		for k := range keys {
			read := budgetOp{op: "spent", key: k}
			if want, got := outcome(ctx, local, lh, read), outcome(ctx, l, rh, read); got != want {
				t.Fatalf("after op %d %+v: %q: redis %s, local %s", i, op, k, got, want)
			}
		}
	}
}

const day = 24 * time.Hour

// budgetTable is a run of operations whose answers cost.Local gives: a
// shared ledger must give the same.
func budgetTable() []budgetOp {
	run := cost.Scope{Key: "run:a", Cap: 1000, TTL: day}
	key := cost.Scope{Key: "key:x"} // uncapped: counted only
	route := cost.Scope{Key: "route:z", Cap: 5000}
	odd := cost.Scope{Key: "run:{odd}: key/ü é\x00\"'" + strings.Repeat("x", cost.MaxKeyLen-20), Cap: 300, TTL: time.Hour}
	both := []cost.Scope{run, key}
	return []budgetOp{
		{op: "spent", key: "nobody"},
		{op: "reserve", id: "h1", amount: 100, scopes: both},
		{op: "reserve", id: "h2", amount: 900, scopes: both}, // exactly to the cap
		{op: "reserve", id: "h3", amount: 1, scopes: both},   // full: holds under way
		{op: "reserve", id: "h3", amount: 1, scopes: []cost.Scope{key}},
		{op: "settle", id: "h3", actual: 7},
		{op: "settle", id: "h1", actual: 50},
		{op: "settle", id: "h1", actual: 50, scopes: both}, // settled already: nothing
		{op: "reserve", id: "h4", amount: 1, scopes: both},
		{op: "reserve", id: "h5", amount: 951, scopes: both}, // 50+951 > 1000: exhausted
		{op: "reserve", id: "h5", amount: 949, scopes: both}, // full
		// Exhausted, in a later scope, goes before full in an earlier one.
		{op: "reserve", id: "h6", amount: 5001, scopes: []cost.Scope{run, route}},
		{op: "reserve", id: "h6", amount: 100, scopes: []cost.Scope{route, run}},
		{op: "settle", id: "h2", actual: 900},
		{op: "settle", id: "h4", actual: 0},
		{op: "reserve", id: "h7", amount: 50, scopes: []cost.Scope{run, route, key}}, // to the cap, after settles
		{op: "reserve", id: "h8", amount: 0, scopes: both},
		{op: "reserve", id: "h9", amount: 1, scopes: both},
		{op: "settle", id: "h7", actual: 80}, // past the estimate: spend passes the cap
		{op: "settle", id: "h8", actual: 0},
		{op: "reserve", id: "h9", amount: 0, scopes: both},
		{op: "reserve", id: "h9", amount: 1, scopes: []cost.Scope{route}},
		{op: "settle", id: "h9", actual: 1},
		// An id reserved again after its settle is a new hold.
		{op: "reserve", id: "h9", amount: 10, scopes: []cost.Scope{route}},
		{op: "settle", id: "h9", actual: 10},
		// A hold never taken, or not taken for want of room, changes nothing.
		{op: "settle", id: "never", actual: 3, scopes: []cost.Scope{route, key}},
		{op: "reserve", id: "nope", amount: 10_000, scopes: []cost.Scope{key, route}},
		{op: "settle", id: "nope", actual: 3, scopes: []cost.Scope{key, route}},
		// A hold of no scope.
		{op: "reserve", id: "none", amount: 10},
		{op: "settle", id: "none", actual: 10},
		// Keys of any bytes, up to MaxKeyLen.
		{op: "reserve", id: "o1", amount: 300, scopes: []cost.Scope{odd, key}},
		{op: "reserve", id: "o2", amount: 1, scopes: []cost.Scope{key, odd}},
		{op: "settle", id: "o1", actual: 299},
		{op: "reserve", id: "o2", amount: 1, scopes: []cost.Scope{key, odd}},
		{op: "reserve", id: "o3", amount: 1, scopes: []cost.Scope{odd}},
		{op: "settle", id: "o2", actual: 1},
		{op: "reserve", id: "o3", amount: 1, scopes: []cost.Scope{odd}},
		// Large amounts, exact.
		{op: "reserve", id: "big", amount: 4_000_000 * cost.Dollar, scopes: []cost.Scope{{Key: "big", Cap: 4_000_000*cost.Dollar + 1}}},
		{op: "settle", id: "big", actual: 4_000_000*cost.Dollar - 1},
		{op: "reserve", id: "big2", amount: 3, scopes: []cost.Scope{{Key: "big", Cap: 4_000_000*cost.Dollar + 1}}},
		{op: "reserve", id: "big2", amount: 2, scopes: []cost.Scope{{Key: "big", Cap: 4_000_000*cost.Dollar + 1}}},
	}
}

// randomBudgetOps are n random operations on a few scopes, each hold
// settled at most once and no id taken twice while held.
func randomBudgetOps(seed uint64, n int) []budgetOp {
	r := rand.New(rand.NewPCG(seed, 1))
	scopes := []cost.Scope{{Key: "run:r1", Cap: 20_000, TTL: day}, {Key: "run:r2", Cap: 7000}, {Key: "key:k", Cap: 50_000}, {Key: "route:free"}}
	amounts := map[string]cost.Amount{}
	var ops []budgetOp
	var open []string
	next := 0
	for range n {
		switch k := r.IntN(10); {
		case k < 5:
			var sc []cost.Scope
			for _, i := range r.Perm(len(scopes))[:1+r.IntN(len(scopes))] {
				sc = append(sc, scopes[i])
			}
			next++
			id := fmt.Sprintf("r%d", next)
			amounts[id] = cost.Amount(r.IntN(1000))
			ops = append(ops, budgetOp{op: "reserve", id: id, amount: amounts[id], scopes: sc})
			open = append(open, id) // settled whether taken or not: one not taken counts as never taken
		case k < 9 && len(open) > 0:
			i := r.IntN(len(open))
			// Mostly within the estimate, at times past it.
			a := amounts[open[i]]
			ops = append(ops, budgetOp{op: "settle", id: open[i], actual: cost.Amount(r.Int64N(int64(a+a/8) + 1))})
			open = append(open[:i], open[i+1:]...)
		default:
			ops = append(ops, budgetOp{op: "spent", key: scopes[r.IntN(len(scopes))].Key})
		}
	}
	return ops
}

// TestBudgetConformsToLocal: the shared ledger answers as cost.Local
// does, on a table of cases and on random runs.
func TestBudgetConformsToLocal(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	t.Run("table", func(t *testing.T) {
		conform(t, newStore(t, srv.url(), time.Minute).Ledger(), budgetTable())
	})
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("random", seed), func(t *testing.T) {
			st := storeOn(t, Config{URL: srv.url(), Prefix: fmt.Sprintf("t%d:", seed), Timeout: 10 * time.Second})
			conform(t, st.Ledger(), randomBudgetOps(seed, 400))
		})
	}
}

// TestBudgetScriptsWriteNoNumbers: the budget scripts' times and amounts
// all come from Go; their text has nothing left to render.
func TestBudgetScriptsWriteNoNumbers(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]script{"reserve": budgetReserveScript, "settle": budgetSettleScript, "spent": budgetSpentScript} {
		if strings.Contains(s.text, "${") {
			t.Errorf("%s: a ${…} left in the text", name)
		}
	}
	for name, src := range map[string]string{"budget": budgetLua, "reserve": budgetReserveLua, "settle": budgetSettleLua} {
		for _, lit := range numbersIn(t, name, src) {
			if lit != "0" && lit != "1" && lit != "2" {
				t.Errorf("%s writes %s: send it from Go", name, lit)
			}
		}
	}
}

// TestBudgetReplicasNeverPassTheCap: three replicas, 50 requests each
// at a time, reserve random amounts under one cap (waiting while holds
// under way leave no room) and settle each for at most its amount, until
// the cap is exhausted for them. The spend never passes the cap, and
// the run stops within one largest amount of it.
func TestBudgetReplicasNeverPassTheCap(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	const capAmount, most = cost.Amount(300_000), 1000
	run := cost.Scope{Key: "run:shared", Cap: capAmount, TTL: day}
	total := cost.Scope{Key: "key:total"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken, exhausted := 0, 0
	var full atomic.Int64
	for range 3 {
		l := fullCounter{newStore(t, srv.url(), time.Minute).Ledger(), &full}
		for range 50 {
			wg.Go(func() {
				for {
					h := cost.Hold{ID: cost.NewHoldID(), Amount: cost.Amount(1 + rand.IntN(most)), Scopes: []cost.Scope{run, total}}
					err := cost.Reserve(ctx, l, h)
					var ex *cost.Exhausted
					if errors.As(err, &ex) {
						if ex.Key != run.Key || ex.Cap != capAmount || ex.Spent+h.Amount <= capAmount {
							t.Errorf("exhausted %+v for %d", *ex, h.Amount)
						}
						mu.Lock()
						exhausted++
						mu.Unlock()
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					if err := l.Settle(ctx, h, cost.Amount(rand.Int64N(int64(h.Amount)+1))); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					taken++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	l := newStore(t, srv.url(), time.Minute).Ledger()
	spent, held, err := l.Spent(ctx, run.Key)
	if err != nil {
		t.Fatal(err)
	}
	all, allHeld, err := l.Spent(ctx, total.Key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d holds settled, %d reservations waited on holds under way, %d requests exhausted; spent %d of %d",
		taken, full.Load(), exhausted, spent, capAmount)
	switch {
	case spent > capAmount:
		t.Fatalf("spent %d, past the cap %d", spent, capAmount)
	case spent <= capAmount-most:
		t.Fatalf("spent %d: stopped more than %d short of the cap %d", spent, most, capAmount)
	case held != 0 || allHeld != 0:
		t.Fatalf("%d and %d still held once every hold settled", held, allHeld)
	case all != spent:
		t.Fatalf("the uncapped scope spent %d, the capped one %d: a settle reached one and not the other", all, spent)
	case exhausted != 150:
		t.Fatalf("%d requests exhausted, want 150", exhausted)
	case full.Load() == 0:
		t.Fatal("no reservation ever found the cap full of holds: the run did not contend")
	}
}

// fullCounter is a ledger that counts its TryReserves answered ErrFull.
type fullCounter struct {
	cost.Ledger
	full *atomic.Int64
}

func (f fullCounter) TryReserve(ctx context.Context, h cost.Hold) error {
	err := f.Ledger.TryReserve(ctx, h)
	if errors.Is(err, cost.ErrFull) {
		f.full.Add(1)
	}
	return err
}

// TestBudgetExpiredHoldFreesRoom: a hold never settled (its replica
// died) holds room only until it expires, on Redis' clock; settled late,
// it is not released twice, but its spend is added.
func TestBudgetExpiredHoldFreesRoom(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	a, b := newFakeStore(t, srv.url(), fc, fc).Ledger(), newFakeStore(t, srv.url(), fc, fc).Ledger()
	ctx := context.Background()
	run := []cost.Scope{{Key: "run:x", Cap: 1000, TTL: day}}
	dead := cost.Hold{ID: "dead", Amount: 600, Scopes: run, Expires: fc.Now().Add(time.Minute)}
	if err := a.TryReserve(ctx, dead); err != nil {
		t.Fatal(err)
	}
	next := cost.Hold{ID: "next", Amount: 600, Scopes: run} // expires in DefaultHoldTTL
	if err := b.TryReserve(ctx, next); !errors.Is(err, cost.ErrFull) {
		t.Fatalf("b reserved %v beside a's hold, want full", err)
	}
	fc.Advance(time.Minute - time.Millisecond)
	wantSpent(t, b, "run:x", 0, 600)
	fc.Advance(time.Millisecond)
	wantSpent(t, b, "run:x", 0, 0)
	if err := b.TryReserve(ctx, next); err != nil {
		t.Fatalf("b could not reserve once a's hold expired: %v", err)
	}
	// a comes back and settles: next's hold stays, the spend counts.
	if err := a.Settle(ctx, dead, 100); err != nil {
		t.Fatal(err)
	}
	wantSpent(t, b, "run:x", 100, 600)
	if err := b.TryReserve(ctx, cost.Hold{ID: "more", Amount: 301, Scopes: run}); !errors.Is(err, cost.ErrFull) {
		t.Fatalf("reserved %v past spend and hold, want full", err)
	}
	// A hold with no Expires lives DefaultHoldTTL (next was taken a
	// minute in).
	fc.Advance(DefaultHoldTTL - time.Millisecond)
	wantSpent(t, a, "run:x", 100, 600)
	fc.Advance(time.Millisecond)
	wantSpent(t, a, "run:x", 100, 0)
	// A hold past its expiry when taken lasts a millisecond.
	if err := a.TryReserve(ctx, cost.Hold{ID: "late", Amount: 900, Scopes: run, Expires: fc.Now().Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	wantSpent(t, a, "run:x", 100, 900)
	fc.Advance(time.Millisecond)
	wantSpent(t, a, "run:x", 100, 0)
}

func wantSpent(t *testing.T, l cost.Ledger, key string, spent, held cost.Amount) {
	t.Helper()
	s, h, err := l.Spent(context.Background(), key)
	if err != nil || s != spent || h != held {
		t.Fatalf("%s: spent %d held %d (%v), want %d and %d", key, s, h, err, spent, held)
	}
}

// TestBudgetSettleIsOncePerHold: a second Settle of a hold changes
// nothing, however late; a TryReserve retried while its hold is held
// takes it once; a hold that expired unsettled has its Settle add its
// actual, without a second release, within LateSettle of its expiry, and
// not after.
func TestBudgetSettleIsOncePerHold(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	b := newFakeStore(t, srv.url(), fc, fc).Ledger().(*budgets)
	ctx := context.Background()
	scopes := []cost.Scope{{Key: "run:x", Cap: 1000}, {Key: "key:y"}}
	h := cost.Hold{ID: "h", Amount: 500, Scopes: scopes}
	for range 2 {
		if err := b.TryReserve(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	wantSpent(t, b, "run:x", 0, 500)
	settle := func(h cost.Hold, actual cost.Amount, want bool) {
		t.Helper()
		if ok, err := b.settle(ctx, h, actual); err != nil || ok != want {
			t.Fatalf("settle %s: %v (%v), want %v", h.ID, ok, err, want)
		}
	}
	settle(h, 200, true)
	for range 2 {
		settle(h, 200, false)
		wantSpent(t, b, "run:x", 200, 0)
		wantSpent(t, b, "key:y", 200, 0)
		fc.Advance(2 * LateSettle)
	}
	// Expired, settled late: released once (by its expiry), spend added.
	late := cost.Hold{ID: "late", Amount: 300, Scopes: scopes, Expires: fc.Now().Add(time.Second)}
	other := cost.Hold{ID: "other", Amount: 400, Scopes: scopes, Expires: fc.Now().Add(3 * LateSettle)}
	for _, h := range []cost.Hold{late, other} {
		if err := b.TryReserve(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	fc.Advance(time.Second + LateSettle - time.Millisecond)
	wantSpent(t, b, "run:x", 200, 400)
	settle(late, 250, true)
	settle(late, 250, false)
	wantSpent(t, b, "run:x", 450, 400)
	wantSpent(t, b, "key:y", 450, 400)
	// Past LateSettle after its expiry, a Settle changes nothing.
	gone := cost.Hold{ID: "gone", Amount: 1, Scopes: scopes, Expires: fc.Now().Add(time.Second)}
	if err := b.TryReserve(ctx, gone); err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Second + LateSettle)
	settle(gone, 1, false)
	wantSpent(t, b, "run:x", 450, 400)
	settle(other, 0, true)
	// An id reserved again after its settle is a new hold.
	if err := b.TryReserve(ctx, h); err != nil {
		t.Fatal(err)
	}
	wantSpent(t, b, "run:x", 450, 500)
	settle(h, 10, true)
	wantSpent(t, b, "run:x", 460, 0)
}

// TestBudgetKeysLiveTheirScopesTTL: a scope with a TTL keeps its keys
// that long after its last write, and while a hold is under it; one
// without keeps them.
func TestBudgetKeysLiveTheirScopesTTL(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	l, b := st.Ledger(), st.Ledger().(*budgets)
	rdb := srv.client(t)
	ctx := context.Background()
	brief := cost.Scope{Key: "run:brief", TTL: 300 * time.Millisecond}
	long := cost.Scope{Key: "run:long", TTL: day}
	kept := cost.Scope{Key: "key:kept"}
	h := cost.Hold{ID: "h", Amount: 5, Scopes: []cost.Scope{brief, long, kept}}
	if err := l.TryReserve(ctx, h); err != nil {
		t.Fatal(err)
	}
	pttl := func(key string) time.Duration {
		t.Helper()
		d, err := rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, sc := range h.Scopes {
		spend, holds := b.scopeKeys(sc.Key)
		for _, k := range []string{spend, holds} {
			d := pttl(k)
			switch {
			case sc.TTL == 0 && d != -1:
				t.Errorf("%s: PTTL %v, want none", k, d)
			case sc == brief && (d < DefaultHoldTTL-time.Minute || d > DefaultHoldTTL):
				t.Errorf("%s: PTTL %v while the hold is under way, want its life %v", k, d, DefaultHoldTTL)
			case sc == long && (d < day-time.Minute || d > day):
				t.Errorf("%s: PTTL %v, want a day", k, d)
			}
		}
	}
	if err := l.Settle(ctx, h, 4); err != nil {
		t.Fatal(err)
	}
	wantSpent(t, l, brief.Key, 4, 0)
	spend, _ := b.scopeKeys(brief.Key)
	if d := pttl(spend); d <= 0 || d > brief.TTL {
		t.Fatalf("%s: PTTL %v once settled, want at most %v", spend, d, brief.TTL)
	}
	waitUntil(t, 5*time.Second, "the brief scope's spend to lapse", func() bool {
		s, _, err := l.Spent(ctx, brief.Key)
		return err == nil && s == 0
	})
	wantSpent(t, l, long.Key, 4, 0)
	wantSpent(t, l, kept.Key, 4, 0)
}

// TestBudgetErrorsAreReturned: a cancelled context, or a Redis that is
// gone, is the caller's error.
func TestBudgetErrorsAreReturned(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	l := newStore(t, srv.url(), time.Minute).Ledger()
	h := cost.Hold{ID: "h", Amount: 5, Scopes: []cost.Scope{{Key: "run:x", Cap: 10}}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.TryReserve(ctx, h); !errors.Is(err, context.Canceled) {
		t.Fatalf("reserve under a cancelled context: %v", err)
	}
	if err := l.Settle(ctx, h, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("settle under a cancelled context: %v", err)
	}
	if _, _, err := l.Spent(ctx, "run:x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("spent under a cancelled context: %v", err)
	}
	srv.stop()
	bg := context.Background()
	if err := l.TryReserve(bg, h); err == nil || errors.Is(err, cost.ErrFull) {
		t.Fatalf("reserve with Redis gone: %v", err)
	}
	if err := l.Settle(bg, h, 1); err == nil {
		t.Fatal("settle with Redis gone: no error")
	}
	if _, _, err := l.Spent(bg, "run:x"); err == nil {
		t.Fatal("spent with Redis gone: no error")
	}
}

// TestBudgetOnACluster: on a Redis Cluster every budget key is in one
// slot, so a hold's scopes of any names take one script; the ledger
// answers as cost.Local does there too.
func TestBudgetOnACluster(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	st := storeOn(t, Config{URL: c.URL(), Mode: modeCluster, Timeout: 10 * time.Second})
	if _, ok := st.rdb().(*redis.ClusterClient); !ok {
		t.Fatalf("client %T, want a cluster client", st.rdb())
	}
	b := st.Ledger().(*budgets)
	conform(t, b, budgetTable())
	keys := []string{b.holdsKey()}
	for _, op := range budgetTable() {
		for _, sc := range op.scopes {
			spend, holds := b.scopeKeys(sc.Key)
			keys = append(keys, spend, holds)
		}
	}
	owner := sameSlot(t, c, keys...)
	direct := owner.Client()
	defer direct.Close()
	spend, _ := b.scopeKeys("run:a")
	if v, err := direct.HGet(context.Background(), spend, "spent").Result(); err != nil || v == "" {
		t.Fatalf("the node serving the budget slot has no spend of run:a (%q, %v)", v, err)
	}
	// A second replica sees the first's holds.
	other := storeOn(t, Config{URL: c.URL(), Mode: modeCluster, Timeout: 10 * time.Second}).Ledger()
	ctx := context.Background()
	h := cost.Hold{ID: "c1", Amount: 10, Scopes: []cost.Scope{{Key: "run:c", Cap: 15}, {Key: "key:c"}}}
	if err := b.TryReserve(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := other.TryReserve(ctx, cost.Hold{ID: "c2", Amount: 10, Scopes: h.Scopes}); !errors.Is(err, cost.ErrFull) {
		t.Fatalf("the other replica reserved %v past the first's hold, want full", err)
	}
	if err := b.Settle(ctx, h, 7); err != nil {
		t.Fatal(err)
	}
	wantSpent(t, other, "run:c", 7, 0)
	wantSpent(t, other, "key:c", 7, 0)
}

// TestBudgetHoldWithoutExpiresLivesTenMinutes: a hold with a zero
// Expires lives DefaultHoldTTL, ten minutes on Redis' clock, and no
// longer.
func TestBudgetHoldWithoutExpiresLivesTenMinutes(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	l := newFakeStore(t, srv.url(), fc, fc).Ledger()
	run := []cost.Scope{{Key: "run:x", Cap: 1000}}
	if err := l.TryReserve(context.Background(), cost.Hold{ID: "h", Amount: 600, Scopes: run}); err != nil {
		t.Fatal(err)
	}
	fc.Advance(10*time.Minute - time.Second)
	wantSpent(t, l, "run:x", 0, 600)
	fc.Advance(time.Second - time.Millisecond)
	wantSpent(t, l, "run:x", 0, 600)
	fc.Advance(time.Millisecond)
	wantSpent(t, l, "run:x", 0, 0)
}

// TestBudgetScopeNamedTwiceCountsOnce: a hold naming one scope key
// twice holds it once, under the smallest positive cap given for it (a
// cap of 0, none, given beside one does not lift it), and keeps its keys
// the longest TTL given.
func TestBudgetScopeNamedTwiceCountsOnce(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	l, b := st.Ledger(), st.Ledger().(*budgets)
	rdb := srv.client(t)
	ctx := context.Background()
	for i, c := range []struct {
		caps []cost.Amount // the caps given for the one key, in order
		cap  cost.Amount   // the cap that applies; 0: none
	}{
		{[]cost.Amount{100, 0}, 100},
		{[]cost.Amount{0, 100}, 100},
		{[]cost.Amount{0, 0}, 0},
		{[]cost.Amount{100, 50}, 50},
		{[]cost.Amount{50, 100}, 50},
		{[]cost.Amount{0, 100, 50, 0, 70}, 50},
		{[]cost.Amount{80, 80}, 80},
	} {
		key := fmt.Sprintf("run:twice%d", i)
		var scopes []cost.Scope
		for j, cp := range c.caps {
			scopes = append(scopes, cost.Scope{Key: key, Cap: cp, TTL: time.Duration(j+1) * time.Hour})
		}
		reserve := func(id string, amount cost.Amount) error {
			return l.TryReserve(ctx, cost.Hold{ID: id, Amount: amount, Scopes: scopes})
		}
		if c.cap > 0 {
			// One past the cap is exhausted, under that cap.
			var ex *cost.Exhausted
			if err := reserve("over", c.cap+1); !errors.As(err, &ex) || ex.Key != key || ex.Cap != c.cap || ex.Spent != 0 {
				t.Fatalf("caps %v: reserved %d: %v, want exhausted under the cap %d", c.caps, c.cap+1, err, c.cap)
			}
		}
		amount := cost.Amount(1000) // uncapped: any amount
		if c.cap > 0 {
			amount = c.cap
		}
		// Exactly to the cap is taken, and held once.
		if err := reserve("h", amount); err != nil {
			t.Fatalf("caps %v: reserved %d: %v", c.caps, amount, err)
		}
		wantSpent(t, l, key, 0, amount)
		if c.cap > 0 {
			if err := reserve("more", 1); !errors.Is(err, cost.ErrFull) {
				t.Fatalf("caps %v: reserved 1 beside a hold of the cap: %v, want full", c.caps, err)
			}
		}
		spend, holds := b.scopeKeys(key)
		for _, k := range []string{spend, holds} {
			if d, err := rdb.PTTL(ctx, k).Result(); err != nil || d <= time.Duration(len(c.caps)-1)*time.Hour {
				t.Fatalf("caps %v: %s: PTTL %v (%v), want the longest TTL given, %d h", c.caps, k, d, err, len(c.caps))
			}
		}
		if err := l.Settle(ctx, cost.Hold{ID: "h", Amount: amount, Scopes: scopes}, amount-1); err != nil {
			t.Fatal(err)
		}
		wantSpent(t, l, key, amount-1, 0)
	}
}
