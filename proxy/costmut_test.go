package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// The tests of this file pin the boundaries of the cost side's code
// (issue 51), one rule each, so that an operator changed in it fails a
// test: the tier memory, the budget marks, the spend table, a request's
// spend, bounds, scopes, holds and their settling, the cost headers, and
// the pricing of answers.

// TestFlexUntilKeepsThreeStandardAnswersAndNeverMoreThanHalf: before
// any standard answer of its model, a flex request gives way at half its
// budget; after, three standard answers' time (a second at least) is
// kept for standard, and never more than half the budget.
func TestFlexUntilKeepsThreeStandardAnswersAndNeverMoreThanHalf(t *testing.T) {
	arrived := time.Unix(1000, 0)
	deadline := arrived.Add(60 * time.Second)
	var m tierMemory
	if got := m.flexUntil("r", "m", arrived, deadline); !got.Equal(arrived.Add(30 * time.Second)) {
		t.Errorf("no sample: flex until %v after arrival, want 30s", got.Sub(arrived))
	}
	for _, c := range []struct{ took, reserve time.Duration }{
		{2 * time.Second, 6 * time.Second},    // three standard answers
		{333 * time.Millisecond, time.Second}, // a second at least
		{20 * time.Second, 30 * time.Second},  // never more than half
		{9 * time.Second, 27 * time.Second},   // just under half
	} {
		m.std = map[string]time.Duration{tierKey("r", "m"): c.took}
		if got := m.flexUntil("r", "m", arrived, deadline); !got.Equal(deadline.Add(-c.reserve)) {
			t.Errorf("standard took %v: flex until %v before the deadline, want %v", c.took, deadline.Sub(got), c.reserve)
		}
	}
	if got := m.flexUntil("r", "other", arrived, deadline); !got.Equal(arrived.Add(30 * time.Second)) {
		t.Errorf("another model took this one's sample: %v", deadline.Sub(got))
	}
}

// TestNoteStandardTakesTheFirstSampleThenAQuarterOfEach: the learned
// standard time starts at its first sample and then moves a quarter of
// the way to each new one.
func TestNoteStandardTakesTheFirstSampleThenAQuarterOfEach(t *testing.T) {
	var m tierMemory
	k := tierKey("r", "m")
	for _, c := range []struct{ took, want time.Duration }{
		{4 * time.Second, 4 * time.Second},
		{8 * time.Second, 5 * time.Second},
		{time.Second, 4 * time.Second},
	} {
		m.noteStandard("r", "m", c.took)
		if got := m.std[k]; got != c.want {
			t.Errorf("after %v: %v, want %v", c.took, got, c.want)
		}
	}
}

// TestTierMemoryKeepsAtMostMaxTierMemoryModels: the 4,096th model is
// remembered, without flex and with its standard time; the 4,097th is
// not, while a model already known still learns.
func TestTierMemoryKeepsAtMostMaxTierMemoryModels(t *testing.T) {
	var m tierMemory
	for i := range maxTierMemory {
		m.markNoFlex("r", strconv.Itoa(i))
		m.noteStandard("r", strconv.Itoa(i), time.Second)
	}
	m.markNoFlex("r", "one more")
	m.noteStandard("r", "one more", time.Second)
	m.noteStandard("r", "0", 5*time.Second)
	if !m.noFlex("r", "0") || !m.noFlex("r", strconv.Itoa(maxTierMemory-1)) {
		t.Error("a model within the bound was not kept as without flex")
	}
	if m.noFlex("r", "one more") || len(m.noFlexes) != maxTierMemory {
		t.Errorf("past the bound: %d models without flex kept", len(m.noFlexes))
	}
	if _, ok := m.std[tierKey("r", "one more")]; ok || len(m.std) != maxTierMemory {
		t.Errorf("past the bound: %d standard times kept", len(m.std))
	}
	if got := m.std[tierKey("r", "0")]; got != 2*time.Second {
		t.Errorf("a known model's time, full: %v, want 2s", got)
	}
	if m.noFlex("other route", "0") {
		t.Error("a model without flex on one route is without it on another")
	}
}

// TestABudgetMarkRefusesOnlyWhatPassesItsCap: a fresh mark refuses a
// request whose bound, with the marked spend, passes the cap (exactly
// the cap fits); an uncapped scope, an unmarked one and a stale mark
// refuse nothing.
func TestABudgetMarkRefusesOnlyWhatPassesItsCap(t *testing.T) {
	var b budgetMarks
	b.mark(&cost.Exhausted{Key: "k", Spent: 6, Cap: 10})
	b.mark(&cost.Exhausted{Key: "k", Spent: 3, Cap: 10}) // spend only grows: the larger is kept
	capped := []cost.Scope{{Key: "free", Cap: 100}, {Key: "k", Cap: 10}}
	if err := b.exhausted(capped, 4); err != nil {
		t.Errorf("6 spent and 4 under a cap of 10: %v", err)
	}
	var f *failure
	if err := b.exhausted(capped, 5); !errors.As(err, &f) || f.kind != failBudget || f.spent != 6 || f.cap != 10 {
		t.Errorf("6 spent and 5 under a cap of 10: %v", err)
	}
	if err := b.exhausted([]cost.Scope{{Key: "k"}}, cost.Dollar); err != nil {
		t.Errorf("an uncapped scope refused: %v", err)
	}
	if err := b.exhausted([]cost.Scope{{Key: "unmarked", Cap: 1}}, 5); err != nil {
		t.Errorf("an unmarked scope refused (the ledger decides): %v", err)
	}
	b.spent["k"] = budgetMark{spent: 6, at: time.Now().Add(-markTTL - time.Second)}
	if err := b.exhausted(capped, 5); err != nil {
		t.Errorf("a mark older than markTTL refused: %v", err)
	}
}

