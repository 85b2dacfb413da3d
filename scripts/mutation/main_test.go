package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const sample = `{"go_module":"m","files":[{"file_name":"a.go","mutations":[
 {"type":"CONDITIONALS_BOUNDARY","status":"KILLED","line":3,"column":5},
 {"type":"CONDITIONALS_BOUNDARY","status":"LIVED","line":4,"column":9},
 {"type":"ARITHMETIC_BASE","status":"LIVED","line":5,"column":2},
 {"type":"ARITHMETIC_BASE","status":"NOT COVERED","line":6,"column":2},
 {"type":"INVERT_NEGATIVES","status":"TIMED OUT","line":7,"column":2}]}]}`

func TestReportCountsAndHoldsTheThresholds(t *testing.T) {
	r, err := readResult("pkg", strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if r.mutants[0].File != "pkg/a.go" {
		t.Fatalf("file %q, want it relative to the module", r.mutants[0].File)
	}
	if r.count("KILLED") != 1 || r.count("LIVED") != 2 || r.count("NOT COVERED") != 1 || r.count("TIMED OUT") != 1 {
		t.Fatalf("counts wrong: %+v", r.mutants)
	}
	if e := r.efficacy(0); e != 25 {
		t.Fatalf("efficacy %v, want killed/(killed+lived+not covered) = 25", e)
	}
	if e := r.efficacy(1); e < 33.3 || e > 33.4 {
		t.Fatalf("efficacy %v with one survivor accepted, want 1/3 = 33.3", e)
	}
	src := func(file string, line int) string {
		return map[int]string{4: "if a < b {", 5: "x := y + 1"}[line]
	}
	listed, err := parseSurvivors(strings.NewReader(`# comment
pkg/a.go | CONDITIONALS_BOUNDARY@9 | if a < b { | a == b takes either branch to the same result
`))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if report(&out, []result{r}, minEfficacy, listed, src, false) {
		t.Fatal("33 % efficacy and an unlisted survivor passed")
	}
	if !strings.Contains(out.String(), "| pkg | 1 | 2 | 1 | 1 | 1 | 33.3 % (below 90 %)") {
		t.Fatalf("table row missing:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "2 survivors not listed") || !strings.Contains(out.String(), "pkg/a.go:5:2 ARITHMETIC_BASE\n") ||
		!strings.Contains(out.String(), "pkg/a.go:6:2 ARITHMETIC_BASE (not covered") {
		t.Fatalf("the unlisted survivor and the mutant no test runs are not named:\n%s", out.String())
	}
	// The listed line edited: the survivor needs a new look.
	edited := func(file string, line int) string { return "if a <= b {" }
	out.Reset()
	report(&out, []result{r}, minEfficacy, listed, edited, false)
	if !strings.Contains(out.String(), "3 survivors not listed") {
		t.Fatalf("an edited line kept its listing:\n%s", out.String())
	}
}

func TestReportPassesWhenEverySurvivorIsListed(t *testing.T) {
	var ms []mutant
	for i := range 19 {
		ms = append(ms, mutant{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "KILLED", Line: i + 1})
	}
	ms = append(ms, mutant{File: "p/x.go", Type: "INVERT_NEGATIVES", Status: "LIVED", Line: 30, Column: 4})
	listed := map[survivor]string{{File: "p/x.go", Type: "INVERT_NEGATIVES", Column: 4, Code: "n := -m"}: "why"}
	var out strings.Builder
	if !report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, listed, func(string, int) string { return "n := -m" }, true) {
		t.Fatalf("95 %% with its one survivor listed failed:\n%s", out.String())
	}
}

func TestAListedNotCoveredMutantIsAccepted(t *testing.T) {
	ms := []mutant{
		{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "KILLED", Line: 1},
		{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "KILLED", Line: 2},
		{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "NOT COVERED", Line: 3, Column: 8},
	}
	src := func(string, int) string { return "c = 20 * time.Millisecond" }
	var out strings.Builder
	if report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, nil, src, false) {
		t.Fatalf("an unlisted constant no test covers passed at 66.7 %%:\n%s", out.String())
	}
	listed := map[survivor]string{{File: "p/x.go", Type: "ARITHMETIC_BASE", Column: 8, Code: "c = 20 * time.Millisecond"}: "applied by hand, a test fails"}
	out.Reset()
	if !report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, listed, src, true) {
		t.Fatalf("the listed constant still failed the run:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "| p | 2 | 0 | 1 | 0 | 1 | 100.0 %") {
		t.Fatalf("table row wrong:\n%s", out.String())
	}
}

func TestSurvivorLinesNeedAReason(t *testing.T) {
	for _, bad := range []string{
		"pkg/a.go | CONDITIONALS_BOUNDARY@9 | if a < b {",
		"pkg/a.go | CONDITIONALS_BOUNDARY | if a < b { | why",
		"pkg/a.go | CONDITIONALS_BOUNDARY@9 | if a < b { |  ",
	} {
		if _, err := parseSurvivors(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	l, err := parseSurvivors(strings.NewReader("p/a.go | INVERT_LOGICAL@3 | if a || b | c { | code with a bar in it still parses"))
	if err != nil {
		t.Fatal(err)
	}
	want := survivor{File: "p/a.go", Type: "INVERT_LOGICAL", Column: 3, Code: "if a || b | c {"}
	if _, ok := l[want]; !ok {
		t.Fatalf("parsed %+v", l)
	}
}

func TestTouchedKeepsChangedPackages(t *testing.T) {
	// A test file changed alone has no line to mutate.
	got := touched(corePackages, []string{"proxy/serve.go", "README.md", "lanequeue/testdata/x", "e2e/core_test.go", "tokens/usage_test.go", "backoff/backoff.go",
		"internal/bucket/spacer.go", "internal/bucketcases/cases.go"})
	if strings.Join(got, ",") != "backoff,proxy,internal/bucket" {
		t.Fatalf("touched = %v", got)
	}
}

// TestAPackageInAFolderHasItsResultInTheRunsDirectory: gremlins writes
// its JSON where the tool says, which for internal/bucket must not be a
// folder of the run's directory that nobody made.
func TestAPackageInAFolderHasItsResultInTheRunsDirectory(t *testing.T) {
	for pkg, want := range map[string]string{"proxy": "/tmp/run/proxy.json", "internal/bucket": "/tmp/run/internal-bucket.json"} {
		if got := resultFile("/tmp/run", pkg); got != want {
			t.Errorf("resultFile(%q) = %q, want %q", pkg, got, want)
		}
	}
}

func TestGremlinsRunsBypassTheTestCache(t *testing.T) {
	cmd := gremlinsCmd("/m", "proxy", "/tmp/out.json", 1, 10, "abc123",
		[]string{"HOME=/root", "GOFLAGS=-buildvcs=false", "PATH=/bin", "GIT_CONFIG_COUNT=3"})
	var goflags []string
	for _, kv := range cmd.Env {
		if v, ok := strings.CutPrefix(kv, "GOFLAGS="); ok {
			goflags = append(goflags, v)
		}
	}
	if len(goflags) != 1 || goflags[0] != "-buildvcs=false -count=1" {
		t.Errorf("GOFLAGS = %q, want one entry keeping the caller's flags and adding -count=1", goflags)
	}
	if !slices.Contains(cmd.Env, "HOME=/root") || !slices.Contains(cmd.Env, "PATH=/bin") {
		t.Errorf("environment lost entries: %q", cmd.Env)
	}
	args := strings.Join(cmd.Args, " ")
	for _, want := range []string{gremlins + " unleash /m/proxy", "-o /tmp/out.json", "--workers 1", "--timeout-coefficient 10", "--diff abc123"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	// A diff run names files as gremlins does, relative to the package.
	if cmd.Dir != "/m/proxy" {
		t.Errorf("runs in %q, want the package's directory", cmd.Dir)
	}
	for _, want := range []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=diff.relative", "GIT_CONFIG_VALUE_0=true"} {
		if !slices.Contains(cmd.Env, want) {
			t.Errorf("env lacks %s: %q", want, cmd.Env)
		}
	}
	if slices.Contains(cmd.Env, "GIT_CONFIG_COUNT=3") {
		t.Errorf("the caller's git config count kept: %q", cmd.Env)
	}
	cmd = gremlinsCmd("/m", "tokens", "o", 1, 0, "", nil)
	if !slices.Contains(cmd.Env, "GOFLAGS=-count=1") {
		t.Errorf("env without GOFLAGS: got %q", cmd.Env)
	}
	if a := strings.Join(cmd.Args, " "); strings.Contains(a, "--diff") || strings.Contains(a, "--timeout-coefficient") {
		t.Errorf("unset options passed: %q", a)
	}
}

// TestDiffRunsHoldTheThresholdToo: a changed-lines run holds the same
// 90 % as a full one; a listed survivor is out of the count either way,
// so one equivalent mutant among five does not fail it, while a mutant no
// test runs does.
func TestDiffRunsHoldTheThresholdToo(t *testing.T) {
	ms := []mutant{{File: "p/x.go", Type: "INVERT_NEGATIVES", Status: "LIVED", Line: 9, Column: 4}}
	for i := range 4 {
		ms = append(ms, mutant{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "KILLED", Line: i + 1})
	}
	listed := map[survivor]string{{File: "p/x.go", Type: "INVERT_NEGATIVES", Column: 4, Code: "n := -m"}: "why"}
	src := func(string, int) string { return "n := -m" }
	var out strings.Builder
	if !report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, listed, src, false) {
		t.Fatalf("four killed and one listed survivor failed:\n%s", out.String())
	}
	out.Reset()
	if report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, nil, src, false) {
		t.Fatalf("a run with an unlisted survivor passed:\n%s", out.String())
	}
	uncovered := append(slices.Clone(ms), mutant{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "NOT COVERED", Line: 20})
	out.Reset()
	if report(&out, []result{{pkg: "p", mutants: uncovered}}, minEfficacy, listed, src, false) {
		t.Fatalf("four killed of five counted (one not covered) passed:\n%s", out.String())
	}
}

// TestAnUnlistedMutantNoTestRunsFailsTheRun: a changed line no test runs
// fails the run even when the killed mutants around it hold the package
// above 90 %, as a survivor would; listed with its reason, it passes.
func TestAnUnlistedMutantNoTestRunsFailsTheRun(t *testing.T) {
	var ms []mutant
	for i := range 19 {
		ms = append(ms, mutant{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "KILLED", Line: i + 1})
	}
	ms = append(ms, mutant{File: "p/x.go", Type: "CONDITIONALS_BOUNDARY", Status: "NOT COVERED", Line: 30, Column: 7})
	src := func(string, int) string { return "case n > 0:" }
	for _, full := range []bool{false, true} {
		var out strings.Builder
		if report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, nil, src, full) {
			t.Fatalf("full=%v: an unlisted mutant no test runs passed at 95 %%:\n%s", full, out.String())
		}
		if !strings.Contains(out.String(), "p/x.go:30:7 CONDITIONALS_BOUNDARY (not covered") ||
			!strings.Contains(out.String(), "p/x.go | CONDITIONALS_BOUNDARY@7 | case n > 0: | <why it may live>") {
			t.Fatalf("full=%v: the mutant is not named with its listing:\n%s", full, out.String())
		}
	}
	listed := map[survivor]string{{File: "p/x.go", Type: "CONDITIONALS_BOUNDARY", Column: 7, Code: "case n > 0:"}: "a case line; applied by hand, a test fails"}
	var out strings.Builder
	if !report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, listed, src, true) {
		t.Fatalf("the listed mutant no test runs still failed the run:\n%s", out.String())
	}
}

