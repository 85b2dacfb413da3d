package limit

import (
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/bucketcases"
)

// The token bucket's table of cases, testdata/bucket_cases.json, is shared
// with redisstate, whose test runs the same file on the Lua budget on a real
// Redis (redisstate/bucket_cases_test.go), and with internal/bucket, whose
// test runs it on the bucket the budget is built on. Its types, times,
// checks and judging are in internal/bucketcases; the format is documented
// in the file's "doc".

// budgetEngine is the budget as the table's steps drive it. A take
// advances first, as the lane admits (which advances) before it takes.
type budgetEngine struct{ b *budget }

func (e budgetEngine) Advance(now time.Time) { e.b.advance(now) }
func (e budgetEngine) Admit(now time.Time, cost float64) (time.Time, bool) {
	return e.b.admit(now, cost)
}
func (e budgetEngine) Take(now time.Time, cost float64)    { e.b.advance(now); e.b.take(cost) }
func (e budgetEngine) Refund(cost float64)                 { e.b.refund(cost) }
func (e budgetEngine) Settle(estimate, used, mark float64) { e.b.settle(estimate, used, mark) }
func (e budgetEngine) Avail() float64                      { return e.b.bucket.Level() }

// runBucketCaseGo runs c on the Go budget and returns what did not meet
// the expectations (with instead: as the xfail_on engine is known to give).
func runBucketCaseGo(c bucketcases.Case, instead bool) []string {
	b := &budget{known: c.Bucket.Known, seen: c.Bucket.Seen}
	b.resize(c.Bucket.Size, 0)
	b.bucket.Rate = c.Bucket.Rate
	b.bucket.Set(bucketcases.Time(c.Bucket.At), c.Bucket.Avail)
	return bucketcases.Run(c, budgetEngine{b}, instead)
}

func TestBucketCasesGo(t *testing.T) {
	cases := bucketcases.Load(t, "testdata/bucket_cases.json")
	var xfail []string
	for _, c := range cases {
		if c.XFail != "" {
			xfail = append(xfail, c.Name+" (on "+c.XFailOn+")")
		}
		t.Run(c.Name, func(t *testing.T) {
			bucketcases.Judge(t, "go", c, func(instead bool) []string {
				return runBucketCaseGo(c, instead)
			})
		})
	}
	t.Logf("%d cases; marked xfail: %s", len(cases), strings.Join(xfail, ", "))
}
