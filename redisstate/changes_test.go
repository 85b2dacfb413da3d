package redisstate

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/clock"
)

// testToken is the admin token of the test's fleet.
const testToken = "a fleet's admin token, long enough"

// signedStore is a store on srv whose changes are signed with token,
// polled every 10 ms, logging to out.
func signedStore(t *testing.T, srv *server, token string, out *lockedBuffer) *Store {
	t.Helper()
	cfg := Config{URL: srv.url(), Timeout: 10 * time.Second, ChangesEvery: 10 * time.Millisecond, KeyTTL: time.Minute, ChangesToken: token}
	if out != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(out, nil))
	}
	return storeOn(t, cfg)
}

// heard collects what a watcher was handed, as field=value.
type heardList struct{ ch chan string }

func watchAll(st *Store) heardList {
	h := heardList{make(chan string, 100)}
	st.WatchChanges(func(f, v string, _ bool) { h.ch <- f + "=" + v })
	return h
}

// next is the next change heard within 5 s, or "" past it.
func (h heardList) next() string {
	select {
	case s := <-h.ch:
		return s
	case <-time.After(5 * time.Second):
		return ""
	}
}

// none fails the test when anything is heard within d.
func (h heardList) none(t *testing.T, d time.Duration, what string) {
	t.Helper()
	select {
	case s := <-h.ch:
		t.Fatalf("%s: the replica took %q", what, s)
	case <-time.After(d):
	}
}

// rawHSet writes field=value into the changes hash as anyone with
// access to Redis could, past the store.
func rawHSet(t *testing.T, st *Store, field, value string) {
	t.Helper()
	if err := st.rdb().HSet(context.Background(), st.changesKey(), field, value).Err(); err != nil {
		t.Fatal(err)
	}
}

func rawHGet(t *testing.T, st *Store, field string) string {
	t.Helper()
	v, err := st.rdb().HGet(context.Background(), st.changesKey(), field).Result()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestAForgedChangeIsIgnoredAndLoggedOnce: changes written straight into
// the hash (unsigned; signed with a made-up signature; a real one's
// signature on an edited change) are not handed on, each is logged once
// however often the replica polls, and the log never holds the token.
// The signed change after them is handed on.
func TestAForgedChangeIsIgnoredAndLoggedOnce(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	var out lockedBuffer
	a, b := signedStore(t, srv, testToken, nil), signedStore(t, srv, testToken, &out)
	heard := watchAll(b)
	rawHSet(t, a, "route:default:hold", `{"op":"hold","by":"intruder"}`)
	rawHSet(t, a, "lane:ab:hold", "v1 99 "+strings.Repeat("0", 64)+` {"op":"hold","by":"intruder"}`)
	if err := a.PutChange(context.Background(), "route:x:limits", `{"op":"limits","by":"token:1234"}`); err != nil {
		t.Fatal(err)
	}
	if h := heard.next(); h != `route:x:limits={"op":"limits","by":"token:1234"}` {
		t.Fatalf("the replica heard %q first, want the signed change", h)
	}
	sealed := rawHGet(t, a, "route:x:limits")
	rawHSet(t, a, "route:x:limits", strings.Replace(sealed, "token:1234", "token:abcd", 1))
	heard.none(t, 200*time.Millisecond, "forged changes, 20 polls")
	logs := out.String()
	for _, want := range []string{
		`field=route:default:hold reason="not signed"`,
		`field=lane:ab:hold reason="wrong signature`,
		`field=route:x:limits reason="wrong signature`,
	} {
		if n := strings.Count(logs, `msg="a change in redis ignored" `+want); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", want, n, logs)
		}
	}
	if strings.Contains(logs, testToken) || strings.Contains(logs, "intruder") {
		t.Errorf("the log holds the token or the forged change:\n%s", logs)
	}
}

// TestAChangeSignedWithAnotherTokenIsIgnored: a replica whose admin
// token is another's does not take its changes (nor they its), and says
// why.
func TestAChangeSignedWithAnotherTokenIsIgnored(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	var out lockedBuffer
	a, b := signedStore(t, srv, testToken, nil), signedStore(t, srv, "another token", &out)
	heard := watchAll(b)
	if err := a.PutChange(context.Background(), "route:x:hold", "held"); err != nil {
		t.Fatal(err)
	}
	heard.none(t, 100*time.Millisecond, "a change of another token")
	if !strings.Contains(out.String(), `msg="a change in redis ignored" field=route:x:hold reason="wrong signature`) {
		t.Fatalf("not logged:\n%s", out.String())
	}
	c := signedStore(t, srv, testToken, nil)
	if h := watchAll(c).next(); h != "route:x:hold=held" {
		t.Fatalf("a replica of the same token heard %q", h)
	}
}

