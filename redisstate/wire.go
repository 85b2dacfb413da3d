package redisstate

// What Go sends the Lua scripts and reads back, by name on both sides.
//
// A script's ARGV is a Go struct (admitArgs, learnArgs, giveBackArgs,
// heartbeatArgs): argv flattens one into the ARGV list, field by field
// in order, and the script reads that list through the table args, which
// newScript's prologue fills from the same struct type by the fields' lua
// tags (args.cost, args.req.known). A slice field, last, takes the rest
// of ARGV.
//
// A script's reply is a list of integers whose layout is a Go struct
// (admitWire, learnWire and levelWire, heartbeatWire): the script returns
// the Lua values the fields' lua tags name, in the fields' order (the
// ${…Reply} placeholders in scripts.go, see luaList), and one decode
// function per reply reads them back by name, refusing a reply of
// another length. Neither side counts positions by hand.

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// admitArgs are admitScript's arguments.
type admitArgs struct {
	// Now is the time the script runs at (ms); 0: Redis' own (TIME).
	// Only a test's store sends one (see Store.scriptNow).
	Now      int64  `lua:"now"`
	Cost     int64  `lua:"cost"`  // the request's estimated tokens
	Alone    bool   `lua:"alone"` // no answer awaited: it may go to learn what the budgets hold
	Lease    string `lua:"lease"` // the permit's name
	LeaseTTL int64  `lua:"ttl"`   // ms
	Replica  string `lua:"replica"`
	// Age is that of the replica's oldest waiter (ms).
	Age           int64 `lua:"age"`
	KeyTTL        int64 `lua:"keyttl"`        // ms
	DefaultClimit int   `lua:"defaultClimit"` // the concurrency limit while no replica said one
	MaxClimit     int   `lua:"maxClimit"`
	// SlowStart is 1 when the group starts slow (limit.Limits.SlowStart;
	// see spread), else 0.
	SlowStart int `lua:"slowStart"`
	// Windowed: a fixed window's allowance paces the group, so the
	// request budget neither holds nor is charged.
	Windowed bool `lua:"windowed"`
	// Knock: the request is a fixed window's closure's test, which the
	// pause taken for the closure does not hold (see learnArgsFor).
	Knock bool `lua:"knock"`
	// Returned are the replica's leases of the group given back and not
	// yet removed: removed first.
	Returned []string `lua:"returned"`
}

// learnArgs are learnScript's arguments.
type learnArgs struct {
	Now     int64  `lua:"now"`    // see admitArgs.Now
	KeyTTL  int64  `lua:"keyttl"` // ms
	Pause   int64  `lua:"pause"`  // the pause's length from now (ms; 0: none)
	Climit  int    `lua:"climit"` // the replica's concurrency limit
	Replica string `lua:"replica"`
	// Req and Tok are the replica's request and token budgets.
	Req budgetArgs `lua:"req"`
	Tok budgetArgs `lua:"tok"`
	// Lowered: the upstream's refusals lowered Climit.
	Lowered bool `lua:"lowered"`
	// Level is the number in flight the answer's request went at, all
	// replicas together (0: none).
	Level int        `lua:"level"`
	Kind  answerKind `lua:"kind"`
	// ConcurrencyBound: the replica judged the bound a concurrency limit.
	ConcurrencyBound bool `lua:"concurrencyBound"`
	Refusal          bool `lua:"refusal"` // the answer is a refusal
	// Reply is an accepted answer's time from its dispatch to its
	// headers (ms; the first is kept, see spread).
	Reply int64 `lua:"reply"`
	// Bound is a refusal's time to the boundary of the fixed window's
	// closure it is in, stated by the upstream to the millisecond (ms; 0:
	// none); Sent the requests the group had sent right after its
	// request went (0: not Redis' permit). See windows.refused.
	Bound int64   `lua:"bound"`
	Sent  float64 `lua:"sent"`
}

// answerKind is an answer's kind among the counts by level.
type answerKind int

const (
	answerUncounted answerKind = iota // not counted: not sent, failed, or on a permit Redis did not give
	answerAdmitted
	answerRefused
)

