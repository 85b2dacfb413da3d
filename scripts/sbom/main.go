// Command sbom writes the CycloneDX 1.5 JSON bill of materials of a
// release (scripts/release.sh runs it): every module linked into the given
// binaries, read from their embedded build information (what `go version
// -m` prints), with scope "required", and every other module whose
// packages the repository's tests and tools build, from the module graph
// (`go list -deps -test ./...`), with scope "excluded". Each carries its
// version, package URL and go.sum hash.
//
// Usage: go run ./scripts/sbom -version V -time RFC3339 -o FILE BINARY...
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

func main() {
	version := flag.String("version", "", "the release's version")
	at := flag.String("time", "", "the release's commit time, RFC 3339")
	out := flag.String("o", "", "output file")
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: sbom -version V [-time RFC3339] -o FILE BINARY...")
		os.Exit(2)
	}
	if err := run(*version, *at, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

func run(version, at, out string, binaries []string) error {
	var linked []*buildinfo.BuildInfo
	for _, b := range binaries {
		bi, err := buildinfo.ReadFile(b)
		if err != nil {
			return fmt.Errorf("%s: %w", b, err)
		}
		linked = append(linked, bi)
	}
	built, err := goList("list", "-deps", "-test", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", "./...")
	if err != nil {
		return err
	}
	sums, err := goList("list", "-m", "-f", "{{.Path}} {{.Version}} {{.Sum}}", "all")
	if err != nil {
		return err
	}
	b, err := bom(version, at, linked, modulesOf(built, sums))
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// goList runs the go command and returns its output's lines, once each.
func goList(args ...string) ([]string, error) {
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args[:2], " "), err, stderr.Bytes())
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}

// module is one module version of the build.
type module struct {
	Path, Version, Sum string
}

// modulesOf turns "path version" lines into modules, taking each one's sum
// from the "path version sum" lines of the module graph.
func modulesOf(lines, sums []string) []module {
	sum := map[string]string{}
	for _, l := range sums {
		if f := strings.Fields(l); len(f) == 3 {
			sum[f[0]+"@"+f[1]] = f[2]
		}
	}
	var mods []module
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 2 {
			mods = append(mods, module{Path: f[0], Version: f[1], Sum: sum[f[0]+"@"+f[1]]})
		}
	}
	return mods
}

// The CycloneDX 1.5 JSON document, only the parts written here.
type (
	document struct {
		BOMFormat    string      `json:"bomFormat"`
		SpecVersion  string      `json:"specVersion"`
		SerialNumber string      `json:"serialNumber"`
		Version      int         `json:"version"`
		Metadata     metadata    `json:"metadata"`
		Components   []component `json:"components"`
	}
	metadata struct {
		Timestamp  string     `json:"timestamp,omitempty"`
		Tools      tools      `json:"tools"`
		Component  component  `json:"component"`
		Properties []property `json:"properties,omitempty"`
	}
	tools struct {
		Components []component `json:"components"`
	}
	component struct {
		Type       string     `json:"type"`
		BOMRef     string     `json:"bom-ref,omitempty"`
		Name       string     `json:"name"`
		Version    string     `json:"version,omitempty"`
		Scope      string     `json:"scope,omitempty"`
		PURL       string     `json:"purl,omitempty"`
		Properties []property `json:"properties,omitempty"`
	}
	property struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
)

// bom is the document for the release: linked holds the binaries' build
// information, built the modules the repository's own packages and tests
// build with (a superset of what the binaries link).
func bom(version, at string, linked []*buildinfo.BuildInfo, built []module) (document, error) {
	if len(linked) == 0 {
		return document{}, errors.New("no binaries")
	}
	app := linked[0].Main.Path
	required := map[module]bool{}
	var props []property
	for _, bi := range linked {
		if bi.Main.Path != app {
			return document{}, fmt.Errorf("binaries of two modules: %s and %s", app, bi.Main.Path)
		}
		for _, d := range bi.Deps {
			if d.Replace != nil {
				return document{}, fmt.Errorf("%s is replaced by %s: a release must build from published modules", d.Path, d.Replace.Path)
			}
			required[module{Path: d.Path, Version: d.Version, Sum: d.Sum}] = true
		}
		props = appendOnce(props, property{Name: "go:toolchain", Value: bi.GoVersion})
		for _, s := range bi.Settings {
			if s.Key == "GOOS" || s.Key == "GOARCH" {
				props = appendOnce(props, property{Name: "go:" + s.Key, Value: s.Value})
			}
		}
	}
	var comps []component
	for m := range required {
		comps = append(comps, library(m, "required"))
	}
	for _, m := range built {
		if !required[m] && !slices.ContainsFunc(comps, func(c component) bool { return c.Name == m.Path && c.Version == m.Version }) {
			comps = append(comps, library(m, "excluded"))
		}
	}
	slices.SortFunc(comps, func(a, b component) int { return strings.Compare(a.BOMRef, b.BOMRef) })

	root := component{Type: "application", BOMRef: purl(app, version), Name: app, Version: version, PURL: purl(app, version)}
	doc := document{
		BOMFormat: "CycloneDX", SpecVersion: "1.5", Version: 1,
		Metadata: metadata{
			Timestamp:  at,
			Tools:      tools{Components: []component{{Type: "application", Name: "llmproxy scripts/sbom"}}},
			Component:  root,
			Properties: props,
		},
		Components: comps,
	}
	doc.SerialNumber = serial(doc)
	return doc, nil
}

func library(m module, scope string) component {
	c := component{Type: "library", BOMRef: purl(m.Path, m.Version), Name: m.Path, Version: m.Version, Scope: scope, PURL: purl(m.Path, m.Version)}
	if m.Sum != "" {
		c.Properties = []property{{Name: "go:sum", Value: m.Sum}}
	}
	return c
}

// purl is a Go module's package URL; "+" (in +incompatible) is escaped.
func purl(path, version string) string {
	return "pkg:golang/" + path + "@" + strings.ReplaceAll(version, "+", "%2B")
}

func appendOnce(ps []property, p property) []property {
	if slices.Contains(ps, p) {
		return ps
	}
	return append(ps, p)
}

// serial is a UUID (version 8, the RFC 9562 form for a name hashed by any
// function) of the document's content: the same release gets the same
// serial number.
func serial(d document) string {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(d)
	u := h.Sum(nil)[:16]
	u[6] = u[6]&0x0f | 0x80
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
