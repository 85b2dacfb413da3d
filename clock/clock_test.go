package clock

import (
	"testing"
	"time"
)

func TestFakeFiresDueTimersInOrder(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewFake(start)
	var got []string
	var at []time.Time
	c.AfterFunc(2*time.Second, func() { got = append(got, "b"); at = append(at, c.Now()) })
	c.AfterFunc(time.Second, func() {
		got = append(got, "a")
		at = append(at, c.Now())
		// A timer scheduled by a callback fires in the same Advance when due.
		c.AfterFunc(500*time.Millisecond, func() { got = append(got, "a2"); at = append(at, c.Now()) })
	})
	stopped := c.AfterFunc(1500*time.Millisecond, func() { got = append(got, "never") })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop should report true once, then false")
	}
	c.Advance(1900 * time.Millisecond)
	if len(got) != 2 || got[0] != "a" || got[1] != "a2" {
		t.Fatalf("fired %v", got)
	}
	if !at[0].Equal(start.Add(time.Second)) || !at[1].Equal(start.Add(1500*time.Millisecond)) {
		t.Fatalf("callbacks saw times %v", at)
	}
	if !c.Now().Equal(start.Add(1900 * time.Millisecond)) {
		t.Fatalf("now = %v", c.Now())
	}
	if c.Pending() != 1 {
		t.Fatalf("pending = %d, want 1", c.Pending())
	}
	c.Advance(time.Second)
	if len(got) != 3 || got[2] != "b" {
		t.Fatalf("fired %v", got)
	}
}

func TestFakeNeverMovesBackwards(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewFake(start)
	c.Set(start.Add(-time.Hour))
	if !c.Now().Equal(start) {
		t.Fatalf("now = %v", c.Now())
	}
}

func TestLaterIsTheLaterOfTwo(t *testing.T) {
	a := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := a.Add(time.Nanosecond)
	for _, tt := range []struct{ x, y, want time.Time }{
		{a, b, b}, {b, a, b}, {a, a, a}, {time.Time{}, a, a}, {a, time.Time{}, a},
	} {
		if got := Later(tt.x, tt.y); !got.Equal(tt.want) {
			t.Errorf("Later(%v, %v) = %v, want %v", tt.x, tt.y, got, tt.want)
		}
	}
}
