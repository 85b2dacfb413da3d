package redisstate

import (
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// luaLocal are the numbers a script may write as they are: units, steps
// and timings of the scripts' own, which no Go code has. Any other number
// a script uses is Go's, named ${name} and rendered from sharedNumbers.
var luaLocal = map[string]string{
	"0":      "zero",
	"1":      "one: a flag, an increment, a step, the clock's 1 ms",
	"2":      "the step over HGETALL's field and value pairs, and a halving",
	"1000":   "ms in a second, µs in a ms: a unit, only after *, / or %",
	"250":    "how long a waiter that stopped asking is kept (ms)",
	"10000":  "how long the raise lease lasts (ms)",
	"60000":  "a minute (ms): how long a replica's word counts (alive, its climit, a first request alone, a window's low figure)",
	"120000": "the TTL of the replicas' and busy sets (ms)",
}

// tooCommonToTell are the Lua-local numbers a shared number may equal: a
// stray literal of such a value cannot be told from a Lua-local use, so
// TestScriptsHaveGosNumbers checks the shared name is used instead.
var tooCommonToTell = map[string]bool{"0": true, "1": true, "2": true, "1000": true}

var (
	luaComment = regexp.MustCompile(`--[^\n]*`)
	luaString  = regexp.MustCompile(`'[^'\n]*'|"[^"\n]*"`)
	luaIndex   = regexp.MustCompile(`\[\d+\]`) // a position in a list (KEYS, HMGET's fields), not a quantity
	luaNumber  = regexp.MustCompile(`\d+(\.\d+)?`)
)

// TestScriptsHaveGosNumbers: the numbers Go and the scripts share come to
// the scripts from Go's constants. A script's source writes no number as
// it is but the Lua-local ones (a unit, a step, a timing no Go code has);
// no Lua-local number is one of Go's, but for the few too common to tell;
// every shared number is used; nothing is left to render. And the
// constants that mirror the in-process state's (lanequeue's and limit's)
// have their values.
func TestScriptsHaveGosNumbers(t *testing.T) {
	t.Parallel()
	scripts := map[string]script{"admit": admitScript, "learn": learnScript, "giveBack": giveBackScript, "heartbeat": heartbeatScript, "forget": forgetScript, "apart": apartScript}
	used, written := map[string]bool{}, map[string]bool{}
	for name, s := range scripts {
		if strings.Contains(s.text, "${") {
			t.Errorf("%s: a ${…} left in the text", name)
		}
		for _, m := range placeholder.FindAllStringSubmatch(s.src, -1) {
			used[m[1]] = true
		}
		for _, lit := range numbersIn(t, name, s.src) {
			written[lit] = true
			if _, ok := luaLocal[lit]; !ok {
				t.Errorf("%s writes %s: render it from Go's constant, or list it in luaLocal with why no Go code has it", name, lit)
			}
		}
	}
	for lit := range luaLocal {
		if !written[lit] {
			t.Errorf("luaLocal lists %s, which no script writes", lit)
		}
	}
	for name, n := range sharedNumbers {
		if !used[name] {
			t.Errorf("no script uses ${%s} (%d): a script writes it as a literal, or it is not shared", name, n)
		}
		if lit := constant.MakeInt64(n).ExactString(); !tooCommonToTell[lit] {
			if _, ok := luaLocal[lit]; ok {
				t.Errorf("luaLocal lists %s, the value of the shared %s: a stray literal of it would pass", lit, name)
			}
		}
	}
	lq := goConsts(t, "lanequeue", "limit")
	for name, ours := range map[string]constant.Value{
		"firstAnswerWindow": constant.MakeInt64(int64(firstAnswerWindow)),
		"startSpread":       constant.MakeInt64(startSpread),
		"levelMemory":       constant.MakeInt64(levelMemory),
		"maxLevel":          constant.MakeInt64(maxLevel),
		"probeWindows":      constant.MakeInt64(probeWindows),
		"maxClimb":          constant.MakeInt64(maxClimb),
		"minSplit":          constant.MakeInt64(minSplitMs * 1_000_000),
		"lengthSlack":       constant.MakeInt64(lengthSlack),
	} {
		theirs, ok := lq[name]
		if !ok || theirs.Kind() == constant.Unknown {
			t.Errorf("neither lanequeue nor limit has a constant %s, or its value cannot be read from its source", name)
		} else if !constant.Compare(constant.ToFloat(ours), token.EQL, constant.ToFloat(theirs)) {
			t.Errorf("%s is %s here and %s in Go's in-process state", name, ours, theirs)
		}
	}
}

// numbersIn are the numbers src writes as they are, outside comments,
// strings and list positions; a 1000 not after *, / or % is reported as
// "1000 (not a unit)".
func numbersIn(t *testing.T, name, src string) []string {
	t.Helper()
	code := luaIndex.ReplaceAllString(luaString.ReplaceAllString(luaComment.ReplaceAllString(src, ""), "''"), "[i]")
	var lits []string
	for _, at := range luaNumber.FindAllStringIndex(code, -1) {
		if at[0] > 0 && (isWordByte(code[at[0]-1]) || code[at[0]-1] == '.') {
			continue // part of a name
		}
		lit := code[at[0]:at[1]]
		before := strings.TrimRight(code[:at[0]], " ")
		if lit == "1000" && (before == "" || !strings.ContainsRune("*/%", rune(before[len(before)-1]))) {
			lit = "1000 (not a unit)"
		}
		lits = append(lits, lit)
	}
	if len(lits) == 0 {
		t.Errorf("%s: no number found; is numbersIn reading it?", name)
	}
	return lits
}

func isWordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// goConsts are the values of the package constants of pkgs (folders
// beside this one), read from their source: those the scripts share are
// their own, unexported. Only the standard library's imports are read (a
// constant that needs another package's reads as unknown).
func goConsts(t *testing.T, pkgs ...string) map[string]constant.Value {
	t.Helper()
	consts := map[string]constant.Value{}
	for _, name := range pkgs {
		dir := filepath.Join("..", name)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		var files []*ast.File
		for _, e := range entries {
			if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
				f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, 0)
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, f)
			}
		}
		conf := types.Config{Importer: importer.Default(), Error: func(error) {}} // the module's own imports do not resolve
		pkg, _ := conf.Check(name, fset, files, nil)
		for _, c := range pkg.Scope().Names() {
			if k, ok := pkg.Scope().Lookup(c).(*types.Const); ok {
				consts[c] = k.Val()
			}
		}
	}
	return consts
}
