package redisstate

import (
	_ "embed"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/bucket"
)

// The scripts keep a limit group's shared state in these keys:
//
//	state   hash: paused (ms), first (when a first request went alone),
//	        acc (the latest accepted answer, ms), reply (the first
//	        accepted answer's time to its headers, ms), last (the latest
//	        dispatch, ms), rn
//	        (refusals learned from), an (answers admitted), ms/mc/mp (dispatches this second and
//	        the last), the fleet's fixed window (see windows.gate): wb
//	        its start (ms), ws the requests sent when it began, wa the
//	        answers of it admitted, pb/ps/pa the same of the window before,
//	        wp the latest boundary a refusal named, wo the one the length
//	        is counted from, wcap its allowance, wlen its
//	        length (ms), wfull the windows since, wclimb its probe's
//	        climb; and per budget (prefix r_ for requests, t_ for
//	        tokens) known, syn, size, rate (per second), avail, at (ms),
//	        sent, seen (the largest sent-at-dispatch an answer's remaining
//	        count covered), low (when its figures were last affirmed)
//	leases  sorted set: one member per permit out, scored by its expiry (ms)
//	waiting hash: replica -> "since:seen:cost", the arrival of the
//	        replica's oldest waiter, when it last asked (ms), and its
//	        estimated tokens
//	climits hash: replica -> "limit:seen:lowered", its concurrency limit,
//	        when it said so (ms), and 1 when refusals lowered it
//	raise   string: the replica that may raise a pace learned from
//	        refusals (one at a time), for 10 s after its last raise
//	levels  hash: a<level>, r<level>: every replica's answers admitted and
//	        refused by the number in flight they went at; n their total
//	sent    string (one per lanes' group, every limit of it): the group's
//	        dispatches, every replica's
//
// A limit's keys and its group's count share the group's hash tag, so a
// Redis Cluster keeps them in one slot.
//
// Times are milliseconds on Redis' clock (TIME): the one clock every
// replica shares, so a replica whose clock is off moves nothing but its
// own deadlines. Replicas send durations (a pause's length, a waiter's
// age) and read times back against the `now` each script returns. A
// test may stand a clock of its own in for Redis' (Config.redisClock):
// every script's args.now is then its time, and TIME is not read.

// The scripts are in lua/: the budget arithmetic (bucket.lua, the Go
// bucket's), the fleet's slow-start spread (spread.lua), its fixed window
// (window.lua) and its counts by level (levels.lua), whose functions take
// the names of the Go functions they mirror and say which (the pairs are
// listed in mirrors_test.go, and those of one rule run on shared cases);
// and a file per script (admit.lua, learn.lua, giveback.lua, apart.lua,
// forget.lua, heartbeat.lua), opening with what it takes (KEYS, args) and
// returns. A script is its file after the files whose functions it calls.
// The numbers they share with Go are rendered in from sharedNumbers.
var (
	admitScript     = newScript(admitArgs{}, bucketLua, spreadLua, windowLua, admitLua)
	learnScript     = newScript(learnArgs{}, bucketLua, windowLua, levelsLua, learnLua)
	giveBackScript  = newScript(giveBackArgs{}, bucketLua, giveBackLua)
	apartScript     = newScript(apartArgs{}, apartLua)
	forgetScript    = newScript(struct{}{}, forgetLua)
	heartbeatScript = newScript(heartbeatArgs{}, bucketLua, heartbeatLua)
)

// The files in lua/, each whole: one missing is a build error.
var (
	//go:embed lua/bucket.lua
	bucketLua string
	//go:embed lua/spread.lua
	spreadLua string
	//go:embed lua/window.lua
	windowLua string
	//go:embed lua/levels.lua
	levelsLua string
	//go:embed lua/admit.lua
	admitLua string
	//go:embed lua/learn.lua
	learnLua string
	//go:embed lua/giveback.lua
	giveBackLua string
	//go:embed lua/apart.lua
	apartLua string
	//go:embed lua/forget.lua
	forgetLua string
	//go:embed lua/heartbeat.lua
	heartbeatLua string
)

// script is a Lua script, the text it runs and the text that was
// rendered from.
type script struct {
	*redis.Script
	text, src string
}

// newScript is the script of the files' text, one after the other, which
// reads its ARGV, laid out as argv lays out args, from the table args (see
// wire.go), with each ${name} rendered (see render). A script's text is
// fixed when the package starts, so its SHA is too.
func newScript(args any, files ...string) script {
	src := strings.Join(files, "")
	text := argsPrologue(reflect.TypeOf(args)) + render(src)
	return script{redis.NewScript(text), text, src}
}

