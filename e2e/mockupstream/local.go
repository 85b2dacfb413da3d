package mockupstream

import (
	"context"
	"slices"
	"sync"
	"time"
)

// models is a local model server's one loaded model (Config.ModelLoad > 0),
// as Ollama, LM Studio or a single-GPU vLLM hold one: requests wait in one
// line in arrival order; the head is served when its model is loaded and
// a parallel place is free; a head for another model waits until nothing
// is being served, then its model loads (ModelLoad), and only then is it
// served.
type models struct {
	load     time.Duration
	parallel int // 0 = unlimited
	done     <-chan struct{}
	now      func() time.Time

	mu      sync.Mutex
	loaded  string
	has     bool
	loading bool
	serving int
	line    []*modelWaiter
	present map[string]int // models among the requests in the handler
	most    int64          // the most distinct models present at once
	loads   int64
	swaps   int64

	mostServing int64       // the most requests served at once
	arrivals    []time.Time // when each request joined the line, in order
}

type modelWaiter struct {
	model string
	ready chan struct{}
}

func newModels(cfg Config, done <-chan struct{}) *models {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &models{load: cfg.ModelLoad, parallel: cfg.LocalParallel, done: done, now: now, present: map[string]int{}}
}

// enter waits until a request for model is served, or ctx or the server
// ends (false). leave must follow a true return.
func (m *models) enter(ctx context.Context, model string) (leave func(), ok bool) {
	w := &modelWaiter{model: model, ready: make(chan struct{})}
	m.mu.Lock()
	m.arrivals = append(m.arrivals, m.now())
	m.present[model]++
	m.most = max(m.most, int64(len(m.present)))
	m.line = append(m.line, w)
	m.pumpLocked()
	m.mu.Unlock()
	if waitOn(ctx, m.done, w.ready) {
		return func() {
			m.mu.Lock()
			m.serving--
			m.goneLocked(model)
			m.pumpLocked()
			m.mu.Unlock()
		}, true
	}
	m.mu.Lock()
	select {
	case <-w.ready: // served as it gave up
		m.serving--
	default:
		for i, x := range m.line {
			if x == w {
				m.line = append(m.line[:i], m.line[i+1:]...)
				break
			}
		}
	}
	m.goneLocked(model)
	m.pumpLocked()
	m.mu.Unlock()
	return nil, false
}

func (m *models) goneLocked(model string) {
	if m.present[model]--; m.present[model] == 0 {
		delete(m.present, model)
	}
}

// pumpLocked serves the head of the line while it can, and starts a load
// when the head wants another model and nothing is being served.
func (m *models) pumpLocked() {
	for len(m.line) > 0 && !m.loading {
		w := m.line[0]
		if m.has && m.loaded == w.model {
			if m.parallel > 0 && m.serving >= m.parallel {
				return
			}
			m.serving++
			m.mostServing = max(m.mostServing, int64(m.serving))
			m.line = m.line[1:]
			close(w.ready)
			continue
		}
		if m.serving > 0 {
			return
		}
		m.loading = true
		m.loads++
		if m.has {
			m.swaps++
		}
		model := w.model
		time.AfterFunc(m.load, func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.loading, m.loaded, m.has = false, model, true
			m.pumpLocked()
		})
		return
	}
}

// ModelStats is what a local model server saw (Config.ModelLoad > 0).
type ModelStats struct {
	// Loads counts model loads, the first included; Swaps the loads after
	// the first.
	Loads, Swaps int64
	// MaxModelsPresent is the most distinct models among the requests in
	// the server at once, served or waiting for a load: 1 means no client
	// ever had two models in flight at once.
	MaxModelsPresent int64
	// Loaded is the model loaded now ("" before the first load).
	Loaded string
	// MaxServing is the most requests served at once, from leaving the
	// line to the end of their answer: at most LocalParallel when it is set.
	MaxServing int64
	// Arrivals are the times, on Config.Now, at which the requests that
	// reached the line (every admitted one) arrived there, in arrival
	// order. Requests refused by admission are not in it.
	Arrivals []time.Time
}

// MinArrivalGap is the shortest time between two consecutive Arrivals,
// or -1 when there are fewer than two.
func (st ModelStats) MinArrivalGap() time.Duration {
	if len(st.Arrivals) < 2 {
		return -1
	}
	at := slices.SortedFunc(slices.Values(st.Arrivals), time.Time.Compare)
	gap := at[1].Sub(at[0])
	for i := 2; i < len(at); i++ {
		gap = min(gap, at[i].Sub(at[i-1]))
	}
	return gap
}

func (m *models) stats() ModelStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return ModelStats{Loads: m.loads, Swaps: m.swaps, MaxModelsPresent: m.most, Loaded: m.loaded,
		MaxServing: m.mostServing, Arrivals: slices.Clone(m.arrivals)}
}
