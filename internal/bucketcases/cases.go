// Package bucketcases reads and judges the token bucket's table of cases,
// limit/testdata/bucket_cases.json, which three tests run: internal/bucket's
// on the Go bucket, limit's on the header budget built on it, and
// redisstate's on the Lua budget on a real Redis. It holds what those tests
// share (the table's types, its times, its checks, how a step's result is
// compared and how a case is judged); each keeps the code that runs a case
// on its own engine.
//
// Only tests use this package, so it may import "testing".
package bucketcases

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// file is the table: the format is documented in its "doc".
type file struct {
	Doc   []string `json:"doc"`
	Cases []Case   `json:"cases"`
}

// Case is one case: a starting bucket and steps run on it in order.
type Case struct {
	Name   string `json:"name"`
	Note   string `json:"note"`
	Bucket struct {
		Known bool    `json:"known"`
		Size  float64 `json:"size"`
		Rate  float64 `json:"rate"`
		Avail float64 `json:"avail"`
		At    float64 `json:"at"`
		Seen  float64 `json:"seen"`
	} `json:"bucket"`
	Steps   []Step `json:"steps"`
	XFail   string `json:"xfail"`
	XFailOn string `json:"xfail_on"`
}

// Step is one step of a case and what it expects.
type Step struct {
	Op   string   `json:"op"`
	T    float64  `json:"t"`
	Cost float64  `json:"cost"`
	N    float64  `json:"n"`
	Mark *float64 `json:"mark"`
	// Used is what a settle's request used: a giveback gives back what n
	// was charged (at most the window) less Used.
	Used float64 `json:"used"`
	// want is what the step expects: its fields sit in the step's own
	// JSON object. (An alias, as a field named Expect would clash with
	// the method.)
	want
	// Instead is what the case's xfail_on engine gives at this step.
	Instead *Expect `json:"instead"`
}

type want = Expect

// Expect is what a step checks: ok and retry for an admit, avail for the
// rest.
type Expect struct {
	Avail *float64 `json:"avail"`
	OK    *bool    `json:"ok"`
	Retry *float64 `json:"retry"`
}

// Expect is what s expects: with instead, what the case's xfail_on engine
// is known to give.
func (s Step) Expect(instead bool) Expect {
	e := s.want
	if instead && s.Instead != nil {
		if s.Instead.OK != nil {
			e.OK, e.Retry = s.Instead.OK, s.Instead.Retry
		}
		if s.Instead.Avail != nil {
			e.Avail = s.Instead.Avail
		}
	}
	return e
}

// Describe names step i and its inputs.
func (s Step) Describe(i int) string {
	switch {
	case s.Op == "admit" || s.Op == "take":
		return fmt.Sprintf("step %d (%s %v at t=%v)", i, s.Op, s.Cost, s.T)
	case s.Op == "giveback" && s.Mark != nil:
		return fmt.Sprintf("step %d (giveback %v less %v used, settle mark %v, at t=%v)", i, s.N, s.Used, *s.Mark, s.T)
	case s.Op == "giveback":
		return fmt.Sprintf("step %d (giveback %v at t=%v)", i, s.N, s.T)
	}
	return fmt.Sprintf("step %d (%s to t=%v)", i, s.Op, s.T)
}

// fits reports whether e is what op checks.
func (s Step) fits(e Expect) bool {
	switch s.Op {
	case "advance", "take":
		return e.Avail != nil && e.OK == nil && e.Retry == nil
	case "giveback":
		return e.Avail != nil && e.OK == nil && e.Retry == nil && (s.Mark != nil || s.N >= 0)
	case "admit":
		return e.OK != nil && e.Avail == nil && *e.OK == (e.Retry == nil)
	}
	return false
}

// Load reads and checks the table at path: a typo in it must not pass as
// a case that checks nothing. Unknown fields, an empty or repeated name, a
// step whose expectations do not fit its op, and an xfail without a reason,
// an engine ("go" or "lua") or an instead (or an instead without an xfail)
// all fail t.
func Load(t testing.TB, path string) []Case {
	t.Helper()
	var f file
	Decode(t, path, &f)
	names := map[string]bool{}
	for _, c := range f.Cases {
		if c.Name == "" || names[c.Name] {
			t.Fatalf("%s: case name %q empty or repeated", path, c.Name)
		}
		names[c.Name] = true
		if (c.XFail == "") != (c.XFailOn == "") || c.XFailOn != "" && c.XFailOn != "go" && c.XFailOn != "lua" {
			t.Fatalf("%s: case %s: xfail needs a reason and xfail_on \"go\" or \"lua\"", path, c.Name)
		}
		if len(c.Steps) == 0 {
			t.Fatalf("%s: case %s has no steps", path, c.Name)
		}
		instead := false
		for i, s := range c.Steps {
			if !s.fits(s.Expect(false)) || !s.fits(s.Expect(true)) {
				t.Fatalf("%s: case %s step %d: %+v does not fit op %q", path, c.Name, i, s, s.Op)
			}
			instead = instead || s.Instead != nil
		}
		if instead != (c.XFail != "") {
			t.Fatalf("%s: case %s: a case marked xfail says what its engine gives instead, and only such a case", path, c.Name)
		}
	}
	if len(f.Cases) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	return f.Cases
}

