package shape

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// exportedBudget is the most exported top-level names (types, functions,
// variables, constants; methods and fields apart) each package may have.
// A package not listed has no budget. Raising one is a one-line change a
// reviewer sees: say in the commit why the package needs the name.
var exportedBudget = map[string]int{
	"lanequeue": 25,
	"limit":     25,
}

// proxyEngineBudget is the most distinct identifiers of lanequeue and
// limit that the proxy package's production code may name.
const proxyEngineBudget = 15

// funcBudget is the most lines a production function (or method) may
// span, from its signature to its closing brace.
const funcBudget = 60

// parsePackage parses the production Go files directly in dir.
func parsePackage(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, af)
	}
	if len(out) == 0 {
		t.Fatalf("no Go files in %s: the package moved, update this test", dir)
	}
	return out
}

// exportedNames lists the exported top-level names of files.
func exportedNames(files []*ast.File) []string {
	var names []string
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names = append(names, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(names)
	return names
}

func TestExportedNamesWithinBudget(t *testing.T) {
	fset := token.NewFileSet()
	for _, pkg := range slices.Sorted(maps.Keys(exportedBudget)) {
		names := exportedNames(parsePackage(t, fset, pkg))
		t.Logf("%s: %d exported names, budget %d", pkg, len(names), exportedBudget[pkg])
		if len(names) > exportedBudget[pkg] {
			t.Errorf("%s exports %d top-level names, budget %d: %s", pkg, len(names), exportedBudget[pkg], strings.Join(names, " "))
		}
	}
}

// TestProxyNamesFewOfTheEngine fails when the proxy package reaches into
// more of the engine's names than its budget: what the proxy needs of a
// lane belongs behind a few names.
func TestProxyNamesFewOfTheEngine(t *testing.T) {
	fset := token.NewFileSet()
	used := map[string]bool{}
	for _, f := range parsePackage(t, fset, "proxy") {
		local := map[string]string{} // import name -> package
		for _, im := range f.Imports {
			path := strings.Trim(im.Path.Value, `"`)
			base := path[strings.LastIndex(path, "/")+1:]
			if base != "lanequeue" && base != "limit" || !strings.Contains(path, "llmproxy/") {
				continue
			}
			name := base
			if im.Name != nil {
				name = im.Name.Name
			}
			local[name] = base
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && local[id.Name] != "" {
					used[local[id.Name]+"."+sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	names := slices.Sorted(maps.Keys(used))
	t.Logf("proxy names %d identifiers of lanequeue and limit, budget %d", len(names), proxyEngineBudget)
	if len(names) > proxyEngineBudget {
		t.Errorf("proxy names %d identifiers of lanequeue and limit, budget %d: %s", len(names), proxyEngineBudget, strings.Join(names, " "))
	}
}

// TestFunctionsWithinBudget fails when a production function passes
// funcBudget lines: anywhere in what the module ships (tests, the test
// harnesses under e2e/ and the developer tools under scripts/ apart).
func TestFunctionsWithinBudget(t *testing.T) {
	fset := token.NewFileSet()
	var long []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" ||
				path == filepath.Join(root, "e2e") || path == filepath.Join(root, "scripts")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > funcBudget {
				rel, _ := filepath.Rel(root, path)
				long = append(long, fmt.Sprintf("%s:%d %s %d lines", rel, fset.Position(fd.Pos()).Line, fd.Name.Name, n))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range long {
		t.Errorf("function over %d lines: %s", funcBudget, l)
	}
}
