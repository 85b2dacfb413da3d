package limit

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/bucketcases"
)

// The token bucket's table of cases, testdata/bucket_cases.json, is shared
// with redisstate, whose test runs the same file on the Lua budget on a real
// Redis (redisstate/bucket_cases_test.go). Its types, checks and judging are
// in internal/bucketcases; the format is documented in the file's "doc".

// casesEpoch is the table's time 0.
var casesEpoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

func casesTime(ms float64) time.Time {
	return casesEpoch.Add(time.Duration(math.Round(ms * float64(time.Millisecond))))
}

func casesMs(at time.Time) float64 {
	return float64(at.Sub(casesEpoch)) / float64(time.Millisecond)
}

// runBucketCaseGo runs c on the Go budget and returns what did not meet
// the expectations (with instead: as the xfail_on engine is known to give).
func runBucketCaseGo(c bucketcases.Case, instead bool) []string {
	b := &budget{known: c.Bucket.Known, limit: c.Bucket.Size, rate: c.Bucket.Rate,
		avail: c.Bucket.Avail, at: casesTime(c.Bucket.At), seen: c.Bucket.Seen}
	var bad []string
	for i, s := range c.Steps {
		now := casesTime(s.T)
		ok, retry := false, 0.0
		switch s.Op {
		case "advance":
			b.advance(now)
		case "admit":
			var at time.Time
			at, ok = b.admit(now, s.Cost)
			if !at.IsZero() {
				retry = casesMs(at)
			}
		case "take":
			// The lane admits (which advances) before it takes.
			b.advance(now)
			b.take(s.Cost)
		case "giveback":
			// Refund and settle take no time: they apply at the bucket's
			// own, and what is left at t is what advancing then shows.
			if s.Mark == nil {
				b.refund(s.N)
			} else {
				b.settle(max(s.N, 0), max(-s.N, 0)+s.Used, *s.Mark)
			}
			b.advance(now)
		}
		where := s.Describe(i)
		bad = append(bad, bucketcases.Check(where, s.Expect(instead), ok, retry, b.avail)...)
	}
	return bad
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
