package sim

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/e2e/universe"
	"github.com/llmproxy/llmproxy/proxy"
)

var (
	draws     = flag.Int("universe.draws", 200, "how many upstreams TestUniverse draws")
	firstSeed = flag.Uint64("universe.seed", 1, "the first draw's seed; the others follow it")
	showDraws = flag.Bool("universe.v", false, "log every draw, not only the worst")
)

// outcome is one draw's run through the proxy against its omniscient
// sender.
type outcome struct {
	d                 universe.Draw
	makespan, ideal   time.Duration
	upstream, refused int64
	failures          int
	firstFail         string
}

func (o outcome) ratio() float64 { return o.makespan.Seconds() / o.ideal.Seconds() }

func (o outcome) refusedPct() float64 {
	if o.upstream == 0 {
		return 0
	}
	return 100 * float64(o.refused) / float64(o.upstream)
}

func (o outcome) String() string {
	s := fmt.Sprintf("%.2f× (%.1fs against %.1fs), %.1f%% of %d refused", o.ratio(), o.makespan.Seconds(),
		o.ideal.Seconds(), o.refusedPct(), o.upstream)
	if o.failures > 0 {
		s += fmt.Sprintf(", %d lost (%s)", o.failures, o.firstFail)
	}
	return s + "\n    " + o.d.String()
}

// refusalTarget is the share of refusals a draw may see: silent dialects
// have only refusals to learn from.
func refusalTarget(d universe.Draw) float64 {
	if universe.SilentDialect(d.Dialect) {
		return 10
	}
	return 5
}

// runDraw runs d through one proxy in a synctest bubble.
func runDraw(t *testing.T, d universe.Draw) outcome {
	o := outcome{d: d}
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(startOffset)
		o.ideal = universe.Ideal(d, time.Now())
		up := universe.NewUpstream(d)
		srv := mockupstream.NewInProcessHandler(up)
		defer srv.Close()
		u, _ := url.Parse(srv.URL())
		p, err := proxy.New(proxy.Config{Upstream: u, Transport: srv.Transport(), MaxRetries: proxy.DefaultMaxRetries,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop()
		if *trace {
			defer traceLanes(t, p, up.Stats)()
		}
		o.makespan, o.failures, o.firstFail = load(d.N, d.C, func(i int) error { return sendDraw(p, d, i) })
		o.upstream, o.refused = up.Stats()
	})
	return o
}

// sendDraw sends request i of d through p and checks its answer came whole.
func sendDraw(p *proxy.Proxy, d universe.Draw, i int) error {
	req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, d.Path(), bytes.NewReader(d.Body(i)))
	req.Header.Set("Authorization", "Bearer sk-universe")
	req.Header.Set("x-api-key", "sk-universe")
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	p.ServeHTTP(w, req)
	return universe.Check(d, w.Code, w.Body.Bytes())
}

// The universe's bars: the targets (reported when missed), and
// the floor the engine holds today, which fails the test when it slips.
// Raise the floor as the engine improves; never lower it to let a change
// in.
var (
	universeTarget = bars{median: 1.05, within: 95, beyond: 0}
	// Measured anew when the draws took the order requests arrive in
	// (2026-12-06: seeds 1-200 gave 1.149-1.181×, 32-35 %, 25-27.5 % over
	// fourteen runs, the package's other tests beside them in most; the
	// same draws without it 1.122×, 37 %). The floor sits past that noise.
	universeFloor = bars{median: 1.19, within: 31, beyond: 0.30}
)

// bars: the median draw's makespan ÷ the omniscient sender's; the share
// (%) of draws within 1.10× and their share of refusals; the share of
// draws over 1.5× or with a lost request.
type bars struct{ median, within, beyond float64 }