// TestAFullRunFailsOnAStaleListing: a full run over a package sees every
// survivor its listings name; a listing it did not see (the mutant is
// killed now, or its line changed) fails the run. A changed-lines run
// cannot tell, and does not.
func TestAFullRunFailsOnAStaleListing(t *testing.T) {
	ms := []mutant{{File: "p/x.go", Type: "ARITHMETIC_BASE", Status: "KILLED", Line: 1}}
	listed := map[survivor]string{
		{File: "p/x.go", Type: "INVERT_NEGATIVES", Column: 4, Code: "n := -m"}: "why",
		{File: "q/y.go", Type: "INVERT_NEGATIVES", Column: 4, Code: "n := -m"}: "another package's, not run",
	}
	src := func(string, int) string { return "n := -m" }
	var out strings.Builder
	if report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, listed, src, true) {
		t.Fatalf("a full run passed with a listing it saw no survivor of:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "1 listings name no survivor") || !strings.Contains(out.String(), "p/x.go | INVERT_NEGATIVES@4 | n := -m") {
		t.Fatalf("the stale listing is not named alone:\n%s", out.String())
	}
	out.Reset()
	if !report(&out, []result{{pkg: "p", mutants: ms}}, minEfficacy, listed, src, false) {
		t.Fatalf("a changed-lines run failed on a listing it could not see:\n%s", out.String())
	}
}

