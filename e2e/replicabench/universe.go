package main

// Rows whose upstream is an e2e/universe draw: issue 48's rows
// (universe/<row>) and the draws -universe names (draw/<seed>), each
// through one proxy and through the replicas, the replicas held to one
// proxy's figures (+0.05×, +2 points, nothing more lost). Their ideal is
// the omniscient sender's makespan from the instant the load starts.

import (
	"fmt"
	"net/http/httptest"

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
	parsed, err := universe.ParseSeeds(seeds)
	if err != nil {
		return nil, err
	}
	for _, seed := range parsed {
		rows = append(rows, row(fmt.Sprintf("draw/%d", seed), universe.Generate(seed)))
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
