package shape

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root is the module's root, seen from this package.
const root = "../.."

// engineBaseline is the production lines of the engine (non-test Go files
// of limit/ and lanequeue/, the simulator apart) when issue 48 began, at
// 8887bc6; the issue lets them grow by at most a tenth while the engine
// learns any upstream, so that rules that turn out to be one become one.
const engineBaseline = 7648

// engineBudget is the most production lines the engine may have.
const engineBudget = engineBaseline * 110 / 100

// enginePackages are the engine's packages, relative to the root.
var enginePackages = []string{"limit", "lanequeue"}

// productionLines counts the lines of the non-test Go files directly in
// dir (not its subdirectories).
func productionLines(t *testing.T, dir string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no Go files in %s: the package moved, update this test", dir)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n += bytes.Count(b, []byte("\n"))
		if len(b) > 0 && b[len(b)-1] != '\n' {
			n++
		}
	}
	return n
}

// TestEngineLinesWithinBudget fails when the engine's production code
// grows past its budget: a new rule has to replace or merge others.
func TestEngineLinesWithinBudget(t *testing.T) {
	total := 0
	for _, p := range enginePackages {
		n := productionLines(t, p)
		t.Logf("%s: %d production lines", p, n)
		total += n
	}
	t.Logf("engine: %d production lines, budget %d (baseline %d + 10 %%)", total, engineBudget, engineBaseline)
	if total > engineBudget {
		t.Errorf("the engine (%s) has %d production lines, budget %d: make two rules one before adding another",
			strings.Join(enginePackages, ", "), total, engineBudget)
	}
}