// TestListedSurvivorsStillReadAsListed: every listing in survivors.txt
// names a Go file of a core package, a line that file still holds, and on
// that line, at the column it names, an operator of the kind its mutator
// changes, so a listing left behind by an edit, a move or a typo fails
// every test run, not only the full mutation runs CI never makes.
func TestListedSurvivorsStillReadAsListed(t *testing.T) {
	listed, err := readSurvivors("survivors.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) == 0 {
		t.Fatal("no listings read")
	}
	for s := range listed {
		if err := checkListing(filepath.Join("..", ".."), s); err != nil {
			t.Errorf("%s | %s@%d | %s: %v", s.File, s.Type, s.Column, s.Code, err)
		}
	}
}

// TestAListingMustNameItsOperatorWhereItStands: the static check of a
// listing finds a wrong column, a mutator the operator does not take, a
// line no longer in its file, a file gone and a package the runs never
// mutate.
func TestAListingMustNameItsOperatorWhereItStands(t *testing.T) {
	root := t.TempDir()
	src := "package p\n\nfunc f(a, b int) int {\n\tif a < b {\n\t\ta++\n\t}\n\treturn -a\n}\n"
	if err := os.MkdirAll(filepath.Join(root, "backoff"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "backoff", "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s    survivor
		want string // "" when the listing holds
	}{
		{survivor{"backoff/p.go", "CONDITIONALS_BOUNDARY", 7, "if a < b {"}, ""},
		{survivor{"backoff/p.go", "CONDITIONALS_NEGATION", 7, "if a < b {"}, ""},
		{survivor{"backoff/p.go", "INCREMENT_DECREMENT", 4, "a++"}, ""},
		{survivor{"backoff/p.go", "INVERT_NEGATIVES", 9, "return -a"}, ""},
		{survivor{"backoff/p.go", "CONDITIONALS_BOUNDARY", 8, "if a < b {"}, "column 8"},
		{survivor{"backoff/p.go", "ARITHMETIC_BASE", 7, "if a < b {"}, "ARITHMETIC_BASE"},
		{survivor{"backoff/p.go", "CONDITIONALS_BOUNDARY", 7, "if a <= b {"}, "no line reads"},
		{survivor{"backoff/q.go", "CONDITIONALS_BOUNDARY", 7, "if a < b {"}, "no such file"},
		{survivor{"e2e/p.go", "CONDITIONALS_BOUNDARY", 7, "if a < b {"}, "not a core package"},
		{survivor{"backoff/p_test.go", "CONDITIONALS_BOUNDARY", 7, "if a < b {"}, "test file"},
		{survivor{"backoff/p.go", "NO_SUCH_MUTATOR", 7, "if a < b {"}, "no mutator"},
	} {
		err := checkListing(root, c.s)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.s, err)
		case c.want != "" && err == nil:
			t.Errorf("%+v held, want an error about %q", c.s, c.want)
		case c.want != "" && !strings.Contains(err.Error(), c.want):
			t.Errorf("%+v: %v, want it to say %q", c.s, err, c.want)
		}
	}
}

