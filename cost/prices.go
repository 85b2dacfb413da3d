package cost

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/llmproxy/llmproxy/tokens"
)

// Tier is a service tier an answer is billed at.
type Tier string

// The tiers a price table knows. Dearest is none of them: the dearest
// of a model's prices, for a bound on a request whatever tier serves it.
const (
	Standard Tier = "standard"
	Flex     Tier = "flex"
	Batch    Tier = "batch"
	Priority Tier = "priority"
	Dearest  Tier = "dearest"
)

// TierOf is the tier a provider's name for one means: OpenAI's
// service_tier ("default", "auto", "flex", "priority", "scale"),
// Anthropic's ("standard", "priority", "batch", "standard_only"), Groq's
// ("on_demand", "flex") and Gemini's. "" for a name it does not know.
func TierOf(name string) Tier {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "default", "auto", "standard", "standard_only", "on_demand":
		return Standard
	case "flex":
		return Flex
	case "batch":
		return Batch
	case "priority", "scale", "fast":
		return Priority
	}
	return ""
}

// Price is what a tier charges, in US dollars per million tokens.
// CachedInput is the price of input tokens served from the provider's
// prompt cache; zero = the same as Input.
type Price struct {
	Input       float64 `json:"input"`
	CachedInput float64 `json:"cached_input,omitempty"`
	Output      float64 `json:"output"`
}

// Model is one model's prices by tier, and the most it may write when a
// request sets no limit.
type Model struct {
	Standard  *Price `json:"standard"`
	Flex      *Price `json:"flex,omitempty"`
	Batch     *Price `json:"batch,omitempty"`
	Priority  *Price `json:"priority,omitempty"`
	MaxOutput int64  `json:"max_output,omitempty"`
}

// tier is m's price at t; a tier m has no price for is priced as
// standard. Dearest is each of its prices at its dearest tier.
func (m *Model) tier(t Tier) Price {
	p := m.Standard
	switch t {
	case Dearest:
		d := *m.Standard
		for _, q := range []*Price{m.Flex, m.Batch, m.Priority} {
			if q != nil {
				d = Price{Input: max(d.Input, q.Input), CachedInput: max(d.CachedInput, q.CachedInput), Output: max(d.Output, q.Output)}
			}
		}
		return d
	case Flex:
		p = cmpOr(m.Flex, p)
	case Batch:
		p = cmpOr(m.Batch, p)
	case Priority:
		p = cmpOr(m.Priority, p)
	}
	return *p
}

func cmpOr(a, b *Price) *Price {
	if a != nil {
		return a
	}
	return b
}

// Table is a price table: models by name. A name matches a model of
// its own name, or the longest entry it starts with followed by a
// version: '-' and a digit, "-latest", or '@' ("gpt-4o-mini-2024-07-18"
// is priced as "gpt-4o-mini"; "o3-pro", another model, is not priced as
// "o3"), after a provider's prefix ("models/", "openai/") is removed.
type Table struct {
	models map[string]*Model
	// names are the entries, longest first, for prefix matches.
	names []string
}

// file is a price table's data file.
type file struct {
	Models map[string]*Model `json:"models"`
}

//go:embed prices.json
var defaultPrices []byte

// DefaultMaxOutput is the output a request that sets no limit is
// bounded by when its model's entry names none: the largest common
// models write up to 128,000 tokens.
const DefaultMaxOutput = 128_000

// Load reads a price table from path; "" is the table that ships with
// the proxy (prices.json).
func Load(path string) (*Table, error) {
	data := defaultPrices
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}
	return Parse(data)
}

// Parse reads a price table from its JSON.
func Parse(data []byte) (*Table, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	if len(f.Models) == 0 {
		return nil, errors.New("price table: no models")
	}
	t := &Table{models: make(map[string]*Model, len(f.Models))}
	for name, m := range f.Models {
		if err := m.check(); err != nil {
			return nil, fmt.Errorf("price table: model %q: %w", name, err)
		}
		t.models[name] = m
		t.names = append(t.names, name)
	}
	slices.SortFunc(t.names, func(a, b string) int { return len(b) - len(a) })
	return t, nil
}

func (m *Model) check() error {
	if m == nil || m.Standard == nil {
		return errors.New("no standard price")
	}
	for _, p := range []*Price{m.Standard, m.Flex, m.Batch, m.Priority} {
		if p == nil {
			continue
		}
		for _, v := range []float64{p.Input, p.CachedInput, p.Output} {
			if !(v >= 0) || v > 1e6 || math.IsInf(v, 0) {
				return fmt.Errorf("price %v: want 0 to 1,000,000 dollars per million tokens", v)
			}
		}
	}
	if m.MaxOutput < 0 {
		return errors.New("negative max_output")
	}
	return nil
}

// Model is the entry that prices name; nil when none does.
func (t *Table) Model(name string) *Model {
	if t == nil || name == "" {
		return nil
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	if m := t.models[name]; m != nil {
		return m
	}
	for _, n := range t.names {
		if rest, ok := strings.CutPrefix(name, n); ok && isVersion(rest) {
			return t.models[n]
		}
	}
	return nil
}

// isVersion reports whether rest, what follows an entry's name in a
// model's, names a version of it: "-2024-07-18", "-0613", "-latest",
// "@001".
func isVersion(rest string) bool {
	switch {
	case strings.HasPrefix(rest, "@") && len(rest) > 1, rest == "-latest":
		return true
	case len(rest) > 1 && rest[0] == '-':
		return rest[1] >= '0' && rest[1] <= '9'
	}
	return false
}

// Cost is what u cost at model's price for tier, rounded to the
// nano-dollar; ok is false when the table has no price for model. Input
// tokens read from the prompt cache (u.Cached) are priced as cached.
func (t *Table) Cost(model string, tier Tier, u tokens.Usage) (Amount, bool) {
	m := t.Model(model)
	if m == nil {
		return 0, false
	}
	p := m.tier(tier)
	cached := min(max(u.Cached, 0), u.Input)
	cachedPrice := p.CachedInput
	if cachedPrice == 0 {
		cachedPrice = p.Input
	}
	c := float64(u.Input-cached)*perToken(p.Input) + float64(cached)*perToken(cachedPrice) + float64(u.Output)*perToken(p.Output)
	return Amount(math.Round(c)), true
}

// Bound is the most a request of at most input prompt tokens and output
// generated ones costs at model's price for tier, rounded up; ok is
// false when the table has no price for model. output < 0 means the
// request set no limit: the model's MaxOutput bounds it.
func (t *Table) Bound(model string, tier Tier, input, output int64) (Amount, bool) {
	m := t.Model(model)
	if m == nil {
		return 0, false
	}
	if output < 0 {
		output = m.maxOutput()
	}
	p := m.tier(tier)
	c := float64(input)*perToken(p.Input) + float64(output)*perToken(p.Output)
	return Amount(min(math.Ceil(c), maxBound)), true
}

// maxBound is the most Bound gives: a billion dollars, far from what an
// Amount holds, so that sums of holds cannot overflow.
const maxBound = 1e18

// MaxOutput is the most model writes when a request sets no limit: its
// entry's max_output, or DefaultMaxOutput; DefaultMaxOutput for a model
// the table does not price.
func (t *Table) MaxOutput(model string) int64 {
	if m := t.Model(model); m != nil {
		return m.maxOutput()
	}
	return DefaultMaxOutput
}

func (m *Model) maxOutput() int64 { return cmp0(m.MaxOutput, DefaultMaxOutput) }

func cmp0(v, def int64) int64 {
	if v > 0 {
		return v
	}
	return def
}
