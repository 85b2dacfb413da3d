package lanequeue

import (
	"math"
	"time"
)

// Upstreams that send no rate-limit headers still say no, and usually say
// when to try again ("Please try again in 48ms", retry-after-ms). A lane
// whose request budget is unknown turns such a refusal into a pace: an
// empty bucket that gives one more request after the hint refills at one
// request per hint. The lane then sends at that rate, lowered by every
// shorter-paced refusal and raised a little each second without one, so a
// limit that grows is found again. Real headers, when they come, replace it.

const (
	maxRefusalHint = 10 * time.Second // longer hints are pauses, not a pace
	probeInterval  = time.Second      // how often the pace creeps up while all goes well
	probeFactor    = 1.05             // by how much
	burstSeconds   = 0.25             // the learned bucket holds this much of its rate
)

// refusedLocked learns from a refusal with the upstream's hint. Requires
// p.mu held.
func (p *pacer) refusedLocked(hint time.Duration, now time.Time) {
	if p.requests.known && !p.synthetic {
		return // the headers say more than a refusal can
	}
	p.lastRefusal = now
	if hint <= 0 || hint > maxRefusalHint {
		return
	}
	rate := 1 / hint.Seconds()
	if p.synthetic {
		rate = math.Min(rate, p.requests.rate)
	}
	p.setSyntheticLocked(rate, now)
	p.requests.avail = math.Min(p.requests.avail, 0)
}

// acceptedLocked lets the learned pace creep up after a quiet second.
// Requires p.mu held.
func (p *pacer) acceptedLocked(now time.Time) {
	if p.synthetic && now.Sub(p.lastProbe) >= probeInterval && now.Sub(p.lastRefusal) >= probeInterval {
		p.lastProbe = now
		p.setSyntheticLocked(p.requests.rate*probeFactor, now)
	}
}

func (p *pacer) setSyntheticLocked(rate float64, now time.Time) {
	b := &p.requests
	b.advance(now)
	if !p.synthetic {
		b.avail, b.at = 0, now
	}
	p.synthetic = true
	b.known = true
	b.rate = rate
	b.limit = math.Max(1, rate*burstSeconds)
	b.avail = math.Min(b.avail, b.limit)
	b.resetAt = time.Time{}
}

func (p *pacer) accepted(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acceptedLocked(now)
}

func (p *pacer) refused(hint time.Duration, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusedLocked(hint, now)
}
