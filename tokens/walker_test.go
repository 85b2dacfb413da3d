package tokens

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// streams are the ways a stream may come: whole, or in pieces.
var streams = []struct {
	name string
	of   func(string) io.Reader
}{
	{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
	{"bytes", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
	{"halves", func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) }},
	{"data with EOF", func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) }},
}

// pieces reads s in pieces of 1 to 16 bytes, their sizes drawn from x.
type pieces struct {
	s []byte
	x uint64
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.s) == 0 {
		return 0, io.EOF
	}
	p.x ^= p.x << 13
	p.x ^= p.x >> 7
	p.x ^= p.x << 17
	n := copy(b[:min(len(b), int(p.x%16)+1)], p.s)
	p.s = p.s[n:]
	return n, nil
}

// TestFirstString: the first top-level member of the key, in any case or
// escaping, wherever it is, past values of any kind and size; its value
// when that is a string of at most max bytes as written, decoded.
// Nothing for a nested member, a value of another kind, or JSON that
// is not valid up to there.
func TestFirstString(t *testing.T) {
	long := strings.Repeat("a", 100<<10)
	m := func(n int) string { return strings.Repeat("m", n) }
	for _, c := range []struct {
		in, key string
		max     int
		want    string
		ok      bool
	}{
		{`{"model":"gpt-x"}`, "model", 1024, "gpt-x", true},
		{` {"messages":[{"role":"user","content":"` + long + `"}], "n":2, "stream":true, "x":null, "f":false, "model" : "gpt-y"}`, "model", 1024, "gpt-y", true},
		{`{"a":{"model":"inner","b":[1,{"c":"]}\"{"}]},"model":"outer"}`, "model", 1024, "outer", true},
		{`{"` + long + `":1,"model":"after-a-long-key"}`, "model", 1024, "after-a-long-key", true},
		{`{"model":"caf\u00e9\"q\ud83d\ude00"}`, "model", 1024, "café\"q😀", true},
		{`{"Model":"cased"}`, "model", 1024, "cased", true},
		{`{"\u006D\u006F\u0044\u0065\u004C":"every-byte-escaped"}`, "model", 1024, "every-byte-escaped", true},
		{`{"\u212a":"kelvin"}`, "k", 1024, "kelvin", true}, // K folds to k
		{`{"model":""}`, "model", 1024, "", true},
		{`{"model":"first","model":"second"}`, "model", 1024, "first", true},
		{`{"model":"x"`, "model", 1024, "x", true}, // what follows is not read
		{`{"model":"x",]`, "model", 1024, "x", true},
		{`{"model":"` + m(1022) + `"}`, "model", 1024, m(1022), true},
		{`{"model":"` + m(1023) + `"}`, "model", 1024, "", false},
		{`{"model":"` + m(window/2-2) + `"}`, "model", 1 << 20, m(window/2 - 2), true},
		{`{"model":"` + m(window/2-1) + `"}`, "model", 1 << 20, "", false},
		{`{"model":"` + long + `"}`, "model", 1024, "", false},
		{`{"a":{"model":"inner"}}`, "model", 1024, "", false},
		{`{"model":null}`, "model", 1024, "", false},
		{`{"model":7}`, "model", 1024, "", false},
		{`{"model":"a\qb"}`, "model", 1024, "", false},
		{`{"model":"unterminated`, "model", 1024, "", false},
		{`{"x":1 "model":"y"}`, "model", 1024, "", false},
		{`{"x":tru,"model":"y"}`, "model", 1024, "", false},
		{`{"x":"` + long, "model", 1024, "", false},
		{`{}`, "model", 1024, "", false},
		{`["model","x"]`, "model", 1024, "", false},
		{`not json`, "model", 1024, "", false},
		{``, "model", 1024, "", false},
		{`{"a":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `,"model":"deep"}`, "model", 1024, "deep", true},
		{`{"a":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `,"model":"deep"}`, "model", 1024, "", false},
	} {
		for _, s := range streams {
			got, ok := newWalker(s.of(c.in)).firstString(c.key, c.max)
			if got != c.want || ok != c.ok {
				t.Errorf("%s: FirstString(%q, %d) of %.60q = %.20q, %v; want %.20q, %v", s.name, c.key, c.max, c.in, got, ok, c.want, c.ok)
			}
		}
	}
}

// countingReader counts what is read of it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestFirstStringReadsNoFurther: past the first member of the key, at
// most the window is read, whatever its value; and however much comes
// before it, the window does not grow.
func TestFirstStringReadsNoFurther(t *testing.T) {
	pad := strings.Repeat("x", 1<<20)
	for _, in := range []string{`{"model":"m","pad":"` + pad + `"}`, `{"model":[` + pad + `]}`} {
		c := &countingReader{r: strings.NewReader(in)}
		newWalker(c).firstString("model", 1024)
		if c.n > window {
			t.Errorf("%.20q…: %d bytes read", in, c.n)
		}
	}
	w := newWalker(strings.NewReader(`{"pad":"` + pad + `","list":[` + strings.Repeat(`"`+pad[:1000]+`",`, 1000) + `1],"model":"m"}`))
	if got, ok := w.firstString("model", 1024); got != "m" || !ok || cap(w.b) != window {
		t.Errorf("after 2 MiB: %q, %v, window of %d bytes", got, ok, cap(w.b))
	}
}

