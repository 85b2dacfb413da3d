package redisstate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/bucketcases"
)

// The token bucket's table of cases, shared with the Go bucket's and
// budget's tests (internal/bucket/cases_test.go,
// limit/bucket_cases_test.go): the same file, run here on the Lua
// budget (lua/bucket.lua) on a real Redis. The format is documented in
// the file's "doc"; its types, checks and judging are in
// internal/bucketcases.

const bucketCasesPath = "../limit/testdata/bucket_cases.json"

// bucketHarness runs one step of a case on lua/bucket.lua's budget at the
// step's own time (ARGV[2], ms) instead of clock(). KEYS the state hash; ARGV op, now,
// cost or n, mark (-1: none). The budget is the tokens one (prefix t_), as
// in the scripts. advance and admit save nothing (no script saves a bare
// refill, and a refused admitScript saves nothing); take is admitScript's
// charge and save; giveback is giveBackScript's loop body for one budget.
// Returns {avail} or, for admit, {ok, at, avail}; numbers as %.17g text so
// nothing is rounded on the way. render fills in the numbers bucket.lua has
// from Go.
var bucketHarness = redis.NewScript(render(bucketLua + `
local key, p, op, now, x, mark, used = KEYS[1], 't_', ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function f(v) return string.format('%.17g', v) end
local b = refill(key, p, now)
if op == 'admit' then
  local ok, at = admit(b, now, x)
  return {ok and 1 or 0, f(at), f(b.avail)}
elseif op == 'take' then
  if b.known == 1 then b.avail = b.avail - charge(b, x) end
  b.sent = b.sent + x
  save(key, p, b)
elseif op == 'giveback' then
  local counted = mark > 0 and num(redis.call('HGET', key, p..'seen'), 0) >= mark
  if b.known == 1 and (x ~= 0 or used ~= 0) and not counted then
    local back = x
    if back > 0 then back = charge(b, back) end
    back = back - used
    b.avail = math.min(b.size, b.avail + back)
    save(key, p, b)
  end
elseif op ~= 'advance' then
  return redis.error_reply('bucketHarness: unknown op ' .. tostring(op))
end
return {f(b.avail)}
`))

func fmtNum(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// runBucketCaseLua runs c on lua/bucket.lua's budget under key and returns what did
// not meet the expectations (with instead: as the xfail_on engine is known
// to give).
func runBucketCaseLua(ctx context.Context, rdb *redis.Client, key string, c bucketcases.Case, instead bool) ([]string, error) {
	known := 0
	if c.Bucket.Known {
		known = 1
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		return nil, err
	}
	// The starting state as the scripts keep it (see scripts.go).
	if err := rdb.HSet(ctx, key, "t_known", known, "t_syn", 0, "t_size", fmtNum(c.Bucket.Size),
		"t_rate", fmtNum(c.Bucket.Rate), "t_avail", fmtNum(c.Bucket.Avail), "t_at", fmtNum(c.Bucket.At),
		"t_sent", 0, "t_seen", fmtNum(c.Bucket.Seen)).Err(); err != nil {
		return nil, err
	}
	var bad []string
	for i, s := range c.Steps {
		where := s.Describe(i)
		x, mark := s.Cost, -1.0
		if s.Op == "giveback" {
			x = s.N
			if s.Mark != nil {
				mark = *s.Mark
			}
		}
		res, err := bucketHarness.Run(ctx, rdb, []string{key}, s.Op, fmtNum(s.T), fmtNum(x), fmtNum(mark), fmtNum(s.Used)).Slice()
		if err != nil {
			return bad, fmt.Errorf("%s: %v", where, err)
		}
		nums := make([]float64, len(res))
		for k, v := range res {
			if nums[k], err = strconv.ParseFloat(fmt.Sprint(v), 64); err != nil {
				return bad, fmt.Errorf("%s: reply %v: %v", where, res, err)
			}
		}
		ok, retry, avail := false, 0.0, nums[0]
		if s.Op == "admit" {
			ok, retry, avail = nums[0] == 1, nums[1], nums[2]
		}
		bad = append(bad, bucketcases.Check(where, s.Expect(instead), ok, retry, avail)...)
	}
	return bad, nil
}

func TestBucketCasesLua(t *testing.T) {
	t.Parallel()
	cases := bucketcases.Load(t, bucketCasesPath)
	rdb := startServer(t).client(t)
	ctx := context.Background()
	var xfail []string
	for _, c := range cases {
		if c.XFail != "" {
			xfail = append(xfail, c.Name+" (on "+c.XFailOn+")")
		}
		t.Run(c.Name, func(t *testing.T) {
			bucketcases.Judge(t, "lua", c, func(instead bool) []string {
				bad, err := runBucketCaseLua(ctx, rdb, "bucket-cases:"+c.Name, c, instead)
				if err != nil {
					t.Fatal(err)
				}
				return bad
			})
		})
	}
	t.Logf("%d cases; marked xfail: %s", len(cases), strings.Join(xfail, ", "))
}