// TestASignedChangeMovedOrReplayedIsIgnored: a change's sealed value
// copied to another field, or to the same field of another prefix, is
// not taken; nor is an earlier change of a field written back over a
// later one the replica took. A replica that never saw the later one has
// nothing to tell the replay by, and takes it (the documented limit).
func TestASignedChangeMovedOrReplayedIsIgnored(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	var out lockedBuffer
	a, b := signedStore(t, srv, testToken, nil), signedStore(t, srv, testToken, &out)
	heard := watchAll(b)
	ctx := context.Background()
	if err := a.PutChange(ctx, "route:x:hold", "hold"); err != nil {
		t.Fatal(err)
	}
	if h := heard.next(); h != "route:x:hold=hold" {
		t.Fatalf("heard %q", h)
	}
	first := rawHGet(t, a, "route:x:hold")
	if err := a.PutChange(ctx, "route:x:hold", "release"); err != nil {
		t.Fatal(err)
	}
	if h := heard.next(); h != "route:x:hold=release" {
		t.Fatalf("heard %q", h)
	}
	rawHSet(t, a, "route:y:hold", first)
	rawHSet(t, a, "route:x:hold", first)
	heard.none(t, 100*time.Millisecond, "a moved change and a replayed one")
	// The replica reads the writes when Redis tells it of them: on a
	// loaded machine that can be after the 100 ms above.
	logged := func(logs string) bool {
		return strings.Contains(logs, `field=route:y:hold reason="wrong signature`) && strings.Contains(logs, `field=route:x:hold reason="version `)
	}
	for deadline := time.Now().Add(10 * time.Second); !logged(out.String()) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if logs := out.String(); !logged(logs) {
		t.Fatalf("the moved and the replayed change are not logged:\n%s", logs)
	}
	other := storeOn(t, Config{URL: srv.url(), Timeout: 10 * time.Second, ChangesToken: testToken, Prefix: "other:"})
	rawHSet(t, other, "route:x:hold", first)
	var took []string
	other.pollChanges(func(f, v string, _ bool) { took = append(took, f) }, true)
	if len(took) != 0 {
		t.Fatalf("a change of another prefix was taken: %v", took)
	}
	if h := watchAll(signedStore(t, srv, testToken, nil)).next(); h != "route:x:hold=hold" {
		t.Fatalf("a replica started after the replay heard %q", h)
	}
	// Another change signed at the version in force is no newer either.
	b.changesMu.Lock()
	held := b.changesVersion["route:x:hold"]
	b.changesMu.Unlock()
	rawHSet(t, a, "route:x:hold", a.seal("route:x:hold", held, "hold at the same version"))
	heard.none(t, 100*time.Millisecond, "another change at the version in force")
}

// TestTheLaterOfTwoChangesWins: a change put while the hash holds a
// version at or above the writer's clock (another replica's, on a clock
// ahead) goes above it, and every replica takes it; a value no token
// signed, with a version far ahead, does not keep a change out.
func TestTheLaterOfTwoChangesWins(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	start := time.Now()
	ahead := clock.NewFake(start.Add(time.Hour))
	a := storeOn(t, Config{URL: srv.url(), Timeout: 10 * time.Second, ChangesEvery: 10 * time.Millisecond, KeyTTL: time.Minute,
		ChangesToken: testToken, Clock: ahead})
	b := signedStore(t, srv, testToken, nil)
	heardA := watchAll(a)
	ctx := context.Background()
	if err := a.PutChange(ctx, "route:x:hold", "hold"); err != nil {
		t.Fatal(err)
	}
	if err := b.PutChange(ctx, "route:x:hold", "release"); err != nil {
		t.Fatal(err)
	}
	if h := heardA.next(); h != "route:x:hold=release" {
		t.Fatalf("the replica with the clock ahead heard %q, want the later release", h)
	}
	if v, _, err := b.unseal("route:x:hold", rawHGet(t, b, "route:x:hold")); err != nil || v != ahead.Now().UnixMilli()+1 {
		t.Fatalf("the later change's version %d (%v), want %d, one above the earlier's", v, err, ahead.Now().UnixMilli()+1)
	}
	rawHSet(t, b, "route:x:hold", "v1 99999999999999 "+strings.Repeat("0", 64)+" hold")
	if err := b.PutChange(ctx, "route:x:hold", "hold again"); err != nil {
		t.Fatal(err)
	}
	if h := heardA.next(); h != "route:x:hold=hold again" {
		t.Fatalf("after a forged version far ahead, heard %q", h)
	}
	ttl, err := b.rdb().PTTL(ctx, b.changesKey()).Result()
	if err != nil || ttl <= 50*time.Second || ttl > time.Minute {
		t.Fatalf("the changes expire in %v (%v), want about a minute", ttl, err)
	}
}