// TestBudgetMarksStartOverPastMaxBudgetMarks: 10,000 accounts are kept
// marked; the next mark starts the marks over.
func TestBudgetMarksStartOverPastMaxBudgetMarks(t *testing.T) {
	var b budgetMarks
	for i := range maxBudgetMarks {
		b.mark(&cost.Exhausted{Key: strconv.Itoa(i), Spent: 1, Cap: 1})
	}
	if len(b.spent) != maxBudgetMarks {
		t.Fatalf("%d marks kept of %d", len(b.spent), maxBudgetMarks)
	}
	b.mark(&cost.Exhausted{Key: "one more", Spent: 1, Cap: 1})
	if _, ok := b.spent["one more"]; !ok || len(b.spent) != 1 {
		t.Errorf("past the bound: %d marks", len(b.spent))
	}
}

// TestAMarkEndsOnlyTheWaitsItLeavesNoRoomFor: of two queued requests
// under a cap of 10, a mark of 6 spent ends the one of bound 5, with the
// budget's failure as its cause, and not the one of bound 4.
func TestAMarkEndsOnlyTheWaitsItLeavesNoRoomFor(t *testing.T) {
	var b budgetMarks
	scopes := []cost.Scope{{Key: "k", Cap: 10}}
	fits, endFits := context.WithCancelCause(context.Background())
	over, endOver := context.WithCancelCause(context.Background())
	defer b.wait(scopes, 4, endFits)()
	defer b.wait(scopes, 5, endOver)()
	b.mark(&cost.Exhausted{Key: "k", Spent: 6, Cap: 10})
	if fits.Err() != nil {
		t.Error("a wait whose bound fits what is left was ended")
	}
	var f *failure
	if cause := context.Cause(over); !errors.As(cause, &f) || f.kind != failBudget || f.spent != 6 || f.cap != 10 {
		t.Errorf("the wait that does not fit ended with %v", cause)
	}
}

// TestAnUnregisteredWaitIsNotEnded: a queued request's uncapped scope
// holds no wait, and one unregistered is not ended by a mark while the
// other on its account is; with both gone no waiter is left.
func TestAnUnregisteredWaitIsNotEnded(t *testing.T) {
	var b budgetMarks
	scopes := []cost.Scope{{Key: "run:u"}, {Key: "key:k", Cap: 10}}
	gone, endGone := context.WithCancelCause(context.Background())
	stays, endStays := context.WithCancelCause(context.Background())
	unGone := b.wait(scopes, 5, endGone)
	unStays := b.wait(scopes, 5, endStays)
	unGone()
	b.mark(&cost.Exhausted{Key: "run:u", Spent: cost.Dollar})
	if stays.Err() != nil {
		t.Error("a mark on an uncapped scope ended a wait")
	}
	b.mark(&cost.Exhausted{Key: "key:k", Spent: 6, Cap: 10})
	if gone.Err() != nil {
		t.Error("an unregistered wait was ended")
	}
	var f *failure
	if !errors.As(context.Cause(stays), &f) {
		t.Errorf("the registered wait ended with %v", context.Cause(stays))
	}
	unStays()
	if len(b.waiters) != 0 {
		t.Errorf("waiters left: %v", b.waiters)
	}
	if got := capped([]cost.Scope{{Key: "a"}, {Key: "b", Cap: -1}, {Key: "c", Cap: 1}}); len(got) != 1 || got[0].Key != "c" {
		t.Errorf("capped: %v", got)
	}
}

// TestARunsRowCountsItsRequestsTokensAndCostByTier: a run's row counts
// its requests and failures, the input and output tokens of the answers
// whose usage was read, its flex refusals, its latest budget, and the
// priced answers' cost by tier; its lane counts the priced answers only.
func TestARunsRowCountsItsRequestsTokensAndCostByTier(t *testing.T) {
	var tb spendTable
	tb.note("lane", &spend{run: "r", key: "k", runBudget: 5 * cost.Dollar, priced: true, served: cost.Flex, amount: 1000, flexRefused: 2}, true, 150, 100)
	tb.note("lane", &spend{run: "r", key: "k", priced: true, served: cost.Standard, amount: 3000}, false, 40, 30)
	tb.note("lane", &spend{run: "r", key: "k", priced: true, served: cost.Flex, amount: 500, flexRefused: 1}, true, 0, 7)
	tb.note("lane", &spend{run: "r", key: "k"}, false, -1, 0)
	tb.note("other", &spend{priced: true, amount: 1}, true, 10, 5) // no run
	tb.note("", &spend{run: "r2", key: "k", priced: true, amount: 9}, true, 0, 0)
	runs := tb.Runs()
	if len(runs) != 2 {
		t.Fatalf("runs %+v", runs)
	}
	r := runs[slices.IndexFunc(runs, func(r runView) bool { return r.Name == "r" })]
	if r.Key != "k" || r.Requests != 4 || r.Failures != 2 || r.InputTokens != 130 || r.OutputTokens != 60 || r.FlexRefusals != 3 ||
		r.BudgetUSD != "5" || r.CostUSD != "0.0000045" || r.ByTier["flex"] != "0.0000015" || r.ByTier["standard"] != "0.000003" {
		t.Errorf("row %+v", r)
	}
	lanes := tb.Lanes(10)
	if len(lanes) != 2 || lanes[0].Lane != "lane" || lanes[0].Priced != 3 || lanes[0].CostUSD != "0.0000045" ||
		lanes[1].Lane != "other" || lanes[1].Priced != 1 {
		t.Errorf("lanes %+v", lanes)
	}
}