// Numbers the scripts share with Go. A script's text names one as
// ${name} and has it from these constants (see sharedNumbers), and those
// that the in-process state has too are its constants' values (lanequeue's
// and limit's, which TestScriptsHaveGosNumbers holds both to, or the Go
// bucket's, which a constant here is made of). The numbers a script writes
// as they are are its own: units (1000 ms in a second), steps, and
// timings no Go code has (listed, each with why, in luaLocal in
// scripts_test.go).
const (
	// firstAnswerWindow: until some replica learned from an answer, the
	// group's first request goes alone, fleet-wide, for at most this
	// long, as one process's does (lanequeue's firstAnswerWindow).
	firstAnswerWindow = time.Second
	// startSpread: see spread (limit's startSpread).
	startSpread = 2
	// levelMemory: the counts by level halve once they pass it
	// (limit's levelMemory). maxLevel is the highest level a reply's
	// counts may carry (limit's maxLevel).
	levelMemory = 512
	maxLevel    = 4096
	// maxWaitSeconds bounds one pacing wait (the Go bucket's MaxWait,
	// a day): a tiny rate asks again then.
	maxWaitSeconds = int64(bucket.MaxWait / time.Second)
	// maxPause bounds a pause, or a fixed window's closure, read from
	// Redis: it ends this long after it is read at the latest. A pause
	// is written as the state's "paused" field, which whoever can write
	// to Redis can set to any time; without a bound one write would hold
	// a group on every replica for ever. The pauses the proxy takes are
	// its retry waits, at most LLMPROXY_MAX_RETRY_AFTER (2m by default),
	// lengthened when one paid nothing, and a fixed window's closure, to
	// a boundary the upstream states (a minute's window, in practice):
	// an hour is past all of them. A longer one (an operator who set
	// LLMPROXY_MAX_RETRY_AFTER above an hour) still holds the replica
	// that took it for its whole length (its own pause, not read from
	// Redis); the others ask the upstream again after the hour.
	maxPause = time.Hour
	// replyScale: a reply carries a rate, or a count by level, as an
	// integer replyScale times it.
	replyScale = 1000
	// probeWindows, maxClimb: the fleet's window probes as one
	// process's does (limit's); minSplitMs (limit's minSplit) is the shortest span
	// a boundary is told apart from another by; lengthSlack: a length
	// read more than a lengthSlack-th over the known one saw windows go
	// by unseen (limit's, see windows.refused).
	probeWindows = 4
	maxClimb     = 2
	minSplitMs   = 20
	lengthSlack  = 8
	// windowMarginMs: the fleet takes a window it predicts to open this
	// many milliseconds late (see windows.gate).
	windowMarginMs = 5
)

// sharedNumbers are the numbers a script's text names as ${name}.
var sharedNumbers = map[string]int64{
	"firstAnswerWindow": firstAnswerWindow.Milliseconds(),
	"startSpread":       startSpread,
	"levelMemory":       levelMemory,
	"maxWaitSeconds":    maxWaitSeconds,
	"maxPause":          maxPause.Milliseconds(),
	"replyScale":        replyScale,
	"probeWindows":      probeWindows,
	"maxClimb":          maxClimb,
	"minSplit":          minSplitMs,
	"lengthSlack":       lengthSlack,
	"windowMargin":      windowMarginMs,
	"leftCounted":       int64(leftCounted),
	"leftCapped":        int64(leftCapped),
	"answerUncounted":   int64(answerUncounted),
	"answerAdmitted":    int64(answerAdmitted),
	"answerRefused":     int64(answerRefused),
}

// replyLists are the Lua lists a script's text names as ${name} for the
// replies it makes (see wire.go).
var replyLists = map[string]string{
	"admitReply":     luaList(admitWire{}),
	"learnReply":     luaList(learnWire{}),
	"levelCount":     luaList(levelWire{}),
	"heartbeatReply": luaList(heartbeatWire{}),
}

var placeholder = regexp.MustCompile(`\$\{(\w+)\}`)

// render is src with each ${name} replaced by its reply list or shared
// number; a name with neither is a mistake in this package, found when
// it starts.
func render(src string) string {
	return placeholder.ReplaceAllStringFunc(src, func(m string) string {
		name := m[2 : len(m)-1]
		if l, ok := replyLists[name]; ok {
			return l
		}
		n, ok := sharedNumbers[name]
		if !ok {
			panic("redisstate: a script names " + m + ", which has no value")
		}
		return strconv.FormatInt(n, 10)
	})
}
