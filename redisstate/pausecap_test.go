package redisstate

import (
	"context"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// TestAPauseWrittenIntoRedisHoldsAnHourAtMost: whoever can write to
// Redis sets a group's pause to 9e15 ms (about 285,000 years) straight
// into its state hash, unsigned. Every replica refuses the group for at
// most maxPause (an hour) from then, and sends again once it is past;
// the next answer learned writes the bounded end back.
func TestAPauseWrittenIntoRedisHoldsAnHourAtMost(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 2)
	sa, sb := st[0].Shared("g", groupCfg).(*shared), st[1].Shared("g", groupCfg)
	tk := admitOn(t, fc, sa, 1)
	sa.Return(&tk, fc.Now())
	st[0].flush()
	ctx := context.Background()
	if err := st[0].rdb().HSet(ctx, sa.state, "paused", "9e15").Err(); err != nil {
		t.Fatal(err)
	}
	start := fc.Now()
	for _, sh := range []limit.Shared{sa, sb} {
		_, at, ok := sh.Admit(fc.Now(), 1, false)
		if ok || !at.Equal(start.Add(time.Hour)) {
			t.Fatalf("admitted %v, asks again %v from now; want refused for the hour the pause is bounded by", ok, at.Sub(start))
		}
		if p := sh.PausedUntil(); !p.Equal(start.Add(time.Hour)) {
			t.Fatalf("paused %v from now, want an hour", p.Sub(start))
		}
	}
	fc.Advance(30 * time.Minute)
	if _, at, ok := sb.Admit(fc.Now(), 1, false); ok || !at.Equal(start.Add(time.Hour)) {
		t.Fatalf("half an hour on: admitted %v, asks again %v from the write; want the hour's end", ok, at.Sub(start))
	}
	fc.Set(start.Add(time.Hour))
	tk = admitOn(t, fc, sb, 1)
	// Learning an answer reads the pause bounded too, and writes it back so.
	if err := st[0].rdb().HSet(ctx, sa.state, "paused", "9e15").Err(); err != nil {
		t.Fatal(err)
	}
	sb.Learn(&tk, limit.Report{Status: 200, Verdict: limit.Accepted}, fc.Now())
	if p := sb.PausedUntil(); !p.Equal(fc.Now().Add(time.Hour)) {
		t.Fatalf("after learning, paused %v from now, want an hour", p.Sub(fc.Now()))
	}
	got, err := st[0].rdb().HGet(ctx, sa.state, "paused").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if want := fc.Now().Add(time.Hour).UnixMilli(); got != want {
		t.Fatalf("the pause written back ends %d ms past an hour on", got-want)
	}
}

// TestAClosureWrittenIntoRedisIsForgotten: a fixed window written into
// the state hash whose closure would end past an hour on (its allowance
// sent, its length 9e15 ms) holds nothing: the window is forgotten. One
// that ends within the hour holds the group until it ends.
func TestAClosureWrittenIntoRedisIsForgotten(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	fc := clock.NewFake(fakeStart)
	st := fakeStores(t, srv.url(), fc, 1)
	sa := st[0].Shared("g", groupCfg).(*shared)
	tk := admitOn(t, fc, sa, 1)
	sa.Return(&tk, fc.Now())
	st[0].flush()
	ctx := context.Background()
	now := fc.Now().UnixMilli()
	// The window began now; its end (plus the 5 ms margin) an hour on.
	if err := st[0].rdb().HSet(ctx, sa.state, "wb", now, "ws", 0, "wcap", 1, "wlen", time.Hour.Milliseconds()-windowMarginMs).Err(); err != nil {
		t.Fatal(err)
	}
	if _, at, ok := sa.Admit(fc.Now(), 1, false); ok || !at.Equal(fc.Now().Add(time.Hour)) {
		t.Fatalf("a window closed an hour: admitted %v, asks again %v from now; want the hour", ok, at.Sub(fc.Now()))
	}
	if err := st[0].rdb().HSet(ctx, sa.state, "wlen", time.Hour.Milliseconds()-windowMarginMs+1).Err(); err != nil {
		t.Fatal(err)
	}
	if _, at, ok := sa.Admit(fc.Now(), 1, false); !ok {
		t.Fatalf("a window closed past an hour held the group, asks again %v from now", at.Sub(fc.Now()))
	}
	if n, err := st[0].rdb().HExists(ctx, sa.state, "wlen").Result(); err != nil || n {
		t.Fatalf("the window is still in redis (%v, %v)", n, err)
	}
}