// TestARunIdlePastRunTTLGoesAndTheOldestWhenFull: a row idle exactly
// runTTL is kept, one idle longer goes when a run is made; at maxRuns
// rows the one idle longest makes room, and not before.
func TestARunIdlePastRunTTLGoesAndTheOldestWhenFull(t *testing.T) {
	now := time.Now()
	var tb spendTable
	tb.run(runKey{"k", "edge"}, now).Last = now.Add(-runTTL)
	tb.run(runKey{"k", "stale"}, now).Last = now.Add(-runTTL - time.Nanosecond)
	tb.run(runKey{"k", "new"}, now).Last = now
	if _, ok := tb.runs[runKey{"k", "edge"}]; !ok {
		t.Error("a run idle exactly runTTL went")
	}
	if _, ok := tb.runs[runKey{"k", "stale"}]; ok {
		t.Error("a run idle past runTTL was kept")
	}
	tb = spendTable{}
	for i := range maxRuns {
		tb.run(runKey{"k", strconv.Itoa(i)}, now).Last = now.Add(time.Duration(i-maxRuns) * time.Second)
	}
	if len(tb.runs) != maxRuns {
		t.Fatalf("%d runs kept of %d", len(tb.runs), maxRuns)
	}
	tb.run(runKey{"k", "one more"}, now).Last = now
	_, oldest := tb.runs[runKey{"k", "0"}]
	_, next := tb.runs[runKey{"k", "1"}]
	if len(tb.runs) != maxRuns || oldest || !next {
		t.Errorf("past the bound: %d runs, the oldest kept %v, the next %v", len(tb.runs), oldest, next)
	}
}

// TestTheLaneIdleLongestMakesRoomAtMaxSpendLanes: a new lane in a full
// table takes the place of the one that spent last longest ago.
func TestTheLaneIdleLongestMakesRoomAtMaxSpendLanes(t *testing.T) {
	var tb spendTable
	tb.lanes = map[string]*laneSpend{}
	base := time.Now()
	for i := range maxSpendLanes {
		id := "l" + strconv.Itoa(i)
		tb.lanes[id] = &laneSpend{Lane: id, last: base.Add(time.Duration((i+7)%maxSpendLanes) * time.Second)}
	}
	oldest := "l" + strconv.Itoa(maxSpendLanes-7)
	tb.lane("new")
	if _, ok := tb.lanes[oldest]; ok || len(tb.lanes) != maxSpendLanes || tb.lanes["new"] == nil || tb.lanes["l0"] == nil {
		t.Errorf("past the bound: %d lanes, the oldest kept %v", len(tb.lanes), ok)
	}
}

// TestLanesAreTheDearestFirstAtMostN: Lanes(n) lists the lanes by cost,
// the dearest first, and at most n of them; Runs the latest first.
func TestLanesAreTheDearestFirstAtMostN(t *testing.T) {
	var tb spendTable
	costs := []cost.Amount{30, 700, 1, 5000, 20, 300, 2, 90}
	for i, a := range costs {
		tb.note("l"+strconv.Itoa(i), &spend{run: "r" + strconv.Itoa(i), priced: true, amount: a}, true, 0, 0)
		time.Sleep(time.Millisecond)
	}
	var got []string
	for _, l := range tb.Lanes(len(costs)) {
		got = append(got, l.CostUSD)
	}
	if strings.Join(got, " ") != "0.000005 0.0000007 0.0000003 0.00000009 0.00000003 0.00000002 0.000000002 0.000000001" {
		t.Errorf("lanes by cost: %v", got)
	}
	if n := len(tb.Lanes(3)); n != 3 {
		t.Errorf("Lanes(3): %d", n)
	}
	if runs := tb.Runs(); runs[0].Name != "r7" || runs[len(runs)-1].Name != "r0" {
		t.Errorf("runs from %s to %s, want the latest first", runs[0].Name, runs[len(runs)-1].Name)
	}
}

// TestTheWireIsTheFlexBodyOnFlexElseTheStandardOne, and heard drops the
// rate-limit headers of the one answer after a quiet flex refusal.
func TestTheWireIsTheFlexBodyOnFlexElseTheStandardOne(t *testing.T) {
	s := spend{flexBody: []byte("flex"), std: []byte("std"), onFlex: true}
	if string(s.wire()) != "flex" {
		t.Errorf("on flex: %s", s.wire())
	}
	s.onFlex = false
	if string(s.wire()) != "std" {
		t.Errorf("at standard: %s", s.wire())
	}
	r := limit.Report{Status: 200, Limits: headerparse.Limits{RetryAfter: time.Second, HasRetryAfter: true}}
	s.quieted = true
	if got := s.heard(r); got.Limits.HasRetryAfter || got.Status != 200 || s.quieted {
		t.Errorf("after a quiet refusal: %+v", got)
	}
	if got := s.heard(r); !got.Limits.HasRetryAfter {
		t.Error("the limits were dropped twice")
	}
}

// TestWhyIsTheSpentBudgetOnlyWhenItEndedTheWait: a lane's refusal is
// replaced by the budget's failure only when that is what ended the
// request's wait.
func TestWhyIsTheSpentBudgetOnlyWhenItEndedTheWait(t *testing.T) {
	lane := errors.New("the lane's refusal")
	var s spend
	if got := s.why(lane); got != lane {
		t.Errorf("no budget: %v", got)
	}
	s.ended, s.end = context.WithCancelCause(context.Background())
	if got := s.why(nil); got != nil {
		t.Errorf("no refusal: %v", got)
	}
	if got := s.why(lane); got != lane {
		t.Errorf("a wait not ended: %v", got)
	}
	s.end(nil)
	if got := s.why(lane); got != lane {
		t.Errorf("a wait ended without a failure: %v", got)
	}
	spent := budgetFailure(&cost.Exhausted{Key: "key:k", Spent: 1, Cap: 1})
	s.ended, s.end = context.WithCancelCause(context.Background())
	s.end(spent)
	if got := s.why(lane); got != spent {
		t.Errorf("a wait ended by a spent budget: %v", got)
	}
	if got := s.why(nil); got != nil {
		t.Errorf("no refusal, a budget spent: %v", got)
	}
}

