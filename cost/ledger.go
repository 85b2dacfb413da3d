package cost

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// Scope is one account a request's spend counts to, and its cap.
type Scope struct {
	// Key names the account: the proxy uses "run:…", "key:…" and
	// "route:…" (see the proxy's budgets). At most MaxKeyLen bytes.
	Key string
	// Cap is the most the account may spend; 0 or less: no cap, the
	// spend is only counted.
	Cap Amount
	// TTL, when positive, drops the account's spend once it has been
	// idle that long (a run's is kept for a day after its last request).
	TTL time.Duration
}

// MaxKeyLen bounds a Scope's Key.
const MaxKeyLen = 200

// Hold is a reservation a Ledger took: an amount under each of its
// scopes, until Settle.
type Hold struct {
	ID     string
	Amount Amount
	Scopes []Scope
	// Expires is when a ledger shared by replicas drops the hold if it
	// was never settled (its replica died).
	Expires time.Time
}

// Exhausted is Reserve's error when a scope's cap cannot take the
// amount even once every hold under it has settled.
type Exhausted struct {
	Key        string
	Spent, Cap Amount
}

func (e *Exhausted) Error() string {
	return "budget " + e.Key + " exhausted: spent " + e.Spent.String() + " of " + e.Cap.String() + " USD"
}

// ErrFull is TryReserve's answer when the amount does not fit now but
// holds under way may give room back when they settle.
var ErrFull = errors.New("cost: budget full until holds under way settle")

// Ledger keeps spend and holds. TryReserve and Settle are atomic over
// all of a hold's scopes.
type Ledger interface {
	// TryReserve takes h.Amount under every scope of h if each scope's
	// spend, holds and h.Amount stay within its cap. Else it returns
	// *Exhausted for a scope that cannot take h.Amount with no holds
	// under it, or ErrFull.
	TryReserve(ctx context.Context, h Hold) error
	// Settle ends h: its amount is released and actual is added to the
	// spend of each of its scopes. A hold settled already, or never
	// taken, changes nothing.
	Settle(ctx context.Context, h Hold, actual Amount) error
	// Spent is the spend and the holds of the scope key.
	Spent(ctx context.Context, key string) (spent, held Amount, err error)
}

// NewHoldID is a random hold id.
func NewHoldID() string { return strconv.FormatUint(rand.Uint64(), 36) }

// Reserve takes h on l, waiting while the amount does not fit but holds
// under way may make room (ErrFull), until ctx ends.
func Reserve(ctx context.Context, l Ledger, h Hold) error {
	wait := 5 * time.Millisecond
	for {
		err := l.TryReserve(ctx, h)
		if !errors.Is(err, ErrFull) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// Local is a Ledger in this process's memory.
type Local struct {
	mu       sync.Mutex
	accounts map[string]*account
	holds    map[string]Hold
	now      func() time.Time
	swept    time.Time
}

type account struct {
	spent, held Amount
	holds       int
	ttl         time.Duration
	last        time.Time
}

// NewLocal is an empty Local ledger.
func NewLocal() *Local {
	return &Local{accounts: map[string]*account{}, holds: map[string]Hold{}, now: time.Now}
}

// TryReserve implements Ledger. Spend only grows, so a scope whose
// spend and the amount pass its cap is exhausted for the amount, holds
// under way or not.
func (l *Local) TryReserve(_ context.Context, h Hold) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.sweep(now)
	full := false
	for _, s := range h.Scopes {
		if s.Cap <= 0 {
			continue
		}
		var a account
		if p := l.accounts[s.Key]; p != nil {
			a = *p
		}
		switch {
		case a.spent+h.Amount > s.Cap:
			return &Exhausted{Key: s.Key, Spent: a.spent, Cap: s.Cap}
		case a.spent+a.held+h.Amount > s.Cap:
			full = true
		}
	}
	if full {
		return ErrFull
	}
	for _, s := range h.Scopes {
		a := l.account(s, now)
		a.held += h.Amount
		a.holds++
	}
	l.holds[h.ID] = h
	return nil
}

func (l *Local) account(s Scope, now time.Time) *account {
	a := l.accounts[s.Key]
	if a == nil {
		a = &account{}
		l.accounts[s.Key] = a
	}
	a.ttl, a.last = s.TTL, now
	return a
}

// Settle implements Ledger.
func (l *Local) Settle(_ context.Context, h Hold, actual Amount) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if _, ok := l.holds[h.ID]; !ok {
		return nil // settled already
	}
	delete(l.holds, h.ID)
	for _, s := range h.Scopes {
		a := l.account(s, now)
		a.held -= h.Amount
		a.holds--
		a.spent += actual
	}
	return nil
}

// Spent implements Ledger.
func (l *Local) Spent(_ context.Context, key string) (spent, held Amount, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.accounts[key]; a != nil {
		return a.spent, a.held, nil
	}
	return 0, 0, nil
}

// sweep drops the accounts idle past their TTL with no holds, once a
// minute at most.
func (l *Local) sweep(now time.Time) {
	if now.Sub(l.swept) < time.Minute {
		return
	}
	l.swept = now
	for k, a := range l.accounts {
		if a.ttl > 0 && a.holds == 0 && now.Sub(a.last) > a.ttl {
			delete(l.accounts, k)
		}
	}
}
