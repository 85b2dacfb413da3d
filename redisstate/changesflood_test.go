package redisstate

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// flood writes n fields named by name(i) into the changes hash, each
// valued value, past the store, in one command.
func flood(t *testing.T, st *Store, n int, name func(int) string, value string) {
	t.Helper()
	pairs := make([]any, 0, 2*n)
	for i := range n {
		pairs = append(pairs, name(i), value)
	}
	if err := st.rdb().HSet(context.Background(), st.changesKey(), pairs...).Err(); err != nil {
		t.Fatal(err)
	}
}

// pollN polls b's changes n times, as its watcher would, and returns the
// fields handed on; and how many fields b keeps.
func pollN(t *testing.T, b *Store, n int) ([]string, int) {
	t.Helper()
	var heard []string
	for range n {
		if !b.pollChanges(func(f, v string, _ bool) { heard = append(heard, f+"="+v) }, false) {
			t.Fatal("redis did not answer the poll")
		}
	}
	b.changesMu.Lock()
	defer b.changesMu.Unlock()
	return heard, len(b.changesSeen)
}

// TestAFloodOfFieldsInTheChangesIsBounded: whoever can write to Redis
// fills the changes hash. 50,000 fields of no form a replica writes are
// not kept, and three polls log one line for them all; 12,000 of a
// change's form, unsigned, are kept up to 10,000, each poll logs ten of
// the new ones and one line for the rest, and the flood past the most
// kept one line more, once. A signed change past the most kept is not
// taken while the flood is there, and is once it is gone: what is kept
// follows the hash.
func TestAFloodOfFieldsInTheChangesIsBounded(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	var out lockedBuffer
	a, b := signedStore(t, srv, testToken, nil), signedStore(t, srv, testToken, &out)
	lines := func() int { return strings.Count(out.String(), "level=WARN") }

	pollN(t, b, 1) // a poll of an empty hash first: the flood after it is logged
	flood(t, a, 50_000, func(i int) string { return fmt.Sprintf("junk:%d", i) }, "x")
	rawHSet(t, a, "route:"+strings.Repeat("r", maxChangeName+1)+":hold", "x")
	rawHSet(t, a, "route:r:hold", strings.Repeat("x", maxChangeValue+1))
	heard, kept := pollN(t, b, 3)
	if len(heard) != 0 || kept != 0 {
		t.Fatalf("after the junk: heard %d, kept %d; want none", len(heard), kept)
	}
	if n := lines(); n != 1 || !strings.Contains(out.String(), `none a replica writes (not logged again while some remain)" count=50002`) {
		t.Fatalf("the junk logged %d lines, want one counting it:\n%.2000s", n, out.String())
	}

	flood(t, a, 12_000, func(i int) string { return fmt.Sprintf("lane:%x:hold", i) }, "unsigned")
	heard, kept = pollN(t, b, 3)
	if len(heard) != 0 || kept != maxChangesSeen {
		t.Fatalf("after 12,000 unsigned changes: heard %d, kept %d; want none, and %d", len(heard), kept, maxChangesSeen)
	}
	logs := out.String()
	if n := lines(); n != 1+maxIgnoredLogged+2 {
		t.Fatalf("the unsigned changes logged %d lines, want %d:\n%.3000s", n-1, maxIgnoredLogged+2, logs)
	}
	if !strings.Contains(logs, fmt.Sprintf(`msg="more changes in redis ignored" count=%d`, maxChangesSeen-maxIgnoredLogged)) ||
		!strings.Contains(logs, `past the most a replica keeps (not logged again while some remain)" count=2000 most_kept=10000`) {
		t.Fatalf("the rest is not counted:\n%.3000s", logs)
	}

	if err := a.PutChange(context.Background(), "route:x:hold", "hold"); err != nil {
		t.Fatal(err)
	}
	if heard, _ = pollN(t, b, 1); len(heard) != 0 {
		t.Fatalf("past the most kept, the replica took %q", heard)
	}
	if err := a.rdb().Del(context.Background(), a.changesKey()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.PutChange(context.Background(), "route:x:hold", "hold"); err != nil {
		t.Fatal(err)
	}
	heard, kept = pollN(t, b, 1)
	if len(heard) != 1 || heard[0] != "route:x:hold=hold" || kept != 1 {
		t.Fatalf("the flood gone: heard %q, kept %d; want the signed change alone", heard, kept)
	}
}

// TestAChangeOfNoFormAReplicaTakesIsRefused: PutChange refuses a field
// of no change's form, or a change too long, rather than write what no
// replica would take; the longest name and change that fit go.
func TestAChangeOfNoFormAReplicaTakesIsRefused(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a := signedStore(t, srv, testToken, nil)
	ctx := context.Background()
	long := strings.Repeat("r", maxChangeName)
	fits := strings.Repeat("v", maxChangeValue-len(a.seal("route:x:hold", 1<<62, "")))
	for _, c := range []struct {
		field, value string
		ok           bool
	}{
		{"route:" + long + ":hold", "hold", true},
		{"route:" + long + "r:hold", "hold", false},
		{"lane:ab:hold", "hold", true},
		{"route:x y:hold", "hold", false},
		{"other:x:hold", "hold", false},
		{"route:x:hold", fits, true},
		{"route:x:hold", fits + "v", false},
	} {
		if err := a.PutChange(ctx, c.field, c.value); (err == nil) != c.ok {
			t.Errorf("PutChange(%.20s…, %d bytes): %v; want taken: %v", c.field, len(c.value), err, c.ok)
		}
	}
}

// TestOnePollLogsTenIgnoredChanges: ten unsigned changes new to a poll
// are logged one line each; an eleventh is counted in one line more.
func TestOnePollLogsTenIgnoredChanges(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	var out lockedBuffer
	a, b := signedStore(t, srv, testToken, nil), signedStore(t, srv, testToken, &out)
	flood(t, a, maxIgnoredLogged, func(i int) string { return fmt.Sprintf("lane:%x:hold", i) }, "unsigned")
	pollN(t, b, 1)
	if n, more := strings.Count(out.String(), "a change in redis ignored"), strings.Count(out.String(), "more changes"); n != maxIgnoredLogged || more != 0 {
		t.Fatalf("ten changes: %d lines, %d more; want ten and none:\n%s", n, more, out.String())
	}
	flood(t, a, maxIgnoredLogged+1, func(i int) string { return fmt.Sprintf("lane:%x:clear", i) }, "unsigned")
	pollN(t, b, 1)
	if !strings.Contains(out.String(), `msg="more changes in redis ignored" count=1`) {
		t.Fatalf("an eleventh is not counted:\n%s", out.String())
	}
}
