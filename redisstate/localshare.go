package redisstate

import (
	"math"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/internal/bucket"
	"github.com/llmproxy/llmproxy/limit"
)

// limits are a group's shared limits as Redis last told them: the
// concurrency limit, and each budget's window and refill per second (0:
// not known).
type limits struct {
	concurrency      int
	reqSize, reqRate float64
	tokSize, tokRate float64
}

// share is what one replica may use of a group's limits while Redis is
// away or slow: the last shared limits divided by the replicas busy
// lately, so that the replicas together send about what one proxy would,
// and one whose clients are done leaves its part to the others.
// Requests go evenly spaced; tokens come from a bucket that starts empty,
// as nothing says what the window has left.
type share struct {
	n           int // the replicas it is 1/n for
	concurrency int
	gap         time.Duration // between two requests; 0: no bound
	requests    bucket.Spacer
	tokens      bucket.Bucket // Rate 0: no bound
}

// newShare is 1/n of last, each figure falling back on what the local
// state learned when Redis never said it (a replica that started while
// Redis was away).
func newShare(last limits, v limit.View, n int) *share {
	n = max(n, 1)
	c := last.concurrency
	if c <= 0 {
		c = v.Concurrency
	}
	sh := &share{n: n, concurrency: max(1, c/n)}
	reqRate := last.reqRate
	if reqRate <= 0 && v.Requests.Known {
		reqRate = v.Requests.PerSecond
	}
	if reqRate > 0 {
		sh.gap = time.Duration(float64(n) / reqRate * float64(time.Second))
	}
	tokRate, tokSize := last.tokRate, last.tokSize
	if tokRate <= 0 && v.Tokens.Known {
		tokRate, tokSize = v.Tokens.PerSecond, v.Tokens.Limit
	}
	if tokRate > 0 {
		sh.tokens.Rate, sh.tokens.Size = tokRate/float64(n), math.Max(tokSize/float64(n), 1)
	}
	return sh
}

// view is what the share lets the replica send.
func (sh *share) view() *limit.ShareView {
	v := &limit.ShareView{Replicas: sh.n, Concurrency: sh.concurrency, TokensPerSecond: sh.tokens.Rate}
	if gap := sh.gap; gap > 0 {
		v.RequestsPerSecond = float64(time.Second) / float64(gap)
	}
	return v
}

// carry keeps what old had used (nil: nothing): the next request's time
// and the tokens left, within this share's window.
func (sh *share) carry(old *share) {
	if old == nil {
		return
	}
	sh.requests = old.requests
	sh.tokens.Set(old.tokens.At(), math.Min(old.tokens.Level(), sh.tokens.Size))
}

// admit says whether a request costing cost tokens fits the share at
// now, and if not when it will.
func (sh *share) admit(now time.Time, cost int64) (time.Time, bool) {
	at := now
	if sh.gap > 0 {
		at = clock.Later(at, sh.requests.Next())
	}
	if sh.tokens.Rate > 0 {
		if when, ok := sh.tokens.Admit(now, float64(cost)); !ok {
			at = clock.Later(at, when)
		}
	}
	if at.After(now) {
		return at, false
	}
	return time.Time{}, true
}

// take charges one request of cost tokens at now.
func (sh *share) take(now time.Time, cost int64) {
	if sh.gap > 0 {
		sh.requests.Take(now, sh.gap)
	}
	if sh.tokens.Rate > 0 {
		sh.tokens.Refill(now)
		sh.tokens.Charge(float64(cost))
	}
}
