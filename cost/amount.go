package cost

import (
	"errors"
	"math"
	"strconv"
	"strings"
)

// Amount is a sum of money in nano-dollars (10⁻⁹ USD). An int64 holds
// up to about 9.2 billion dollars.
type Amount int64

// Dollar is one US dollar.
const Dollar Amount = 1e9

// String is a in dollars with as many decimals as it needs, at most
// nine: "0.000135", "12", "-0.5".
func (a Amount) String() string {
	neg := a < 0
	u := uint64(a)
	if neg {
		u = uint64(-a)
	}
	whole, frac := u/uint64(Dollar), u%uint64(Dollar)
	s := strconv.FormatUint(whole, 10)
	if frac != 0 {
		f := strconv.FormatUint(frac+uint64(Dollar), 10)[1:] // nine digits, leading zeros kept
		s += "." + strings.TrimRight(f, "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}

// Dollars is a as a float64 number of dollars, for metrics.
func (a Amount) Dollars() float64 { return float64(a) / float64(Dollar) }

// ParseDollars reads a non-negative decimal number of dollars ("5",
// "0.25", "1e2"), rounded to the nano-dollar.
func ParseDollars(s string) (Amount, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	switch {
	case err != nil:
		return 0, errors.New("not a number of dollars")
	case f < 0 || math.IsNaN(f):
		return 0, errors.New("a negative amount")
	case f > 9e9:
		return 0, errors.New("more than 9,000,000,000 dollars")
	}
	return Amount(math.Round(f * float64(Dollar))), nil
}

// perToken is a price per million tokens as nano-dollars per token, a
// float64 so that fractions of a nano-dollar add up before rounding.
func perToken(perMillion float64) float64 { return perMillion * float64(Dollar) / 1e6 }
