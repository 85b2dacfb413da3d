package redisstate

import (
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/bucket"
	"github.com/llmproxy/llmproxy/limit"
)

// TestAShareFallsBackOnTheLocalViewForWhatRedisNeverSaid: newShare is
// 1/n of the last shared limits, and each figure Redis never gave (0)
// comes from what the local state learned, if it learned it; a figure
// Redis gave wins over the local one; a rate nobody knows leaves that
// bound off (0).
func TestAShareFallsBackOnTheLocalViewForWhatRedisNeverSaid(t *testing.T) {
	t.Parallel()
	known := func(size, rate float64) limit.BudgetView {
		return limit.BudgetView{Known: true, Limit: size, PerSecond: rate}
	}
	cases := []struct {
		name string
		last limits
		v    limit.View
		n    int
		want share
	}{
		{name: "nothing known, one replica", v: limit.View{Concurrency: 4}, n: 1,
			want: share{concurrency: 4}},
		{name: "local concurrency when Redis gave none", v: limit.View{Concurrency: 6}, n: 2,
			want: share{concurrency: 3}},
		{name: "Redis' concurrency wins over the local one", last: limits{concurrency: 8}, v: limit.View{Concurrency: 2}, n: 2,
			want: share{concurrency: 4}},
		{name: "at least one permit", last: limits{concurrency: 2}, n: 5,
			want: share{concurrency: 1}},
		{name: "no replica count is one replica", last: limits{concurrency: 2}, n: 0,
			want: share{concurrency: 2}},
		{name: "local request rate when Redis gave none", v: limit.View{Concurrency: 2, Requests: known(60, 2)}, n: 2,
			want: share{concurrency: 1, gap: time.Second}},
		{name: "Redis' request rate wins", last: limits{concurrency: 2, reqRate: 4}, v: limit.View{Requests: known(60, 1)}, n: 2,
			want: share{concurrency: 1, gap: 500 * time.Millisecond}},
		{name: "an unknown local request rate is no bound", v: limit.View{Concurrency: 2, Requests: limit.BudgetView{PerSecond: 5}}, n: 1,
			want: share{concurrency: 2}},
		{name: "local token bucket when Redis gave none", v: limit.View{Concurrency: 2, Tokens: known(1000, 100)}, n: 2,
			want: share{concurrency: 1, tokens: bucket.Bucket{Rate: 50, Size: 500}}},
		{name: "Redis' token bucket wins", last: limits{concurrency: 2, tokRate: 10, tokSize: 600}, v: limit.View{Tokens: known(1000, 100)}, n: 3,
			want: share{concurrency: 1, tokens: bucket.Bucket{Rate: 10.0 / 3, Size: 200}}},
		{name: "a bucket holds at least one token", last: limits{concurrency: 2, tokRate: 1, tokSize: 1}, n: 4,
			want: share{concurrency: 1, tokens: bucket.Bucket{Rate: 0.25, Size: 1}}},
		{name: "an unknown local token rate is no bound", v: limit.View{Concurrency: 2, Tokens: limit.BudgetView{Limit: 100, PerSecond: 5}}, n: 1,
			want: share{concurrency: 2}},
	}
	for _, c := range cases {
		got := *newShare(c.last, c.v, c.n)
		c.want.n = max(c.n, 1) // what it is a share of: no replica count is one
		if got != c.want {
			t.Errorf("%s: newShare(%+v, n=%d) = %+v, want %+v", c.name, c.last, c.n, got, c.want)
		}
	}
}

// TestAShareSpacesRequestsByItsGap: with a request rate, a share admits
// one request, then none until the gap has passed; without one it admits
// every request at once.
func TestAShareSpacesRequestsByItsGap(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_000_000, 0)
	sh := newShare(limits{concurrency: 4, reqRate: 2}, limit.View{}, 1) // gap 500ms
	if _, ok := sh.admit(t0, 1); !ok {
		t.Fatal("the first request was refused")
	}
	sh.take(t0, 1)
	at, ok := sh.admit(t0.Add(100*time.Millisecond), 1)
	if ok || !at.Equal(t0.Add(500*time.Millisecond)) {
		t.Fatalf("second request 100ms later: ok %v at %v, want refused until %v", ok, at, t0.Add(500*time.Millisecond))
	}
	if _, ok := sh.admit(t0.Add(500*time.Millisecond), 1); !ok {
		t.Fatal("second request refused once the gap had passed")
	}

	free := newShare(limits{concurrency: 4}, limit.View{}, 1)
	for i := range 5 {
		if _, ok := free.admit(t0, 1); !ok {
			t.Fatalf("request %d refused by a share without a request rate", i+1)
		}
		free.take(t0, 1)
	}
}

