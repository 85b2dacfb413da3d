package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/llmproxy/llmproxy/internal/buildinfo"
)

func TestVersionCommand(t *testing.T) {
	for _, arg := range []string{"version", "-version", "--version"} {
		var out bytes.Buffer
		if code := run(context.Background(), nil, []string{arg}, nil, &out, io.Discard, nil); code != 0 {
			t.Fatalf("%s: exit %d", arg, code)
		}
		if out.String() != buildinfo.Read().Describe() {
			t.Errorf("%s printed %q, want the build's description", arg, out.String())
		}
		if !strings.Contains(out.String(), "go        "+runtime.Version()) {
			t.Errorf("%s does not name the Go release:\n%s", arg, out.String())
		}
	}
}

func TestHelpNamesTheBuild(t *testing.T) {
	var out bytes.Buffer
	run(context.Background(), nil, []string{"-h"}, nil, &out, io.Discard, nil)
	if want := "This is llmproxy " + buildinfo.Read().Short() + "."; !strings.Contains(out.String(), want) {
		t.Errorf("-h lacks %q", want)
	}
	if !strings.Contains(out.String(), "llmproxy version ") {
		t.Error("-h does not list the version command")
	}
}

// TestRunningProxyNamesItsBuild: the start-up log line, /healthz and the
// llmproxy_build_info metric all name the build.
func TestRunningProxyNamesItsBuild(t *testing.T) {
	pr := startProgram(t, nil)
	b := buildinfo.Read()
	line := ""
	for _, l := range strings.Split(pr.logs.String(), "\n") {
		if strings.Contains(l, "llmproxy listening") {
			line = l
		}
	}
	if !strings.Contains(line, "version="+b.Version) || !strings.Contains(line, "go="+b.GoVersion) || !strings.Contains(line, "revision=") {
		t.Errorf("start-up line does not name the build: %q", line)
	}

	resp, err := http.Get("http://" + pr.admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]any
	err = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if err != nil || health["status"] != "ok" || health["version"] != b.Version || health["goversion"] != runtime.Version() {
		t.Errorf("/healthz = %v (%v), want status ok and the build", health, err)
	}

	resp, err = http.Get("http://" + pr.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `llmproxy_build_info{goversion="` + runtime.Version() + `",revision="` + b.Revision + `",version="` + b.Version + `"} 1`
	if !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

// TestStaticBuildNamesItsCommit builds the binary as the image and the
// releases do, with stamping off as in CI, and asks it its version: the
// commit must come through the linker (a renamed variable or package would
// silently leave it out).
func TestStaticBuildNamesItsCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "llmproxy")
	const rev = "0123456789abcdef0123456789abcdef01234567"
	cmd := exec.Command("sh", "scripts/build-static.sh", bin)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(gotool)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GOFLAGS=-buildvcs=false", "LLMPROXY_REVISION="+rev, "LLMPROXY_VERSION=v9.8.7")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build-static.sh: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("llmproxy version: %v\n%s", err, out)
	}
	for _, want := range []string{"llmproxy v9.8.7\n", "revision  " + rev + "\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("llmproxy version lacks %q:\n%s", want, out)
		}
	}
}

// TestBuildInfoMetricIsDocumented: the metric table of docs/operations.md
// has llmproxy_build_info with its labels (the proxy package's check of
// that table leaves it to this package, which registers it).
func TestBuildInfoMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "| `llmproxy_build_info` | gauge | version, revision, goversion |") {
		t.Error("the metric table of docs/operations.md lacks llmproxy_build_info with its labels")
	}
}
