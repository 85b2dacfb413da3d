package limit

import (
	"testing"

	"github.com/llmproxy/llmproxy/internal/mirrorcases"
)

// The table of cases of the functions the fleet's Lua mirrors rule for
// rule, shared with redisstate, whose test runs the same file on the Lua
// functions on a real Redis (redisstate/mirror_cases_test.go). Its types
// and judging are in internal/mirrorcases; the format is documented in the
// file's "doc".
func TestMirrorCasesGo(t *testing.T) {
	tab := mirrorcases.Load(t, "../redisstate/testdata/mirror_cases.json")
	for _, c := range tab.Extra {
		w := &shape{climb: c.Climb, full: c.Full}
		if got := w.extra(); got != c.Want {
			t.Errorf("shape.extra %s: %d, want %d", c.Name, got, c.Want)
		}
	}
	for _, c := range tab.Answered {
		l := &learner{}
		c.Each(l.answered)
		got := mirrorcases.Counts{Admitted: map[int]float64{}, Refused: map[int]float64{}, Counted: l.counted}
		for level := range l.admitted {
			if n := l.admitted[level]; n != 0 {
				got.Admitted[level] = n
			}
			if n := l.refusedAt[level]; n != 0 {
				got.Refused[level] = n
			}
		}
		c.Judge(t, "go", got)
	}
}
