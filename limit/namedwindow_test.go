package limit

import (
	"testing"
	"time"
)

// TestAShorterReadingFromANamedBoundaryReplacesTheLength: from a boundary
// the upstream named to a later one lie whole windows, which the pool
// may not have filled: a reading of 5 s teaches at most 5 s, and a
// window that admitted and began at a named boundary, read as 1 s, makes
// the length 1 s at once. Refused before it admitted anything, or begun
// at a roll, the reading is held.
func TestAShorterReadingFromANamedBoundaryReplacesTheLength(t *testing.T) {
	for _, tt := range []struct {
		name            string
		named, admitted bool
		hi              time.Duration
		want            bool
	}{
		{"named, admitted", true, true, time.Second, true},
		{"not admitted", true, false, time.Second, false},
		{"begun at a roll", false, true, time.Second, false},
		{"longer", true, true, 9 * time.Second, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := shape{lengthLo: 5 * time.Second, lengthHi: 5*time.Second + time.Millisecond}
			lo := tt.hi - time.Millisecond
			counted := w.readLength(lo, tt.hi, false, tt.admitted, tt.named)
			replaced := w.lengthLo == lo && w.lengthHi == tt.hi
			if counted != tt.want || replaced != tt.want {
				t.Fatalf("counted %v, length (%v, %v]; want replaced %v", counted, w.lengthLo, w.lengthHi, tt.want)
			}
		})
	}
}

// TestAReadingAnEighthShorterFromANamedBoundaryIsHeld: a known length of
// exactly 5 s, read as 4.375 s from a named boundary, is neither within
// an eighth of it (that agrees with it) nor more than an eighth shorter
// (that replaces it): the reading is held until the next. A millisecond
// shorter, it replaces the length at once.
func TestAReadingAnEighthShorterFromANamedBoundaryIsHeld(t *testing.T) {
	w := shape{lengthLo: 5 * time.Second, lengthHi: 5 * time.Second}
	hi := 5*time.Second - 5*time.Second/lengthSlack
	if w.readLength(hi-time.Millisecond, hi, false, true, true) || w.lengthLo != 5*time.Second || w.lengthHi != 5*time.Second {
		t.Fatalf("length (%v, %v] after a reading of %v; want 5 s held", w.lengthLo, w.lengthHi, hi)
	}
	w = shape{lengthLo: 5 * time.Second, lengthHi: 5 * time.Second}
	if !w.readLength(hi-2*time.Millisecond, hi-time.Millisecond, false, true, true) || w.lengthHi != hi-time.Millisecond {
		t.Fatalf("length (%v, %v] after a reading a millisecond shorter; want it replaced", w.lengthLo, w.lengthHi)
	}
}

// TestNamedFollowsHowAWindowBegan: a window opened at a boundary the hints
// named and confirmed is named, one opened on a knock alone or begun at a
// roll is not, and a closure keeps what the window that ended was.
func TestNamedFollowsHowAWindowBegan(t *testing.T) {
	w := windows{closure: closure{stated: true, confirmed: true}}
	w.open(t0, 0)
	if !w.cur.named {
		t.Fatal("a window opened at a named boundary is not named")
	}
	w.close(at(time.Second), at(time.Second), false)
	if !w.prev.named {
		t.Fatal("the closure forgot that the window that ended was named")
	}
	w.stated = false
	w.open(at(2*time.Second), 1)
	if w.cur.named {
		t.Fatal("a window opened on a knock is named")
	}
	w.close(at(3*time.Second), at(3*time.Second), false)
	if w.prev.named {
		t.Fatal("the closure took an unnamed window for named")
	}
	w.stated = true
	w.open(at(4*time.Second), 0)
	w.lengthHi = time.Second
	w.dispatched(at(4 * time.Second))
	w.roll(at(6 * time.Second))
	if w.cur.named {
		t.Fatal("a window begun at a roll is named")
	}
}
