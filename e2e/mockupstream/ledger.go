package mockupstream

import (
	"maps"
	"math"
)

// The tiers the ledger bills by, and Config.Prices' keys.
const (
	TierStandard = "standard"
	TierFlex     = "flex"
)

// TierPrice is a tier's price in US dollars per million tokens.
type TierPrice struct {
	Input, Output float64
}

// TierLedger is what one tier served and billed.
type TierLedger struct {
	// Requests counts the answers billed: 200s written to the end.
	Requests int
	// PromptTokens and CompletionTokens sum what their usage reported
	// (for a stream, what its usage chunk reports, sent or not).
	PromptTokens, CompletionTokens int64
	// NanoUSD is their cost in billionths of a US dollar: each answer's
	// prompt×Input/1e6 + completion×Output/1e6 dollars, rounded to the
	// nano-dollar, then summed.
	NanoUSD int64
}

// Ledger is what the server billed, by tier served (TierStandard,
// TierFlex), and the flex requests it turned away, which cost nothing.
type Ledger struct {
	ByTier map[string]TierLedger
	// FlexRefused counts the flex requests refused for capacity
	// (FlexRefuseShare); FlexUnsupported those for a model that does not
	// offer flex (FlexModels).
	FlexRefused, FlexUnsupported int
	// ByKey is the same per API key, each with a nil ByKey.
	ByKey map[string]Ledger
}

// Total sums the tiers.
func (l Ledger) Total() TierLedger {
	var t TierLedger
	for _, tl := range l.ByTier {
		t.Requests += tl.Requests
		t.PromptTokens += tl.PromptTokens
		t.CompletionTokens += tl.CompletionTokens
		t.NanoUSD += tl.NanoUSD
	}
	return t
}

// book is the ledger as kept: the totals and each key's, ByKey unused in
// all of them. Server.mu guards it.
type book struct {
	total Ledger
	byKey map[string]*Ledger
}

// entries are the ledgers a key's answer counts in: the totals and the
// key's, created empty.
func (b *book) entries(key string) []*Ledger {
	kl, ok := b.byKey[key]
	if !ok {
		kl = &Ledger{}
		b.byKey[key] = kl
	}
	return []*Ledger{&b.total, kl}
}

// Ledger returns a copy of what the server billed so far.
func (s *Server) Ledger() Ledger {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.ledger.total
	l.ByTier = maps.Clone(l.ByTier)
	l.ByKey = make(map[string]Ledger, len(s.ledger.byKey))
	for k, kl := range s.ledger.byKey {
		c := *kl
		c.ByTier = maps.Clone(kl.ByTier)
		l.ByKey[k] = c
	}
	return l
}

// bill records a whole 200 answer of key's request q, at the tier that
// served it.
func (s *Server) bill(key string, q *request) {
	tier := TierStandard
	if q.flex {
		tier = TierFlex
	}
	nano := nanoUSD(s.price(tier), q.promptTokens, q.completionTokens)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.ledger.entries(key) {
		if l.ByTier == nil {
			l.ByTier = make(map[string]TierLedger)
		}
		tl := l.ByTier[tier]
		tl.Requests++
		tl.PromptTokens += q.promptTokens
		tl.CompletionTokens += q.completionTokens
		tl.NanoUSD += nano
		l.ByTier[tier] = tl
	}
}

// countFlexTurnedAway counts a flex request refused for capacity, or for
// a model without flex when unsupported.
func (s *Server) countFlexTurnedAway(key string, unsupported bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.ledger.entries(key) {
		if unsupported {
			l.FlexUnsupported++
		} else {
			l.FlexRefused++
		}
	}
}

// price is tier's price: Config.Prices', flex defaulting to half of
// standard.
func (s *Server) price(tier string) TierPrice {
	if p, ok := s.cfg.Prices[tier]; ok {
		return p
	}
	if tier == TierFlex {
		p := s.cfg.Prices[TierStandard]
		return TierPrice{Input: p.Input / 2, Output: p.Output / 2}
	}
	return TierPrice{}
}

// nanoUSD is the cost at p of prompt and completion tokens, in
// nano-dollars, rounded.
func nanoUSD(p TierPrice, prompt, completion int64) int64 {
	// Dollars per million tokens are nano-dollars per thousandth of one.
	return int64(math.Round((float64(prompt)*p.Input + float64(completion)*p.Output) * 1e3))
}