// mutatorTokens are the operators gremlins v0.6.0 changes under each
// mutator's name: its engine's table from operator to mutators, read the
// other way.
var mutatorTokens = map[string][]token.Token{
	"ARITHMETIC_BASE":         {token.ADD, token.SUB, token.MUL, token.QUO, token.REM},
	"CONDITIONALS_BOUNDARY":   {token.LSS, token.LEQ, token.GTR, token.GEQ},
	"CONDITIONALS_NEGATION":   {token.EQL, token.NEQ, token.LSS, token.LEQ, token.GTR, token.GEQ},
	"INCREMENT_DECREMENT":     {token.INC, token.DEC},
	"INVERT_ASSIGNMENTS":      {token.ADD_ASSIGN, token.SUB_ASSIGN, token.MUL_ASSIGN, token.QUO_ASSIGN, token.REM_ASSIGN},
	"INVERT_BITWISE":          {token.AND, token.OR, token.XOR, token.AND_NOT, token.SHL, token.SHR},
	"INVERT_BWASSIGN":         {token.AND_ASSIGN, token.OR_ASSIGN, token.XOR_ASSIGN, token.AND_NOT_ASSIGN, token.SHL_ASSIGN, token.SHR_ASSIGN},
	"INVERT_LOGICAL":          {token.LAND, token.LOR},
	"INVERT_LOOPCTRL":         {token.BREAK, token.CONTINUE},
	"INVERT_NEGATIVES":        {token.SUB},
	"REMOVE_SELF_ASSIGNMENTS": {token.ADD_ASSIGN, token.SUB_ASSIGN, token.MUL_ASSIGN, token.QUO_ASSIGN, token.REM_ASSIGN, token.AND_ASSIGN, token.OR_ASSIGN, token.XOR_ASSIGN, token.AND_NOT_ASSIGN, token.SHL_ASSIGN, token.SHR_ASSIGN},
}

