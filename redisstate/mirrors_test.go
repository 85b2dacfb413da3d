package redisstate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/llmproxy/llmproxy/internal/mirrorcases"
)

// mirrors are the Lua functions that do for the fleet what a Go function
// does in one process, each beside its Go function, under a name of the
// same words. A pair marked same holds one rule: its Lua comment ends
// "Mirrors pkg's Type.method.", the Go function's doc names the Lua
// function and its file, and a table of cases runs both (the bucket's,
// limit/testdata/bucket_cases.json; the others', testdata/mirror_cases.json,
// keyed by the Lua name). The others are the fleet's simpler form of the
// Go function: "The fleet's form of pkg's Type.method".
var mirrors = []struct {
	file, lua string // in lua/
	pkg, fn   string // a folder of the module, and Type.method in it
	same      bool
}{
	{"bucket.lua", "refill", "internal/bucket", "Bucket.Refill", true},
	{"bucket.lua", "admit", "internal/bucket", "Bucket.Admit", true},
	{"bucket.lua", "charge", "internal/bucket", "Bucket.charge", true},
	{"window.lua", "windows.extra", "limit", "shape.extra", true},
	{"levels.lua", "learner.answered", "limit", "learner.answered", true},
	{"spread.lua", "spread", "limit", "Memory.spread", false},
	{"window.lua", "windows.gate", "limit", "windows.gate", false},
	{"window.lua", "windows.readLength", "limit", "shape.readLength", false},
	{"window.lua", "windows.accepted", "limit", "windows.accepted", false},
	{"window.lua", "windows.refused", "limit", "windows.refused", false},
}

var mirrorsLine = regexp.MustCompile(`(?m)^-- (?:Mirrors|The fleet's form of) (\S+)'s (\S+?)[. ]`)

// TestMirroredPairsNameEachOther: every pair's two functions exist and
// name each other, every Lua function that says it mirrors one is in
// mirrors, and the pairs of one rule are those the shared cases run.
func TestMirroredPairsNameEachOther(t *testing.T) {
	t.Parallel()
	listed := map[string]bool{}
	tab := mirrorcases.Load(t, mirrorCasesPath)
	tabled := map[string]bool{"windows.extra": len(tab.Extra) > 0, "learner.answered": len(tab.Answered) > 0}
	for _, m := range mirrors {
		listed[m.file+" "+m.lua] = true
		src, err := os.ReadFile(filepath.Join("lua", m.file))
		if err != nil {
			t.Fatal(err)
		}
		def := "function " + m.lua + "("
		i := strings.Index(string(src), def)
		if i < 0 {
			t.Errorf("lua/%s has no %s", m.file, def)
			continue
		}
		want := "-- The fleet's form of " + m.pkg + "'s " + m.fn
		if m.same {
			want = "-- Mirrors " + m.pkg + "'s " + m.fn + ".\n"
			if m.pkg != "internal/bucket" && !tabled[m.lua] {
				t.Errorf("%s: no cases in %s", m.lua, mirrorCasesPath)
			}
		}
		if !strings.Contains(luaCommentAbove(string(src), i), want) {
			t.Errorf("lua/%s: %s's comment does not say %q", m.file, m.lua, want)
		}
		doc, ok := goDoc(t, m.pkg, m.fn)
		if !ok {
			t.Errorf("%s has no %s, which lua/%s's %s mirrors", m.pkg, m.fn, m.file, m.lua)
		} else if want := m.lua + " in redisstate/lua/" + m.file; m.same && !strings.Contains(strings.Join(strings.Fields(doc), " "), want) {
			t.Errorf("%s's %s: its doc does not name %q", m.pkg, m.fn, want)
		}
	}
	files, err := os.ReadDir("lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join("lua", f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, at := range mirrorsLine.FindAllStringIndex(string(src), -1) {
			rest := string(src[at[1]:])
			rest = rest[strings.Index(rest, "\n"):]
			for strings.HasPrefix(rest, "\n--") {
				rest = rest[strings.Index(rest[1:], "\n")+1:]
			}
			def := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(rest, "\n"), "local "), "function ")
			name, _, _ := strings.Cut(def, "(")
			if !listed[f.Name()+" "+name] {
				t.Errorf("lua/%s: %s says it mirrors Go but is not in mirrors", f.Name(), name)
			}
		}
	}
}

// luaCommentAbove is the run of comment lines right above src[i:].
func luaCommentAbove(src string, i int) string {
	lines := strings.SplitAfter(src[:i], "\n")
	j := len(lines) - 1 // the partial line before i (a "local " maybe)
	k := j
	for k > 0 && strings.HasPrefix(lines[k-1], "--") {
		k--
	}
	return strings.Join(lines[k:j], "")
}

// goDoc is the doc comment of the function fn (Type.method or a plain
// name) in the module's folder pkg, and whether it is there.
func goDoc(t *testing.T, pkg, fn string) (string, bool) {
	t.Helper()
	recv, name, isMethod := strings.Cut(fn, ".")
	if !isMethod {
		name, recv = recv, ""
	}
	dir := filepath.Join("..", pkg)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != name || (fd.Recv == nil) != (recv == "") {
				continue
			}
			if recv != "" && receiverName(fd.Recv.List[0].Type) != recv {
				continue
			}
			return fd.Doc.Text(), true
		}
	}
	return "", false
}

func receiverName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
