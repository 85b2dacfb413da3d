package limit

import (
	"testing"
	"time"
)

// TestACeilingWithoutRPMKeepsNoSpacing: a ceiling of other limits (RPM
// 0) spaces no starts by RPM: after a start its RPM spacer is as it was,
// and the next start goes at once. The spacer is looked at, not only the
// next start: the gap RPM 0 would ask for is a minute over zero, +Inf,
// which each platform turns into a Duration its own way (the least on
// amd64, a next start long past that holds nothing; the largest on arm64,
// one that holds every start for ever).
func TestACeilingWithoutRPMKeepsNoSpacing(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := Limits{TPM: 600}.Ceiling()
	c.Take(now, 1)
	if next := c.rpm.Next(); !next.IsZero() {
		t.Fatalf("a ceiling without RPM spaced its starts by RPM: the next at %v", next)
	}
	if at, ok := c.Admit(now, 1, NewMemory(Config{})); !ok {
		t.Fatalf("a ceiling without RPM held the next start until %v", at)
	}
}