// TestFirstStringStopsAtAReadError: a stream that fails before the key is
// read has none.
func TestFirstStringStopsAtAReadError(t *testing.T) {
	src := io.MultiReader(strings.NewReader(`{"a":1,`), iotest.ErrReader(errors.New("disk gone")), strings.NewReader(`"model":"m"}`))
	if got, ok := newWalker(src).firstString("model", 1024); ok {
		t.Errorf("FirstString = %q, true; want nothing", got)
	}
}

// TestWalkerHoldsUpToHalfTheWindow: a value being read is held while it
// is at most half the window, however the stream's reads fall, and no
// longer: the window never holds more than half a value.
func TestWalkerHoldsUpToHalfTheWindow(t *testing.T) {
	for _, n := range []int{window/2 - 1, window / 2} {
		raw := `"` + strings.Repeat("x", n) + `"`
		// The second read begins at the closing quote, when n+1 bytes of
		// the value have been read.
		w := newWalker(io.MultiReader(strings.NewReader(raw[:n+1]), strings.NewReader(raw[n+1:])))
		got := w.value()
		if held := n+1 <= window/2; w.bad || (got != nil) != held || held && string(got) != raw {
			t.Errorf("string of %d bytes: bad %v, value of %d bytes; want held %v", len(raw), w.bad, len(got), held)
		}
	}
}

// TestWalkerHoldsAValueWithKeysInside: the keys in a value being held do
// not end its hold.
func TestWalkerHoldsAValueWithKeysInside(t *testing.T) {
	const raw = `{"a":{"b":"c"},"d":[1,"e"]}`
	w := newWalker(iotest.OneByteReader(strings.NewReader(raw)))
	if got := w.value(); string(got) != raw || w.bad {
		t.Errorf("value = %q (bad %v), want %q", got, w.bad, raw)
	}
}

// walkEverything walks the whole input as one value, counting all of its
// text, and reports whether it is valid JSON and nothing else.
func walkEverything(w walker) (counter, bool) {
	r := reader{walker: w}
	r.everything(&r.c)
	r.peek()
	return r.c, !r.bad && r.i == len(r.b)
}

// TestWalkerReadsAStreamAsABody: a stream is read, however its reads
// fall, as the same bytes in memory are: as valid or not, with the same
// text.
func TestWalkerReadsAStreamAsABody(t *testing.T) {
	for _, in := range []string{
		`{"a":[-0.5e+3,0,1E9,true,false,null,{},[],"\u00e9\/\b\f\n\r\t\"\\\u0000"]}`, `"\ud83d\ude00 é€😀 \ud800x \udc00"`,
		"\"\xff\xe2\x82\"", `12`, `-0`, `1.5e`, `tru`, `nul`, `[1,]`, `{"a" 1}`, `"\u12g4"`, `"\q"`, " [ ] ",
		`{"k\u00e9y":["v",{"w":"x"}]}`, `"\u12`, `"\ud83d\ude0`, `"\ud83d\u`, `"a\`, "\"\xe2\x82", `"a` + strings.Repeat(`\u00e9`, window/6) + `"`, `"` + strings.Repeat("é", window) + `"`,
	} {
		want, wantOK := walkEverything(walker{b: []byte(in)})
		if wantOK != json.Valid([]byte(in)) {
			t.Errorf("%.40q: valid %v in memory", in, wantOK)
		}
		for _, s := range streams {
			if got, ok := walkEverything(*newWalker(s.of(in))); got != want || ok != wantOK {
				t.Errorf("%s: %.40q: %+v, %v; in memory %+v, %v", s.name, in, got, ok, want, wantOK)
			}
		}
	}
}

// FuzzWalkerReadsAStreamAsABody: on any input, the walk in memory finds
// it valid as encoding/json does, and the walk of a stream of it, read in
// pieces, reads it as the walk in memory does.
func FuzzWalkerReadsAStreamAsABody(f *testing.F) {
	f.Add([]byte(`{"a":[1,"\u00e9\ud83d\ude00",{"b":null}],"c":-1.5e3}`), uint64(1))
	f.Add([]byte("\"\xe2\x82\xac\xff\""), uint64(7))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		want, wantOK := walkEverything(walker{b: in})
		if wantOK != json.Valid(in) {
			t.Fatalf("%q: valid %v in memory", in, wantOK)
		}
		if got, ok := walkEverything(*newWalker(&pieces{s: in, x: seed | 1})); got != want || ok != wantOK {
			t.Fatalf("%q in pieces: %+v, %v; in memory %+v, %v", in, got, ok, want, wantOK)
		}
	})
}