// TestBoundCountsTheBodyAndEachChoicesOutputAtTheDearestPrice: input is
// the body's bytes and the estimate; output, when the body sets no limit,
// the model's most for each choice (the estimate's output over 256),
// else the limit; priced at standard, the dearest of testPrices' m.
func TestBoundCountsTheBodyAndEachChoicesOutputAtTheDearestPrice(t *testing.T) {
	p := &Proxy{cfg: Config{Prices: testPrices}}
	for _, c := range []struct {
		output  int64
		limited bool
		want    cost.Amount
	}{
		{512, false, 150*1000 + 2*1000*2000}, // two choices of 1,000
		{100, false, 150*1000 + 1000*2000},   // one at least
		{700, true, 150*1000 + 700*2000},     // the body's limit
	} {
		req := &request{}
		req.body.size = 100
		req.spend = spend{model: "m", estimate: 50, output: c.output, outputLimited: c.limited}
		if got := p.bound(req); got != c.want {
			t.Errorf("output %d, limited %v: %d, want %d", c.output, c.limited, got, c.want)
		}
	}
}

// TestScopeBudgetsListsTheCappedAccounts: a run's, a key's and a
// route's scopes, each with its cap and TTL, only when some cap applies;
// the request's wait is registered under the capped ones.
func TestScopeBudgetsListsTheCappedAccounts(t *testing.T) {
	const route = "r"
	// A run's spend lapses a day after its last request, a key's or a
	// route's after a month idle.
	const day, month = 24 * time.Hour, 30 * 24 * time.Hour
	run := cost.Scope{Key: "run:kh:eval", Cap: 5 * cost.Dollar, TTL: day}
	for _, c := range []struct {
		name              string
		run               string
		runBudget, keyCap cost.Amount
		routeCap          cost.Amount
		want              []cost.Scope
		wantWaits         int
	}{
		{"no cap", "eval", 0, 0, 0, nil, 0},
		{"a run's", "eval", run.Cap, 0, 0, []cost.Scope{run}, 1},
		{"a key's", "", 0, 7, 0, []cost.Scope{{Key: "key:kh", Cap: 7, TTL: month}}, 1},
		{"a key's, in a run", "eval", 0, 7, 0, []cost.Scope{{Key: "run:kh:eval", TTL: day}, {Key: "key:kh", Cap: 7, TTL: month}}, 1},
		{"a route's", "", 0, 0, 9, []cost.Scope{{Key: "route:r", Cap: 9, TTL: month}}, 1},
	} {
		p := &Proxy{cfg: Config{Prices: testPrices, Budget: c.keyCap}, settings: map[string]RouteSettings{route: {Budget: c.routeCap}}}
		req := &request{route: route}
		req.spend = spend{model: "m", key: "kh", run: c.run, runBudget: c.runBudget}
		if err := p.scopeBudgets(req); err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !slices.Equal(req.spend.scopes, c.want) {
			t.Errorf("%s: scopes %+v, want %+v", c.name, req.spend.scopes, c.want)
		}
		if (req.spend.ended != nil) != (c.want != nil) || len(p.budgets.waiters) != c.wantWaits {
			t.Errorf("%s: %d waits registered", c.name, len(p.budgets.waiters))
		}
		if c.want != nil && req.spend.bound != p.bound(req) {
			t.Errorf("%s: bound %d", c.name, req.spend.bound)
		}
	}
	p := &Proxy{cfg: Config{Prices: testPrices, Budget: 7}, settings: map[string]RouteSettings{"": {}}}
	var f *failure
	for _, req := range []*request{{spend: spend{model: "unpriced"}}, {upgrade: true, spend: spend{model: "m"}}} {
		if err := p.scopeBudgets(req); !errors.As(err, &f) || f.kind != failBudgetUnpriced {
			t.Errorf("%+v: %v", req.spend, err)
		}
	}
	p.budgets.mark(&cost.Exhausted{Key: "key:kh", Spent: 7, Cap: 7})
	req := &request{spend: spend{model: "m", key: "kh"}}
	if err := p.scopeBudgets(req); !errors.As(err, &f) || f.kind != failBudget || req.spend.ended != nil {
		t.Errorf("a marked budget: %v", err)
	}
}

// TestCostlyIsAnyOfTheCostSidesCauses: prices, a tier, a run, a run's
// budget, a key's budget, a route's tier or budget each make a request
// costly; none of them, not.
func TestCostlyIsAnyOfTheCostSidesCauses(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		set  RouteSettings
		s    spend
		want bool
	}{
		{"nothing", Config{}, RouteSettings{}, spend{}, false},
		{"prices", Config{Prices: testPrices}, RouteSettings{}, spend{}, true},
		{"a tier", Config{}, RouteSettings{}, spend{asked: cost.Flex}, true},
		{"a run", Config{}, RouteSettings{}, spend{run: "r"}, true},
		{"a run's budget", Config{}, RouteSettings{}, spend{runBudget: 1}, true},
		{"a key's budget", Config{Budget: 1}, RouteSettings{}, spend{}, true},
		{"a route's tier", Config{}, RouteSettings{ServiceTier: cost.Flex}, spend{}, true},
		{"a route's budget", Config{}, RouteSettings{Budget: 1}, spend{}, true},
	} {
		p := &Proxy{cfg: c.cfg, settings: map[string]RouteSettings{"": c.set}}
		if got := p.costly(&request{spend: c.s}); got != c.want {
			t.Errorf("%s: costly %v", c.name, got)
		}
	}
}

// scriptedLedger answers every TryReserve with err.
type scriptedLedger struct {
	err   error
	calls int
}