// budgetArgs are one budget's figures for learnScript.
type budgetArgs struct {
	Known bool     `lua:"known"`
	Syn   bool     `lua:"syn"` // the pace was learned from refusals
	Size  float64  `lua:"size"`
	Rate  float64  `lua:"rate"` // per second
	Mode  leftMode `lua:"mode"`
	Value float64  `lua:"value"` // see Mode
	// Mark is the running total sent right after the answer's request
	// went.
	Mark float64 `lua:"mark"`
}

// leftMode is how learnScript sets what is left of a budget from an
// answer.
type leftMode int

const (
	leftUnchanged leftMode = 0 // the answer says nothing of what is left
	leftCounted   leftMode = 1 // the upstream's remaining count (value), less what was sent after mark
	leftCapped    leftMode = 2 // at most value
)

// newBudgetArgs are b's figures for learnScript; all zero when b is not
// known.
func newBudgetArgs(b limit.BudgetView, syn bool, mode leftMode, value, mark float64) budgetArgs {
	if !b.Known {
		return budgetArgs{}
	}
	return budgetArgs{Known: true, Syn: syn, Size: b.Limit, Rate: b.PerSecond, Mode: mode, Value: value, Mark: mark}
}

// giveBackArgs are giveBackScript's arguments.
type giveBackArgs struct {
	Now      int64   `lua:"now"` // see admitArgs.Now
	Requests float64 `lua:"requests"`
	Tokens   float64 `lua:"tokens"`
	// Mark, when positive, is a settle's: the tokens' running total when
	// its request was sent.
	Mark float64 `lua:"mark"`
	// Used is a settle's: the tokens its request used. What is given back
	// is what Tokens (the estimate) was charged, less Used.
	Used float64 `lua:"used"`
}

// apartArgs are apartScript's arguments.
type apartArgs struct {
	Member string `lua:"member"` // a hash of the limit's key (see shared.PutApart)
	KeyTTL int64  `lua:"keyttl"` // ms
}

// heartbeatArgs are heartbeatScript's arguments.
type heartbeatArgs struct {
	Now     int64  `lua:"now"` // see admitArgs.Now
	Replica string `lua:"replica"`
	// Busy: the replica had requests to admit since its last heartbeat.
	Busy   bool  `lua:"busy"`
	Window int64 `lua:"window"` // how long a replica counts as busy (ms)
}

// argv is the ARGV list of args, a script's arguments: its fields in
// order, a nested struct's in its place, a slice's elements last; a bool
// is 1 or 0.
func argv(args any) []any {
	return appendArgv(nil, reflect.ValueOf(args))
}

