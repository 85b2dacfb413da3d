package main

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/redistest"
)

// TestFleetTiny runs the fleet mode small (two replicas, one-second
// phases), on one redis-server and on a Redis Cluster, and reads the
// figures it prints back from its tables: requests went through with and
// without Redis, and Redis did work for each one.
func TestFleetTiny(t *testing.T) {
	redistest.Need(t, "redis-server")
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := buildLLMProxy(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, cluster := range []bool{false, true} {
		t.Run(map[bool]string{false: "standalone", true: "cluster"}[cluster], func(t *testing.T) {
			if cluster {
				redistest.Need(t, "redis-cli")
			}
			o := options{bin: bin, redisBin: redisBin, tmp: t.TempDir(), reqTimeout: 10 * time.Second}
			fo := &fleetOptions{counts: []int{2}, duration: time.Second, inFlight: 8, rate: 50, keys: 1, concurrency: 64, cluster: cluster}
			var out bytes.Buffer
			if err := runFleet(ctx, o, fo, &out); err != nil {
				t.Fatalf("runFleet: %v\n%s", err, out.String())
			}
			checkFleetOutput(t, out.String(), cluster)
		})
	}
}

// checkFleetOutput checks the figures of the two-replica row.
func checkFleetOutput(t *testing.T, text string, cluster bool) {
	t.Helper()
	t.Log(text)
	through := tableRow(t, text, "admissions/s with Redis", "2")
	for _, col := range []string{"admissions/s without Redis", "admissions/s with Redis", "round trips/request",
		"Redis µs in scripts/request", "Redis CPU ms/1,000 requests", "requests/s one Redis core serves"} {
		if v := number(t, through[col]); v <= 0 {
			t.Errorf("%s = %v, want > 0", col, v)
		}
	}
	// "44.53 (3.02)": commands, then script runs, per request.
	cmds, runs, _ := strings.Cut(through["Redis commands/request (script runs)"], " ")
	if c, r := number(t, cmds), number(t, strings.Trim(runs, "()")); r <= 0 || c < r {
		t.Errorf("Redis commands/request %v, script runs %v: want runs > 0 and commands at least as many", c, r)
	}

	paced := tableRow(t, text, "p99 Redis adds", "2")
	for _, col := range []string{"p50 without Redis", "p50 with Redis", "p99 without Redis", "p99 with Redis"} {
		if v := number(t, paced[col]); v <= 0 {
			t.Errorf("%s = %v ms, want > 0", col, v)
		}
	}
	if p50, p99 := number(t, paced["p50 with Redis"]), number(t, paced["p99 with Redis"]); p99 < p50 {
		t.Errorf("p99 with Redis %v ms below its p50 %v ms", p99, p50)
	}
	want := "CPU in the closed loop with Redis: redis-server"
	if cluster {
		want = "CPU in the closed loop with Redis: the cluster's primaries"
	}
	if !strings.Contains(text, want) {
		t.Errorf("no %q in:\n%s", want, text)
	}
}

// tableRow finds the markdown table whose header has column and returns
// its row whose first cell is first, by header.
func tableRow(t *testing.T, text, column, first string) map[string]string {
	t.Helper()
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if !strings.HasPrefix(line, "|") || !strings.Contains(line, "| "+column+" |") {
			continue
		}
		header := cells(line)
		for _, row := range lines[i+2:] {
			if !strings.HasPrefix(row, "|") {
				break
			}
			if c := cells(row); len(c) == len(header) && c[0] == first {
				m := map[string]string{}
				for k, h := range header {
					m[h] = c[k]
				}
				return m
			}
		}
	}
	t.Fatalf("no table with column %q and a row %q in:\n%s", column, first, text)
	return nil
}

func cells(line string) []string {
	parts := strings.Split(strings.Trim(line, "|"), "|")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

func number(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), " %"), 64)
	if err != nil {
		t.Fatalf("%q is not a number: %v", s, err)
	}
	return v
}
