package lanequeue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// The model test drives a table through random sequences of acquire,
// cancel, report, retry, release, evict, sweep and clock steps, and after
// every step holds it against a plain reference model: which requests wait,
// which hold a permit, which await an answer, which groups must be alive,
// and how many requests each lane's clients count. Budgets stay unknown (reports carry no limits), so every count is
// exact.

// modelKeys are the keys the model uses: the first two share a limit group
// (same credential and model, two paths), the third is a group of its own.
var modelKeys = []Key{
	{CredentialHash: HashCredential("sk-a"), Path: "/v1/chat/completions", Model: "m"},
	{CredentialHash: HashCredential("sk-a"), Path: "/v1/responses", Model: "m"},
	{CredentialHash: HashCredential("sk-b"), Path: "/v1/chat/completions", Model: "m"},
}

// modelReq is one request the model tracks.
type modelReq struct {
	lane     *Lane
	slot     *Slot // nil until the first grant
	ctx      context.Context
	cancel   context.CancelFunc
	answered bool // its latest dispatch was reported
}

// pending is an Acquire or WaitRetry under way.
type pending struct {
	req  *modelReq
	done chan error
	slot chan *Slot
}

type model struct {
	t       *testing.T
	fc      *clock.Fake
	tb      *Table
	lanes   map[*Lane]bool // every lane ever handed out
	waiting []*pending
	held    []*modelReq // granted, holding a permit
	idle    []*modelReq // a retry's wait ended in error: holds nothing, not released
	extra   int         // counter for keys that only push lanes out
}

func newModel(t *testing.T) *model {
	fc := clock.NewFake(t0)
	return &model{t: t, fc: fc, lanes: map[*Lane]bool{},
		tb: NewTable(TableConfig{MaxLanes: 2, IdleTTL: time.Minute, Lane: Config{Concurrency: 2, MaxConcurrency: 4, MaxQueue: 3, Clock: fc}})}
}

func (m *model) get(k Key) *Lane {
	l := m.tb.laneFor(k)
	m.lanes[l] = true
	return l
}

// modelClients are the clients requests come from: none, or one of two.
var modelClients = []string{"", "a", "b"}

func (m *model) acquire(k Key, client string) {
	l := m.get(k)
	ctx, cancel := context.WithCancel(context.Background())
	req := &modelReq{lane: l, ctx: ctx, cancel: cancel}
	p := &pending{req: req, done: make(chan error, 1), slot: make(chan *Slot, 1)}
	go func() {
		s, err := l.acquireAs(ctx, 1, High, client, 0)
		p.slot <- s
		p.done <- err
	}()
	m.waiting = append(m.waiting, p)
}

func (m *model) retry(i int) {
	req := m.held[i]
	m.held = remove(m.held, i)
	p := &pending{req: req, done: make(chan error, 1)}
	go func() { p.done <- req.slot.WaitRetry(req.ctx, 0) }()
	m.waiting = append(m.waiting, p)
}

// cancel ends the i-th waiting call and waits for it to return: it leaves
// the queue in its own goroutine, so until then the queue still counts it.
func (m *model) cancel(i int) {
	p := m.waiting[i]
	m.waiting = remove(m.waiting, i)
	p.req.cancel()
	select {
	case err := <-p.done:
		m.returned(p, err)
	case <-time.After(5 * time.Second):
		m.t.Fatal("a cancelled wait did not return")
	}
}

func remove[T any](s []T, i int) []T { return append(s[:i:i], s[i+1:]...) }

