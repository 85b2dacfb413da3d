package lanequeue

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestALaneNamesAtMostEightModelsSharingItsLimit: of the models drawing
// on a lane's limit, its state names the first 8 others and counts the
// rest; its own model is neither.
func TestALaneNamesAtMostEightModelsSharingItsLimit(t *testing.T) {
	for _, tc := range []struct{ models, named, more int }{{1, 0, 0}, {2, 1, 0}, {9, 8, 0}, {10, 8, 1}, {60, 8, 51}} {
		p := &pool{sharedBy: "configured"}
		for i := range tc.models {
			p.addModel(fmt.Sprint("m", i))
		}
		others, more, because := p.sharedWith("m0")
		if len(others) != tc.named || more != tc.more {
			t.Errorf("%d models: %d named, %d more; want %d, %d", tc.models, len(others), more, tc.named, tc.more)
		}
		if wantBecause := map[bool]string{true: "configured"}[tc.named > 0]; because != wantBecause {
			t.Errorf("%d models: because %q, want %q", tc.models, because, wantBecause)
		}
		for i, m := range others {
			if m != fmt.Sprint("m", i+1) {
				t.Errorf("%d models: named %q, want the others in order from m1", tc.models, others)
				break
			}
		}
	}
}

// TestALimitChangeLineCountsTheModelsItDoesNotName: the log line of a
// lane's limits names the models it names and counts the others.
func TestALimitChangeLineCountsTheModelsItDoesNotName(t *testing.T) {
	for _, tc := range []struct {
		more int
		want string
	}{{0, `shares_limit_with="a, b" `}, {3, `shares_limit_with="a, b and 3 more" `}} {
		var buf bytes.Buffer
		l := &Lane{id: "abc", key: Key{Model: "m"}}
		laneChange{Kind: changeLimits, Lane: l, SharesLimitWith: []string{"a", "b"}, SharesLimitWithMore: tc.more, SharedBecause: "configured"}.
			log(slog.New(slog.NewTextHandler(&buf, nil)))
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("line %q, want %s", buf.String(), tc.want)
		}
	}
}
