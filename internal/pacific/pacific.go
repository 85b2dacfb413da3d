// Package pacific tells the time on the US Pacific clock, where Google's
// per-day quotas renew at midnight (ai.google.dev rate limits), without a
// time zone database: the container image has none, and a database
// embedded for one zone would be most of its size.
//
// It knows the rule the United States have kept since 2007: Pacific
// standard time (UTC−8) but from the second Sunday of March, 02:00 PST,
// to the first Sunday of November, 02:00 PDT, Pacific daylight time
// (UTC−7). It knows no earlier rule.
package pacific

import "time"

// Offsets of the two Pacific clocks from UTC.
const (
	standard = -8 * time.Hour
	daylight = -7 * time.Hour
)

var (
	pst = time.FixedZone("PST", int(standard/time.Second))
	pdt = time.FixedZone("PDT", int(daylight/time.Second))
)

// In is t on the Pacific clock: the same instant, in the zone PST or
// PDT that holds at it.
func In(t time.Time) time.Time {
	if daylightAt(t) {
		return t.In(pdt)
	}
	return t.In(pst)
}

// daylightAt reports whether Pacific daylight time holds at t.
func daylightAt(t time.Time) bool {
	y := t.UTC().Year()
	// 02:00 PST is 10:00 UTC; 02:00 PDT is 09:00 UTC.
	start := sunday(y, time.March, 2).Add(10 * time.Hour)
	end := sunday(y, time.November, 1).Add(9 * time.Hour)
	return !t.Before(start) && t.Before(end)
}

// sunday is the UTC midnight of the nth Sunday of month in year.
func sunday(year int, month time.Month, nth int) time.Time {
	first := time.Date(year, month, 1, 0, 0, 0, 0, time.UTC)
	days := (7 - int(first.Weekday())) % 7 // to the first Sunday
	return first.AddDate(0, 0, days+7*(nth-1))
}

// NextMidnight is the first midnight on the Pacific clock after t. A
// midnight is never inside a change of clocks (they change at 02:00), so
// its zone is the one that holds at it.
func NextMidnight(t time.Time) time.Time {
	y, m, d := In(t).Date()
	next := time.Date(y, m, d+1, 0, 0, 0, 0, pst)
	if daylightAt(next) {
		next = time.Date(y, m, d+1, 0, 0, 0, 0, pdt)
	}
	return next
}

// Clock names t on the Pacific clock for a reader, "00:00 PT", with
// seconds when they are not zero ("06:32:05 PT"), and with the date
// when t is a day or more after now ("2026-12-03 05:23 PT").
func Clock(t, now time.Time) string {
	p := In(t)
	layout := "15:04"
	if p.Second() != 0 {
		layout = "15:04:05"
	}
	if t.Sub(now) >= 24*time.Hour {
		layout = "2006-01-02 " + layout
	}
	return p.Format(layout) + " PT"
}