// epoch is the table's time 0.
var epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// Time is the time ms milliseconds after the table's time 0, to the
// nearest nanosecond.
func Time(ms float64) time.Time {
	return epoch.Add(time.Duration(math.Round(ms * float64(time.Millisecond))))
}

// millis is t in milliseconds from the table's time 0.
func millis(t time.Time) float64 {
	return float64(t.Sub(epoch)) / float64(time.Millisecond)
}

// nearAvail compares what is left: within 1e-9, relative to the larger.
func nearAvail(got, want float64) bool {
	return math.Abs(got-want) <= 1e-9*math.Max(1, math.Max(math.Abs(got), math.Abs(want)))
}

// nearRetry compares retry times in ms: Go's are whole nanoseconds, so
// within a tenth of one.
func nearRetry(got, want float64) bool { return math.Abs(got-want) <= 1e-7 }

// Check compares what a step gave with e: ok and retry for an admit, avail
// for the rest. It returns what did not meet e, each line led by where.
func Check(where string, e Expect, ok bool, retry, avail float64) []string {
	switch {
	case e.OK == nil:
		if !nearAvail(avail, *e.Avail) {
			return []string{fmt.Sprintf("%s: avail %.17g, want %.17g", where, avail, *e.Avail)}
		}
	case ok != *e.OK:
		return []string{fmt.Sprintf("%s: ok %v (retry %.6f), want ok %v", where, ok, retry, *e.OK)}
	case !ok && !nearRetry(retry, *e.Retry):
		return []string{fmt.Sprintf("%s: retry %.6f, want %.6f", where, retry, *e.Retry)}
	}
	return nil
}

// Engine is a bucket in Go, as the table's steps drive it.
type Engine interface {
	// Advance refills the bucket to now.
	Advance(now time.Time)
	// Admit reports whether cost fits at now, or else when it will (the
	// zero time: nothing but an answer can tell).
	Admit(now time.Time, cost float64) (time.Time, bool)
	// Take charges cost at now, as after an admit.
	Take(now time.Time, cost float64)
	// Refund gives back what a charge of cost took.
	Refund(cost float64)
	// Settle swaps what a cost of estimate was charged for what it used,
	// unless an answer's count covered its dispatch, at mark.
	Settle(estimate, used, mark float64)
	// Avail is what the bucket holds.
	Avail() float64
}

// Run runs c's steps on e, a bucket in c's starting state, and returns
// what did not meet the expectations (with instead: as the xfail_on
// engine is known to give).
func Run(c Case, e Engine, instead bool) []string {
	var bad []string
	for i, s := range c.Steps {
		now := Time(s.T)
		ok, retry := false, 0.0
		switch s.Op {
		case "advance":
			e.Advance(now)
		case "admit":
			var at time.Time
			at, ok = e.Admit(now, s.Cost)
			if !at.IsZero() {
				retry = millis(at)
			}
		case "take":
			e.Take(now, s.Cost)
		case "giveback":
			// Refund and settle take no time: they apply at the bucket's
			// own, and what is left at t is what advancing then shows.
			if s.Mark == nil {
				e.Refund(s.N)
			} else {
				e.Settle(max(s.N, 0), max(-s.N, 0)+s.Used, *s.Mark)
			}
			e.Advance(now)
		}
		bad = append(bad, Check(s.Describe(i), s.Expect(instead), ok, retry, e.Avail())...)
	}
	return bad
}

// Judge fails t unless c's outcome on engine ("go" or "lua") is as the
// table says. run runs c and returns what did not meet the expectations
// (with instead: the xfail_on engine's known outputs laid over them). Cases
// marked xfail are reported by name either way: XFAIL when they still
// disagree as recorded, XPASS (an error) when they no longer disagree.
func Judge(t testing.TB, engine string, c Case, run func(instead bool) []string) {
	t.Helper()
	bad := run(false)
	switch {
	case c.XFailOn != engine && len(bad) > 0:
		t.Errorf("case %s (%s) on %s:\n\t%s", c.Name, c.Note, engine, strings.Join(bad, "\n\t"))
	case c.XFailOn != engine && c.XFail != "":
		t.Logf("xfail on %s, passes on %s: %s: %s", c.XFailOn, engine, c.Name, c.XFail)
	case c.XFailOn != engine:
	case len(bad) == 0:
		t.Errorf("XPASS %s: marked xfail on %s but meets every expectation: drop its xfail (%s)", c.Name, engine, c.XFail)
	default:
		if known := run(true); len(known) > 0 {
			t.Errorf("case %s: the known disagreement on %s changed (%s)\n\tagainst what it gave before (instead):\n\t%s\n\tagainst the expectations:\n\t%s",
				c.Name, engine, c.XFail, strings.Join(known, "\n\t"), strings.Join(bad, "\n\t"))
			return
		}
		t.Logf("XFAIL %s (a known disagreement between the Go and Lua buckets): %s\n\t%s", c.Name, c.XFail, strings.Join(bad, "\n\t"))
	}
}

// Decode reads the JSON table at path into v; a field v has no place for
// fails t, so a typo cannot pass as a case that checks nothing.
func Decode(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
