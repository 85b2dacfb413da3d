package proxy

import (
	"context"
	"sync"
)

// attemptWatch ends an attempt: when the deadline comes before the answer's
// headers arrive (timedOut), and at Stop, before or after them.
type attemptWatch struct {
	p        *Proxy
	cancel   context.CancelFunc // cancels the attempt's context
	mu       sync.Mutex
	headers  bool        // the answer's headers arrived
	timedOut bool        // the deadline came first
	unwatch  func() bool // stops the AfterFunc in force
	ended    bool        // end ran: deadlineDone, if it runs late, registers nothing
}

// deadlineDone runs when attempt's deadline context ends. Before the
// headers it cuts the attempt. After them it cuts it at Stop; the
// request's deadline alone does not end an answer under way, which is
// then watched for Stop only.
func (a *attemptWatch) deadlineDone() {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.ended:
	case !a.headers:
		a.timedOut = true
		a.cancel()
	case a.p.stopping():
		a.cancel()
	default:
		a.unwatch = context.AfterFunc(a.p.stopped, a.cancel)
	}
}

// end stops watching and cancels the attempt's context; the answer's
// body is done with. A deadlineDone already started and waiting for the
// lock finds ended, so no watch on Stop outlives the attempt. Safe to
// call more than once.
func (a *attemptWatch) end() {
	a.mu.Lock()
	a.ended = true
	unwatch := a.unwatch
	a.mu.Unlock()
	unwatch()
	a.cancel()
}
