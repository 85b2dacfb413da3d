package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseSBOM checks the SBOM of a release that scripts/release.sh
// wrote into $LLMPROXY_RELEASE_DIST (CI sets it) against sources other
// than the generator's: go.mod's direct requirements (`go mod edit
// -json`) must all be listed at their versions, and every module `go
// version -m` finds in the linux/amd64 binary must be listed as required,
// with its go.sum hash.
func TestReleaseSBOM(t *testing.T) {
	dist := os.Getenv("LLMPROXY_RELEASE_DIST")
	if dist == "" {
		t.Skip("LLMPROXY_RELEASE_DIST is not set (CI sets it after scripts/release.sh --snapshot)")
	}
	raw, err := os.ReadFile(filepath.Join(dist, "llmproxy.cdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		BOMFormat, SpecVersion string
		Metadata               struct {
			Component struct{ Name, Version string }
		}
		Components []struct {
			Name, Version, Scope, PURL string
			Properties                 []struct{ Name, Value string }
		}
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("the SBOM does not parse: %v", err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.5" || doc.Metadata.Component.Name != "github.com/llmproxy/llmproxy" {
		t.Errorf("not llmproxy's CycloneDX 1.5 SBOM: %s %s %s", doc.BOMFormat, doc.SpecVersion, doc.Metadata.Component.Name)
	}
	type listed struct{ scope, sum string }
	byModule := map[string]listed{}
	for _, c := range doc.Components {
		l := listed{scope: c.Scope}
		for _, p := range c.Properties {
			if p.Name == "go:sum" {
				l.sum = p.Value
			}
		}
		byModule[c.Name+"@"+c.Version] = l
	}

	out, err := exec.Command("go", "mod", "edit", "-json", filepath.Join("..", "..", "go.mod")).Output()
	if err != nil {
		t.Fatal(err)
	}
	var gomod struct {
		Require []struct {
			Path, Version string
			Indirect      bool
		}
	}
	if err := json.Unmarshal(out, &gomod); err != nil {
		t.Fatal(err)
	}
	direct := 0
	for _, r := range gomod.Require {
		if r.Indirect {
			continue
		}
		direct++
		if _, ok := byModule[r.Path+"@"+r.Version]; !ok {
			t.Errorf("go.mod requires %s %s; the SBOM does not list it", r.Path, r.Version)
		}
	}
	if direct == 0 {
		t.Error("go.mod has no direct requirements?")
	}

	bin := filepath.Join(dist, "llmproxy-linux-amd64")
	out, err = exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	deps := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "dep" {
			continue
		}
		deps++
		if l := byModule[f[1]+"@"+f[2]]; l.scope != "required" || l.sum != f[3] {
			t.Errorf("%s links %s %s (%s); the SBOM lists %+v", bin, f[1], f[2], f[3], l)
		}
	}
	if deps == 0 {
		t.Errorf("go version -m %s lists no modules", bin)
	}
	ver, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(ver), "\n"); first != "llmproxy "+doc.Metadata.Component.Version {
		t.Errorf("the binary says %q; the SBOM is of %s", first, doc.Metadata.Component.Version)
	}
}
