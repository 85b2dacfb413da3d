package benchcells

import (
	"slices"
	"strings"
	"testing"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

func name(c Cell) string { return c.Name }

func names(cs []Cell) []string {
	var ns []string
	for _, c := range cs {
		ns = append(ns, c.Name)
	}
	return ns
}

// Every cell is named once, and its mock is one New accepts.
func TestCellsNamedOnceAndBuildable(t *testing.T) {
	all := Cells(DefaultLatency, DefaultRPS)
	seen := map[string]bool{}
	for _, c := range all {
		if seen[c.Name] {
			t.Errorf("cell %s twice", c.Name)
		}
		seen[c.Name] = true
		if !strings.HasPrefix(c.Name, c.Shape.Name+"/") {
			t.Errorf("cell %s is not named after its shape %s", c.Name, c.Shape.Name)
		}
		if c.N <= 0 || c.C <= 0 || c.IdealOf(c.N) <= 0 {
			t.Errorf("cell %s: N %d, C %d, ideal %v", c.Name, c.N, c.C, c.IdealOf(c.N))
		}
		mockupstream.New(c.Mock).Close()
	}
}

// A speech sets the cell's switches and no other cell's: two cells of one
// shape differ, and the shape's mock is left as it was.
func TestSpeechesSetTheirCellsOnly(t *testing.T) {
	all := Cells(DefaultLatency, DefaultRPS)
	get := func(n string) Cell { return all[slices.IndexFunc(all, func(c Cell) bool { return c.Name == n })] }
	headers, silent := get("short/headers"), get("short/silent")
	if headers.Mock.NoLimitHeaders || !silent.Mock.NoLimitHeaders || !silent.Mock.NoRetryAfter || !silent.Mock.NoHint {
		t.Errorf("short/headers %+v, short/silent %+v", headers.Mock, silent.Mock)
	}
	if c := get("concurrency/headers"); !c.Mock.NoLimitHeaders || c.Mock.NoRetryAfter {
		t.Errorf("concurrency/headers should say Retry-After alone: %+v", c.Mock)
	}
	if c := get("window/gemini"); c.Mock.HintForm != "gemini" || get("window/ietf").Mock.HintForm != "" {
		t.Errorf("window/gemini %q, window/ietf %q", c.Mock.HintForm, get("window/ietf").Mock.HintForm)
	}
}

func TestPick(t *testing.T) {
	all := Cells(DefaultLatency, DefaultRPS)
	for _, tc := range []struct {
		list string
		want []string // nil: every cell
	}{
		{"", nil},
		{"*", nil},
		{"tpm/silent, short/headers", []string{"tpm/silent", "short/headers"}},
		{"tpm/", []string{"tpm/headers", "tpm/hint", "tpm/silent"}},
		{"window-*/*", []string{"window-aligned/retry-after", "window-1s/azure", "window-60s/retry-after"}},
		{"*/hint,short/hint", []string{"short/hint", "streams/hint", "concurrency/hint", "quantized/hint", "tpm/hint"}},
	} {
		got, err := Pick(all, name, tc.list, "cell")
		if err != nil {
			t.Fatalf("Pick(%q): %v", tc.list, err)
		}
		want := tc.want
		if want == nil {
			want = names(all)
		}
		if !slices.Equal(names(got), want) {
			t.Errorf("Pick(%q) = %v, want %v", tc.list, names(got), want)
		}
	}
	for _, list := range []string{"nosuch", "short/[", "short/headers,nosuch/"} {
		if got, err := Pick(all, name, list, "cell"); err == nil {
			t.Errorf("Pick(%q) = %v, want an error", list, names(got))
		}
	}
}