// TestAShareTokenBucketStartsEmptyChargesAndRefills: a share's token
// bucket starts empty, so the first request waits for its tokens to
// come in; a request charged empties the bucket again, and it fills at
// the share's rate; a request larger than the bucket waits only for a
// full bucket.
func TestAShareTokenBucketStartsEmptyChargesAndRefills(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_000_000, 0)
	sh := newShare(limits{concurrency: 4, tokRate: 200, tokSize: 1000}, limit.View{}, 2) // 100/s, 500
	at, ok := sh.admit(t0, 50)
	if ok || !at.Equal(t0.Add(500*time.Millisecond)) {
		t.Fatalf("50 tokens from an empty bucket: ok %v at %v, want refused until %v", ok, at, t0.Add(500*time.Millisecond))
	}
	t1 := t0.Add(500 * time.Millisecond)
	if _, ok := sh.admit(t1, 50); !ok {
		t.Fatal("50 tokens refused once 50 had come in")
	}
	sh.take(t1, 50)
	if at, ok := sh.admit(t1, 50); ok || !at.Equal(t1.Add(500*time.Millisecond)) {
		t.Fatalf("50 tokens right after the bucket was charged: ok %v at %v, want refused until %v", ok, at, t1.Add(500*time.Millisecond))
	}
	// A request over the bucket's size waits for a full bucket (5s), not
	// forever.
	if at, ok := sh.admit(t1, 10_000); ok || !at.Equal(t1.Add(5*time.Second)) {
		t.Fatalf("10,000 tokens: ok %v at %v, want refused until the bucket is full at %v", ok, at, t1.Add(5*time.Second))
	}
	t2 := t1.Add(time.Hour) // the bucket holds no more than its size
	sh.take(t2, 10_000)
	if at, ok := sh.admit(t2, 1); ok || !at.Equal(t2.Add(10*time.Millisecond)) {
		t.Fatalf("1 token after a full bucket was charged: ok %v at %v, want refused until %v", ok, at, t2.Add(10*time.Millisecond))
	}
	// Part of the need there: only the rest is waited for (20 of 50
	// tokens in after 200ms, 30 to come at 100/s).
	t3 := t2.Add(200 * time.Millisecond)
	if at, ok := sh.admit(t3, 50); ok || !at.Equal(t3.Add(300*time.Millisecond)) {
		t.Fatalf("50 tokens with 20 in: ok %v at %v, want refused until %v", ok, at, t3.Add(300*time.Millisecond))
	}
}

// TestLocalReadsRedisTimesOnTheReplicasClock: a time on Redis' clock is
// moved by the clocks' difference; 0 (no time) stays the zero time.
func TestLocalReadsRedisTimesOnTheReplicasClock(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	if got := local(5_000, 4_000, now); !got.Equal(now.Add(time.Second)) {
		t.Errorf("local(5000, 4000) = %v, want %v", got, now.Add(time.Second))
	}
	for _, v := range []int64{0, -1} {
		if got := local(v, 4_000, now); !got.IsZero() {
			t.Errorf("local(%d, 4000) = %v, want the zero time", v, got)
		}
	}
}

// errString is an error of the tests' own.
type errString string

func (e errString) Error() string { return string(e) }

// TestAShareTakesTheMedianOfTheRecentRates: a refill rate read from
// headers that swings for a moment, low or high, leaves the share at the
// median of the recent readings; a pace learned from refusals, or a
// window found smaller, is taken as it is and starts the readings anew.
func TestAShareTakesTheMedianOfTheRecentRates(t *testing.T) {
	t.Parallel()
	lim := func(reqRate, reqSize, tokRate, tokSize float64) limits {
		return limits{concurrency: 4, reqRate: reqRate, reqSize: reqSize, tokRate: tokRate, tokSize: tokSize}
	}
	var s shared
	see := func(name string, l limits, syn bool, wantReq, wantTok float64) {
		t.Helper()
		s.seeLimits(l, syn)
		got := s.shareLimits()
		if got.reqRate != wantReq || got.tokRate != wantTok {
			t.Fatalf("%s: share rates %v req/s, %v tok/s; want %v, %v", name, got.reqRate, got.tokRate, wantReq, wantTok)
		}
		if got.reqSize != l.reqSize || got.tokSize != l.tokSize || got.concurrency != l.concurrency {
			t.Fatalf("%s: sizes or concurrency changed: %+v from %+v", name, got, l)
		}
	}
	see("first reading", lim(20, 1200, 1000, 60000), false, 20, 1000)
	see("a second, lower", lim(19, 1200, 900, 60000), false, 20, 1000)
	see("a third, between", lim(19.5, 1200, 950, 60000), false, 19.5, 950)
	for range 5 {
		see("steady", lim(20, 1200, 1000, 60000), false, 20, 1000)
	}
	see("a low reading", lim(8, 1200, 300, 60000), false, 20, 1000)
	see("a high reading", lim(37, 1200, 3000, 60000), false, 20, 1000)
	for range 40 { // the old readings are gone
		s.seeLimits(lim(10, 1200, 500, 60000), false)
	}
	see("a new level", lim(10, 1200, 500, 60000), false, 10, 500)
	see("a pace learned from refusals is taken as it is", lim(5, 1200, 500, 60000), true, 5, 500)
	see("a window found smaller is taken as it is", lim(4, 100, 200, 6000), false, 4, 200)
	see("then the median again", lim(6, 100, 300, 6000), false, 6, 300)
	see("of the readings since", lim(5, 100, 250, 6000), false, 5, 250)
}

