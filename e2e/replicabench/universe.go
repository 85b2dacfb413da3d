package main

// Rows whose upstream is an e2e/universe draw: issue 48's rows
// (universe/<row>) and the draws -universe names (draw/<seed>), each
// through one proxy and through the replicas, the replicas held to one
// proxy's figures (+0.05×, +2 points, nothing more lost). Their ideal is
// the omniscient sender's makespan from the instant the load starts.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/e2e/universe"
)

// universeRows are the rows, then a row for each of seeds (a
// comma-separated list).
func universeRows(seeds string) ([]*scenario, error) {
	row := func(name string, d universe.Draw) *scenario {
		return &scenario{name: name, base: name, draw: &d, n: d.N, c: d.C, stream: d.Stream, solo: true,
			target: target{kind: asOneProxy}}
	}
	var rows []*scenario
	for _, r := range universe.Rows() {
		rows = append(rows, row("universe/"+r.Name, r.Draw))
	}
	for s := range strings.SplitSeq(seeds, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("-universe: %q is not a seed", s)
		}
		rows = append(rows, row("draw/"+s, universe.Generate(seed)))
	}
	return rows, nil
}

// upstream is a row's upstream on loopback: the mock, or a draw's.
type upstream interface {
	URL() string
	// counts is the requests that reached it and those it refused.
	counts() (requests, refused int64)
	Close()
}

// startUpstream starts sc's upstream.
func startUpstream(sc *scenario) upstream {
	if sc.draw != nil {
		u := universe.NewUpstream(*sc.draw)
		return &drawUpstream{Server: httptest.NewServer(u), u: u}
	}
	return mockUpstream{mockupstream.New(sc.mock)}
}

type mockUpstream struct{ *mockupstream.Server }

func (m mockUpstream) counts() (int64, int64) {
	st := m.Stats()
	return st.Requests, st.RateLimited
}

type drawUpstream struct {
	*httptest.Server
	u *universe.Upstream
}

func (d *drawUpstream) URL() string            { return d.Server.URL }
func (d *drawUpstream) counts() (int64, int64) { return d.u.Stats() }

// sendDraw sends request i of d to the replica at base.
func sendDraw(ctx context.Context, hc *http.Client, base string, d universe.Draw, i int) error {
	return universe.Send(ctx, hc, base, d, i)
}

// drawIdeal is the omniscient sender's makespan for sc's draw from start.
func drawIdeal(sc *scenario, start time.Time) time.Duration { return universe.Ideal(*sc.draw, start) }