// checkListing says why a listing, read against the module at root, can
// name no mutant gremlins makes, or nil when it can: its file is a Go
// file of a core package, and some line of it reads as listed and holds,
// at the listed column, an operator the listed mutator changes. Gremlins
// mutates the operators of assignments, binary and unary expressions,
// increments and branch statements, at the operator's position (its
// column counts bytes, a tab as one).
func checkListing(root string, s survivor) error {
	if !slices.Contains(corePackages, filepath.Dir(s.File)) {
		return fmt.Errorf("not a core package's file: no run mutates it")
	}
	if !strings.HasSuffix(s.File, ".go") || strings.HasSuffix(s.File, "_test.go") {
		return fmt.Errorf("not a Go file gremlins mutates (a test file or another kind)")
	}
	want, ok := mutatorTokens[s.Type]
	if !ok {
		return fmt.Errorf("no mutator of gremlins v0.6.0 is named %s", s.Type)
	}
	path := filepath.Join(root, filepath.FromSlash(s.File))
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no such file")
	}
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, b, 0)
	if err != nil {
		return err
	}
	at := map[[2]int][]token.Token{} // line and column to the operators there
	ast.Inspect(f, func(n ast.Node) bool {
		var tok token.Token
		var pos token.Pos
		switch n := n.(type) {
		case *ast.AssignStmt:
			tok, pos = n.Tok, n.TokPos
		case *ast.BinaryExpr:
			tok, pos = n.Op, n.OpPos
		case *ast.BranchStmt:
			tok, pos = n.Tok, n.TokPos
		case *ast.IncDecStmt:
			tok, pos = n.Tok, n.TokPos
		case *ast.UnaryExpr:
			tok, pos = n.Op, n.OpPos
		default:
			return true
		}
		p := fset.Position(pos)
		at[[2]int{p.Line, p.Column}] = append(at[[2]int{p.Line, p.Column}], tok)
		return true
	})
	var reading []string
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) != s.Code {
			continue
		}
		ops := at[[2]int{i + 1, s.Column}]
		for _, op := range ops {
			if slices.Contains(want, op) {
				return nil
			}
		}
		reading = append(reading, fmt.Sprintf("line %d has %v at column %d", i+1, ops, s.Column))
	}
	if len(reading) == 0 {
		return fmt.Errorf("no line reads so: look at its mutant again and list or drop it")
	}
	return fmt.Errorf("no operator %s changes: %s", s.Type, strings.Join(reading, "; "))
}

// TestReadResultsReadsEachPackagesJSON: the JSON files a stopped run left
// are read per package, and a directory holding none is an error.
func TestReadResultsReadsEachPackagesJSON(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pkg.json"), []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := readResults(dir, []string{"other", "pkg"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].pkg != "pkg" || rs[0].count("KILLED") != 1 || rs[0].count("LIVED") != 2 {
		t.Fatalf("read %+v", rs)
	}
	if _, err := readResults(t.TempDir(), []string{"pkg"}); err == nil {
		t.Fatal("an empty directory read without error")
	}
}

// TestAFailedRunShowsTheEndOfItsLog: what a failed gremlins run prints
// is its log's last lines, whole, and all of a shorter log.
func TestAFailedRunShowsTheEndOfItsLog(t *testing.T) {
	log := []byte("one\ntwo\nthree\nfour\n")
	if got := string(lastLines(log, 2)); got != "three\nfour\n" {
		t.Fatalf("last 2 lines: %q", got)
	}
	if got := string(lastLines(log, 10)); got != string(log) {
		t.Fatalf("last 10 lines of 4: %q", got)
	}
	if got := string(lastLines([]byte("no newline at all"), 1)); got != "no newline at all" {
		t.Fatalf("one line without a newline: %q", got)
	}
}