// TestAShareMadeAgainCarriesWhatWasUsed: a share made again for a new
// number of busy replicas keeps the old one's next request time and the
// tokens left (within its own window), so a change of count is no burst.
func TestAShareMadeAgainCarriesWhatWasUsed(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	old := newShare(limits{concurrency: 6, reqRate: 6, tokRate: 600, tokSize: 600}, limit.View{}, 3)
	old.take(now, 150) // next request in 0.5 s; tokens 0 - 150
	sh := newShare(limits{concurrency: 6, reqRate: 6, tokRate: 600, tokSize: 600}, limit.View{}, 1)
	sh.carry(old)
	if !sh.requests.Next().Equal(old.requests.Next()) || sh.requests.Next().IsZero() {
		t.Fatalf("next request at %v, want the old share's %v", sh.requests.Next(), old.requests.Next())
	}
	if sh.tokens.Level() != old.tokens.Level() || !sh.tokens.At().Equal(old.tokens.At()) {
		t.Fatalf("tokens %v at %v, want the old share's %v at %v", sh.tokens.Level(), sh.tokens.At(), old.tokens.Level(), old.tokens.At())
	}
	if _, ok := sh.admit(now, 1); ok {
		t.Fatal("the share made again admitted at once what the old one had just spent")
	}
	big := &share{tokens: bucket.Bucket{Size: 10}}
	big.tokens.Set(now, 50)
	small := newShare(limits{concurrency: 6, tokRate: 30, tokSize: 30}, limit.View{}, 3) // window 10
	small.carry(big)
	if small.tokens.Level() != 10 {
		t.Fatalf("carried %v tokens into a window of %v", small.tokens.Level(), small.tokens.Size)
	}
	fresh := newShare(limits{concurrency: 6, reqRate: 6}, limit.View{}, 1)
	fresh.carry(nil)
	if !fresh.requests.Next().IsZero() {
		t.Fatal("a share made from nothing carries a next request time")
	}
}

// TestAShareWithoutATokenBoundSpendsNoTokens: tokens a share without a
// token rate let go are spent from no bucket, so a share made again with
// one starts from nothing spent, not from their debt.
func TestAShareWithoutATokenBoundSpendsNoTokens(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	old := newShare(limits{concurrency: 6, reqRate: 6}, limit.View{}, 1)
	old.take(now, 500)
	sh := newShare(limits{concurrency: 6, tokRate: 600, tokSize: 600}, limit.View{}, 1)
	sh.carry(old)
	if got := sh.tokens.Level(); got != 0 {
		t.Fatalf("the share made again holds %v tokens, want 0: the old one had no bucket to spend from", got)
	}
}

// TestAShareShowsWhatItLetsTheReplicaSend: /lanes shows a third of the
// shared figures as the rates the share paces by (a request gap of
// 300 ms is 3.33/s), and no rate the shared limits did not bound.
func TestAShareShowsWhatItLetsTheReplicaSend(t *testing.T) {
	t.Parallel()
	v := newShare(limits{concurrency: 9, reqRate: 10, tokRate: 3000, tokSize: 9000}, limit.View{}, 3).view()
	if v.Replicas != 3 || v.Concurrency != 3 || v.RequestsPerSecond < 3.33 || v.RequestsPerSecond > 3.34 || v.TokensPerSecond != 1000 {
		t.Fatalf("a third of concurrency 9, 10 requests/s and 3000 tokens/s shows as %+v", *v)
	}
	if v := newShare(limits{concurrency: 4}, limit.View{}, 2).view(); v.RequestsPerSecond != 0 || v.TokensPerSecond != 0 || v.Concurrency != 2 {
		t.Fatalf("a share of a concurrency limit alone shows as %+v", *v)
	}
}
