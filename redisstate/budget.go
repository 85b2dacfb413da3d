package redisstate

// Budgets: the spend ledger (cost.Ledger) the replicas share, so that a
// cap holds for the fleet, not for each replica. Each call is one Lua
// script (lua/budget_reserve.lua, lua/budget_settle.lua,
// lua/budget_spent.lua, after the functions of lua/budget.lua):
// TryReserve checks every scope of the hold and takes it under all of
// them, or none, at once; Settle releases it and adds the spend at once.
//
// Keys. A scope (cost.Scope.Key, a caller's string of at most
// cost.MaxKeyLen bytes) is two keys, named after it as it is (Redis key
// names are binary-safe, ':' and braces included, and the scope's key is
// their last part, so no two scopes' names meet, and a brace in it comes
// after the hash tag):
//
//	<prefix>{budget}:s:<key>  hash: spent, held (the sum of the live
//	                          holds), and '#'<hold id> -> each live
//	                          hold's amount
//	<prefix>{budget}:e:<key>  sorted set: the live holds' ids, scored by
//	                          their expiry (ms on Redis' clock)
//	<prefix>{budget}:holds    sorted set: every hold taken and not yet
//	                          settled, scored by when its Settle is no
//	                          longer awaited (its expiry and LateSettle)
//
// Every budget key has the hash tag {budget}: a Redis Cluster keeps them
// in one slot, so a hold's scopes, whatever their names, are in one
// script's reach (one call a request: one slot takes it).
//
// Holds expire. A hold lives until cost.Hold.Expires (zero:
// DefaultHoldTTL from the call; one already past: a millisecond), counted
// on Redis' clock as the rest of the package's times are: the replica
// sends the time left. A hold past it is released by the next call that
// reads its scope (a reservation, a settle, Spent): a replica that died
// does not hold room for ever.
//
// Settle is once per hold id, as cost.Local's: a hold settled already,
// or never taken, changes nothing (a Settle retried after its first
// reached Redis is a no-op). A hold that expired before its Settle is not
// released twice (its expiry released it), but its actual is added, the
// request having run, if the Settle comes within LateSettle of the
// expiry; later, nothing. Reserving an id again after its Settle takes a
// new hold; a TryReserve of an id still held (retried) takes it once.
//
// A scope with a TTL keeps its keys that long after its last write (and
// at least until its latest hold expires); TTL 0: for ever. Amounts are
// added exactly (HINCRBY); a cap is compared in a Lua number, exact up to
// 2^53 nano-dollars (about 9 million dollars).
//
// Where a hold names one scope key twice, the key counts once, with the
// smallest positive cap and the longest TTL given for it (cost.Local
// would count the hold twice under it).

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/cost"
)

// DefaultHoldTTL is how long a hold without an Expires lives unsettled.
const DefaultHoldTTL = 10 * time.Minute

// LateSettle is how long after a hold expired unsettled its Settle still
// adds its actual (a replica cut off from Redis for a while); later, the
// Settle changes nothing, as one of a hold never taken.
const LateSettle = time.Hour

// The reserve script's outcomes (budgetReserveWire.Outcome).
const (
	reserveTaken     = 0
	reserveFull      = 1
	reserveExhausted = 2
)

var (
	//go:embed lua/budget.lua
	budgetLua string
	//go:embed lua/budget_reserve.lua
	budgetReserveLua string
	//go:embed lua/budget_settle.lua
	budgetSettleLua string
	//go:embed lua/budget_spent.lua
	budgetSpentLua string
)

// The budget scripts: each its file after the functions it calls (clock
// and num are bucket.lua's).
var (
	budgetReserveScript = newScript(budgetReserveArgs{}, bucketLua, budgetLua, renderBudget(budgetReserveLua))
	budgetSettleScript  = newScript(budgetSettleArgs{}, bucketLua, budgetLua, renderBudget(budgetSettleLua))
	budgetSpentScript   = newScript(budgetSpentArgs{}, bucketLua, budgetLua, renderBudget(budgetSpentLua))
)

