package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestADiffRunMutatesTheChangedLinesOnly runs gremlins for real, as the
// -diff run does, on a module of its own in a git repository: a changed
// line of a tested package is mutated and its mutants killed; the lines
// that did not change are not mutated. (Before the diff run ran in the
// package's directory, it mutated nothing at all.)
func TestADiffRunMutatesTheChangedLinesOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gremlins")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.24\n")
	write("pkg/pkg.go", `package pkg

// Big says whether n is over 10.
func Big(n int) bool {
	return n > 10
}

// Small says whether n is under 3.
func Small(n int) bool {
	return n < 3
}
`)
	write("pkg/pkg_test.go", `package pkg

import "testing"

func TestBig(t *testing.T) {
	if Big(10) || !Big(11) {
		t.Fatal("Big")
	}
}

func TestSmall(t *testing.T) {
	if Small(2) == Small(3) || Small(3) || Small(4) {
		t.Fatal("Small")
	}
}
`)
	git("init", "-q")
	git("add", ".")
	git("commit", "-qm", "first")
	// Change Small's line only (the same meaning, other words).
	write("pkg/pkg.go", strings.Replace(string(must(os.ReadFile(filepath.Join(root, "pkg/pkg.go")))), "return n < 3", "return 3 > n", 1))

	out := filepath.Join(t.TempDir(), "pkg.json")
	cmd := gremlinsCmd(root, "pkg", out, 1, 10, "HEAD", os.Environ())
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gremlins: %v\n%s", err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := readResult("pkg", f)
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, m := range r.mutants {
		if m.Status != "KILLED" && m.Status != "LIVED" {
			continue
		}
		if m.Line != 10 {
			t.Errorf("a mutant on unchanged line %d: %+v", m.Line, m)
		}
		if m.Status == "KILLED" {
			killed++
		}
	}
	if killed == 0 {
		t.Fatalf("no mutant of the changed line was killed: %+v", r.mutants)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