// settle waits until every pending call has either returned or is counted
// in its lane's queue, and takes in what returned.
func (m *model) settle() {
	deadline := time.Now().Add(5 * time.Second)
	for {
		still := m.waiting[:0]
		for _, p := range m.waiting {
			select {
			case err := <-p.done:
				m.returned(p, err)
			default:
				still = append(still, p)
			}
		}
		m.waiting = still
		queued := 0
		for l := range m.lanes {
			l.g.mu.Lock()
			queued += l.queued
			l.g.mu.Unlock()
		}
		if queued == len(m.waiting) {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("did not settle: %d waiting calls, %d queued", len(m.waiting), queued)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (m *model) returned(p *pending, err error) {
	req := p.req
	if p.slot != nil { // an Acquire
		if s := <-p.slot; s != nil {
			req.slot = s
		}
	}
	switch {
	case err == nil:
		req.answered = false
		m.held = append(m.held, req)
	case req.slot != nil:
		m.idle = append(m.idle, req) // a retry's wait failed: release is still due
	default:
		req.cancel() // an Acquire that failed leaves nothing behind
	}
}

// check holds the table against the model.
func (m *model) check(step string) {
	m.t.Helper()
	type counts struct{ queued, inFlight, unanswered, live int }
	byLane := map[*Lane]*counts{}
	byGroup := map[*group]*counts{}
	add := func(l *Lane, f func(c *counts)) {
		if byLane[l] == nil {
			byLane[l] = &counts{}
		}
		if byGroup[l.g] == nil {
			byGroup[l.g] = &counts{}
		}
		f(byLane[l])
		f(byGroup[l.g])
	}
	for _, p := range m.waiting {
		add(p.req.lane, func(c *counts) { c.queued++; c.live++ })
	}
	for _, r := range m.held {
		add(r.lane, func(c *counts) {
			c.inFlight++
			c.live++
			if !r.answered {
				c.unanswered++
			}
		})
	}
	for _, r := range m.idle {
		add(r.lane, func(c *counts) { c.live++ })
	}
	inTable := map[*group]int{}
	for _, l := range m.tb.allLanes() {
		inTable[l.g]++
	}
	groups := map[*group]bool{}
	for l := range m.lanes {
		groups[l.g] = true
		want := byLane[l]
		if want == nil {
			want = &counts{}
		}
		l.g.mu.Lock()
		q, f, live := l.queued, l.inFlight, l.client.live
		for _, c := range l.named {
			live += c.live
		}
		l.g.mu.Unlock()
		if q != want.queued || f != want.inFlight || live != want.live {
			m.t.Fatalf("%s: lane %s queued %d in flight %d, its clients count %d; model %d, %d, %d", step, l.key.Path, q, f, live, want.queued, want.inFlight, want.live)
		}
	}
	m.tb.mu.Lock()
	alive := map[*group]bool{}
	for _, g := range m.tb.groups {
		alive[g] = true
	}
	m.tb.mu.Unlock()
	for g := range groups {
		want := byGroup[g]
		if want == nil {
			want = &counts{}
		}
		g.mu.Lock()
		refs, unanswered, permits := int(g.refs.Load()), 0, 0
		g.limMu.Lock()
		limits := map[*pool]bool{}
		for _, lim := range g.limits {
			limits[lim] = true
		}
		g.limMu.Unlock()
		for lim := range limits {
			v := lim.shared.View(g.clock.Now())
			unanswered += lim.unanswered
			permits += v.InFlight
			if v.InFlight > max(v.Concurrency, want.inFlight) || v.Concurrency < 1 || v.Concurrency > 4 {
				g.mu.Unlock()
				m.t.Fatalf("%s: %d permits out, limit %d", step, v.InFlight, v.Concurrency)
			}
		}
		g.mu.Unlock()
		wantRefs := inTable[g] + want.live
		if refs != wantRefs || unanswered != want.unanswered || permits != want.inFlight {
			m.t.Fatalf("%s: group refs %d unanswered %d permits %d; model %d, %d, %d", step, refs, unanswered, permits, wantRefs, want.unanswered, want.inFlight)
		}
		if alive[g] != (wantRefs > 0) {
			m.t.Fatalf("%s: group in the table: %v, but %d lanes and %d requests use it", step, alive[g], inTable[g], want.live)
		}
	}
}

// run applies the operations the bytes encode, two bytes each.
func (m *model) run(ops []byte) {
	verdicts := []limit.Verdict{limit.Accepted, limit.RateRefused, limit.ConcurrencyRefused, limit.Overloaded, limit.Failed, limit.NotSent}
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%9, int(ops[i+1])
		var step string
		switch op {
		case 0, 1:
			step = "acquire"
			if len(m.waiting) < 12 {
				m.acquire(modelKeys[arg%len(modelKeys)], modelClients[arg/len(modelKeys)%len(modelClients)])
			}
		case 2:
			step = "cancel"
			if n := len(m.waiting); n > 0 {
				m.cancel(arg % n)
			}
		case 3:
			step = "report"
			if n := len(m.held); n > 0 {
				r := m.held[arg%n]
				v := verdicts[(arg/16)%len(verdicts)]
				rep := limit.Report{Status: 200, Verdict: v}
				if v == limit.RateRefused && arg%2 == 0 {
					rep.Status, rep.PauseUntil = 429, m.fc.Now().Add(100*time.Millisecond)
				}
				r.slot.Report(rep)
				r.answered = true
			}
		case 4:
			step = "retry"
			if n := len(m.held); n > 0 {
				m.retry(arg % n)
			}
		case 5:
			step = "release"
			if n := len(m.held) + len(m.idle); n > 0 {
				j := arg % n
				var r *modelReq
				if j < len(m.held) {
					r, m.held = m.held[j], remove(m.held, j)
				} else {
					r, m.idle = m.idle[j-len(m.held)], remove(m.idle, j-len(m.held))
				}
				r.slot.release()
				r.cancel()
			}
		case 6:
			step = "evict"
			m.extra++
			m.get(Key{CredentialHash: HashCredential("sk-other"), Path: fmt.Sprintf("/p%d", m.extra)})
		case 7:
			step = "advance"
			m.fc.Advance(time.Duration(arg%4) * 100 * time.Millisecond)
		case 8:
			step = "sweep"
			m.fc.Advance(time.Minute)
			m.tb.sweep()
		}
		m.settle()
		m.check(fmt.Sprintf("op %d (%s)", i/2, step))
	}
	// Wind down: every request gives up or ends; then only the table's own
	// lanes keep groups alive, and a sweep past the TTL drops them all.
	for _, p := range m.waiting {
		p.req.cancel()
	}
	for len(m.waiting) > 0 {
		m.settle()
	}
	for _, r := range append(m.held, m.idle...) {
		r.slot.release()
		r.cancel()
	}
	m.held, m.idle = nil, nil
	m.check("wind-down")
	m.fc.Advance(2 * time.Minute)
	m.tb.sweep()
	m.check("final sweep")
	if n := m.tb.groupCount(); n != 0 {
		m.t.Fatalf("%d groups left after every lane went idle and was swept", n)
	}
}

func FuzzLaneModel(f *testing.F) {
	seeds := [][]byte{
		{0, 0, 0, 1, 0, 2, 3, 0, 5, 0},               // acquire across groups, report, release
		{0, 0, 0, 0, 0, 0, 2, 1, 5, 0, 5, 0},         // a waiter cancelled behind two holders
		{0, 0, 3, 18, 4, 0, 7, 1, 3, 0, 5, 0},        // a refusal with a pause, then a retry
		{0, 0, 0, 2, 6, 0, 6, 0, 2, 0, 5, 0, 8, 0},   // lanes evicted while busy
		{0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 6, 0, 2, 2},   // queue full, eviction, cancel
		{0, 1, 3, 32, 4, 0, 2, 0, 5, 0, 8, 0},        // concurrency refusal, cancelled retry
		{0, 0, 3, 80, 4, 0, 3, 0, 5, 0, 0, 0, 5, 0},  // a connection error gives its charge back
		{0, 0, 0, 1, 3, 48, 3, 49, 4, 0, 4, 1, 7, 3}, // overloaded answers, two retries
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 400 {
			ops = ops[:400]
		}
		newModel(t).run(ops)
	})
}
