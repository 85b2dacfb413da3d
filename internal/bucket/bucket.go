// Package bucket holds the two mechanisms that pace a limit: a token
// bucket (Bucket) and even spacing (Spacer). limit's header budgets and
// configured ceilings and redisstate's local share of the fleet's limits
// are built on them; what each learns and when stays with them.
//
// Neither reads a clock: a method that needs the time takes it, as
// golang.org/x/time/rate's Limiter does in AllowN and ReserveN, so a test
// steps time by hand. Neither is safe for concurrent use: the owner holds
// its own lock. The Lua bucket of redisstate's scripts mirrors Bucket; one
// table of cases (internal/bucketcases) holds both to the same answers.
package bucket

import (
	"math"
	"time"
)

// MaxWait bounds one wait Admit gives, so that a tiny rate cannot
// overflow a time.Duration: the caller asks again then.
const MaxWait = 24 * time.Hour

// Bucket is a token bucket: it holds at most Size tokens and refills at
// Rate tokens a second. Its level is kept as of a time, the latest it was
// refilled to (At); the operations that take no time (Charge, Refund,
// Settle, Set) apply there. The level may go negative: the bucket then
// owes, and refills its debt first.
//
// The zero Bucket is empty, refills at nothing, and starts its time at
// its first Refill. Size and Rate may change at any time; a change counts
// from At, so refill to now first, as x/time/rate's SetLimitAt does.
type Bucket struct {
	// Size is the most the bucket holds, and the most one cost is
	// charged. 0: not stated: a cost is charged whole.
	Size float64
	// Rate is the refill in tokens a second; 0: none.
	Rate float64

	level float64   // what it holds at at
	at    time.Time // zero until the first Refill
	owed  float64   // an overrun settled since the last Refill
}

// Level is what the bucket holds at At; negative when it owes. An overrun
// settled since the last Refill is not in it yet.
func (b *Bucket) Level() float64 { return b.level }

// At is the time of the level: the latest Refill's, or Set's.
func (b *Bucket) At() time.Time { return b.at }

// Set makes the bucket hold level at t, whatever it held. An overrun
// settled since the last Refill is still taken at the next.
func (b *Bucket) Set(t time.Time, level float64) { b.level, b.at = level, t }

// Refill brings the bucket up to now: what Rate added since At, never
// above Size, less any overrun settled since the last Refill (taken after
// the refill, since the cap would forgive it before). A now at or before
// At refills nothing and leaves At where it is: a clock that stepped back
// must not refill the same span twice. Mirrored by refill in
// redisstate/lua/bucket.lua.
func (b *Bucket) Refill(now time.Time) {
	switch {
	case b.at.IsZero():
		b.at = now
	case now.After(b.at):
		if b.Rate > 0 {
			b.level = math.Min(b.Size, b.level+b.Rate*now.Sub(b.at).Seconds())
		}
		b.at = now
	}
	b.level -= b.owed
	b.owed = 0
}

// Admit refills the bucket to now and reports whether cost fits it; if
// not, when it will, at least a millisecond on and at most MaxWait, or
// the zero time when no refill will (Rate 0). A cost larger than Size fits
// a full bucket. Mirrored by admit in redisstate/lua/bucket.lua.
func (b *Bucket) Admit(now time.Time, cost float64) (time.Time, bool) {
	b.Refill(now)
	need := b.charge(cost)
	if b.level >= need {
		return time.Time{}, true
	}
	if b.Rate <= 0 {
		return time.Time{}, false
	}
	secs := math.Min((need-b.level)/b.Rate, MaxWait.Seconds())
	return now.Add(max(time.Duration(math.Ceil(secs*float64(time.Second))), time.Millisecond)), false
}

// Charge takes what cost is charged: all of it, but never more than Size
// when Size is stated, as Admit let it go (more would stall the owner on
// a debt it never had).
func (b *Bucket) Charge(cost float64) { b.level -= b.charge(cost) }

// Refund gives back what Charge(cost) took, for a cost that was never
// spent; the bucket holds no more than Size.
func (b *Bucket) Refund(cost float64) { b.level = math.Min(b.Size, b.level+b.charge(cost)) }

// Settle swaps what a cost of estimate was charged for what it used: the
// difference back, up to Size, or an overrun owed from the next Refill.
func (b *Bucket) Settle(estimate, used float64) {
	if d := b.charge(estimate) - used; d >= 0 {
		b.level = math.Min(b.Size, b.level+d)
	} else {
		b.owed -= d
	}
}

// charge is what a cost takes from the bucket (see Charge). Mirrored by
// charge in redisstate/lua/bucket.lua.
func (b *Bucket) charge(cost float64) float64 {
	if b.Size > 0 {
		return math.Min(cost, b.Size)
	}
	return cost
}
