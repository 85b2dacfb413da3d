package proxy

import (
	"strconv"
	"sync"
	"sync/atomic"
)

// bodyClient is who a body's bytes are counted to, for the fair shares:
// its address (the peer's IP, without the port) and, when the request
// carries one, its credential. Both are kept as hashes of a seed of the
// proxy's own, never as written.
type bodyClient struct {
	addr, cred uint64
	hasCred    bool
}

// bodyBound is one of the bounds on what request bodies hold: memory
// (MaxBufferedBytes) or spool files (MaxSpoolBytes). Besides the total,
// it bounds each client to its fair share: while n clients hold bytes of
// it (the one asking included), one client may hold a 1/(n+1) of it, and
// never less than its floor, so that a client alone may use half of it, a
// newcomer always finds room, and a crowd still leaves each the largest
// body and a sixteenth. Clients are
// told apart by address and by credential, each bounded so: many
// addresses with one key, or many keys from one address, are one client
// for their share.
type bodyBound struct {
	total atomic.Int64 // what all requests hold; read without mu
	// max is the bound; floor the least share; setting the variable
	// that sets max and what the bodies it bounds, for the refusals.
	max, floor    int64
	setting, what string
	mu            sync.Mutex
	// byAddr and byCred are what each client holds, by address and by
	// credential; a client holding nothing is not in them.
	byAddr, byCred map[uint64]int64
}

// init makes b a bound of limit bytes, where the largest body is
// largest bytes, set by the variable setting, of the bodies what
// ("held in memory").
func (b *bodyBound) init(limit, largest int64, setting, what string) {
	b.max, b.floor, b.setting, b.what = limit, min(limit, max(limit/16, largest)), setting, what
	b.byAddr, b.byCred = map[uint64]int64{}, map[uint64]int64{}
}

// Load is what all requests hold.
func (b *bodyBound) Load() int64 { return b.total.Load() }

// share is the most one client may hold while holders hold bytes (it
// among them): a part of the bound kept for one more.
func (b *bodyBound) share(holders int) int64 {
	return max(b.floor, b.max/int64(holders+1))
}

// holders is how many clients of m hold bytes, id counted.
func holders(m map[uint64]int64, id uint64) int {
	n := len(m)
	if _, ok := m[id]; !ok {
		n++
	}
	return n
}

// take counts n more bytes as held by a request of client c, and adds
// them to mine; it refuses them (429 queue_full) when that would take the
// total past max or c past its share.
func (b *bodyBound) take(c *bodyClient, mine *int64, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total.Load()+n > b.max {
		return fail(failQueueFull, "the request bodies "+b.what+" by the proxy reached "+b.setting+"; retry later")
	}
	if h := holders(b.byAddr, c.addr); b.byAddr[c.addr]+n > b.share(h) {
		return b.overShare("address", h)
	}
	if c.hasCred {
		if h := holders(b.byCred, c.cred); b.byCred[c.cred]+n > b.share(h) {
			return b.overShare("credential", h)
		}
		b.byCred[c.cred] += n
	}
	b.byAddr[c.addr] += n
	b.total.Add(n)
	*mine += n
	return nil
}

// overShare is the refusal of a client over its share, told apart by by.
func (b *bodyBound) overShare(by string, holders int) error {
	return fail(failQueueFull, "the request bodies "+b.what+" for this client (by its "+by+") reached its fair share of "+b.setting+
		", "+strconv.FormatInt(b.share(holders), 10)+" bytes while "+strconv.Itoa(holders)+" clients hold bodies; retry later")
}

// give gives back mine, what a request of client c holds.
func (b *bodyBound) give(c *bodyClient, mine *int64) {
	n := *mine
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	drop(b.byAddr, c.addr, n)
	if c.hasCred {
		drop(b.byCred, c.cred, n)
	}
	b.total.Add(-n)
	*mine = 0
}

// drop takes n from what id holds in m, and id out of m when that is
// all it held.
func drop(m map[uint64]int64, id uint64, n int64) {
	if left := m[id] - n; left > 0 {
		m[id] = left
		return
	}
	delete(m, id)
}
