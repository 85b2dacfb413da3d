package backoff

import (
	"fmt"
	"math"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	tests := []struct {
		name  string
		p     Policy
		retry int
		rnd   float64
		want  time.Duration
	}{
		{"defaults first retry no jitter", Policy{}, 0, 0, 500 * time.Millisecond},
		{"defaults first retry max jitter", Policy{}, 0, 0.999999, 375*time.Millisecond + 125},
		{"defaults second retry", Policy{}, 1, 0, time.Second},
		{"defaults third retry half jitter", Policy{}, 2, 0.5, 1750 * time.Millisecond},
		{"defaults capped at retry 4", Policy{}, 4, 0, 8 * time.Second},
		{"defaults retry 3 below cap", Policy{}, 3, 0, 4 * time.Second},
		{"negative retry is first retry", Policy{}, -5, 0, 500 * time.Millisecond},
		{"huge retry does not overflow", Policy{}, math.MaxInt, 0, 8 * time.Second},
		{"rnd above one clamped", Policy{}, 0, 7, 375*time.Millisecond + 1},
		{"rnd negative clamped to zero", Policy{}, 0, -3, 500 * time.Millisecond},
		{"rnd NaN counts as zero", Policy{}, 0, math.NaN(), 500 * time.Millisecond},
		{"custom base and max", Policy{Base: time.Second, Max: 3 * time.Second}, 2, 0, 3 * time.Second},
		{"base above max capped", Policy{Base: time.Minute, Max: time.Second}, 0, 0, time.Second},
		{"negative base and max mean defaults", Policy{Base: -1, Max: -1}, 1, 0, time.Second},
		{"full jitter can reach near zero", Policy{Jitter: 1}, 0, 0.5, 250 * time.Millisecond},
		{"jitter above one clamped", Policy{Jitter: 9}, 0, 0.5, 250 * time.Millisecond},
		{"negative jitter means none", Policy{Jitter: -1}, 0, 0.9, 500 * time.Millisecond},
		{"NaN jitter means default", Policy{Jitter: math.NaN()}, 0, 1, 375*time.Millisecond + 1},
		{"max duration does not overflow", Policy{Base: math.MaxInt64 / 3, Max: math.MaxInt64}, 5, 0, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.p.Delay(tt.retry, tt.rnd)
			// Float rounding may shift the result by a nanosecond or so.
			if diff := got - tt.want; diff < -2 || diff > 2 {
				t.Errorf("Delay(%d, %v) = %v, want %v", tt.retry, tt.rnd, got, tt.want)
			}
		})
	}
}

func TestChoose(t *testing.T) {
	tests := []struct {
		name    string
		retry   int
		hint    time.Duration
		hasHint bool
		want    time.Duration
	}{
		{"hint used", 0, 3 * time.Second, true, 3 * time.Second},
		{"zero hint used", 2, 0, true, 0},
		{"long hint not capped", 0, time.Hour, true, time.Hour},
		{"negative hint falls back to backoff", 1, -time.Second, true, time.Second},
		{"no hint uses backoff", 1, 5 * time.Second, false, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (Policy{}).Choose(tt.retry, tt.hint, tt.hasHint, 0); got != tt.want {
				t.Errorf("Choose = %v, want %v", got, tt.want)
			}
		})
	}
}

func ExamplePolicy_Delay() {
	var p Policy // the SDK schedule: 0.5s doubling to 8s, up to 25% off
	for retry := range 6 {
		fmt.Println(retry, p.Delay(retry, 0), p.Delay(retry, 0.5))
	}
	// Output:
	// 0 500ms 437.5ms
	// 1 1s 875ms
	// 2 2s 1.75s
	// 3 4s 3.5s
	// 4 8s 7s
	// 5 8s 7s
}

func FuzzDelay(f *testing.F) {
	f.Add(int64(0), int64(0), 0.0, 0, 0.0)
	f.Add(int64(time.Second), int64(time.Minute), 0.5, 3, 0.7)
	f.Add(int64(-1), int64(math.MaxInt64), 2.0, math.MaxInt, 1.0)
	f.Add(int64(math.MaxInt64), int64(1), -1.0, -7, -0.5)
	f.Fuzz(func(t *testing.T, base, maxDelay int64, jitter float64, retry int, rnd float64) {
		p := Policy{Base: time.Duration(base), Max: time.Duration(maxDelay), Jitter: jitter}
		d := p.Delay(retry, rnd)
		if d < 0 || d > p.max() {
			t.Fatalf("Delay(%d, %v) = %v, outside [0, %v]", retry, rnd, d, p.max())
		}
		if retry < math.MaxInt {
			if next := p.Delay(retry+1, rnd); next < d {
				t.Fatalf("Delay(%d) = %v > Delay(%d) = %v", retry, d, retry+1, next)
			}
		}
		if got := p.Choose(retry, 0, false, rnd); got != d {
			t.Fatalf("Choose without hint = %v, Delay = %v", got, d)
		}
	})
}
