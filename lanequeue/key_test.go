package lanequeue

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestBoundedKeepsAValueOfExactly128Bytes: 128 bytes is within bounds.
func TestBoundedKeepsAValueOfExactly128Bytes(t *testing.T) {
	s := strings.Repeat("m", maxField)
	if got := bounded(s); got != s {
		t.Fatalf("bounded(128 bytes) = %q, want it unchanged", got)
	}
	if got := bounded(s + "x"); len(got) >= len(s) || !strings.HasPrefix(got, strings.Repeat("m", 64)+"…") {
		t.Fatalf("bounded(129 bytes) = %q, want its first 64 bytes, … and a hash", got)
	}
}

// TestBoundedCutsLongValuesAtAWholeRune: the kept prefix never ends inside
// a multi-byte rune, and bytes that start no rune at all are not kept.
func TestBoundedCutsLongValuesAtAWholeRune(t *testing.T) {
	s := strings.Repeat("a", 63) + "é" + strings.Repeat("b", 100) // é is bytes 63 and 64
	got := bounded(s)
	if want := strings.Repeat("a", 63) + "…"; !strings.HasPrefix(got, want) || !utf8.ValidString(got) {
		t.Fatalf("bounded = %q, want it to start %q and be valid UTF-8", got, want)
	}
	junk := strings.Repeat("\x80", 200) // no byte starts a rune
	got = bounded(junk)
	if !strings.HasPrefix(got, "…") || len(got) != len("…")+16 {
		t.Fatalf("bounded(no runes) = %q, want … and 16 hex digits", got)
	}
}
