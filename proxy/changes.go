package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// Fleet carries the operators' changes between the replicas of the proxy
// (redisstate.Store is one): each field names what a change is about,
// its value is the change.
type Fleet interface {
	// PutChange records value under field for every replica.
	PutChange(ctx context.Context, field, value string) error
	// WatchChanges hands apply every field whose value is new to this
	// replica: those in force at once (first), then each as it changes,
	// one at a time. The replica's own PutChange's are not new to it.
	WatchChanges(apply func(field, value string, first bool))
}

// adminChange is one operator's change as the log, the answers and the
// other replicas see it.
type adminChange struct {
	Op     string        `json:"op"` // limits, reset, hold, release, clear
	Limits *limitsJSON   `json:"limits,omitempty"`
	By     string        `json:"by"`
	At     time.Time     `json:"at"`
	lim    *limit.Limits // Limits, parsed
}

// madeBy is who made a change, and when.
type madeBy struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// routeOps are the operators' changes in force on a route: its limits set
// at run time (nil: its own) and who set them, and its hold (nil: none).
type routeOps struct {
	limits *limit.Limits
	set    madeBy
	hold   *madeBy
}

// operations are the changes in force, by route ("" the default
// upstream); mu also orders the changes, so that a change's record and
// the lanes' agree.
type operations struct {
	mu     sync.Mutex
	routes map[string]*routeOps
}

// recordLocked keeps c as in force on route. Requires o.mu held.
func (o *operations) recordLocked(route string, c adminChange) {
	ops := o.routes[route]
	if ops == nil {
		ops = &routeOps{}
		o.routes[route] = ops
	}
	switch c.Op {
	case "limits", "reset":
		ops.limits, ops.set = c.lim, madeBy{By: c.By, At: c.At}
	case "hold":
		ops.hold = &madeBy{By: c.By, At: c.At}
	case "release":
		ops.hold = nil
	}
}

// limitsJSON is a route's configured limits as the admin endpoints show
// and take them: 0 (or "" for MinGap) is none.
type limitsJSON struct {
	RPM         float64 `json:"rpm"`
	TPM         float64 `json:"tpm"`
	Concurrency int     `json:"concurrency"`
	MinGap      string  `json:"min_gap"` // a Go duration: "200ms"
	Mode        string  `json:"mode"`    // ceiling or start
}