// TestUniverse draws upstreams at random and holds the proxy to the
// omniscient sender on each (the median draw's ratio, the share of draws
// within 1.10× and within their share of refusals, 5 % or 10 % for silent
// dialects, and the share of draws over 1.5× or with a lost request). The
// worst draws are logged with their seeds; one replays with
//
//	go test ./lanequeue/sim -run 'TestUniverse$' -universe.seed SEED -universe.draws 1 -universe.v -v
//	go run ./e2e/loadbench -universe SEED
//
// and a nightly-sized run is -universe.draws 5000.
func TestUniverse(t *testing.T) {
	if raceBuild {
		t.Skip("see raceBuild")
	}
	outcomes := make([]outcome, *draws)
	t.Run("draws", func(t *testing.T) {
		for i := range outcomes {
			seed := *firstSeed + uint64(i)
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				t.Parallel()
				outcomes[i] = runDraw(t, universe.Generate(seed))
			})
		}
	})

	var ratios []float64
	within, beyond, lostDraws, lost := 0, 0, 0, 0
	for _, o := range outcomes {
		if o.failures > 0 {
			lostDraws++
			lost += o.failures
		}
		ratios = append(ratios, o.ratio())
		if o.failures == 0 && o.ratio() <= 1.10 && o.refusedPct() <= refusalTarget(o.d) {
			within++
		}
		if *showDraws {
			t.Logf("%s", o)
		}
		if o.failures > 0 || o.ratio() > 1.5 {
			beyond++
		}
	}
	slices.Sort(ratios)
	got := bars{median: ratios[len(ratios)/2], within: 100 * float64(within) / float64(len(outcomes)),
		beyond: float64(beyond) / float64(len(outcomes))}
	worst := slices.Clone(outcomes)
	sort.Slice(worst, func(i, j int) bool { return badness(worst[i]) > badness(worst[j]) })
	var b strings.Builder
	for _, o := range worst[:min(10, len(worst))] {
		fmt.Fprintf(&b, "  %s\n", o)
	}
	t.Logf("%d draws from seed %d: median %.3f×, %.1f%% within 1.10× and their refusals, %d over 1.5× or lost (%d draws lost %d requests)\nworst:\n%s",
		len(outcomes), *firstSeed, got.median, got.within, beyond, lostDraws, lost, b.String())
	if got.median > universeTarget.median || got.within < universeTarget.within || got.beyond > universeTarget.beyond {
		t.Logf("the issue's targets not met yet: median ≤ %.2f×, ≥ %.0f%% within, none over 1.5× or lost",
			universeTarget.median, universeTarget.within)
	}
	if *draws < 100 {
		return // too few for the floor's shares
	}
	if got.median > universeFloor.median {
		t.Errorf("median draw %.3f× the omniscient sender, floor %.2f×", got.median, universeFloor.median)
	}
	if got.within < universeFloor.within {
		t.Errorf("%.1f%% of draws within 1.10× and their share of refusals, floor %.0f%%", got.within, universeFloor.within)
	}
	if got.beyond > universeFloor.beyond {
		t.Errorf("%.0f%% of draws over 1.5× or lost a request, floor %.0f%%", 100*got.beyond, 100*universeFloor.beyond)
	}
}

// TestUniverseRows runs the rows written by hand (issue 48's table), five
// times each, and holds the median run to each row's targets (or, for a
// row that misses them today, to its floor, reporting the target missed)
// and every run to losing nothing.
func TestUniverseRows(t *testing.T) {
	if raceBuild {
		t.Skip("see raceBuild")
	}
	for _, row := range universe.Rows() {
		t.Run(row.Name, func(t *testing.T) {
			var ratios, refused []float64
			for range runs {
				o := runDraw(t, row.Draw)
				ratios, refused = append(ratios, o.ratio()), append(refused, o.refusedPct())
				if o.failures > 0 {
					t.Errorf("%d lost; first: %s", o.failures, o.firstFail)
				}
			}
			slices.Sort(ratios)
			slices.Sort(refused)
			t.Logf("%-24s %.2f–%.2f× (target %.2f×)  %.1f–%.1f%% refused (target %g%%)", row.Name,
				ratios[0], ratios[runs-1], row.Ratio, refused[0], refused[runs-1], row.Refused)
			ratio, pct, bar := row.Ratio, row.Refused, "target"
			if row.Floor != nil {
				if ratios[runs/2] > ratio || refused[runs/2] > pct {
					t.Logf("%s misses issue 48's target (%.2f×, %g%%); held to its floor", row.Name, ratio, pct)
				}
				ratio, pct, bar = row.Floor[0], row.Floor[1], "floor"
			}
			if m := ratios[runs/2]; m > ratio {
				t.Errorf("median %.2f× the omniscient sender, %s %.2f×", m, bar, ratio)
			}
			if m := refused[runs/2]; m > pct {
				t.Errorf("median %.1f%% refused, %s %g%%", m, bar, pct)
			}
		})
	}
}

// badness orders draws worst first: by how far past 1.10× and past their
// refusal target they went.
func badness(o outcome) float64 {
	b := o.ratio() - 1.10
	if r := o.refusedPct() - refusalTarget(o.d); r > 0 {
		b += r / 20
	}
	if o.failures > 0 {
		b += 10
	}
	return b
}
