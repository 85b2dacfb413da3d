package redisstate

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/mirrorcases"
)

// The table of cases of the Lua functions that mirror one of limit's rule
// for rule, shared with limit's test of the Go ones
// (limit/mirror_cases_test.go): run here on the Lua ones on a real Redis.

const mirrorCasesPath = "testdata/mirror_cases.json"

// mirrorHarness runs one mirrored function from the scripts' own files.
// ARGV op and its inputs: extra, climb, full: windows.extra's figure;
// answered, then level, kind pairs: learner.answered on the hash KEYS[1]
// for each, and the hash.
var mirrorHarness = redis.NewScript(render(bucketLua + windowLua + levelsLua + `
local op = ARGV[1]
if op == 'extra' then return tostring(windows.extra(tonumber(ARGV[2]), tonumber(ARGV[3]))) end
if op == 'answered' then
  for i = 2, #ARGV, 2 do learner.answered(KEYS[1], tonumber(ARGV[i]), tonumber(ARGV[i+1])) end
  return redis.call('HGETALL', KEYS[1])
end
return redis.error_reply('mirrorHarness: unknown op ' .. tostring(op))
`))

var levelField = regexp.MustCompile(`^([ar])(\d+)$`)

func TestMirrorCasesLua(t *testing.T) {
	t.Parallel()
	tab := mirrorcases.Load(t, mirrorCasesPath)
	rdb := startServer(t).client(t)
	ctx := context.Background()
	for _, c := range tab.Extra {
		got, err := mirrorHarness.Run(ctx, rdb, []string{"mirror-cases"}, "extra", c.Climb, c.Full).Text()
		if err != nil {
			t.Fatal(err)
		}
		if got != strconv.Itoa(c.Want) {
			t.Errorf("windows.extra %s: %s, want %d", c.Name, got, c.Want)
		}
	}
	for _, c := range tab.Answered {
		key := "mirror-cases:" + c.Name
		args := []any{"answered"}
		c.Each(func(level int, refused bool) {
			kind := answerAdmitted
			if refused {
				kind = answerRefused
			}
			args = append(args, level, int(kind))
		})
		if err := rdb.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		all, err := mirrorHarness.Run(ctx, rdb, []string{key}, args...).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		got := mirrorcases.Counts{Admitted: map[int]float64{}, Refused: map[int]float64{}}
		for i := 0; i+1 < len(all); i += 2 {
			v, err := strconv.ParseFloat(all[i+1], 64)
			if err != nil {
				t.Fatalf("%s: %s = %q", c.Name, all[i], all[i+1])
			}
			m := levelField.FindStringSubmatch(all[i])
			switch {
			case all[i] == "n":
				got.Counted = v
			case m == nil:
				t.Fatalf("%s: a field %q in the levels hash", c.Name, all[i])
			case m[1] == "a":
				got.Admitted[atoi(m[2])] = v
			default:
				got.Refused[atoi(m[2])] = v
			}
		}
		c.Judge(t, "lua", got)
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
