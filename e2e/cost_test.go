package e2e

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

// costChats is how many chats each phase of the flex run sends: CI's
// sample; the run is -cost.chats 5000.
var costChats = flag.Int("cost.chats", 1000, "chats per phase of TestFlexRunCostsHalfAtThePaceOfStandard (the full run: 5000)")

// costPrices is the proxy's price table for these tests: the mock's
// prices (gpt-4o-mini standard $0.15/M input, $0.60/M output; flex half).
const costPrices = `{"models":{"gpt-4o-mini":{"max_output":16384,"standard":{"input":0.15,"output":0.60},"flex":{"input":0.075,"output":0.30}}}}`

var mockPrices = map[string]mockupstream.TierPrice{
	mockupstream.TierStandard: {Input: 0.15, Output: 0.60},
	mockupstream.TierFlex:     {Input: 0.075, Output: 0.30},
}

func pricesFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(path, []byte(costPrices), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// costRun is what one phase of chats met.
type costRun struct {
	took     time.Duration
	statuses map[int]int
	served   map[string]int
	failures []string
}

// sendChats sends n chats to r's proxy at concurrency j with the key and
// headers given, and returns what they met.
func sendChats(t *testing.T, r *replica, n, j int, key string, hdr ...string) costRun {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: j}}
	defer c.CloseIdleConnections()
	run := costRun{statuses: map[int]int{}, served: map[string]int{}}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range j {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				body := fmt.Sprintf(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"question %d: what is two and two?"}]}`, i)
				req, _ := http.NewRequest(http.MethodPost, "http://"+r.addr+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				for k := 0; k+1 < len(hdr); k += 2 {
					req.Header.Set(hdr[k], hdr[k+1])
				}
				resp, err := c.Do(req)
				mu.Lock()
				if err != nil {
					run.failures = append(run.failures, err.Error())
				} else {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					run.statuses[resp.StatusCode]++
					run.served[resp.Header.Get("X-Llmproxy-Served-Tier")]++
					if resp.StatusCode != 200 && len(run.failures) < 5 {
						run.failures = append(run.failures, fmt.Sprintf("%d %s", resp.StatusCode, b))
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	run.took = time.Since(start)
	return run
}

// lanesOf is r's /lanes, decoded.
func lanesOf(t *testing.T, r *replica) (out struct {
	Lanes []struct {
		KeyHash           string  `json:"key_hash"`
		RequestsPerSecond float64 `json:"requests_per_second"`
	} `json:"lanes"`
	Runs []struct {
		Name         string `json:"name"`
		Key          string `json:"key"`
		Requests     int    `json:"requests"`
		CostUSD      string `json:"cost_usd"`
		FlexRefusals int    `json:"flex_refusals"`
	} `json:"runs"`
}) {
	t.Helper()
	code, body, err := r.adminGet("/lanes")
	if err != nil || code != 200 {
		t.Fatalf("/lanes: %d %v", code, err)
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFlexRunCostsHalfAtThePaceOfStandard: the same chats, at standard
// and then with x-llmproxy-tier: flex, against a mock whose flex refuses
// 30 % of its requests and answers 3× slower, through the real binary.
// Flex costs at most 0.60× standard and takes at most 1.3× its time, no
// flex refusal reaches a client, nothing is lost, the lane's learned
// rate stays within 5 % of the true one, and the proxy's cost of each
// run is the mock's ledger's.
func TestFlexRunCostsHalfAtThePaceOfStandard(t *testing.T) {
	const rpm = 3000 // 50 a second
	mock := startMockUpstream(t, mockupstream.Config{RPM: rpm, RequestBurst: 50, Latency: 200 * time.Millisecond,
		FlexRefuseShare: 0.3, FlexSlowdown: 3, Prices: mockPrices, CompletionTokens: 8})
	r := startReplica(t, "proxy", llmproxyBinary(t), mock.URL(),
		"LLMPROXY_PRICES="+pricesFile(t), "LLMPROXY_LANE_MAX_CONCURRENCY=256")
	n := *costChats
	std := sendChats(t, r, n, 100, "sk-cost-standard", "X-Llmproxy-Run", "standard")
	flex := sendChats(t, r, n, 100, "sk-cost-flex", "X-Llmproxy-Run", "flex", "X-Llmproxy-Tier", "flex")
	for name, run := range map[string]costRun{"standard": std, "flex": flex} {
		if run.statuses[200] != n || len(run.failures) > 0 {
			t.Errorf("%s: %v, failures %v", name, run.statuses, run.failures)
		}
	}
	ledger := mock.Ledger()
	stdCost, flexCost := ledger.ByKey["sk-cost-standard"].Total().NanoUSD, ledger.ByKey["sk-cost-flex"].Total().NanoUSD
	ratio, pace := float64(flexCost)/float64(stdCost), flex.took.Seconds()/std.took.Seconds()
	t.Logf("%d chats: standard %v $%s, flex %v $%s (served %v): cost %.3f×, makespan %.2f×; the mock refused %d flex requests",
		n, std.took.Round(time.Millisecond), cost.Amount(stdCost), flex.took.Round(time.Millisecond), cost.Amount(flexCost),
		flex.served, ratio, pace, ledger.FlexRefused)
	if ratio > 0.60 {
		t.Errorf("flex cost %.3f× standard, want at most 0.60×", ratio)
	}
	if pace > 1.3 {
		t.Errorf("flex took %.2f× standard's time, want at most 1.3×", pace)
	}
	if ledger.FlexRefused == 0 {
		t.Error("the mock refused no flex request: the test shows nothing")
	}
	lanes := lanesOf(t, r)
	for _, run := range lanes.Runs {
		got, err := cost.ParseDollars(run.CostUSD)
		want := map[string]int64{"standard": stdCost, "flex": flexCost}[run.Name]
		if diff := float64(got) - float64(want); err != nil || diff > 0.001*float64(want) || -diff > 0.001*float64(want) {
			t.Errorf("run %s: the proxy says $%s, the mock billed $%s", run.Name, run.CostUSD, cost.Amount(want))
		}
	}
	if len(lanes.Runs) != 2 {
		t.Errorf("runs %+v", lanes.Runs)
	}
	// Flex refusals must not lower what the lane learned. Its reading of
	// the headers at the run's end lands up to 5.5 % over the limit now and
	// then (52.1–52.8 a second in 3 of 7 runs under the race detector, at
	// bb5c65e as since), so the bound above is wider than the one below.
	for _, l := range lanes.Lanes {
		t.Logf("lane of key %s learned %.2f requests a second", l.KeyHash, l.RequestsPerSecond)
		if got := l.RequestsPerSecond; got < 0.95*rpm/60 || got > 1.10*rpm/60 {
			t.Errorf("lane of key %s learned %.2f requests a second, the limit is %d", l.KeyHash, got, rpm/60)
		}
	}
}

// TestFlexAnswersAtStandardBeforeADeadlineShorterThanFlex: flex answers
// take 6 s, the clients' deadline is 3 s: every chat is answered at
// standard, in time.
func TestFlexAnswersAtStandardBeforeADeadlineShorterThanFlex(t *testing.T) {
	mock := startMockUpstream(t, mockupstream.Config{Latency: 300 * time.Millisecond, FlexSlowdown: 20, Prices: mockPrices})
	r := startReplica(t, "proxy", llmproxyBinary(t), mock.URL(),
		"LLMPROXY_PRICES="+pricesFile(t), "LLMPROXY_ROUTE_DEFAULT_SERVICE_TIER=flex")
	start := time.Now()
	run := sendChats(t, r, 20, 20, "sk-deadline", "X-Stainless-Timeout", "3", "X-Stainless-Retry-Count", "0") // as an SDK sends them
	if run.statuses[200] != 20 || run.served["standard"] != 20 {
		t.Fatalf("%v served %v; failures %v", run.statuses, run.served, run.failures)
	}
	if took := time.Since(start); took >= 3*time.Second {
		t.Errorf("the chats took %v, past their 3 s deadline", took)
	}
	if l := mock.Ledger(); l.ByTier[mockupstream.TierFlex].Requests != 0 || l.ByTier[mockupstream.TierStandard].Requests != 20 {
		t.Errorf("the mock billed %+v", l.ByTier)
	}
}

// TestARunsBudgetHoldsAcrossReplicas: three replicas on one Redis, one
// run's chats spread over them at once under x-llmproxy-budget-usd: the
// mock bills at most the cap, and within one chat's bound of it; every
// chat is answered or refused budget_exhausted, nothing is lost.
func TestARunsBudgetHoldsAcrossReplicas(t *testing.T) {
	rs := startRedis(t)
	mock := startMockUpstream(t, mockupstream.Config{Latency: 20 * time.Millisecond, Prices: mockPrices, CompletionTokens: 8})
	bin, prices := llmproxyBinary(t), pricesFile(t)
	extra := append(redisEnv(rs.URL()), "LLMPROXY_PRICES="+prices)
	reps := startReplicas(t, 3, bin, mock.URL(), extra...)
	const budget = "0.002"
	runs := make([]costRun, len(reps))
	var wg sync.WaitGroup
	for i, r := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = sendChats(t, r, 200, 10, "sk-budget", "X-Llmproxy-Run", "capped", "X-Llmproxy-Budget-Usd", budget)
		}()
	}
	wg.Wait()
	ok, refused := 0, 0
	for _, run := range runs {
		ok += run.statuses[200]
		refused += run.statuses[429]
		for _, f := range run.failures {
			if !strings.HasPrefix(f, "429 ") || !strings.Contains(f, "budget_exhausted") {
				t.Errorf("failure: %s", f)
			}
		}
	}
	billed := cost.Amount(mock.Ledger().Total().NanoUSD)
	capAmount, _ := cost.ParseDollars(budget)
	// One chat's bound: its body's bytes (under 130) and its estimate as
	// input, 16 output tokens.
	bound := cost.Amount(200*150 + 16*600)
	t.Logf("%d answered, %d budget_exhausted; the mock billed $%s of $%s", ok, refused, billed, budget)
	if ok+refused != 600 {
		t.Errorf("%d answered + %d refused of 600", ok, refused)
	}
	if billed > capAmount || billed < capAmount-bound {
		t.Errorf("billed $%s: want within ($%s, $%s]", billed, capAmount-bound, capAmount)
	}
	if refused == 0 {
		t.Error("no chat met the cap: the test shows nothing")
	}
}
