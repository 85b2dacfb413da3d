package main

// The failover rows: the replicas on a Redis Cluster of three primaries
// with a replica each, or on a primary watched by three Sentinels, the
// node holding their group SIGKILLed a third of the way through; judged
// against the same load on a standalone Redis nothing happens to.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmproxy/llmproxy/e2e/fleetstate"
	"github.com/llmproxy/llmproxy/internal/redistest"
)

// The kinds of scenario.failover.
const (
	clusterFailover  = "cluster"
	sentinelFailover = "sentinel"
)

// failoverPoints is how many points more refusals than the standalone
// run a failover row may have.
const failoverPoints = 2

// failoverRig is the Redis of a failover row's run.
type failoverRig struct {
	url     string
	env     []string
	cluster *redistest.Cluster
	watch   *redistest.Sentinel
}

// startFailoverRig starts the Redis of kind.
func startFailoverRig(kind string) (*failoverRig, error) {
	switch kind {
	case clusterFailover:
		c, err := redistest.StartCluster(redistest.Options{})
		if err != nil {
			return nil, err
		}
		return &failoverRig{url: c.URL(), cluster: c}, nil
	case sentinelFailover:
		s, err := redistest.StartSentinel("llm", redistest.Options{})
		if err != nil {
			return nil, err
		}
		return &failoverRig{url: s.URL(), watch: s, env: []string{"LLMPROXY_REDIS_SENTINEL_MASTER=llm"}}, nil
	}
	return nil, fmt.Errorf("no failover %q", kind)
}

func (r *failoverRig) stop() {
	if r.cluster != nil {
		r.cluster.Stop()
	}
	if r.watch != nil {
		r.watch.Stop()
	}
}

// kill SIGKILLs the node that holds the group's state: the cluster's
// primary whose slot it is, or the Sentinels' primary. It says which.
func (r *failoverRig) kill() (string, error) {
	if r.watch != nil {
		addr, err := r.watch.PrimaryAddr()
		if err != nil {
			return "", err
		}
		return "primary " + addr, r.watch.Node(addr).Kill()
	}
	primaries, err := r.cluster.Primaries()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, n := range primaries {
		cl := n.Client()
		holds, err := fleetstate.HoldsGroups(ctx, cl)
		cl.Close()
		if err == nil && holds {
			return "cluster primary " + n.Addr() + " holding the group", n.Kill()
		}
	}
	return "", errors.New("no primary holds the group's state")
}

// killHolder is a failover row's during: the node holding the group is
// SIGKILLed a third of the way through the load, or sc.killAt into it.
func killHolder(rig *failoverRig) func(*runEnv) error {
	return func(e *runEnv) error {
		if at := e.sc.killAt; at > 0 {
			select {
			case <-time.After(time.Until(e.start.Add(at))):
			case <-e.load.done:
				e.note("the load ended before %v: nothing killed", at)
				return nil
			case <-e.ctx.Done():
				return nil
			}
		} else if !e.load.waitCompleted(e.ctx, e.load.n/3) {
			e.note("the load ended before a third of it: nothing killed")
			return nil
		}
		what, err := rig.kill()
		if err != nil {
			return fmt.Errorf("%s: kill: %w", e.sc.name, err)
		}
		e.note("%s SIGKILLed at %s (%d done)", what, e.since(), e.load.completed.Load())
		return nil
	}
}

// judgeFailover is a failover row's target against the same load on a
// standalone Redis (base), and whether v meets it.
func judgeFailover(v vals, base *vals) (text, met string) {
	text = fmt.Sprintf("vs standalone Redis: 0 lost, Δ ≤ +%d pts", failoverPoints)
	if base == nil {
		return text, "? (no standalone run)"
	}
	met = "no"
	if v.lost == 0 && v.pct <= base.pct+failoverPoints {
		met = "yes"
	}
	return text, fmt.Sprintf("%s (%+.1f pts, ×%.3f time)", met, v.pct-base.pct, v.makespan/base.makespan)
}