func (l *scriptedLedger) TryReserve(context.Context, cost.Hold) error { l.calls++; return l.err }
func (l *scriptedLedger) Settle(context.Context, cost.Hold, cost.Amount) error {
	return nil
}
func (l *scriptedLedger) Spent(context.Context, string) (cost.Amount, cost.Amount, error) {
	return 0, 0, nil
}

// TestReserveMapsTheLedgersAnswers: a request without scopes, or with a
// hold, asks the ledger nothing; a hold taken is kept; an exhausted
// budget is marked and answered budget_exhausted; a wait that reached
// the deadline is its error; a ledger that failed is an internal error.
func TestReserveMapsTheLedgersAnswers(t *testing.T) {
	scopes := []cost.Scope{{Key: "key:kh", Cap: 10}}
	newReq := func() *request {
		req := &request{deadline: time.Now().Add(50 * time.Millisecond)}
		req.spend = spend{scopes: scopes, bound: 4, client: context.Background()}
		return req
	}
	reserve := func(l *scriptedLedger, req *request) (*Proxy, error) {
		p := &Proxy{stopped: context.Background(), ledger: l, log: slog.New(slog.DiscardHandler)}
		return p, p.reserve(req)
	}
	l := &scriptedLedger{}
	req := newReq()
	if _, err := reserve(l, req); err != nil || req.spend.hold == nil || req.spend.hold.Amount != 4 ||
		!req.spend.hold.Expires.Equal(req.deadline.Add(time.Minute)) || !slices.Equal(req.spend.hold.Scopes, scopes) {
		t.Errorf("taken: %v, hold %+v", err, req.spend.hold)
	}
	if _, err := reserve(l, req); err != nil || l.calls != 1 {
		t.Errorf("held already: %v after %d calls", err, l.calls)
	}
	req = newReq()
	req.spend.scopes = nil
	if _, err := reserve(l, req); err != nil || l.calls != 1 || req.spend.hold != nil {
		t.Errorf("no scopes: %v after %d calls", err, l.calls)
	}
	var f *failure
	p, err := reserve(&scriptedLedger{err: &cost.Exhausted{Key: "key:kh", Spent: 8, Cap: 10}}, newReq())
	if !errors.As(err, &f) || f.kind != failBudget || f.spent != 8 || p.budgets.spent["key:kh"].spent != 8 {
		t.Errorf("exhausted: %v", err)
	}
	if _, err := reserve(&scriptedLedger{err: cost.ErrFull}, newReq()); !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &f) {
		t.Errorf("full until the deadline: %v", err)
	}
	if _, err := reserve(&scriptedLedger{err: errors.New("redis down")}, newReq()); !errors.As(err, &f) || f.kind != failInternal {
		t.Errorf("a failed ledger: %v", err)
	}
}

