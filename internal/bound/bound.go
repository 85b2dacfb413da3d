// Package bound shortens what clients send (a model's name, a path) to a
// size fit to show: in a lane's key, /lanes, metric labels, trace spans
// and log lines. It owns the one rule all of them follow, so that a value
// shown in one place matches it in another.
package bound

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"
)

// MaxField is the longest a field is kept as given; longer ones are
// shortened (see Field).
const MaxField = 128

// Field returns s at a bounded size: s itself when it is at most MaxField
// bytes, else its first 64 bytes (whole runes), "…" and 16 hex digits of
// its SHA-256. Two long values stay apart, and a client cannot make a
// lane, its metrics labels, /lanes or a trace grow with what it sends.
func Field(s string) string {
	if len(s) <= MaxField {
		return s
	}
	cut := 64
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	sum := sha256.Sum256([]byte(s))
	return s[:cut] + "…" + hex.EncodeToString(sum[:8])
}
