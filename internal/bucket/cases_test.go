package bucket

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/bucketcases"
)

// The token bucket's table of cases, which limit's test runs on its
// header budget (built on Bucket) and redisstate's on the Lua bucket, run
// here on Bucket itself. What the table's vocabulary holds beyond the
// bucket is the owner's, and is played here as the owners play it: a
// budget not known is limit's (it admits everything and charges nothing),
// so those cases are left to limit's test; a settle an answer's count
// already covered (seen >= mark) is skipped, as limit's budget and
// giveBackScript skip it.

const casesPath = "../../limit/testdata/bucket_cases.json"

// engine is a Bucket as the table's steps drive it, with the seen of the
// case's budget.
type engine struct {
	b    *Bucket
	seen float64
}

func (e engine) Advance(now time.Time)                               { e.b.Refill(now) }
func (e engine) Admit(now time.Time, cost float64) (time.Time, bool) { return e.b.Admit(now, cost) }
func (e engine) Take(now time.Time, cost float64)                    { e.b.Refill(now); e.b.Charge(cost) }
func (e engine) Refund(cost float64)                                 { e.b.Refund(cost) }
func (e engine) Avail() float64                                      { return e.b.Level() }

// Settle is skipped when an answer's count covered the dispatch.
func (e engine) Settle(estimate, used, mark float64) {
	if mark <= 0 || e.seen < mark {
		e.b.Settle(estimate, used)
	}
}

// runCase runs c on a Bucket and returns what did not meet the
// expectations (with instead: as the xfail_on engine is known to give).
func runCase(c bucketcases.Case, instead bool) []string {
	b := &Bucket{Size: c.Bucket.Size, Rate: c.Bucket.Rate}
	b.Set(bucketcases.Time(c.Bucket.At), c.Bucket.Avail)
	return bucketcases.Run(c, engine{b, c.Bucket.Seen}, instead)
}

func TestBucketCases(t *testing.T) {
	ran := 0
	for _, c := range bucketcases.Load(t, casesPath) {
		if !c.Bucket.Known {
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			bucketcases.Judge(t, "go", c, func(instead bool) []string { return runCase(c, instead) })
		})
	}
	if ran == 0 {
		t.Fatal("no case of a known bucket ran")
	}
	t.Logf("%d cases of a known bucket", ran)
}