func appendArgv(out []any, v reflect.Value) []any {
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Struct:
			out = appendArgv(out, f)
		case reflect.Slice:
			for j := range f.Len() {
				out = append(out, f.Index(j).String())
			}
		case reflect.Bool:
			out = append(out, boolInt(f.Bool()))
		case reflect.Int, reflect.Int64:
			out = append(out, f.Int())
		case reflect.Float64:
			out = append(out, f.Float())
		case reflect.String:
			out = append(out, f.String())
		default:
			panic("redisstate: no ARGV for a " + f.Kind().String())
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// argsPrologue is the Lua that reads ARGV, as argv lays out a value of
// t, into the table args by the fields' lua tags.
func argsPrologue(t reflect.Type) string {
	var p argsLayout
	return "local args = " + p.table(t) + "\n"
}

// argsLayout counts the ARGV slots argsPrologue has read.
type argsLayout struct {
	n    int
	rest bool // a slice took the rest
}

// table is the Lua table of t's fields, read from ARGV from slot n on.
func (p *argsLayout) table(t reflect.Type) string {
	fields := make([]string, t.NumField())
	for i := range fields {
		f := t.Field(i)
		name := f.Tag.Get("lua")
		if name == "" || p.rest {
			panic(fmt.Sprintf("redisstate: %s.%s: no lua tag, or after a slice", t.Name(), f.Name))
		}
		switch f.Type.Kind() {
		case reflect.Struct:
			fields[i] = name + " = " + p.table(f.Type)
		case reflect.Slice:
			p.rest = true
			fields[i] = fmt.Sprintf("%s = {unpack(ARGV, %d)}", name, p.n+1)
		default:
			p.n++
			fields[i] = fmt.Sprintf("%s = ARGV[%d]", name, p.n)
		}
	}
	return "{" + strings.Join(fields, ", ") + "}"
}

// luaList is the Lua table of the values that the lua tags of wire's
// fields name, in the fields' order: what a script returns for a reply
// of wire's layout.
func luaList(wire any) string {
	t := reflect.TypeOf(wire)
	names := make([]string, t.NumField())
	for i := range names {
		names[i] = t.Field(i).Tag.Get("lua")
	}
	return "{" + strings.Join(names, ", ") + "}"
}

// wireLen is the number of integers a reply of W's layout holds.
func wireLen[W any]() int { return reflect.TypeFor[W]().NumField() }

// fill sets the fields of *w, in order, from vals, one each.
func fill[W any](w *W, vals []int64) {
	v := reflect.ValueOf(w).Elem()
	for i := range v.NumField() {
		v.Field(i).SetInt(vals[i])
	}
}

// admitWire is admitScript's reply as it comes: times are ms on Redis'
// clock, rates per second × replyScale, flags 1 or 0.
type admitWire struct {
	OK         int64 `lua:"ok"`
	RetryAt    int64 `lua:"at"` // 0: when a permit frees
	Out        int64 `lua:"out"`
	Climit     int64 `lua:"climit"`
	ReqSent    int64 `lua:"rsent"`
	TokSent    int64 `lua:"tsent"`
	Room       int64 `lua:"room"`
	Paced      int64 `lua:"paced"`
	Paused     int64 `lua:"pausedUntil"`
	Now        int64 `lua:"now"`
	Answered   int64 `lua:"answered"`
	ReqRate    int64 `lua:"rrate"`
	TokSize    int64 `lua:"tsize"`
	TokRate    int64 `lua:"trate"`
	ReqSize    int64 `lua:"rsize"`
	ReqSyn     int64 `lua:"rsyn"`
	Accepted   int64 `lua:"acc"`
	Refusals   int64 `lua:"rn"`
	LastSecond int64 `lua:"lastsec"`
	GroupSent  int64 `lua:"gsent"`
	Admitted   int64 `lua:"an"`
	Apart      int64 `lua:"apn"`
}

// admitReply is admitScript's reply, its times on this replica's clock.
type admitReply struct {
	ok bool
	// retryAt is when to ask again (zero: when a permit frees).
	retryAt time.Time
	// out is the permits out before this one, all replicas.
	out int
	// reqSent and tokSent are the group's running totals of requests
	// and tokens sent, this dispatch included (0 when refused).
	reqSent, tokSent int64
	// room: the budgets known had room for it; paced: the pace learned
	// from refusals admitted it.
	room, paced bool
	paused      time.Time
	redisNow    int64 // Redis' clock (ms) when it ran
	// answered: some replica learned from an answer in the last minute.
	answered bool
	limits   limits
	// paceFromRefusals: the shared request pace was learned from refusals.
	paceFromRefusals bool
	// accepted is when some replica last had an answer the upstream
	// accepted (zero: none).
	accepted time.Time
	// refusals counts the refusals every replica learned from so far.
	refusals uint64
	// lastSecond is the group's dispatches in the last second, all
	// replicas, this one included (0 when refused).
	lastSecond int
	// groupSent counts the dispatches of every limit of the lanes' group
	// (one credential and route, every model), all replicas, this one
	// included (0 when refused).
	groupSent uint64
	// admitted counts the answers every replica had admitted so far.
	admitted uint64
	// apart counts the limits some replica took out of the trial the
	// state paces (see shared.Apart).
	apart int64
}

// decodeAdmit reads admitScript's reply res at now.
func decodeAdmit(res []int64, now time.Time) (admitReply, error) {
	if n := wireLen[admitWire](); len(res) != n {
		return admitReply{}, fmt.Errorf("admit script replied %d integers, want %d", len(res), n)
	}
	var w admitWire
	fill(&w, res)
	at := func(v int64) time.Time { return local(v, w.Now, now) }
	return admitReply{ok: w.OK == 1, retryAt: at(w.RetryAt), out: int(w.Out), reqSent: w.ReqSent, tokSent: w.TokSent,
		room: w.Room == 1, paced: w.Paced == 1, paused: at(capPause(w.Paused, w.Now)), redisNow: w.Now, answered: w.Answered == 1,
		limits: limits{concurrency: int(w.Climit), reqRate: float64(w.ReqRate) / replyScale, tokSize: float64(w.TokSize),
			tokRate: float64(w.TokRate) / replyScale, reqSize: float64(w.ReqSize)},
		paceFromRefusals: w.ReqSyn == 1, accepted: at(w.Accepted), refusals: uint64(max(w.Refusals, 0)), lastSecond: int(w.LastSecond),
		groupSent: uint64(max(w.GroupSent, 0)), admitted: uint64(max(w.Admitted, 0)), apart: w.Apart}, nil
}

// learnWire is the head of learnScript's reply as it comes (times in ms
// on Redis' clock); a levelWire follows per level counted.
type learnWire struct {
	Out    int64 `lua:"out"`
	Paused int64 `lua:"paused"`
	Now    int64 `lua:"now"`
	Raiser int64 `lua:"raiser"` // 1 when this replica holds the raise lease
	Joined int64 `lua:"joined"` // the name of the limit some replica found this one shares (joinName), 0: none
}

// levelWire is one level's count in learnScript's reply.
type levelWire struct {
	Level   int64 `lua:"lvl"`
	Refused int64 `lua:"refused"` // 1 for the refusals' count, 0 the admissions'
	Count   int64 `lua:"count"`   // × replyScale
}

// learnReply is learnScript's reply, its times on this replica's clock.
type learnReply struct {
	out      int // permits out, all replicas
	paused   time.Time
	redisNow int64 // Redis' clock (ms) when it ran
	// raiser: this replica holds the raise lease, so its probes above a
	// pace learned from refusals are the fleet's.
	raiser bool
	// joined names the limit some replica found this state's limit
	// shares (see shared.PutJoined), 0 when none did.
	joined int64
	// admitted and refused count every replica's answers by the number
	// in flight they went at (index: level).
	admitted, refused []float64
}

// decodeLearn reads learnScript's reply res at now.
func decodeLearn(res []int64, now time.Time) (learnReply, error) {
	head, per := wireLen[learnWire](), wireLen[levelWire]()
	if len(res) < head || (len(res)-head)%per != 0 {
		return learnReply{}, fmt.Errorf("learn script replied %d integers, want %d and %d a level", len(res), head, per)
	}
	var w learnWire
	fill(&w, res)
	rep := learnReply{out: int(w.Out), paused: local(capPause(w.Paused, w.Now), w.Now, now), redisNow: w.Now, raiser: w.Raiser == 1,
		joined: w.Joined}
	for i := head; i < len(res); i += per {
		var l levelWire
		fill(&l, res[i:])
		level := int(l.Level)
		if level <= 0 || level > maxLevel {
			continue
		}
		for len(rep.admitted) <= level {
			rep.admitted, rep.refused = append(rep.admitted, 0), append(rep.refused, 0)
		}
		if l.Refused == 1 {
			rep.refused[level] = float64(l.Count) / replyScale
		} else {
			rep.admitted[level] = float64(l.Count) / replyScale
		}
	}
	return rep, nil
}

// heartbeatWire is heartbeatScript's reply.
type heartbeatWire struct {
	Alive int64 `lua:"alive"` // replicas alive in the last minute, this one included
	Busy  int64 `lua:"busy"`  // other replicas busy within the window
}

// decodeHeartbeat reads heartbeatScript's reply res.
func decodeHeartbeat(res []int64) (heartbeatWire, error) {
	if n := wireLen[heartbeatWire](); len(res) != n {
		return heartbeatWire{}, fmt.Errorf("heartbeat script replied %d integers, want %d", len(res), n)
	}
	var w heartbeatWire
	fill(&w, res)
	return w, nil
}

// capPause is the end of a pause (ms on Redis' clock) read from Redis
// when its clock said redisNow, maxPause on at the latest (see
// maxPause): the scripts bound it too, and this holds whatever a script
// replies, before the end is read as a time (where a far one would
// overflow).
func capPause(until, redisNow int64) int64 {
	return min(until, redisNow+maxPause.Milliseconds())
}

// local is a time on Redis' clock (ms), read as the replica's: redisNow
// on Redis' clock is localNow on the replica's. Zero stays zero.
func local(v, redisNow int64, localNow time.Time) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return localNow.Add(time.Duration(v-redisNow) * time.Millisecond)
}
