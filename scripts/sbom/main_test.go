package main

import (
	"debug/buildinfo"
	"runtime/debug"
	"strings"
	"testing"
)

func binary(goos string, deps ...*debug.Module) *buildinfo.BuildInfo {
	return &buildinfo.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/llmproxy/llmproxy", Version: "(devel)"},
		Deps:      deps,
		Settings:  []debug.BuildSetting{{Key: "GOOS", Value: goos}, {Key: "GOARCH", Value: "amd64"}},
	}
}

func TestBOMScopesWhatTheBinariesLink(t *testing.T) {
	chi := &debug.Module{Path: "github.com/go-chi/chi/v5", Version: "v5.5.0", Sum: "h1:chi="}
	sys := &debug.Module{Path: "golang.org/x/sys", Version: "v0.48.0", Sum: "h1:sys="}
	built := []module{
		{Path: "github.com/go-chi/chi/v5", Version: "v5.5.0", Sum: "h1:chi="},
		{Path: "go.uber.org/goleak", Version: "v1.3.0", Sum: "h1:goleak="},
		{Path: "example.com/old", Version: "v2.0.0+incompatible"},
	}
	doc, err := bom("v1.2.0", "2026-11-24T09:20:09Z", []*buildinfo.BuildInfo{binary("linux", chi, sys), binary("windows", chi)}, built)
	if err != nil {
		t.Fatal(err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.5" || doc.Metadata.Component.PURL != "pkg:golang/github.com/llmproxy/llmproxy@v1.2.0" {
		t.Errorf("header: %+v", doc)
	}
	scope := map[string]string{}
	for _, c := range doc.Components {
		scope[c.PURL] = c.Scope
	}
	want := map[string]string{
		"pkg:golang/github.com/go-chi/chi/v5@v5.5.0":       "required",
		"pkg:golang/golang.org/x/sys@v0.48.0":              "required",
		"pkg:golang/go.uber.org/goleak@v1.3.0":             "excluded",
		"pkg:golang/example.com/old@v2.0.0%2Bincompatible": "excluded",
	}
	if len(scope) != len(want) || len(doc.Components) != len(want) {
		t.Errorf("components %v, want %v", scope, want)
	}
	for p, s := range want {
		if scope[p] != s {
			t.Errorf("%s: scope %q, want %q", p, scope[p], s)
		}
	}
	var goos []string
	for _, p := range doc.Metadata.Properties {
		if p.Name == "go:GOOS" {
			goos = append(goos, p.Value)
		}
	}
	if strings.Join(goos, ",") != "linux,windows" {
		t.Errorf("GOOS properties %v, want each target once", goos)
	}
	again, _ := bom("v1.2.0", "2026-11-24T09:20:09Z", []*buildinfo.BuildInfo{binary("linux", chi, sys), binary("windows", chi)}, built)
	if doc.SerialNumber != again.SerialNumber || !strings.HasPrefix(doc.SerialNumber, "urn:uuid:") || len(doc.SerialNumber) != 45 {
		t.Errorf("serial %q then %q: want one UUID for one release", doc.SerialNumber, again.SerialNumber)
	}
}

func TestBOMRefusesAReplacedModule(t *testing.T) {
	dep := &debug.Module{Path: "github.com/go-chi/chi/v5", Version: "v5.5.0", Replace: &debug.Module{Path: "../chi"}}
	if _, err := bom("v1.2.0", "", []*buildinfo.BuildInfo{binary("linux", dep)}, nil); err == nil {
		t.Error("a binary built with a replace directive got an SBOM")
	}
}

func TestModulesOfTakesTheSums(t *testing.T) {
	got := modulesOf([]string{"a.example/x v1.0.0", "b.example/y v0.1.0"}, []string{"a.example/x v1.0.0 h1:x=", "b.example/y v0.2.0 h1:other="})
	want := []module{{"a.example/x", "v1.0.0", "h1:x="}, {"b.example/y", "v0.1.0", ""}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %v, want %v", got, want)
	}
}
