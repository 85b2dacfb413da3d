package limit

import "testing"

// TestConfigDefaultsFillTheZeroFields: a zero (or negative) concurrency,
// lowest and highest take 8, 1 and 1024; figures that are set are kept,
// and the start is moved inside the bounds.
func TestConfigDefaultsFillTheZeroFields(t *testing.T) {
	for _, c := range []struct {
		name         string
		in           Config
		conc, lo, hi int
	}{
		{"zero", Config{}, 8, 1, 1024},
		{"negative", Config{Concurrency: -3, MinConcurrency: -1, MaxConcurrency: -2}, 8, 1, 1024},
		{"all set", Config{Concurrency: 6, MinConcurrency: 4, MaxConcurrency: 9}, 6, 4, 9},
		{"a start of one", Config{Concurrency: 1}, 1, 1, 1024},
		{"a lowest above the default start", Config{MinConcurrency: 10}, 10, 10, 1024},
		{"a highest under the default start", Config{MaxConcurrency: 4}, 4, 1, 4},
		{"a start above the highest", Config{Concurrency: 100, MaxConcurrency: 4}, 4, 1, 4},
		{"a start under the lowest", Config{Concurrency: 2, MinConcurrency: 3}, 3, 3, 1024},
		{"a highest under the lowest", Config{MinConcurrency: 10, MaxConcurrency: 5}, 10, 10, 10},
		{"a highest equal to the lowest", Config{MinConcurrency: 5, MaxConcurrency: 5}, 5, 5, 5},
	} {
		got := c.in.WithDefaults()
		if got.Concurrency != c.conc || got.MinConcurrency != c.lo || got.MaxConcurrency != c.hi {
			t.Errorf("%s: %+v.WithDefaults() = start %d in [%d, %d], want %d in [%d, %d]", c.name, c.in,
				got.Concurrency, got.MinConcurrency, got.MaxConcurrency, c.conc, c.lo, c.hi)
		}
	}
}

// TestAConfiguredConcurrencyIsTheStartAndACeiling: a route's configured
// concurrency replaces the pool's start; as a ceiling it is also the
// highest (and pulls the lowest down to it), as a start it leaves the
// bounds as they are.
func TestAConfiguredConcurrencyIsTheStartAndACeiling(t *testing.T) {
	for _, c := range []struct {
		name         string
		in           Config
		conc, lo, hi int
	}{
		{"ceiling", Config{Concurrency: 8, Limits: Limits{Concurrency: 3}}, 3, 1, 3},
		{"ceiling under the lowest", Config{MinConcurrency: 5, Limits: Limits{Concurrency: 3}}, 3, 3, 3},
		{"ceiling above the highest", Config{MaxConcurrency: 16, Limits: Limits{Concurrency: 50}}, 16, 1, 16},
		{"start", Config{Concurrency: 8, Limits: Limits{Concurrency: 3, Start: true}}, 3, 1, 1024},
		{"start under the lowest", Config{MinConcurrency: 5, Limits: Limits{Concurrency: 3, Start: true}}, 5, 5, 1024},
	} {
		got := c.in.WithDefaults()
		if got.Concurrency != c.conc || got.MinConcurrency != c.lo || got.MaxConcurrency != c.hi {
			t.Errorf("%s: start %d in [%d, %d], want %d in [%d, %d]", c.name,
				got.Concurrency, got.MinConcurrency, got.MaxConcurrency, c.conc, c.lo, c.hi)
		}
	}
}

// TestNewMemoryStartsAtTheDefaultedConcurrency: a pool's state starts at
// its configuration's start, inside the bounds, as WithDefaults gives
// them: a zero configuration lets 8 go at once and holds the ninth.
func TestNewMemoryStartsAtTheDefaultedConcurrency(t *testing.T) {
	m := NewMemory(Config{})
	if v := m.View(t0); v.Concurrency != 8 {
		t.Fatalf("a zero configuration starts at %d, want 8", v.Concurrency)
	}
	for i := range 8 {
		if _, _, ok := m.Admit(t0, 1, false); !ok {
			t.Fatalf("request %d held under a limit of 8", i+1)
		}
	}
	if _, w, ok := m.Admit(t0, 1, false); ok || !w.IsZero() {
		t.Fatalf("the ninth request: ok %v, at %v; want held until a permit comes back", ok, w)
	}
}
