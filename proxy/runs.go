package proxy

import (
	"slices"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/cost"
)

// spendTable is the spend by run (x-llmproxy-run) and by lane, as
// /lanes, /ui, status and /metrics show it. Both are bounded: a run is
// kept for a day after its last request, and at most maxRuns runs and
// maxSpendLanes lanes are; past that the one idle longest goes.
type spendTable struct {
	mu    sync.Mutex
	runs  map[runKey]*runView
	lanes map[string]*laneSpend
}

type runKey struct{ key, name string }

// The most runs and lanes the spend table keeps.
const (
	maxRuns       = 1000
	maxSpendLanes = 10000
)

// runView is one run's row: its requests, tokens, failures and cost by
// tier, as /lanes shows it.
type runView struct {
	Name string `json:"name"`
	// Key is the short hash of the credential its requests carried.
	Key          string `json:"key"`
	Requests     int    `json:"requests"`
	Failures     int    `json:"failures"`
	InputTokens  int64  `json:"input_tokens"`
	OutputTokens int64  `json:"output_tokens"`
	// FlexRefusals are the flex refusals its requests absorbed.
	FlexRefusals int `json:"flex_refusals"`
	// CostUSD is the priced answers' cost, in dollars; ByTier the same
	// by the tier that served them.
	CostUSD string            `json:"cost_usd"`
	ByTier  map[string]string `json:"cost_by_tier_usd"`
	// BudgetUSD is the latest x-llmproxy-budget-usd its requests
	// carried ("": none).
	BudgetUSD string    `json:"budget_usd,omitempty"`
	First     time.Time `json:"first"`
	Last      time.Time `json:"last"`
	cost      cost.Amount
	byTier    map[cost.Tier]cost.Amount
}

// laneSpend is one lane's spend, as /lanes shows it.
type laneSpend struct {
	Lane    string `json:"lane"`
	CostUSD string `json:"cost_usd"`
	Priced  int    `json:"priced_answers"`
	cost    cost.Amount
	last    time.Time
}

// note counts a request, at its end, to its run and its lane: s is its
// cost side, ok whether it ended well, used and prompted the tokens its
// usage counted and the prompt's part of them (see request).
func (t *spendTable) note(lane string, s *spend, ok bool, used, prompted int64) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.priced && lane != "" {
		l := t.lane(lane)
		l.cost += s.amount
		l.Priced++
		l.CostUSD, l.last = l.cost.String(), now
	}
	if s.run == "" {
		return
	}
	r := t.run(runKey{s.key, s.run}, now)
	r.Requests++
	r.Last = now
	r.FlexRefusals += s.flexRefused
	if !ok {
		r.Failures++
	}
	if used > 0 {
		r.InputTokens += prompted
		r.OutputTokens += used - prompted
	}
	if s.runBudget > 0 {
		r.BudgetUSD = s.runBudget.String()
	}
	if s.priced {
		r.cost += s.amount
		r.byTier[s.served] += s.amount
		r.CostUSD = r.cost.String()
		r.ByTier[string(s.served)] = r.byTier[s.served].String()
	}
}

// run is the row of k, made (and room made for it) when there is none.
// Requires t.mu held.
func (t *spendTable) run(k runKey, now time.Time) *runView {
	if r := t.runs[k]; r != nil {
		return r
	}
	if t.runs == nil {
		t.runs = map[runKey]*runView{}
	}
	var oldest *runKey
	for key, r := range t.runs {
		if now.Sub(r.Last) > runTTL {
			delete(t.runs, key)
		} else if oldest == nil || r.Last.Before(t.runs[*oldest].Last) {
			k := key
			oldest = &k
		}
	}
	if len(t.runs) >= maxRuns && oldest != nil {
		delete(t.runs, *oldest)
	}
	r := &runView{Name: k.name, Key: k.key, First: now, CostUSD: "0",
		ByTier: map[string]string{}, byTier: map[cost.Tier]cost.Amount{}}
	t.runs[k] = r
	return r
}

// lane is lane id's spend, made when there is none. Requires t.mu
// held.
func (t *spendTable) lane(id string) *laneSpend {
	if l := t.lanes[id]; l != nil {
		return l
	}
	if t.lanes == nil {
		t.lanes = map[string]*laneSpend{}
	}
	if len(t.lanes) >= maxSpendLanes {
		var oldest string
		for k, l := range t.lanes {
			if oldest == "" || l.last.Before(t.lanes[oldest].last) {
				oldest = k
			}
		}
		delete(t.lanes, oldest)
	}
	l := &laneSpend{Lane: id}
	t.lanes[id] = l
	return l
}

// Runs is every run kept, the latest first.
func (t *spendTable) Runs() []runView {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]runView, 0, len(t.runs))
	for _, r := range t.runs {
		v := *r
		v.ByTier = make(map[string]string, len(r.ByTier))
		for k, a := range r.ByTier {
			v.ByTier[k] = a
		}
		v.byTier = make(map[cost.Tier]cost.Amount, len(r.byTier))
		for k, a := range r.byTier {
			v.byTier[k] = a
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b runView) int { return b.Last.Compare(a.Last) })
	return out
}

// Lanes is the spend of the lanes that had priced answers, dearest
// first, at most n.
func (t *spendTable) Lanes(n int) []laneSpend {
	t.mu.Lock()
	out := make([]laneSpend, 0, len(t.lanes))
	for _, l := range t.lanes {
		out = append(out, *l)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b laneSpend) int { return int(b.cost - a.cost) })
	return out[:min(n, len(out))]
}
