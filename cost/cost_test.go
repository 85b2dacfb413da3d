package cost

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/tokens"
)

func TestAmountStringAndParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Amount
		out  string
	}{
		{"5", 5 * Dollar, "5"},
		{"0.25", Dollar / 4, "0.25"},
		{"0.000135", 135_000, "0.000135"},
		{"1e2", 100 * Dollar, "100"},
		{"0.0000000004", 0, "0"},
		{"0.0000000006", 1, "0.000000001"},
	} {
		got, err := ParseDollars(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseDollars(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
		if s := got.String(); s != c.out {
			t.Errorf("%d.String() = %q, want %q", got, s, c.out)
		}
	}
	if s := (-Dollar / 2).String(); s != "-0.5" {
		t.Errorf("-0.5: %q", s)
	}
	for _, bad := range []string{"", "x", "-1", "NaN", "1e12"} {
		if _, err := ParseDollars(bad); err == nil {
			t.Errorf("ParseDollars(%q) took it", bad)
		}
	}
}

func TestTheShippedTableParsesAndPricesTheIssuesExample(t *testing.T) {
	tab, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	// gpt-4o-mini standard: $0.15/M input, $0.60/M output (PROVIDERS.md §12).
	got, ok := tab.Cost("gpt-4o-mini-2024-07-18", Standard, tokens.Usage{Input: 1_000_000, Output: 1_000_000})
	if !ok || got != 750_000_000 {
		t.Fatalf("a million in and out of gpt-4o-mini: %v %v, want 0.75", got, ok)
	}
	// Cached input at its own price.
	got, _ = tab.Cost("gpt-4o-mini", Standard, tokens.Usage{Input: 1000, Cached: 400, Output: 0})
	if want := Amount(600*150 + 400*75); got != want {
		t.Errorf("cached: %d, want %d", got, want)
	}
}

func TestModelMatchesByNameThenLongestPrefix(t *testing.T) {
	tab, err := Parse([]byte(`{"models":{
		"gpt-4o": {"standard": {"input": 2, "output": 8}},
		"gpt-4o-mini": {"standard": {"input": 1, "output": 4}, "flex": {"input": 0.5, "output": 2}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"gpt-4o": 2, "gpt-4o-2024-08-06": 2, "gpt-4o-mini": 1, "gpt-4o-mini-2024-07-18": 1,
		"openai/gpt-4o-mini": 1, "models/gpt-4o@latest": 2, "gpt-4o-latest": 2, "gpt-4o-0613": 2,
	} {
		m := tab.Model(name)
		if m == nil || m.Standard.Input != want {
			t.Errorf("%q: %+v, want input %v", name, m, want)
		}
	}
	for _, name := range []string{"", "gpt-4", "gpt-4omini", "claude", "gpt-4o-pro", "gpt-4o-mini-search-preview"} {
		if m := tab.Model(name); m != nil {
			t.Errorf("%q matched %+v", name, m)
		}
	}
	// A tier without its own price is priced as standard.
	flex, _ := tab.Cost("gpt-4o-mini", Flex, tokens.Usage{Input: 1e6})
	batch, _ := tab.Cost("gpt-4o-mini", Batch, tokens.Usage{Input: 1e6})
	if flex != Dollar/2 || batch != Dollar {
		t.Errorf("flex %v batch %v, want 0.5 and 1", flex, batch)
	}
}

func TestBoundUsesTheModelsMostWhenTheRequestSetsNone(t *testing.T) {
	tab, _ := Parse([]byte(`{"models":{"m": {"max_output": 1000, "standard": {"input": 1, "output": 1000}}, "n": {"standard": {"input": 0, "output": 1}}}}`))
	b, _ := tab.Bound("m", Standard, 0, -1)
	if b != Dollar {
		t.Errorf("m: %v, want 1 (1,000 tokens at $1,000/M)", b)
	}
	b, _ = tab.Bound("n", Standard, 0, -1)
	if b != Amount(DefaultMaxOutput*1000) {
		t.Errorf("n: %v", b)
	}
	if _, ok := tab.Bound("x", Standard, 1, 1); ok {
		t.Error("an unknown model was bounded")
	}
}

func TestParseRefusesBadTables(t *testing.T) {
	for _, bad := range []string{`{}`, `{"models":{}}`, `{"models":{"m":{}}}`, `{"models":{"m":{"standard":{"input":-1,"output":1}}}}`, `not json`} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

func TestLocalReservesWithinTheCapAndSettles(t *testing.T) {
	ctx := context.Background()
	l := NewLocal()
	scope := []Scope{{Key: "run:a", Cap: 10}}
	h1 := Hold{ID: "1", Amount: 6, Scopes: scope}
	if err := l.TryReserve(ctx, h1); err != nil {
		t.Fatal(err)
	}
	h2 := Hold{ID: "2", Amount: 6, Scopes: scope}
	if err := l.TryReserve(ctx, h2); !errors.Is(err, ErrFull) {
		t.Fatalf("over the cap with a hold under way: %v, want ErrFull", err)
	}
	if err := l.Settle(ctx, h1, 3); err != nil {
		t.Fatal(err)
	}
	if spent, held, _ := l.Spent(ctx, "run:a"); spent != 3 || held != 0 {
		t.Fatalf("spent %d held %d", spent, held)
	}
	if err := l.TryReserve(ctx, h2); err != nil {
		t.Fatalf("room after the settle: %v", err)
	}
	l.Settle(ctx, h2, 6)
	var ex *Exhausted
	if err := l.TryReserve(ctx, Hold{ID: "3", Amount: 2, Scopes: scope}); !errors.As(err, &ex) || ex.Spent != 9 || ex.Cap != 10 {
		t.Fatalf("9 of 10 spent, 2 more: %v", err)
	}
	// A second settle of one hold changes nothing.
	l.Settle(ctx, h2, 6)
	if spent, held, _ := l.Spent(ctx, "run:a"); spent != 9 || held != 0 {
		t.Fatalf("after a second settle: spent %d held %d", spent, held)
	}
}

func TestUncappedScopesOnlyCount(t *testing.T) {
	ctx := context.Background()
	l := NewLocal()
	h := Hold{ID: "x", Amount: 1 << 40, Scopes: []Scope{{Key: "key:k"}}}
	l.Settle(ctx, h, 7) // never taken: nothing
	if err := l.TryReserve(ctx, h); err != nil {
		t.Fatal(err)
	}
	l.Settle(ctx, h, 5)
	if spent, _, _ := l.Spent(ctx, "key:k"); spent != 5 {
		t.Errorf("spent %d", spent)
	}
}

func TestIdleRunsAreDroppedAfterTheirTTL(t *testing.T) {
	ctx := context.Background()
	l := NewLocal()
	now := time.Unix(0, 0)
	l.now = func() time.Time { return now }
	h := Hold{ID: "x", Amount: 1, Scopes: []Scope{{Key: "run:r", Cap: 5, TTL: time.Hour}}}
	l.TryReserve(ctx, h)
	l.Settle(ctx, h, 4)
	now = now.Add(2 * time.Hour)
	if err := l.TryReserve(ctx, Hold{ID: "y", Amount: 3, Scopes: h.Scopes}); err != nil {
		t.Fatalf("an idle run's spend outlived its TTL: %v", err)
	}
}

// TestReserveNeverPassesTheCapUnderConcurrency: many requests reserve
// at once, each settling at most what it held; the spend ends within
// the cap and within one request's bound of it.
func TestReserveNeverPassesTheCapUnderConcurrency(t *testing.T) {
	l := NewLocal()
	const limit, bound = Amount(1000), Amount(37)
	scope := []Scope{{Key: "run:c", Cap: limit}}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				h := Hold{ID: NewHoldID(), Amount: bound, Scopes: scope}
				err := Reserve(context.Background(), l, h)
				if err != nil {
					var ex *Exhausted
					if !errors.As(err, &ex) {
						t.Error(err)
					}
					return
				}
				l.Settle(context.Background(), h, bound-Amount((i+j)%5))
			}
		}()
	}
	wg.Wait()
	spent, held, _ := l.Spent(context.Background(), "run:c")
	if spent > limit || spent <= limit-bound || held != 0 {
		t.Errorf("spent %d held %d: want within (%d, %d]", spent, held, limit-bound, limit)
	}
}

func TestABoundIsAtTheDearestTierAndNeverOverflows(t *testing.T) {
	tab, _ := Parse([]byte(`{"models":{"m":{"max_output":100,"standard":{"input":1,"output":2},"priority":{"input":3,"output":1},"flex":{"input":0.5,"output":1}}}}`))
	b, _ := tab.Bound("m", Dearest, 1e6, 1e6)
	if b != 5*Dollar { // $3 input (priority) and $2 output (standard)
		t.Errorf("dearest: %v, want 5", b)
	}
	b, _ = tab.Bound("m", Dearest, 1<<40, 1<<40*128)
	if b <= 0 || b > Amount(maxBound) {
		t.Errorf("a huge request's bound: %d", b)
	}
	if tab.MaxOutput("m") != 100 || tab.MaxOutput("x") != DefaultMaxOutput {
		t.Errorf("MaxOutput %d %d", tab.MaxOutput("m"), tab.MaxOutput("x"))
	}
}
