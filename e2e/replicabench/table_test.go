package main

import (
	"strings"
	"testing"
	"time"
)

// TestMarkdownShowsMediansAndTheWorstLoss builds a row of three runs of
// one proxy and three of the replicas by hand and reads its Markdown line:
// each side shows the median with the runs' range in brackets, requests
// lost are the most any run lost, and a row met on its medians is not met
// when one run of the replicas lost a request.
func TestMarkdownShowsMediansAndTheWorstLoss(t *testing.T) {
	sc := &scenario{name: "row/x", base: "row/x", n: 100, c: 10, target: target{kind: asOneProxy}}
	run := func(replicas, i int, secs float64, req, refused int64, lost int) result {
		return result{sc: sc, replicas: replicas, run: i, n: 100, c: 10, lost: lost,
			makespan: time.Duration(secs * float64(time.Second)), ideal: 10 * time.Second, upReq: req, up429: refused}
	}
	line := func(lost int) string {
		one := group{sc: sc, replicas: 1, runs: []result{run(1, 1, 10.0, 100, 2, 0), run(1, 2, 10.2, 100, 3, 0), run(1, 3, 9.9, 100, 4, 0)}}
		three := group{sc: sc, replicas: 3, runs: []result{run(3, 1, 10.1, 100, 1, 0), run(3, 2, 12.0, 100, 4, lost), run(3, 3, 10.3, 100, 5, 0)}}
		var b strings.Builder
		printMarkdown(&b, []group{one, three})
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		return lines[len(lines)-1]
	}
	got := line(0)
	for _, want := range []string{
		"| 1.00× (0.99–1.02×), 3.0 % (2.0–4.0 %), 0 lost |",
		"| 1.03× (1.01–1.20×), 4.0 % (1.0–5.0 %), 0 lost |",
		"| yes |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("line %q lacks %q", got, want)
		}
	}
	got = line(2)
	if !strings.Contains(got, ", 2 lost |") || !strings.HasSuffix(got, "| no |") {
		t.Errorf("one run of three lost 2 requests, but the line reads %q", got)
	}
}
