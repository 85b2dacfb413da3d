package redisstate

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestArgsAreLaidOutAsTheScriptReadsThem: argv flattens a script's
// arguments in field order, a nested budget in its place and a bool as 1
// or 0; the prologue reads each slot into the name of its field, and a
// slice, last, takes the rest.
func TestArgsAreLaidOutAsTheScriptReadsThem(t *testing.T) {
	t.Parallel()
	got := argv(learnArgs{Now: 1_700_000_000_000, KeyTTL: 600_000, Pause: 250, Climit: 8, Replica: "r1",
		Req:  budgetArgs{Known: true, Syn: true, Size: 5, Rate: 2.5, Mode: leftCapped, Value: 0, Mark: 41},
		Tok:  budgetArgs{Known: true, Size: 6000, Rate: 100, Mode: leftCounted, Value: 5000, Mark: 900},
		Kind: answerRefused, Level: 3, ConcurrencyBound: true, Reply: 120, Bound: 430, Sent: 41})
	want := []any{int64(1_700_000_000_000), int64(600_000), int64(250), int64(8), "r1",
		1, 1, 5.0, 2.5, int64(2), 0.0, 41.0,
		1, 0, 6000.0, 100.0, int64(1), 5000.0, 900.0,
		0, int64(3), int64(2), 1, 0, int64(120), int64(430), 41.0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("argv(learnArgs) =\n%#v\nwant\n%#v", got, want)
	}
	got = argv(admitArgs{Cost: 7, Alone: true, Lease: "l", Knock: true, Returned: []string{"a", "b"}})
	want = []any{int64(0), int64(7), 1, "l", int64(0), "", int64(0), int64(0), int64(0), int64(0), int64(0), 0, 1, "a", "b"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("argv(admitArgs) =\n%#v\nwant\n%#v", got, want)
	}
	prologue := argsPrologue(reflect.TypeFor[admitArgs]())
	wantLua := "local args = {now = ARGV[1], cost = ARGV[2], alone = ARGV[3], lease = ARGV[4], ttl = ARGV[5], replica = ARGV[6], age = ARGV[7], " +
		"keyttl = ARGV[8], defaultClimit = ARGV[9], maxClimit = ARGV[10], slowStart = ARGV[11], windowed = ARGV[12], knock = ARGV[13], " +
		"returned = {unpack(ARGV, 14)}}\n"
	if prologue != wantLua {
		t.Errorf("admitScript's prologue =\n%s\nwant\n%s", prologue, wantLua)
	}
	if p := argsPrologue(reflect.TypeFor[learnArgs]()); !strings.Contains(p, "req = {known = ARGV[6], syn = ARGV[7],") ||
		!strings.Contains(p, "tok = {known = ARGV[13],") || !strings.HasSuffix(p, "reply = ARGV[25], bound = ARGV[26], sent = ARGV[27]}\n") {
		t.Errorf("learnScript's prologue = %s", p)
	}
}

// TestArgsTheScriptsCannotReadAreRefused: a field without a lua tag, one
// after a slice, or of a kind ARGV has no form for is a mistake that
// stops the package at its start.
func TestArgsTheScriptsCannotReadAreRefused(t *testing.T) {
	t.Parallel()
	panics := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	panics("untagged", func() {
		argsPrologue(reflect.TypeFor[struct {
			A int `lua:"a"`
			B int
		}]())
	})
	panics("after a slice", func() {
		argsPrologue(reflect.TypeFor[struct {
			A []string `lua:"a"`
			B int      `lua:"b"`
		}]())
	})
	panics("a uint", func() {
		argv(struct {
			A uint `lua:"a"`
		}{})
	})
	panics("an unknown name", func() { render("return ${nothing}") })
}

// TestScriptsReadArgsByName: on Redis, a script reads what argv sent by
// the fields' names, a nested struct's and the rest of ARGV included.
func TestScriptsReadArgsByName(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	type inner struct {
		B float64 `lua:"b"`
	}
	type args struct {
		A    string   `lua:"a"`
		In   inner    `lua:"inner"`
		C    bool     `lua:"c"`
		Rest []string `lua:"rest"`
	}
	script := newScript(args{}, "return {args.a, args.inner.b, args.c, #args.rest, args.rest[2]}")
	got, err := script.Run(context.Background(), st.rdb(), nil, argv(args{A: "x", In: inner{B: 2.5}, C: true, Rest: []string{"p", "q"}})...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if want := []any{"x", "2.5", "1", int64(2), "q"}; !reflect.DeepEqual(got, want) {
		t.Errorf("the script read %#v, want %#v", got, want)
	}
}

// TestRepliesAreListedInTheirLayoutsOrder: a script returns the values
// its reply's fields name, in the fields' order.
func TestRepliesAreListedInTheirLayoutsOrder(t *testing.T) {
	t.Parallel()
	if got, want := luaList(heartbeatWire{}), "{alive, busy}"; got != want {
		t.Errorf("luaList(heartbeatWire) = %s, want %s", got, want)
	}
	if got, want := luaList(levelWire{}), "{lvl, refused, count}"; got != want {
		t.Errorf("luaList(levelWire) = %s, want %s", got, want)
	}
	for _, c := range []struct {
		res []int64
		ok  bool
	}{{[]int64{3, 1}, true}, {[]int64{3}, false}, {[]int64{3, 1, 0}, false}} {
		got, err := decodeHeartbeat(c.res)
		if ok := err == nil; ok != c.ok || ok && (got.Alive != 3 || got.Busy != 1) {
			t.Errorf("decodeHeartbeat(%v) = %+v, %v", c.res, got, err)
		}
	}
}
