// Command mutation runs gremlins, at a pinned version, over the core
// packages and holds them to the project's thresholds: test efficacy of at
// least 90 % in every package, and no surviving mutant that is not listed,
// with the reason it survives, in survivors.txt.
//
//	go run ./scripts/mutation                  # every core package
//	go run ./scripts/mutation proxy lanequeue  # some of them
//	go run ./scripts/mutation -diff REV        # only lines changed since REV
//
// CI runs it, package by package, with -diff at the commit of the
// package's last full run, named in scripts/mutation/BASELINE, so it
// tests what changed since the figures in docs/mutation.md were measured.
//
// It prints a Markdown table of killed, lived, not covered and timed-out
// mutants per package, then every unlisted survivor, a mutant no test
// runs among them, and exits 1 when a threshold is missed. Gremlins counts a mutant NOT COVERED when no test
// runs its line, and leaves those and TIMED OUT mutants out of efficacy.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// gremlins is the pinned mutation tester; go run fetches it through the
// module proxy and caches the build.
const gremlins = "github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0"

// corePackages are the packages the thresholds hold for: the data path.
var corePackages = []string{"backoff", "headerparse", "upstream", "lanequeue", "limit", "tokens", "proxy", "redisstate", "internal/bucket"}

// minEfficacy is the lowest test efficacy, in percent, a package may have.
const minEfficacy = 90.0

func main() {
	diff := flag.String("diff", "", "only mutants on lines changed since this git revision, in the packages that hold them")
	survivorsFile := flag.String("survivors", "scripts/mutation/survivors.txt", "the listed survivors, each with its reason")
	// One test run at a time: two on this 2-core machine share its cores,
	// so a passing run may slow past the timeout and count as timed out,
	// which leaves it out of efficacy.
	workers := flag.Int("workers", 1, "gremlins' parallel test runs (0: one per CPU)")
	// Gremlins times a mutant out at this multiple of the package's coverage
	// run, which builds from cache; a mutant's run must compile and link
	// its package again. Its default of 3 timed out most mutants of the
	// small packages here; 10 leaves a hanging test under a minute in all.
	coefficient := flag.Int("timeout-coefficient", 10, "gremlins' timeout as a multiple of the package's test time")
	from := flag.String("report", "", "print the report of the gremlins JSON files (PACKAGE.json) in this directory, without running anything")
	flag.Parse()

	pkgs := corePackages
	if flag.NArg() > 0 {
		pkgs = flag.Args()
	}
	if *diff != "" {
		files, err := gitChanged(*diff)
		if err != nil {
			fatal(err)
		}
		pkgs = touched(pkgs, files)
		if len(pkgs) == 0 {
			fmt.Println("mutation: no Go file of a core package changed since", *diff)
			return
		}
	}
	listed, err := readSurvivors(*survivorsFile)
	if err != nil {
		fatal(err)
	}
	if *from != "" {
		// The JSON a run leaves in its directory when it was stopped
		// before its report (a run over several packages takes hours).
		results, err := readResults(*from, pkgs)
		if err != nil {
			fatal(err)
		}
		if !report(os.Stdout, results, minEfficacy, listed, sourceLine, true) {
			os.Exit(1)
		}
		return
	}
	root, err := os.Getwd() // go run ./scripts/mutation runs from the module root
	if err != nil {
		fatal(err)
	}
	tmp, err := os.MkdirTemp("", "mutation")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(tmp)

	var results []result
	for _, pkg := range pkgs {
		out := resultFile(tmp, pkg)
		start := time.Now()
		cmd := gremlinsCmd(root, pkg, out, *workers, *coefficient, *diff, os.Environ())
		// Its log stays out of the report, but when the run fails it says
		// why: a coverage run whose tests failed prints their output there.
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, os.Stderr
		if err := cmd.Run(); err != nil {
			os.Stderr.Write(lastLines(log.Bytes(), 200))
			fatal(fmt.Errorf("gremlins on %s: %w", pkg, err))
		}
		f, err := os.Open(out)
		if err != nil {
			fatal(err)
		}
		r, err := readResult(pkg, f)
		f.Close()
		if err != nil {
			fatal(err)
		}
		r.took = time.Since(start)
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "mutation: %s done in %s\n", pkg, r.took.Round(time.Second))
	}
	// A full run also holds every listing of its packages to a survivor it
	// saw; a diff run mutates only the changed lines, and cannot.
	if !report(os.Stdout, results, minEfficacy, listed, sourceLine, *diff == "") {
		os.Exit(1)
	}
}

