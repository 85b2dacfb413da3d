package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAClientFailureThroughTheProxyFailsTheBenchmark: a cell with a
// client failure through the proxy is named and fails the run; failures
// sent straight to the upstream (the direct rows) and clean cells do not.
func TestAClientFailureThroughTheProxyFailsTheBenchmark(t *testing.T) {
	clean := row{cell: "short/headers", mode: "proxy", runs: []result{{}, {}}}
	direct := row{cell: "short/silent", mode: "direct", runs: []result{{failures: 12}}}
	failing := row{cell: "streams/hint", mode: "proxy", runs: []result{{}, {failures: 1}}}
	var out strings.Builder
	if failedThroughTheProxy(&out, []row{clean, direct}) || out.Len() != 0 {
		t.Fatalf("clean proxy rows and a direct row's failures failed the run: %q", out.String())
	}
	if !failedThroughTheProxy(&out, []row{clean, direct, failing}) {
		t.Fatal("a client failure through the proxy passed")
	}
	if got := out.String(); !strings.Contains(got, "streams/hint: 1 client failures through the proxy in 2 run(s)") ||
		strings.Contains(got, "short/") {
		t.Fatalf("the message names %q; want streams/hint alone", got)
	}
}

// TestTheCommandExitsNonZeroWhenClientsFail runs the command itself (this
// test binary, as main) on a universe cell through a binary that cannot
// start, so every client fails: it prints its table and exits 1.
func TestTheCommandExitsNonZeroWhenClientsFail(t *testing.T) {
	if os.Getenv("LOADBENCH_AS_MAIN") == "1" {
		os.Args = append([]string{"loadbench"}, strings.Fields(os.Getenv("LOADBENCH_ARGS"))...)
		main()
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTheCommandExitsNonZeroWhenClientsFail$")
	cmd.Env = append(os.Environ(), "LOADBENCH_AS_MAIN=1",
		"LOADBENCH_ARGS=-scenario universe/* -bin "+t.TempDir()+"/no-such-llmproxy")
	out, err := cmd.CombinedOutput()
	exit, ok := err.(*exec.ExitError)
	if !ok || exit.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1:\n%s", err, out)
	}
	if !strings.Contains(string(out), "client failures through the proxy") {
		t.Fatalf("the output does not say why:\n%s", out)
	}
}
