package pacific

import (
	"testing"
	"time"
)

// TestInAgreesWithTheTimeZoneDatabase: every hour of 2024 to 2031 (the
// changes of clocks among them) reads the same on this package's clock as
// on America/Los_Angeles from Go's own zone database.
func TestInAgreesWithTheTimeZoneDatabase(t *testing.T) {
	la, err := time.LoadLocation("America/Los_Angeles")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	for at := time.Date(2024, 1, 1, 0, 30, 0, 0, time.UTC); at.Year() < 2032; at = at.Add(time.Hour) {
		got, want := In(at), at.In(la)
		_, gotOff := got.Zone()
		_, wantOff := want.Zone()
		if gotOff != wantOff || !got.Equal(at) {
			t.Fatalf("%v: Pacific offset %ds, want %ds", at, gotOff, wantOff)
		}
	}
}

// TestNextMidnight: the next midnight on the Pacific clock, across both
// changes of clocks and from midnight itself (the one after, not it).
func TestNextMidnight(t *testing.T) {
	for _, c := range []struct{ at, want string }{
		{"2026-11-27T16:00:00Z", "2026-11-28T08:00:00Z"}, // PST
		{"2026-07-01T06:59:59Z", "2026-07-01T07:00:00Z"}, // PDT, a second before
		{"2026-07-01T07:00:00Z", "2026-07-02T07:00:00Z"}, // at midnight: the next one
		{"2026-03-08T09:30:00Z", "2026-03-09T07:00:00Z"}, // 01:30 PST on the day clocks go forward
		{"2026-03-08T11:00:00Z", "2026-03-09T07:00:00Z"}, // 04:00 PDT that day
		{"2026-03-07T20:00:00Z", "2026-03-08T08:00:00Z"}, // the day before: its midnight is still PST
		{"2026-10-31T20:00:00Z", "2026-11-01T07:00:00Z"}, // the day before clocks go back: midnight PDT
		{"2026-11-01T08:30:00Z", "2026-11-02T08:00:00Z"}, // 01:30 PDT on the day they go back
		{"2026-11-01T10:30:00Z", "2026-11-02T08:00:00Z"}, // 02:30 PST that day
		{"2026-12-31T20:00:00Z", "2027-01-01T08:00:00Z"}, // into a new year
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		want, _ := time.Parse(time.RFC3339, c.want)
		if got := NextMidnight(at); !got.Equal(want) {
			t.Errorf("NextMidnight(%s) = %v, want %s", c.at, got.UTC(), c.want)
		}
	}
}

// TestClock: a time named for a reader on the Pacific clock.
func TestClock(t *testing.T) {
	now, _ := time.Parse(time.RFC3339, "2026-11-27T16:00:00Z")
	for _, c := range []struct {
		at   string
		want string
	}{
		{"2026-11-28T08:00:00Z", "00:00 PT"},
		{"2026-11-27T16:32:05Z", "08:32:05 PT"},
		{"2026-11-28T15:59:59Z", "07:59:59 PT"},         // just under a day ahead
		{"2026-11-28T16:00:00Z", "2026-11-28 08:00 PT"}, // a day ahead
		{"2026-12-03T13:23:00Z", "2026-12-03 05:23 PT"}, // days ahead
		{"2026-07-01T07:00:00Z", "00:00 PT"},            // PDT; in the past: no date
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		if got := Clock(at, now); got != c.want {
			t.Errorf("Clock(%s) = %q, want %q", c.at, got, c.want)
		}
	}
}

// TestTheClocksChangeOnTheSecond: daylight time begins at 02:00 PST (10:00
// UTC) on the second Sunday of March and ends at 02:00 PDT (09:00 UTC) on
// the first Sunday of November, neither a second sooner nor later.
func TestTheClocksChangeOnTheSecond(t *testing.T) {
	for _, c := range []struct {
		at   string
		zone string
	}{
		{"2026-03-08T09:59:59Z", "PST"},
		{"2026-03-08T10:00:00Z", "PDT"},
		{"2026-11-01T08:59:59Z", "PDT"},
		{"2026-11-01T09:00:00Z", "PST"},
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		if zone, _ := In(at).Zone(); zone != c.zone {
			t.Errorf("In(%s) is in %s, want %s", c.at, zone, c.zone)
		}
	}
}