// gremlinsCmd is one gremlins run over pkg, a directory of the module at
// root, writing its JSON to out.
//
// Its environment adds -count=1 to GOFLAGS. Gremlins times its coverage
// run, `go test -cover`, and times mutants out at a multiple of that; a
// coverage run answered from Go's test cache (the package unchanged since
// the last run) takes a second, so every mutant whose tests take longer
// than the multiple shows as timed out, survivors among them, and the
// figures change from the first run to the second.
//
// It runs in the package's directory. Gremlins names the files it mutates
// relative to the package, and with --diff matches them against the names
// `git diff` prints, which run from the module root are relative to the
// root: nothing matched, and a diff run mutated nothing. From the package's
// directory, with git's diff.relative set for the run, git prints names
// relative to the package too.
func gremlinsCmd(root, pkg, out string, workers, coefficient int, diff string, environ []string) *exec.Cmd {
	dir := filepath.Join(root, pkg)
	args := []string{"run", gremlins, "unleash", dir, "-o", out,
		"--workers", strconv.Itoa(workers)}
	if coefficient > 0 {
		args = append(args, "--timeout-coefficient", strconv.Itoa(coefficient))
	}
	if diff != "" {
		args = append(args, "--diff", diff)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	goflags := "-count=1"
	env := make([]string, 0, len(environ)+4)
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "GOFLAGS="); ok {
			goflags = strings.TrimSpace(v + " " + goflags)
			continue
		}
		if strings.HasPrefix(kv, "GIT_CONFIG_") {
			continue // the run's own git settings below
		}
		env = append(env, kv)
	}
	env = append(env, "GOFLAGS="+goflags)
	if diff != "" {
		env = append(env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=diff.relative", "GIT_CONFIG_VALUE_0=true")
	}
	cmd.Env = env
	return cmd
}

// lastLines is the end of b: its last n lines at most.
func lastLines(b []byte, n int) []byte {
	i := len(b)
	for ; n > 0 && i > 0; n-- {
		i = bytes.LastIndexByte(b[:i-1], '\n') + 1
		if i == 0 {
			break
		}
	}
	return b[i:]
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mutation:", err)
	os.Exit(2)
}

// mutant is one mutation gremlins made.
type mutant struct {
	File   string `json:"-"` // relative to the module root
	Type   string `json:"type"`
	Status string `json:"status"`
	Line   int    `json:"line"`
	Column int    `json:"column"`
}

// result is one package's run.
type result struct {
	pkg     string
	mutants []mutant
	took    time.Duration
}

func (r result) count(status string) int {
	n := 0
	for _, m := range r.mutants {
		if m.Status == status {
			n++
		}
	}
	return n
}

// efficacy is killed over killed, lived and not covered, in percent,
// leaving out the accepted survivors (listed, each with its reason: an
// equivalent mutant is no test's to kill, and a constant no coverage
// block holds is listed with the test that fails when it is applied by
// hand); 100 when none of these
// happened. A mutant no test runs lives as surely as one a test runs and
// misses: it counts as lived.
func (r result) efficacy(accepted int) float64 {
	k := r.count("KILLED")
	rest := r.count("LIVED") + r.count("NOT COVERED") - accepted
	if k+rest == 0 {
		return 100
	}
	return 100 * float64(k) / float64(k+rest)
}