// TestSettleChargesThePriceTheWholeHoldForAnUnpricedSuccessElseNothing:
// a priced answer is charged its price; an unpriced 2xx the whole hold
// (it may have been billed); any other, nothing. The hold is released,
// and the request's waits end.
func TestSettleChargesThePriceTheWholeHoldForAnUnpricedSuccessElseNothing(t *testing.T) {
	l := cost.NewLocal()
	p := &Proxy{ledger: l, log: slog.New(slog.DiscardHandler)}
	for i, c := range []struct {
		status int
		priced bool
		want   cost.Amount
	}{
		{200, true, 7}, {200, false, 100}, {299, false, 100}, {300, false, 0}, {199, false, 0}, {429, false, 0}, {0, false, 0},
	} {
		key := "key:" + strconv.Itoa(i)
		h := cost.Hold{ID: key, Amount: 100, Scopes: []cost.Scope{{Key: key, Cap: 1000}}}
		if err := l.TryReserve(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		req := &request{status: c.status}
		req.spend = spend{hold: &h, priced: c.priced, amount: 7}
		req.spend.ended, req.spend.end = context.WithCancelCause(context.Background())
		req.spend.unwait = p.budgets.wait(h.Scopes, 100, req.spend.end)
		p.settle(req)
		spent, held, _ := l.Spent(context.Background(), key)
		if spent != c.want || held != 0 || req.spend.hold != nil {
			t.Errorf("%d, priced %v: spent %d, held %d, want %d", c.status, c.priced, spent, held, c.want)
		}
		if req.spend.ended.Err() == nil || len(p.budgets.waiters) != 0 {
			t.Errorf("%d: the request's wait is still registered", c.status)
		}
	}
	p.settle(&request{}) // nothing held, nothing to wait for
}

// recordingLedger is a ledger whose Settle fails with err, and records
// whether its context was live and when it ends.
type recordingLedger struct {
	scriptedLedger
	settleErr error
	live      bool
	deadline  time.Time
}

func (l *recordingLedger) Settle(ctx context.Context, _ cost.Hold, _ cost.Amount) error {
	l.live = ctx.Err() == nil
	l.deadline, _ = ctx.Deadline()
	return l.settleErr
}

// TestSettleGivesTheLedgerFiveSecondsAndLogsItsFailure: the ledger gets
// a live context of five seconds to settle in; its failure is logged,
// its success not, and the hold is let go either way.
func TestSettleGivesTheLedgerFiveSecondsAndLogsItsFailure(t *testing.T) {
	for _, fails := range []bool{false, true} {
		var logs strings.Builder
		l := &recordingLedger{}
		if fails {
			l.settleErr = errors.New("redis down")
		}
		p := &Proxy{ledger: l, log: slog.New(slog.NewTextHandler(&logs, nil))}
		req := &request{status: 200}
		req.spend.hold = &cost.Hold{ID: "h", Amount: 1}
		start := time.Now()
		p.settle(req)
		if end := time.Now(); !l.live || l.deadline.Before(start.Add(5*time.Second)) || l.deadline.After(end.Add(5*time.Second)) {
			t.Errorf("fails %v: the ledger got a context live %v, of %v", fails, l.live, l.deadline.Sub(start))
		}
		if logged := strings.Contains(logs.String(), "could not settle"); logged != fails || req.spend.hold != nil {
			t.Errorf("fails %v: logged %q, hold %v", fails, logs.String(), req.spend.hold)
		}
	}
}

// TestTheBudgetHeaderTakesANanoDollarToNineBillion: x-llmproxy-budget-usd
// is above 0, at most 9e9, and at least a nano-dollar once rounded; the
// tier is flex or standard in any case; the run a name.
func TestTheBudgetHeaderTakesANanoDollarToNineBillion(t *testing.T) {
	for _, c := range []struct {
		v    string
		want cost.Amount
		msg  string // in the refusal; "": accepted
	}{
		{"9e9", 9e9 * cost.Dollar, ""},
		{"9000000000.001", 0, "above 0"},
		{"5", 5 * cost.Dollar, ""},
		{" 0.25 ", cost.Dollar / 4, ""},
		{"6e-10", 1, ""},
		{"0", 0, "above 0"},
		{"4e-10", 0, "nano-dollar"},
		{"1e-12", 0, "nano-dollar"},
		{"NaN", 0, "above 0"},
	} {
		h := http.Header{}
		h.Set(budgetHeader, c.v)
		var s clientSay
		err := readCostSay(h, &s)
		var f *failure
		switch {
		case c.msg == "" && (err != nil || s.budget != c.want):
			t.Errorf("%q: %v, budget %d, want %d", c.v, err, s.budget, c.want)
		case c.msg != "" && (!errors.As(err, &f) || f.kind != failBadBudget || !strings.Contains(f.msg, c.msg)):
			t.Errorf("%q: %v, want a refusal saying %q", c.v, err, c.msg)
		}
	}
	for v, want := range map[string]cost.Tier{"FLEX": cost.Flex, " Standard ": cost.Standard, "flex": cost.Flex, "": "", "priority": ""} {
		h := http.Header{}
		h.Set(tierHeader, v)
		var s clientSay
		if err := readCostSay(h, &s); s.tier != want || (err == nil) != (want != "") {
			t.Errorf("tier %q: %q, %v", v, s.tier, err)
		}
	}
	for v, ok := range map[string]bool{"x": true, "eval-1": true, "": false, "a b": false} {
		h := http.Header{runHeader: {v}}
		var s clientSay
		if err := readCostSay(h, &s); (err == nil) != ok || ok && s.run != v {
			t.Errorf("run %q: %q, %v", v, s.run, err)
		}
	}
}

// TestAnAnswerOfExactlyMaxMeteredBodyIsPriced: a non-streamed answer of
// maxMeteredBody bytes is read whole and priced, without a served-tier
// header when no tier was asked; one byte more goes whole, unpriced.
func TestAnAnswerOfExactlyMaxMeteredBodyIsPriced(t *testing.T) {
	head := `{"usage":{"prompt_tokens":1000,"completion_tokens":500},"pad":"`
	answer := func(n int) string { return head + strings.Repeat("x", n-len(head)-2) + `"}` }
	var answering atomic.Pointer[string]
	h := costHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		body := *answering.Load()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}), nil)
	for _, c := range []struct {
		n    int
		cost string
	}{{maxMeteredBody, "0.002"}, {maxMeteredBody + 1, ""}} {
		body := answer(c.n)
		answering.Store(&body)
		resp := h.post("/v1/chat/completions", chat)
		if got := readAll(t, resp.Body); got != body {
			t.Errorf("%d bytes: the client got %d", c.n, len(got))
		}
		if got := resp.Header.Get(costHeader); got != c.cost {
			t.Errorf("%d bytes: cost %q, want %q", c.n, got, c.cost)
		}
		if got := resp.Header.Get(servedTierHeader); got != "" {
			t.Errorf("%d bytes: served tier %q when none was asked", c.n, got)
		}
	}
}

// TestPriceStreamSetsItsTrailerOnlyWhenPriced: the stream loses its
// length either way; it announces the cost trailer when priced, and
// its usage chunk is taken out only when the proxy asked for it.
func TestPriceStreamSetsItsTrailerOnlyWhenPriced(t *testing.T) {
	const usage = "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n"
	const done = "data: [DONE]\n\n"
	for _, c := range []struct{ priced, strip bool }{{true, false}, {false, true}, {true, true}, {false, false}} {
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Length", "99")
		req := &request{}
		req.spend.stripUsage = c.strip
		w := priceStream(rec, req, c.priced)
		io.WriteString(w, usage+done)
		w.Close()
		if got := rec.Header().Get("Trailer"); (got == costHeader) != c.priced || (got == "") == c.priced {
			t.Errorf("%+v: Trailer %q", c, got)
		}
		if _, ok := rec.Header()["Content-Length"]; ok {
			t.Errorf("%+v: the length was kept", c)
		}
		want := usage + done
		if c.strip {
			want = done
		}
		if got := rec.Body.String(); got != want {
			t.Errorf("%+v: the client got %q", c, got)
		}
	}
}

