package universe

import (
	"container/heap"
	"time"
)

// Ideal is the makespan of the omniscient sender: a client of the draw's
// concurrency that knows the upstream's true limits and sends each request
// the instant the upstream would admit it, in order within each scope
// (as a lane is in order), never refused. The run starts at start on the
// clock the aligned windows keep (the time of the first request), and is
// computed event by event, not waited.
func Ideal(d Draw, start time.Time) time.Duration {
	_, last := schedule(d, start)
	return last.Sub(start)
}

// sent is one request of the omniscient sender's: sent at t, answered at
// end.
type sent struct {
	i      int
	t, end time.Time
}

// schedule is the omniscient sender's run: each request as it was sent, in
// the order sent, and when the last answer came.
func schedule(d Draw, start time.Time) ([]sent, time.Time) {
	s := newState(d)
	var out []sent
	var running ends
	var pending []int // issued by the client, not yet sent, in order
	now, next, free := start, 0, d.C
	last := start
	for next < d.N || len(pending) > 0 || len(running) > 0 {
		for free > 0 && next < d.N {
			pending = append(pending, next)
			next++
			free--
		}
		// Send what the limits admit now, in order within each scope.
		wake := time.Time{}
		blocked := map[string]bool{}
		kept := pending[:0]
		for _, i := range pending {
			model := d.Model(i)
			sk := model
			if d.SharedModels {
				sk = ""
			}
			if blocked[sk] {
				kept = append(kept, i)
				continue
			}
			body := d.Body(i)
			v := s.admit(now, model, d.Charge(body), false)
			if v.ok {
				at := now.Add(d.answerTime(body))
				heap.Push(&running, end{at, model})
				out = append(out, sent{i, now, at})
				continue
			}
			blocked[sk] = true
			kept = append(kept, i)
			if v.wait > 0 && (wake.IsZero() || now.Add(v.wait).Before(wake)) {
				wake = now.Add(v.wait)
			}
		}
		pending = kept
		// The next event: an answer's end, a wait's end, a change of the
		// limits.
		if len(running) > 0 && (wake.IsZero() || running[0].at.Before(wake)) {
			wake = running[0].at
		}
		for _, c := range d.changes() {
			if at := s.start.Add(c); at.After(now) && (wake.IsZero() || at.Before(wake)) {
				wake = at
			}
		}
		if wake.IsZero() {
			break // nothing can happen: a request no limit can ever admit
		}
		now = wake
		for len(running) > 0 && !running[0].at.After(now) {
			e := heap.Pop(&running).(end)
			s.release(e.model)
			free++
			last = e.at
		}
	}
	return out, last
}

type end struct {
	at    time.Time
	model string
}

// ends is a min-heap of answers' ends.
type ends []end

func (h ends) Len() int           { return len(h) }
func (h ends) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h ends) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *ends) Push(x any)        { *h = append(*h, x.(end)) }
func (h *ends) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
