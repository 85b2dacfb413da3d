package proxy

import (
	"os"
	"strings"
	"testing"
)

// TestOutcomesNameEveryWayAnAnswerEnds: the operations guide names every
// outcome the proxy counts in llmproxy_requests_total's row, and an
// outcome is a failure unless the answer went whole or its client left.
func TestOutcomesNameEveryWayAnAnswerEnds(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| `llmproxy_requests_total`") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("docs/operations.md has no row for llmproxy_requests_total")
	}
	for _, o := range allOutcomes {
		if !strings.Contains(row, "`"+string(o)+"`") {
			t.Errorf("docs/operations.md's llmproxy_requests_total row does not name %q", o)
		}
		if want := o != OutcomeOK && o != OutcomeClientGone; o.Failed() != want {
			t.Errorf("%q.Failed() = %v", o, o.Failed())
		}
	}
	if len(allOutcomes) != 6 {
		t.Errorf("%d outcomes listed, want the 6 ways an answer ends", len(allOutcomes))
	}
}