// TestAStreamWhoseClientAskedForUsageIsPricedInItsTrailer: the proxy
// takes nothing out, and still prices it.
func TestAStreamWhoseClientAskedForUsageIsPricedInItsTrailer(t *testing.T) {
	h := costHarness(t, &flexUpstream{}, nil)
	asked := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}],"max_tokens":500}`
	resp := h.post("/v1/chat/completions", asked)
	if body := readAll(t, resp.Body); !strings.Contains(body, `"usage"`) {
		t.Errorf("the client lost its usage: %q", body)
	}
	if got := resp.Trailer.Get(costHeader); got != "0.002" {
		t.Errorf("cost trailer %q, want 0.002", got)
	}
}

// TestAMultipleChoicesAnswerIsNeitherPricedNorNamedATier: a 300 is no
// success: it carries no cost, nor the tier that served it.
func TestAMultipleChoicesAnswerIsNeitherPricedNorNamedATier(t *testing.T) {
	h := costHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMultipleChoices)
		io.WriteString(w, `{"usage":{"prompt_tokens":1000,"completion_tokens":500}}`)
	}), nil)
	resp := h.post("/v1/chat/completions", chat, "X-Llmproxy-Tier", "flex")
	readAll(t, resp.Body)
	if resp.StatusCode != 300 || resp.Header.Get(costHeader) != "" || resp.Header.Get(servedTierHeader) != "" {
		t.Errorf("%d: cost %q, served %q", resp.StatusCode, resp.Header.Get(costHeader), resp.Header.Get(servedTierHeader))
	}
}

// TestTheSpendSeriesAreBoundedToMaxSpendSeries: of more runs and lanes
// than maxSpendSeries, /metrics gets maxSpendSeries of each, the lanes
// the dearest.
func TestTheSpendSeriesAreBoundedToMaxSpendSeries(t *testing.T) {
	var tb spendTable
	for i := range maxSpendSeries + 5 {
		tb.note("l"+strconv.Itoa(i), &spend{run: "r" + strconv.Itoa(i), key: "k", priced: true, served: cost.Standard,
			amount: cost.Amount(i + 1)}, true, 0, 0)
	}
	ch := make(chan prometheus.Metric, 4*maxSpendSeries)
	spendCollector{&tb}.Collect(ch)
	close(ch)
	runs, lanes := 0, 0
	for m := range ch {
		switch m.Desc() {
		case runSpendDesc:
			runs++
		case laneSpendDesc:
			lanes++
		}
	}
	if runs != maxSpendSeries || lanes != maxSpendSeries {
		t.Errorf("%d run series, %d lane series, want %d each", runs, lanes, maxSpendSeries)
	}
	if got := tb.Lanes(maxSpendSeries); got[len(got)-1].cost != 6 {
		t.Errorf("the cheapest lane served costs %d, want 6", got[len(got)-1].cost)
	}
}

// TestFlexDecideRetriesFlexWhileStandardStillHasTime: a flex refusal is
// retried on flex, quietly, while its backoff ends before flexUntil;
// then it goes at standard at once; under FLEX_FALLBACK=never it gives
// up at its deadline; a model without flex is learned and goes at
// standard.
func TestFlexDecideRetriesFlexWhileStandardStillHasTime(t *testing.T) {
	p := costHarness(t, &flexUpstream{}, nil).proxy
	now := time.Now()
	req := &request{deadline: now.Add(10 * time.Second)}
	req.spend = spend{onFlex: true, fallback: true, flexUntil: now.Add(time.Second), model: "m"}
	d := p.flexDecide(req, flexBusy, now, 0, decision{pauseGroup: true})
	if d.action != actRetry || d.wait != 250*time.Millisecond || !d.quiet || d.pauseGroup || !req.spend.onFlex ||
		req.spend.flexRefused != 1 || !req.spend.quieted {
		t.Errorf("the first refusal: %+v, spend %+v", d, req.spend)
	}
	d = p.flexDecide(req, flexBusy, now.Add(500*time.Millisecond), 0, decision{}) // 500ms more ends at flexUntil
	if d.action != actRetry || d.wait != 0 || req.spend.onFlex || req.spend.flexRefused != 2 {
		t.Errorf("the second refusal: %+v, spend %+v", d, req.spend)
	}
	req.spend = spend{onFlex: true, model: "m"} // FLEX_FALLBACK=never
	if d = p.flexDecide(req, flexBusy, now, 0, decision{}); d.action != actRetry || !req.spend.onFlex {
		t.Errorf("never, time left: %+v", d)
	}
	if d = p.flexDecide(req, flexBusy, now.Add(10*time.Second), 0, decision{}); d.action != actGiveUp || d.quiet || !req.spend.onFlex {
		t.Errorf("never, at the deadline: %+v", d)
	}
	req.spend = spend{onFlex: true, fallback: true, flexUntil: now.Add(time.Second), model: "nf"}
	if d = p.flexDecide(req, flexUnsupported, now, 0, decision{}); d.action != actRetry || d.wait != 0 || req.spend.onFlex ||
		req.spend.flexRefused != 0 || !p.tiers.noFlex("", "nf") {
		t.Errorf("no flex: %+v, spend %+v", d, req.spend)
	}
}

// TestFlexContextBoundsOnlyAFlexAttemptThatMayFallBack: the attempt's
// context ends at flexUntil only on flex, with a fallback, a flexUntil
// and retries; one whose flexUntil passed goes at standard at once.
func TestFlexContextBoundsOnlyAFlexAttemptThatMayFallBack(t *testing.T) {
	until := time.Now().Add(time.Hour)
	for _, c := range []struct {
		name string
		req  request
		want bool
	}{
		{"bounded", request{spend: spend{onFlex: true, fallback: true, flexUntil: until}}, true},
		{"at standard", request{spend: spend{fallback: true, flexUntil: until}}, false},
		{"never", request{spend: spend{onFlex: true, flexUntil: until}}, false},
		{"no flexUntil", request{spend: spend{onFlex: true, fallback: true}}, false},
		{"retry off", request{retryOff: true, spend: spend{onFlex: true, fallback: true, flexUntil: until}}, false},
	} {
		ctx, cancel := flexContext(context.Background(), &c.req)
		d, ok := ctx.Deadline()
		if ok != c.want || ok && !d.Equal(until) {
			t.Errorf("%s: deadline %v %v", c.name, d, ok)
		}
		cancel()
	}
	req := &request{spend: spend{onFlex: true, fallback: true, flexUntil: time.Now().Add(-time.Millisecond)}}
	if ctx, _ := flexContext(context.Background(), req); req.spend.onFlex || ctx.Done() != nil {
		t.Error("a flex attempt past its flexUntil was not sent at standard at once")
	}
}

// TestAskFlexMakesTheFlexBodyOnlyWhereFlexCanBeAsked: a chat of a model
// not known to lack flex gets its flex body, held, and its flexUntil; a
// path without a tier field, a model without flex, a spooled body and a
// body that is no JSON object do not.
func TestAskFlexMakesTheFlexBodyOnlyWhereFlexCanBeAsked(t *testing.T) {
	p := costHarness(t, &flexUpstream{}, nil).proxy
	p.tiers.markNoFlex("", "noflex")
	spool, err := os.CreateTemp(t.TempDir(), "spool")
	if err != nil {
		t.Fatal(err)
	}
	defer spool.Close()
	now := time.Now()
	for _, c := range []struct {
		name, path, model, body string
		file                    *os.File
		want                    bool
	}{
		{"a chat", "/v1/chat/completions", "m", chat, nil, true},
		{"embeddings", "/v1/embeddings", "m", chat, nil, false},
		{"a model without flex", "/v1/chat/completions", "noflex", chat, nil, false},
		{"spooled", "/v1/chat/completions", "m", chat, spool, false},
		{"not JSON", "/v1/chat/completions", "m", "not json", nil, false},
	} {
		req := &request{target: &url.URL{Path: c.path}, arrived: now, deadline: now.Add(time.Minute)}
		req.body.mem, req.body.file = []byte(c.body), c.file
		req.spend.model = c.model
		p.askFlex(req)
		s := &req.spend
		if s.onFlex != c.want || (s.flexBody != nil) != c.want {
			t.Errorf("%s: on flex %v", c.name, s.onFlex)
		}
		if c.want && (!strings.Contains(string(s.flexBody), `"service_tier":"flex"`) || req.body.held != int64(len(s.flexBody)) ||
			!s.flexUntil.Equal(now.Add(30*time.Second))) {
			t.Errorf("%s: %s, held %d, until %v", c.name, s.flexBody, req.body.held, s.flexUntil.Sub(now))
		}
		p.unhold(req)
	}
}

// TestAskUsageAsksTheFlexBodyTooAndHoldsTheCopy: a priced chat stream's
// standard body asks for its usage, and so does its flex body; the copy
// is held.
func TestAskUsageAsksTheFlexBodyTooAndHoldsTheCopy(t *testing.T) {
	p := costHarness(t, &flexUpstream{}, nil).proxy
	stream := `{"model":"m","stream":true,"messages":[]}`
	req := &request{target: &url.URL{Path: "/v1/chat/completions"}}
	req.body.mem = []byte(stream)
	flex := []byte(`{"model":"m","stream":true,"service_tier":"flex","messages":[]}`)
	req.spend = spend{model: "m", flexBody: flex} // as askFlex leaves it
	p.askUsage(req)
	s := &req.spend
	if !s.stripUsage || !strings.Contains(string(s.std), `"include_usage":true`) || !strings.Contains(string(s.flexBody), `"include_usage":true`) ||
		req.body.held != int64(len(s.std)) {
		t.Errorf("std %s, flex %s, held %d", s.std, s.flexBody, req.body.held)
	}
	p.unhold(req)
	// A spooled body is not rewritten, whatever it holds in memory.
	req = &request{target: req.target}
	spool, err := os.CreateTemp(t.TempDir(), "spool")
	if err != nil {
		t.Fatal(err)
	}
	defer spool.Close()
	req.body.mem, req.body.file = []byte(stream), spool
	req.spend.model = "m"
	if err = p.prepareSpend(req); err != nil || req.spend.std != nil || req.body.held != 0 {
		t.Errorf("a spooled body: %v, std %s", err, req.spend.std)
	}
}

// TestAnUnpricedStreamKeepsItsLength: a stream the proxy neither prices
// nor rewrites goes with the length the upstream gave it.
func TestAnUnpricedStreamKeepsItsLength(t *testing.T) {
	const events = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
	h := costHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(events)))
		io.WriteString(w, events)
	}), nil)
	resp := h.post("/v1/chat/completions", `{"model":"unpriced","stream":true,"messages":[]}`)
	if body := readAll(t, resp.Body); body != events || resp.ContentLength != int64(len(events)) {
		t.Errorf("the client got %q of length %d", body, resp.ContentLength)
	}
}

// TestABudgetIsNamedToItsClientWithoutTheKeysHash: a spent budget's
// message names its run (bounded to 64 bytes), its key's budget or its
// route's, never the credential's hash.
func TestABudgetIsNamedToItsClientWithoutTheKeysHash(t *testing.T) {
	long := strings.Repeat("r", 64)
	for key, want := range map[string]string{
		"run:kh:eval":          `of run "eval" (x-llmproxy-budget-usd)`,
		"run:kh:" + long:       `of run "` + long + `" (x-llmproxy-budget-usd)`,
		"run:kh:" + long + "x": `of run "` + long + `…" (x-llmproxy-budget-usd)`,
		"run:kh:":              `of run (none) (x-llmproxy-budget-usd)`,
		"key:kh":               `of this API key (LLMPROXY_BUDGET_USD)`,
		"route:openai":         `of route "openai" (LLMPROXY_ROUTE_<NAME>_BUDGET_USD)`,
	} {
		if got := scopeName(key); got != want {
			t.Errorf("%s: %s, want %s", key, got, want)
		}
	}
	if msg := budgetFailure(&cost.Exhausted{Key: "key:kh", Spent: 2 * cost.Dollar, Cap: 2 * cost.Dollar}).Error(); !strings.Contains(msg, "is spent: 2 of 2 USD") {
		t.Errorf("message %q", msg)
	}
}