// budgetNames are the ${name}s the budget scripts have of their own,
// rendered before the package's own (render).
var budgetNames = map[string]string{
	"budgetReserveReply": luaList(budgetReserveWire{}),
	"budgetSettleReply":  luaList(budgetSettleWire{}),
	"budgetSpentReply":   luaList(budgetSpentWire{}),
	"reserveTaken":       strconv.Itoa(reserveTaken),
	"reserveFull":        strconv.Itoa(reserveFull),
	"reserveExhausted":   strconv.Itoa(reserveExhausted),
}

// renderBudget is src with the budget scripts' own ${name}s replaced.
func renderBudget(src string) string {
	return placeholder.ReplaceAllStringFunc(src, func(m string) string {
		if v, ok := budgetNames[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// budgetReserveArgs are budgetReserveScript's arguments.
type budgetReserveArgs struct {
	Now    int64  `lua:"now"` // see admitArgs.Now
	ID     string `lua:"id"`
	Amount int64  `lua:"amount"`
	Life   int64  `lua:"life"` // how long the hold lives unsettled (ms)
	Late   int64  `lua:"late"` // LateSettle (ms)
	// Scopes are each scope's cap and TTL (ms), in the order of the keys.
	Scopes []string `lua:"scopes"`
}

// budgetSettleArgs are budgetSettleScript's arguments.
type budgetSettleArgs struct {
	Now    int64  `lua:"now"` // see admitArgs.Now
	ID     string `lua:"id"`
	Actual int64  `lua:"actual"`
	// Scopes are each scope's TTL (ms), in the order of the keys.
	Scopes []string `lua:"scopes"`
}

// budgetSpentArgs are budgetSpentScript's arguments.
type budgetSpentArgs struct {
	Now int64 `lua:"now"` // see admitArgs.Now
}

// budgetReserveWire is budgetReserveScript's reply.
type budgetReserveWire struct {
	Outcome int64 `lua:"outcome"` // reserveTaken, reserveFull or reserveExhausted
	Scope   int64 `lua:"scope"`   // the exhausted scope, 1-based
	Spent   int64 `lua:"spent"`   // its spend
}

// budgetSettleWire is budgetSettleScript's reply.
type budgetSettleWire struct {
	Settled int64 `lua:"settled"` // 1, or 0 when the hold was not awaited (see budget_settle.lua)
}

// budgetSpentWire is budgetSpentScript's reply.
type budgetSpentWire struct {
	Spent int64 `lua:"spent"`
	Held  int64 `lua:"held"`
}

// Ledger is the spend ledger the replicas share through this store's
// Redis (see the top of budget.go). Its errors are Redis' (or ctx's,
// or the store's Timeout's): it does not fall back to a local ledger,
// nor take the store's lanes local; the caller decides.
func (s *Store) Ledger() cost.Ledger { return &budgets{s} }

// budgets is Store.Ledger's ledger.
type budgets struct{ s *Store }

var _ cost.Ledger = (*budgets)(nil)

// holdsKey is the set of the holds taken and not yet settled.
func (b *budgets) holdsKey() string { return b.s.cfg.Prefix + "{budget}:holds" }

// scopeKeys are the spend hash and the holds set of the scope key.
func (b *budgets) scopeKeys(key string) (spend, holds string) {
	p := b.s.cfg.Prefix + "{budget}:"
	return p + "s:" + key, p + "e:" + key
}

// keys are the holds set, then each scope's two keys.
func (b *budgets) keys(scopes []cost.Scope) []string {
	keys := make([]string, 1, 1+2*len(scopes))
	keys[0] = b.holdsKey()
	for _, sc := range scopes {
		spend, holds := b.scopeKeys(sc.Key)
		keys = append(keys, spend, holds)
	}
	return keys
}

// distinct are scopes with each key once: the smallest positive cap and
// the longest TTL given for it.
func distinct(scopes []cost.Scope) []cost.Scope {
	out := make([]cost.Scope, 0, len(scopes))
	at := make(map[string]int, len(scopes))
	for _, sc := range scopes {
		i, ok := at[sc.Key]
		if !ok {
			at[sc.Key] = len(out)
			out = append(out, sc)
			continue
		}
		o := &out[i]
		if sc.Cap > 0 && (o.Cap <= 0 || sc.Cap < o.Cap) {
			o.Cap = sc.Cap
		}
		o.TTL = max(o.TTL, sc.TTL)
	}
	return out
}

// ttlMs is a scope's TTL in ms, at least 1 when positive; 0: none.
func ttlMs(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}

// call runs a budget script under ctx and the store's Timeout.
func (b *budgets) call(ctx context.Context, op string, sc script, keys []string, args any) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.s.cfg.Timeout)
	defer cancel()
	b.s.commands.WithLabelValues(op).Inc()
	res, err := sc.Run(ctx, b.s.rdb(), keys, argv(args)...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("redisstate: %s: %w", strings.ReplaceAll(op, "_", " "), err)
	}
	return res, nil
}

// TryReserve implements cost.Ledger in one script over every scope of h.
func (b *budgets) TryReserve(ctx context.Context, h cost.Hold) error {
	scopes := distinct(h.Scopes)
	if len(scopes) == 0 {
		return ctx.Err()
	}
	life := DefaultHoldTTL
	if !h.Expires.IsZero() {
		life = max(h.Expires.Sub(b.s.now()), time.Millisecond)
	}
	args := budgetReserveArgs{Now: b.s.scriptNow(), ID: h.ID, Amount: int64(h.Amount), Life: max(life.Milliseconds(), 1), Late: LateSettle.Milliseconds(),
		Scopes: make([]string, 0, 2*len(scopes))}
	for _, sc := range scopes {
		args.Scopes = append(args.Scopes, strconv.FormatInt(int64(sc.Cap), 10), ttlMs(sc.TTL))
	}
	res, err := b.call(ctx, "budget_reserve", budgetReserveScript, b.keys(scopes), args)
	if err != nil {
		return err
	}
	if n := wireLen[budgetReserveWire](); len(res) != n {
		return fmt.Errorf("redisstate: budget reserve script replied %d integers, want %d", len(res), n)
	}
	var w budgetReserveWire
	fill(&w, res)
	switch w.Outcome {
	case reserveTaken:
		return nil
	case reserveFull:
		return cost.ErrFull
	case reserveExhausted:
		if w.Scope >= 1 && int(w.Scope) <= len(scopes) {
			sc := scopes[w.Scope-1]
			return &cost.Exhausted{Key: sc.Key, Spent: cost.Amount(w.Spent), Cap: sc.Cap}
		}
	}
	return fmt.Errorf("redisstate: budget reserve script replied %v", res)
}

// Settle implements cost.Ledger in one script over every scope of h. A
// hold settled already, never taken or expired past LateSettle changes
// nothing (see the top of budget.go).
func (b *budgets) Settle(ctx context.Context, h cost.Hold, actual cost.Amount) error {
	_, err := b.settle(ctx, h, actual)
	return err
}

// settle is Settle, and whether it settled h (false: h was not awaited).
func (b *budgets) settle(ctx context.Context, h cost.Hold, actual cost.Amount) (bool, error) {
	scopes := distinct(h.Scopes)
	if len(scopes) == 0 {
		return false, ctx.Err()
	}
	args := budgetSettleArgs{Now: b.s.scriptNow(), ID: h.ID, Actual: int64(actual),
		Scopes: make([]string, 0, len(scopes))}
	for _, sc := range scopes {
		args.Scopes = append(args.Scopes, ttlMs(sc.TTL))
	}
	res, err := b.call(ctx, "budget_settle", budgetSettleScript, b.keys(scopes), args)
	if err != nil {
		return false, err
	}
	if n := wireLen[budgetSettleWire](); len(res) != n {
		return false, fmt.Errorf("redisstate: budget settle script replied %d integers, want %d", len(res), n)
	}
	var w budgetSettleWire
	fill(&w, res)
	return w.Settled == 1, nil
}

// Spent implements cost.Ledger; it releases the scope's expired holds.
func (b *budgets) Spent(ctx context.Context, key string) (spent, held cost.Amount, err error) {
	spend, holds := b.scopeKeys(key)
	res, err := b.call(ctx, "budget_spent", budgetSpentScript, []string{spend, holds}, budgetSpentArgs{Now: b.s.scriptNow()})
	if err != nil {
		return 0, 0, err
	}
	if n := wireLen[budgetSpentWire](); len(res) != n {
		return 0, 0, fmt.Errorf("redisstate: budget spent script replied %d integers, want %d", len(res), n)
	}
	var w budgetSpentWire
	fill(&w, res)
	return cost.Amount(w.Spent), cost.Amount(w.Held), nil
}
