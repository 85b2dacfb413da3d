package lanequeue

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/clock"
)

// DefaultFairness is how long a modelGate lets the loaded model's
// requests go ahead of a waiting request for another model.
const DefaultFairness = 30 * time.Second

// modelGate keeps a local model server to one model at a time. A request
// enters before its lane; requests for the loaded model enter at once,
// others wait until the loaded model has nothing in flight. Then the model
// whose request has waited longest is loaded, and all its waiters enter.
// While another model waits, the loaded one keeps entering new requests
// until the fairness bound passes (counted from the later of that wait's
// start and the last swap, so at most one swap in a bound is forced);
// then it stops, and the swap follows its last answer.
type modelGate struct {
	fairness time.Duration
	clock    clock.Clock

	mu         sync.Mutex
	loaded     string
	hasLoaded  bool
	inFlight   int
	draining   bool // the fairness bound passed: the loaded model takes no more
	queues     map[string]*list.List
	waiting    int
	lastSwap   time.Time
	timer      clock.Timer
	timerGen   uint64
	loads      int64
	swaps      int64
	arrivals   int64
	arrSwaps   int64 // model changes between consecutive arrivals
	lastArrive string
}

type gateWaiter struct {
	model   string
	arrived time.Time
	ready   chan struct{}
	elem    *list.Element
}

// newModelGate returns a gate with the fairness bound (zero =
// DefaultFairness) on clock c (nil = the wall clock).
func newModelGate(fairness time.Duration, c clock.Clock) *modelGate {
	if fairness <= 0 {
		fairness = DefaultFairness
	}
	if c == nil {
		c = clock.Real{}
	}
	return &modelGate{fairness: fairness, clock: c, queues: map[string]*list.List{}}
}

// enter waits until a request for model may go to the server, or ctx is
// done; waited says it did not enter at once. leave must be called once
// the request's answer has ended (more calls do nothing).
func (m *modelGate) enter(ctx context.Context, model string) (leave func(), waited bool, err error) {
	m.mu.Lock()
	now := m.clock.Now()
	m.arrivals++
	if m.arrivals > 1 && model != m.lastArrive {
		m.arrSwaps++
	}
	m.lastArrive = model
	if m.hasLoaded && m.loaded == model && !m.draining {
		m.inFlight++
		m.mu.Unlock()
		return m.leaver(), false, nil
	}
	if m.inFlight == 0 && m.waiting == 0 {
		m.loadLocked(model, now)
		m.inFlight++
		m.mu.Unlock()
		return m.leaver(), false, nil
	}
	w := &gateWaiter{model: model, arrived: now, ready: make(chan struct{})}
	q := m.queues[model]
	if q == nil {
		q = list.New()
		m.queues[model] = q
	}
	w.elem = q.PushBack(w)
	m.waiting++
	m.armLocked(now)
	m.mu.Unlock()

	select {
	case <-w.ready:
		return m.leaver(), true, nil
	case <-ctx.Done():
	}
	m.mu.Lock()
	select {
	case <-w.ready: // entered while giving up
		m.leaveLocked()
	default:
		q.Remove(w.elem)
		m.waiting--
		if q.Len() == 0 {
			delete(m.queues, model)
		}
	}
	m.mu.Unlock()
	return nil, true, deadlineErr(ctx.Err())
}

func (m *modelGate) leaver() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.leaveLocked()
			m.mu.Unlock()
		})
	}
}

func (m *modelGate) leaveLocked() {
	m.inFlight--
	if m.inFlight == 0 && m.waiting > 0 {
		m.swapLocked(m.clock.Now())
	}
}

// loadLocked makes model the loaded one. Requires m.mu held.
func (m *modelGate) loadLocked(model string, now time.Time) {
	if m.hasLoaded && m.loaded == model {
		m.draining = false
		return
	}
	if m.hasLoaded {
		m.swaps++
	}
	m.loads++
	m.loaded, m.hasLoaded, m.lastSwap = model, true, now
	m.draining = false
	if m.timer != nil {
		// The bound counts again from this load.
		m.timer.Stop()
		m.timer = nil
		m.timerGen++
	}
}

// swapLocked loads the model whose request waited longest and lets all of
// its waiters in. Requires m.mu held, nothing in flight.
func (m *modelGate) swapLocked(now time.Time) {
	var next *gateWaiter
	for _, q := range m.queues {
		w := q.Front().Value.(*gateWaiter)
		if next == nil || w.arrived.Before(next.arrived) {
			next = w
		}
	}
	m.loadLocked(next.model, now)
	q := m.queues[next.model]
	delete(m.queues, next.model)
	for e := q.Front(); e != nil; e = e.Next() {
		m.inFlight++
		m.waiting--
		close(e.Value.(*gateWaiter).ready)
	}
	m.armLocked(now)
}

// armLocked sets the fairness timer for the oldest request waiting for
// another model. Requires m.mu held.
func (m *modelGate) armLocked(now time.Time) {
	if m.draining || m.waiting == 0 || m.timer != nil {
		return
	}
	var oldest time.Time
	for model, q := range m.queues {
		if model == m.loaded {
			continue
		}
		if a := q.Front().Value.(*gateWaiter).arrived; oldest.IsZero() || a.Before(oldest) {
			oldest = a
		}
	}
	if oldest.IsZero() {
		return
	}
	at := clock.Later(oldest, m.lastSwap).Add(m.fairness)
	m.timerGen++
	gen := m.timerGen
	m.timer = m.clock.AfterFunc(max(at.Sub(now), 0), func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.timerGen != gen {
			return
		}
		m.timer = nil
		m.draining = true
		if m.inFlight == 0 && m.waiting > 0 {
			m.swapLocked(m.clock.Now())
		}
	})
}

// GateStats is what a modelGate shows.
type GateStats struct {
	Route    string `json:"route"` // the local route's name
	Loaded   string `json:"loaded_model"`
	InFlight int    `json:"in_flight"`
	Waiting  int    `json:"waiting"`
	Draining bool   `json:"draining,omitempty"`
	Loads    int64  `json:"loads"`
	Swaps    int64  `json:"swaps"`
	// SwapsAvoided is how many more swaps arrival order would have made:
	// the model changes between consecutive arrivals, less Swaps.
	SwapsAvoided int64 `json:"swaps_avoided"`
	// FairnessSeconds is the bound a waiting model is held to.
	FairnessSeconds float64 `json:"fairness_seconds"`
}

// Stats is the gate's state now.
func (m *modelGate) Stats() GateStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return GateStats{Loaded: m.loaded, InFlight: m.inFlight, Waiting: m.waiting, Draining: m.draining,
		Loads: m.loads, Swaps: m.swaps, SwapsAvoided: max(m.arrSwaps-m.swaps, 0), FairnessSeconds: m.fairness.Seconds()}
}
