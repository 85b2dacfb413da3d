package lanequeue

import "testing"

// TestPriorityReadsHighOrLowInAnyCase: "high" and "low" in any case set
// the priority; any other text is an error that leaves it as it was.
func TestPriorityReadsHighOrLowInAnyCase(t *testing.T) {
	for _, c := range []struct {
		text string
		want Priority
	}{{"high", High}, {"HIGH", High}, {"High", High}, {"low", Low}, {"LOW", Low}, {"lOw", Low}} {
		p := Priority(7) // neither: shows the text set it
		if err := p.UnmarshalText([]byte(c.text)); err != nil || p != c.want {
			t.Errorf("%q: %v, %v; want %v", c.text, p, err, c.want)
		}
		if got := c.want.String(); got != map[Priority]string{High: "high", Low: "low"}[c.want] {
			t.Errorf("String of %d = %q", c.want, got)
		}
	}
	for _, text := range []string{"", "medium", "hi", "lowest", " low"} {
		p := Low
		if err := p.UnmarshalText([]byte(text)); err == nil || p != Low {
			t.Errorf("%q: %v, %v; want an error and the priority unchanged", text, p, err)
		}
	}
}
