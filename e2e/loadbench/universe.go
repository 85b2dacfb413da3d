package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/e2e/internal/benchcells"
	"github.com/llmproxy/llmproxy/e2e/universe"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/upstream"
)

// A universe cell is a draw of e2e/universe run on real sockets and the
// wall's clock: issue 48's rows ("universe/<row>", each with its target)
// and the draws -universe names ("draw/<seed>", held to the universe's bar
// for one draw: 1.10× and 5 %, 10 % for silent dialects). Its ideal is the
// omniscient sender's makespan from the instant the load starts. The proxy
// runs in process, or as the binary -bin names.
type universeCell struct {
	name string
	d    universe.Draw
}

// universeCells is the rows, then a draw for each seed in seeds (a
// comma-separated list).
func universeCells(seeds string) ([]universeCell, error) {
	var cs []universeCell
	for _, r := range universe.Rows() {
		cs = append(cs, universeCell{"universe/" + r.Name, r.Draw})
		targets["universe/"+r.Name] = target{r.Ratio, r.Refused}
	}
	parsed, err := universe.ParseSeeds(seeds)
	if err != nil {
		return nil, err
	}
	for _, seed := range parsed {
		d := universe.Generate(seed)
		name := fmt.Sprintf("draw/%d", seed)
		t := target{1.10, 5}
		if universe.SilentDialect(d.Dialect) {
			t.pct = 10
		}
		targets[name] = t
		cs = append(cs, universeCell{name, d})
	}
	return cs, nil
}

// pickCells picks, by each of list's comma-separated patterns, the mock's
// cells and the universe's; a pattern that picks from neither is an error.
func pickCells(cells []benchcells.Cell, ucells []universeCell, list string) ([]benchcells.Cell, []universeCell, error) {
	if strings.TrimSpace(list) == "" {
		return cells, ucells, nil
	}
	var picked []benchcells.Cell
	var upicked []universeCell
	seen := map[string]bool{}
	for item := range strings.SplitSeq(list, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		a, errA := benchcells.Pick(cells, func(c benchcells.Cell) string { return c.Name }, item, "cell")
		b, errB := benchcells.Pick(ucells, func(c universeCell) string { return c.name }, item, "cell")
		if errA != nil && errB != nil {
			return nil, nil, errA
		}
		for _, c := range a {
			if !seen[c.Name] {
				seen[c.Name] = true
				picked = append(picked, c)
			}
		}
		for _, c := range b {
			if !seen[c.name] {
				seen[c.name] = true
				upicked = append(upicked, c)
			}
		}
	}
	return picked, upicked, nil
}

// runUniverse runs one universe cell through the proxy.
func runUniverse(uc universeCell, bin string, timeout time.Duration) result {
	d := uc.d
	up := universe.NewUpstream(d)
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	base, stop, err := startProxy(upSrv.URL, bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadbench: %s: %v\n", uc.name, err)
		return result{cell: uc.name, mode: "proxy", n: d.N, c: d.C, failures: d.N, ideal: time.Second}
	}
	defer stop()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * d.C}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	var mu sync.Mutex
	failures := 0
	sem := make(chan struct{}, d.C)
	var wg sync.WaitGroup
	start := time.Now()
	ideal := universe.Ideal(d, start)
	for i := range d.N {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := universe.Send(ctx, hc, base, d, i); err != nil {
				mu.Lock()
				failures++
				if failures <= showFailures {
					fmt.Fprintf(os.Stderr, "%s: request %d: %v\n", uc.name, i, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	requests, refused := up.Stats()
	return result{cell: uc.name, mode: "proxy", n: d.N, c: d.C, makespan: time.Since(start), ideal: ideal,
		failures: failures, upstreamRequests: requests, upstream429: refused}
}

// startProxy starts a proxy in front of upstreamURL: in process, or the
// binary bin on a free loopback port. It returns the proxy's base URL.
func startProxy(upstreamURL, bin string) (base string, stop func(), err error) {
	if bin == "" {
		u, _ := url.Parse(upstreamURL)
		tr := upstream.NewTransport()
		p, err := proxy.New(proxy.Config{Upstream: u, MaxRetries: proxy.DefaultMaxRetries, Transport: tr,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return "", nil, err
		}
		front := httptest.NewServer(p)
		return front.URL, func() { front.Close(); p.Stop(); tr.CloseIdleConnections() }, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "LLMPROXY_ADDR="+addr, "LLMPROXY_ADMIN_ADDR=127.0.0.1:0",
		"LLMPROXY_UPSTREAM="+upstreamURL, "LLMPROXY_LOG_LEVEL=warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return "http://" + addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("%s did not listen on %s in 10 s", bin, addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
