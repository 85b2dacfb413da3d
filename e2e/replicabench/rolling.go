package main

// rolling-restart: the load goes through a front (e2e/front: round robin
// over the replicas whose /readyz says 200, the next one when a connection
// is refused or dropped before an answer), once as it is (the row's
// baseline, "/steady") and once while the replicas are restarted one after
// another as a Kubernetes rolling update does: SIGTERM, the drain, a new
// process on the same ports and the same Redis, ready, then the next. The
// target compares the two: at most 5 % more time, 2 points more refusals
// at the upstream, none lost.

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/llmproxy/llmproxy/e2e/fleetstate"
	"github.com/llmproxy/llmproxy/e2e/front"
)

// rollingTarget's figures.
const (
	rollingRatio  = 1.05 // makespan with restarts ÷ without, at most
	rollingPoints = 2    // points of upstream refusals over the run without restarts, at most
)

// variants are a row's groups in the order they run: through one proxy
// first when solo, without its restarts first when rolling.
func variants(sc *scenario, replicas int) []group {
	switch {
	case sc.solo:
		return []group{{sc: sc, replicas: 1}, {sc: sc, replicas: replicas}}
	case sc.rolling || sc.failover != "":
		return []group{{sc: sc, replicas: replicas, steady: true}, {sc: sc, replicas: replicas}}
	}
	return []group{{sc: sc, replicas: replicas}}
}

// startFront puts a front before reps; its backends keep their addresses
// across restarts.
func startFront(reps []*replica) (*front.Server, error) {
	bs := make([]front.Backend, len(reps))
	for i, r := range reps {
		bs[i] = front.Backend{Addr: r.addr, Admin: r.admin}
	}
	return front.Start(front.Config{Backends: bs})
}

// noteFront notes where the front sent the answers and how often it went
// to another replica.
func (res *result) noteFront(fr *front.Server) {
	st := fr.Stats()
	res.notes = append(res.notes, fmt.Sprintf("front: answers by replica %v, %d tries failed over, %d requests it gave up on",
		st.Answered, st.Failovers, st.Failed))
}

// replicas is the replicas running now (a restart replaces one).
func (e *runEnv) replicas() []*replica {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.reps)
}

func (e *runEnv) replace(i int, r *replica) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reps[i] = r
}

// rollReplicas restarts each replica in turn, the first a fifth of the
// way through the load and each next one once it is ready and another
// fifth is done.
func rollReplicas(e *runEnv) error {
	for i := range e.replicas() {
		if !e.load.waitCompleted(e.ctx, (i+1)*e.load.n/5) {
			e.note("the load ended before restart %d", i)
			return nil
		}
		if err := restartOne(e, i); err != nil {
			return err
		}
	}
	return nil
}

// restartOne stops replica i with SIGTERM, waits for it to exit, notes
// what it left in Redis, and starts a new process with its environment on
// its ports.
func restartOne(e *runEnv, i int) error {
	old := e.replicas()[i]
	before, _ := fleetstate.Replicas(e.ctx, e.rdb)
	at := time.Now()
	_ = old.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-old.done:
	case <-time.After(45 * time.Second):
		old.kill()
		e.note("replica %d still draining 45s after SIGTERM: killed", i)
	case <-e.ctx.Done():
		return nil
	}
	drained := time.Since(at)
	// Its id is the one that left the fleet's set as it closed its store.
	after, _ := fleetstate.Replicas(e.ctx, e.rdb)
	left := "its id unknown (it did not leave the fleet's set)"
	for _, id := range before {
		if !slices.Contains(after, id) {
			if n, err := fleetstate.LeasesOf(e.ctx, e.rdb, id); err == nil {
				left = fmt.Sprintf("%d of its permits left in Redis", n)
			}
		}
	}
	status := "exit 0"
	if old.exitErr != nil {
		status = old.exitErr.Error()
	}
	env := append(slices.Clone(old.cmd.Env), "LLMPROXY_ADDR="+old.addr, "LLMPROXY_ADMIN_ADDR="+old.admin)
	fresh, err := startReplica(old.name+"'", old.cmd.Path, envValue(old.cmd.Env, "LLMPROXY_UPSTREAM"), env)
	if err == nil {
		err = fresh.waitReady(true, 15*time.Second)
	}
	if err != nil {
		if fresh != nil {
			fresh.kill()
		}
		return fmt.Errorf("restart of replica %d: %w", i, err)
	}
	e.replace(i, fresh)
	e.note("replica %d: SIGTERM at %s, drained in %.2fs (%s), %s; its successor ready %.2fs after the SIGTERM",
		i, fmt.Sprintf("%.1fs", at.Sub(e.start).Seconds()), drained.Seconds(), status, left, time.Since(at).Seconds())
	return nil
}

// envValue is the value of name in env, the last one set.
func envValue(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

// judgeRolling is the rolling row's target against its run without
// restarts (base), and whether v meets it.
func judgeRolling(v vals, base *vals) (text, met string) {
	text = fmt.Sprintf("vs no restarts: ≤%g× time, Δ ≤ +%d pts, 0 lost", rollingRatio, rollingPoints)
	if base == nil {
		return text, "? (no run without restarts)"
	}
	ratio := v.makespan / base.makespan
	ok := ratio <= rollingRatio && v.pct <= base.pct+rollingPoints && v.lost == 0
	met = "no"
	if ok {
		met = "yes"
	}
	return text, fmt.Sprintf("%s (×%.3f, %+.1f pts)", met, ratio, v.pct-base.pct)
}