// readResult reads gremlins' JSON output for pkg.
func readResult(pkg string, rd io.Reader) (result, error) {
	var out struct {
		Files []struct {
			Name      string   `json:"file_name"`
			Mutations []mutant `json:"mutations"`
		} `json:"files"`
	}
	if err := json.NewDecoder(rd).Decode(&out); err != nil {
		return result{}, fmt.Errorf("%s: gremlins output: %w", pkg, err)
	}
	r := result{pkg: pkg}
	for _, f := range out.Files {
		for _, m := range f.Mutations {
			m.File = filepath.ToSlash(filepath.Join(pkg, f.Name))
			r.mutants = append(r.mutants, m)
		}
	}
	slices.SortFunc(r.mutants, func(a, b mutant) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
	return r, nil
}

// resultFile is where pkg's gremlins JSON goes in dir: PKG.json, a
// package under another's folder (internal/bucket) named with a dash
// (internal-bucket.json).
func resultFile(dir, pkg string) string {
	return filepath.Join(dir, strings.ReplaceAll(pkg, "/", "-")+".json")
}

// readResults reads dir/PKG.json for each of pkgs that has one.
func readResults(dir string, pkgs []string) ([]result, error) {
	var results []result
	for _, pkg := range pkgs {
		f, err := os.Open(resultFile(dir, pkg))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		r, err := readResult(pkg, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	if len(results) == 0 {
		return nil, fmt.Errorf("no PACKAGE.json of %v in %s", pkgs, dir)
	}
	return results, nil
}

// survivor names a mutant that may live: where, which mutator, and the
// source line as it reads (so an edit of the line asks for a new look).
type survivor struct {
	File, Type string
	Column     int
	Code       string
}

// readSurvivors reads the list of accepted survivors. Each line is
//
//	path | MUTATOR@column | source line, trimmed | why it may live
//
// and blank lines and lines starting with # are skipped. A line without a
// reason is an error: every survivor is there for a stated reason.
func readSurvivors(path string) (map[survivor]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[survivor]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSurvivors(f)
}

func parseSurvivors(rd io.Reader) (map[survivor]string, error) {
	listed := map[survivor]string{}
	sc := bufio.NewScanner(rd)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The code may itself hold " | ": the reason follows the last one.
		parts := strings.SplitN(line, " | ", 3)
		if len(parts) < 3 {
			return nil, fmt.Errorf("survivors line %d: want path | MUTATOR@column | code | reason", n)
		}
		i := strings.LastIndex(parts[2], " | ")
		if i < 0 {
			return nil, fmt.Errorf("survivors line %d: want path | MUTATOR@column | code | reason", n)
		}
		code, reason := parts[2][:i], strings.TrimSpace(parts[2][i+3:])
		typ, col, ok := strings.Cut(parts[1], "@")
		c, err := strconv.Atoi(col)
		if !ok || err != nil {
			return nil, fmt.Errorf("survivors line %d: %q is not MUTATOR@column", n, parts[1])
		}
		if reason == "" {
			return nil, fmt.Errorf("survivors line %d: no reason", n)
		}
		listed[survivor{File: parts[0], Type: typ, Column: c, Code: strings.TrimSpace(code)}] = reason
	}
	return listed, sc.Err()
}

// sourceLine is the trimmed text of a file's line, "" when unreadable.
func sourceLine(file string, line int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	if line < 1 || line > len(lines) {
		return ""
	}
	return strings.TrimSpace(lines[line-1])
}

// report prints the table and the unlisted survivors, and says whether
// every package reached minEff and every survivor, lived or not covered,
// is listed. With full
// (a run over whole packages), every listing of a package run must name
// a survivor of the run: one whose mutant is now killed, or whose line is
// gone, is stale.
func report(w io.Writer, results []result, minEff float64, listed map[survivor]string, source func(string, int) string, full bool) bool {
	ok := true
	fmt.Fprintln(w, "| package | killed | lived | not covered | timed out | accepted | efficacy | time |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	var unlisted, stale []string
	seen := map[survivor]bool{}
	total := 0
	for _, r := range results {
		accepted := 0
		for _, m := range r.mutants {
			if m.Status != "LIVED" && m.Status != "NOT COVERED" {
				continue
			}
			code := source(m.File, m.Line)
			key := survivor{File: m.File, Type: m.Type, Column: m.Column, Code: code}
			if _, ok := listed[key]; ok {
				accepted++
				seen[key] = true
				continue
			}
			// A mutant no test runs lives as surely as one a test misses,
			// and fails the run the same way: otherwise a changed line no
			// test runs passes while the others hold the percentage.
			status := ""
			if m.Status == "NOT COVERED" {
				status = " (not covered: no test runs its line)"
			}
			unlisted = append(unlisted, fmt.Sprintf("%s:%d:%d %s%s\n    %s | %s@%d | %s | <why it may live>",
				m.File, m.Line, m.Column, m.Type, status, m.File, m.Type, m.Column, code))
		}
		total += accepted
		mark := ""
		if r.efficacy(accepted) < minEff {
			mark, ok = fmt.Sprintf(" (below %g %%)", minEff), false
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %.1f %%%s | %s |\n", r.pkg, r.count("KILLED"), r.count("LIVED"),
			r.count("NOT COVERED"), r.count("TIMED OUT"), accepted, r.efficacy(accepted), mark, r.took.Round(time.Second))
		if !full {
			continue
		}
		for s := range listed {
			if strings.HasPrefix(s.File, r.pkg+"/") && !seen[s] {
				stale = append(stale, fmt.Sprintf("%s | %s@%d | %s", s.File, s.Type, s.Column, s.Code))
			}
		}
	}
	fmt.Fprintf(w, "\n%d survivors listed in survivors.txt as equivalent or accepted.\n", total)
	if len(unlisted) > 0 {
		ok = false
		fmt.Fprintf(w, "\n%d survivors not listed: add a test that kills (or, not covered, runs) each, or list it with its reason:\n", len(unlisted))
		for _, u := range unlisted {
			fmt.Fprintln(w, u)
		}
	}
	if len(stale) > 0 {
		ok = false
		slices.Sort(stale)
		fmt.Fprintf(w, "\n%d listings name no survivor of this run (killed now, or the line is gone): drop them:\n", len(stale))
		for _, s := range stale {
			fmt.Fprintln(w, "    "+s)
		}
	}
	return ok
}

// gitChanged lists the files changed since rev, committed or not.
func gitChanged(rev string) ([]string, error) {
	out, err := exec.Command("git", "diff", "--name-only", rev, "--").Output()
	if err != nil {
		return nil, fmt.Errorf("git diff %s: %w", rev, err)
	}
	return strings.Fields(string(out)), nil
}

// touched keeps the packages among pkgs that hold one of files, a Go
// file that is not a test (a test alone has no line to mutate).
func touched(pkgs, files []string) []string {
	var out []string
	for _, p := range pkgs {
		for _, f := range files {
			if filepath.Dir(f) == p && strings.HasSuffix(f, ".go") && !strings.HasSuffix(f, "_test.go") {
				out = append(out, p)
				break
			}
		}
	}
	return out
}
