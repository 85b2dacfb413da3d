package lanequeue

import "time"

// History is a lane's recent throughput: answers given and upstream 429s,
// per bucket of BucketSeconds, oldest first, the last bucket being the
// one that holds End.
type History struct {
	BucketSeconds int       `json:"bucket_seconds"`
	End           time.Time `json:"end"`
	Answers       []uint32  `json:"answers"`
	Upstream429   []uint32  `json:"upstream_429"`
}

const (
	// historyBucket is one bar of the dashboard's chart.
	historyBucket = 5 * time.Second
	// historyBuckets cover the last five minutes.
	historyBuckets = 60
)

// history is a ring of counts per historyBucket; idx is the bucket number
// (time since the epoch / historyBucket) of the newest slot.
type history struct {
	idx      int64
	answers  [historyBuckets]uint32
	refusals [historyBuckets]uint32
}

func bucketOf(t time.Time) int64 { return t.UnixNano() / int64(historyBucket) }

// ring is bucket b's slot; b may be negative under a test clock.
func ring(b int64) int { return int((b%historyBuckets + historyBuckets) % historyBuckets) }

// advance moves the ring forward to now's bucket, clearing what it skips.
func (h *history) advance(now time.Time) {
	b := bucketOf(now)
	if b <= h.idx {
		return
	}
	if b-h.idx >= historyBuckets {
		h.answers, h.refusals = [historyBuckets]uint32{}, [historyBuckets]uint32{}
	} else {
		for i := h.idx + 1; i <= b; i++ {
			h.answers[ring(i)], h.refusals[ring(i)] = 0, 0
		}
	}
	h.idx = b
}

// slot returns the ring index for t, or -1 when t is older than the ring.
func (h *history) slot(t time.Time) int {
	h.advance(t)
	b := bucketOf(t)
	if h.idx-b >= historyBuckets {
		return -1
	}
	return ring(b)
}

func (h *history) answer(now time.Time) {
	if i := h.slot(now); i >= 0 {
		h.answers[i]++
	}
}

func (h *history) refusal(now time.Time) {
	if i := h.slot(now); i >= 0 {
		h.refusals[i]++
	}
}

// view returns the ring as of now, oldest bucket first.
func (h *history) view(now time.Time) History {
	h.advance(now)
	v := History{
		BucketSeconds: int(historyBucket / time.Second),
		End:           time.Unix(0, (h.idx+1)*int64(historyBucket)).UTC(),
		Answers:       make([]uint32, historyBuckets),
		Upstream429:   make([]uint32, historyBuckets),
	}
	for k := range historyBuckets {
		i := ring(h.idx + 1 + int64(k))
		v.Answers[k], v.Upstream429[k] = h.answers[i], h.refusals[i]
	}
	return v
}