// TestWithoutATokenNoChangeIsShared: a store without a token writes no
// change (ErrNoChangesToken) and takes none, signed or not.
func TestWithoutATokenNoChangeIsShared(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	a := signedStore(t, srv, testToken, nil)
	none := signedStore(t, srv, "", nil)
	if err := none.PutChange(context.Background(), "route:x:hold", "hold"); !errors.Is(err, ErrNoChangesToken) {
		t.Fatalf("a tokenless put: %v", err)
	}
	if err := a.rdb().HGet(context.Background(), a.changesKey(), "route:x:hold").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("a tokenless put wrote to redis: %v", err)
	}
	if err := a.PutChange(context.Background(), "route:x:hold", "hold"); err != nil {
		t.Fatal(err)
	}
	rawHSet(t, a, "route:y:hold", "hold")
	watchAll(none).none(t, 100*time.Millisecond, "a replica without a token")
}

// TestTheSignatureCoversEachPartApart: the signature is the token's (a
// key derived from it, not the token), and the parts' boundaries are
// part of it: "route:x1" at version 23 is not "route:x" at 123.
func TestTheSignatureCoversEachPartApart(t *testing.T) {
	st := &Store{cfg: Config{Prefix: "p:"}, signKey: changesKeyFrom(testToken)}
	base := st.mac("route:x1", 23, "v")
	for _, other := range []string{st.mac("route:x", 123, "v"), st.mac("route:x1", 2, "3v"), st.mac("route:x1", 23, "w")} {
		if other == base {
			t.Fatal("two changes share a signature")
		}
	}
	moved := &Store{cfg: Config{Prefix: "p:r"}, signKey: st.signKey}
	if moved.mac("oute:x1", 23, "v") == base {
		t.Fatal("the prefix's boundary is not signed")
	}
	if string(st.signKey) == testToken || len(st.signKey) != 32 || changesKeyFrom("") != nil {
		t.Fatalf("the key is %q", st.signKey)
	}
	if changesKeyFrom("t") == nil || string(changesKeyFrom("t")) == string(changesKeyFrom("u")) {
		t.Fatal("two tokens give one key")
	}
	for _, raw := range []string{"", "v1", "v2 5 " + base + " v", "v1 x " + base + " v", "v1 0 " + base + " v", "v1 -1 " + base + " v"} {
		if _, _, err := st.unseal("route:x1", raw); err == nil {
			t.Errorf("%q unsealed", raw)
		}
	}
	if _, _, err := st.unseal("route:x1", st.seal("route:x1", 0, "v")); err == nil {
		t.Error("a change signed at version 0 unsealed")
	}
	if v, value, err := st.unseal("route:x1", st.seal("route:x1", 1, "v")); err != nil || v != 1 || value != "v" {
		t.Errorf("a change of version 1 read as %d %q %v", v, value, err)
	}
	if v, value, err := st.unseal("route:x1", "v1 23 "+base+" v"); err != nil || v != 23 || value != "v" {
		t.Fatalf("a sealed change read as %d %q %v", v, value, err)
	}
	if sealed := st.seal("route:x1", 23, "a b"); sealed != "v1 23 "+st.mac("route:x1", 23, "a b")+" a b" {
		t.Fatalf("sealed as %q", sealed)
	}
	if clip("abc", 3) != "abc" || clip("abcd", 3) != "abc…" {
		t.Fatal("clip")
	}
}
