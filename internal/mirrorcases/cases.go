// Package mirrorcases reads and judges the table of cases of the Lua
// functions in redisstate/lua that mirror one of limit's rule for rule
// (redisstate/testdata/mirror_cases.json; the token bucket's mirrors have
// their own table, see internal/bucketcases). Two tests run it: limit's
// on the Go functions and redisstate's on the Lua ones on a real Redis.
// Each keeps the code that runs a case on its own engine.
//
// Only tests use this package, so it may import "testing".
package mirrorcases

import (
	"fmt"
	"maps"
	"testing"

	"github.com/llmproxy/llmproxy/internal/bucketcases"
)

// Table is the table: the format is documented in its "doc".
type Table struct {
	Doc      []string   `json:"doc"`
	Extra    []Extra    `json:"windows.extra"`
	Answered []Answered `json:"learner.answered"`
}

// Extra is a case of windows.extra: how many more than its allowance a
// window sends after Climb probing windows in a row admitted all they
// sent, Full windows having ended in a closure.
type Extra struct {
	Name  string `json:"name"`
	Climb int    `json:"climb"`
	Full  int    `json:"full"`
	Want  int    `json:"want"`
}

// Answered is a case of learner.answered: answers counted one after the
// other, and the counts they leave.
type Answered struct {
	Name    string   `json:"name"`
	Note    string   `json:"note"`
	Answers []Answer `json:"answers"`
	Want    Counts   `json:"want"`
	// XFail says why the XFailOn engine ("go" or "lua") gives Instead.
	XFail   string  `json:"xfail"`
	XFailOn string  `json:"xfail_on"`
	Instead *Counts `json:"instead"`
}

// Answer is Times answers (0: one) at Level in flight.
type Answer struct {
	Level   int  `json:"level"`
	Refused bool `json:"refused"`
	Times   int  `json:"times"`
}

// Counts are the answers admitted and refused by level (none: absent),
// and their total.
type Counts struct {
	Admitted map[int]float64 `json:"admitted"`
	Refused  map[int]float64 `json:"refused"`
	Counted  float64         `json:"counted"`
}

func (c Counts) String() string {
	return fmt.Sprintf("admitted %v, refused %v, counted %v", c.Admitted, c.Refused, c.Counted)
}

func (c Counts) equal(o Counts) bool {
	return maps.Equal(c.Admitted, o.Admitted) && maps.Equal(c.Refused, o.Refused) && c.Counted == o.Counted
}

// Load reads and checks the table at path: unknown fields, an empty or
// repeated name, a function with no cases, and an xfail without a reason,
// an engine ("go" or "lua") or an instead all fail t.
func Load(t testing.TB, path string) Table {
	t.Helper()
	var tab Table
	bucketcases.Decode(t, path, &tab)
	names := map[string]bool{}
	name := func(n string) {
		if n == "" || names[n] {
			t.Fatalf("%s: case name %q empty or repeated", path, n)
		}
		names[n] = true
	}
	for _, c := range tab.Extra {
		name(c.Name)
	}
	for _, c := range tab.Answered {
		name(c.Name)
		if (c.XFail == "") != (c.XFailOn == "") || (c.XFail == "") != (c.Instead == nil) || c.XFailOn != "" && c.XFailOn != "go" && c.XFailOn != "lua" {
			t.Fatalf("%s: case %s: xfail needs a reason, xfail_on \"go\" or \"lua\" and instead", path, c.Name)
		}
	}
	if len(tab.Extra) == 0 || len(tab.Answered) == 0 {
		t.Fatalf("%s: a function with no cases", path)
	}
	return tab
}

// Each is a's answers one at a time.
func (a Answered) Each(count func(level int, refused bool)) {
	for _, x := range a.Answers {
		for range max(x.Times, 1) {
			count(x.Level, x.Refused)
		}
	}
}

// Judge holds engine's counts got to the case's: its Want, or, for the
// engine the case is marked xfail on, Instead (and then got meeting Want
// is an error too: the engines agree now, and the mark must go).
func (a Answered) Judge(t testing.TB, engine string, got Counts) {
	t.Helper()
	if a.XFailOn != engine {
		if !got.equal(a.Want) {
			t.Errorf("%s: %v, want %v", a.Name, got, a.Want)
		}
		return
	}
	switch {
	case got.equal(a.Want):
		t.Errorf("%s: XPASS: %s now gives %v, as the case wants: drop the xfail", a.Name, engine, got)
	case !got.equal(*a.Instead):
		t.Errorf("%s: %v, neither the case's %v nor its xfail's %v", a.Name, got, a.Want, *a.Instead)
	default:
		t.Logf("%s: XFAIL on %s (%s): %v for %v", a.Name, engine, a.XFail, got, a.Want)
	}
}
