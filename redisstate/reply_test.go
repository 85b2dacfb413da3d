package redisstate

import (
	"reflect"
	"testing"
	"time"
)

// TestScriptRepliesDecodeByName: the scripts' replies are read into named
// fields, Redis times turned into this replica's (Redis said 1,000,000 ms
// when the replica's clock read now), zero staying zero, and a reply of
// another shape refused.
func TestScriptRepliesDecodeByName(t *testing.T) {
	now := time.Unix(5_000, 0)
	redisAt := func(ms int64) time.Time { return now.Add(time.Duration(ms-1_000_000) * time.Millisecond) }
	admits := []struct {
		name string
		res  []int64
		want admitReply
		ok   bool
	}{
		{"admitted", []int64{1, 0, 3, 8, 41, 900, 1, 0, 0, 1_000_000, 1, 20_500, 6000, 100_000, 5, 0, 999_750, 7, 19, 130, 36, 2},
			admitReply{ok: true, out: 3, reqSent: 41, tokSent: 900, room: true, redisNow: 1_000_000, answered: true,
				limits:   limits{concurrency: 8, reqRate: 20.5, tokSize: 6000, tokRate: 100, reqSize: 5},
				accepted: redisAt(999_750), refusals: 7, lastSecond: 19, groupSent: 130, admitted: 36, apart: 2}, true},
		{"refused while paused, pace from refusals", []int64{0, 1_002_000, 8, 8, 0, 0, 0, 1, 1_002_000, 1_000_000, 0, 4000, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0},
			admitReply{retryAt: redisAt(1_002_000), out: 8, paced: true, paused: redisAt(1_002_000), redisNow: 1_000_000,
				limits: limits{concurrency: 8, reqRate: 4, reqSize: 2}, paceFromRefusals: true}, true},
		// A pause read from Redis ends an hour on at the latest, whatever
		// a script replied: an hour is kept, one past it cut to it.
		{"paused an hour", []int64{0, 0, 0, 8, 0, 0, 0, 0, 4_600_000, 1_000_000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			admitReply{paused: redisAt(4_600_000), redisNow: 1_000_000, limits: limits{concurrency: 8}}, true},
		{"paused for ever", []int64{0, 0, 0, 8, 0, 0, 0, 0, 9e15, 1_000_000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			admitReply{paused: now.Add(time.Hour), redisNow: 1_000_000, limits: limits{concurrency: 8}}, true},
		{"short", []int64{1, 0, 3, 8, 41, 900, 1, 0, 0, 1_000_000, 1, 20_500, 6000, 100_000, 5, 0, 999_750, 7, 19, 130, 36}, admitReply{}, false},
		{"long", []int64{1, 0, 3, 8, 41, 900, 1, 0, 0, 1_000_000, 1, 20_500, 6000, 100_000, 5, 0, 999_750, 7, 19, 130, 36, 2, 0}, admitReply{}, false},
	}
	for _, c := range admits {
		got, err := decodeAdmit(c.res, now)
		if ok := err == nil; ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("admit %s: decodeAdmit = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	// 4096 is the highest level; level 1 grows the counts to 4097 too.
	highest, refusedAt1 := make([]float64, 4097), make([]float64, 4097)
	highest[4096], refusedAt1[1] = 2, 0.5
	learns := []struct {
		name string
		res  []int64
		want learnReply
		ok   bool
	}{
		{"levels", []int64{4, 0, 1_000_000, 1, 77, 2, 0, 3500, 9, 1, 2000, 9, 0, 500, 0, 1, 7, 5000, 0, 1000},
			learnReply{out: 4, redisNow: 1_000_000, raiser: true, joined: 77,
				admitted: []float64{0, 0, 3.5, 0, 0, 0, 0, 0, 0, 0.5}, refused: []float64{0, 0, 0, 0, 0, 0, 0, 0, 0, 2}}, true},
		{"paused, no levels", []int64{0, 1_000_250, 1_000_000, 0, 0}, learnReply{paused: redisAt(1_000_250), redisNow: 1_000_000}, true},
		{"paused an hour", []int64{0, 4_600_000, 1_000_000, 0, 0}, learnReply{paused: redisAt(4_600_000), redisNow: 1_000_000}, true},
		{"paused for ever", []int64{0, 9e15, 1_000_000, 0, 0}, learnReply{paused: now.Add(time.Hour), redisNow: 1_000_000}, true},
		{"short", []int64{0, 0, 0, 0}, learnReply{}, false},
		{"a level cut short", []int64{4, 0, 1_000_000, 1, 0, 2, 0, 3500, 9, 1}, learnReply{}, false},
		{"a level of 0 or past the highest, left out", []int64{4, 0, 1_000_000, 0, 0, 0, 0, 1000, 4097, 1, 1000, 4096, 0, 2000, 1, 1, 500},
			learnReply{out: 4, redisNow: 1_000_000, admitted: highest, refused: refusedAt1}, true},
	}
	for _, c := range learns {
		got, err := decodeLearn(c.res, now)
		if ok := err == nil; ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("learn %s: decodeLearn = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestAProbeIsSeenWithTheLeaseOrUnderTheFleetsPace: a replica's probe
// reached the upstream when it holds the raise lease, or when the fleet's
// pace is at least the probe's; not otherwise.
func TestAProbeIsSeenWithTheLeaseOrUnderTheFleetsPace(t *testing.T) {
	for _, c := range []struct {
		raiser     bool
		fleet, own float64
		seen       bool
	}{
		{true, 10, 12.5, true},
		{false, 10, 12.5, false},
		{false, 12.5, 12.5, true},
		{false, 14, 12.5, true},
		{true, 14, 12.5, true},
	} {
		if got := probeSeen(c.raiser, c.fleet, c.own); got != c.seen {
			t.Errorf("probeSeen(raiser %v, fleet %v, own %v) = %v, want %v", c.raiser, c.fleet, c.own, got, c.seen)
		}
	}
}
