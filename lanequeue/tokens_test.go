package lanequeue

import "testing"

func TestALimitChargesInTheUpstreamsCount(t *testing.T) {
	var p pool
	if got := p.counted(100, 0); got != 100 {
		t.Fatalf("before any usage: %d, want the estimate, 100", got)
	}
	p.learnCount(100, 300) // the upstream counted 3× the estimate
	if got := p.counted(200, 0); got != 600 {
		t.Errorf("after one answer of 3×: %d, want 600", got)
	}
	for range 40 {
		p.learnCount(100, 50)
	}
	if got := p.counted(200, 0); got < 99 || got > 101 {
		t.Errorf("after many answers of 0.5×: %d, want about 100", got)
	}
	p.learnCount(100, -1) // no usage said
	p.learnCount(0, 500)  // nothing estimated
	if got := p.counted(200, 0); got < 99 || got > 101 {
		t.Errorf("an answer without usage moved the count: %d", got)
	}
	// The output reserved is charged as it is, whatever the prompt's
	// count.
	if got := p.counted(300, 100); got < 199 || got > 201 {
		t.Errorf("a prompt of 200 estimated and 100 of output: %d, want about 200", got)
	}
	p.learnCount(1, 1e9)
	if p.perEstimate > maxPerEstimate {
		t.Errorf("one wild reading took the count to %.1f per estimated token", p.perEstimate)
	}
}

func TestALimitLearnsFromTheSlotsPromptNotItsOutput(t *testing.T) {
	var p pool
	// 300 estimated, 100 of them output: a prompt of 200 counted as 600.
	p.learnCountOf(&Slot{cost: 300, output: 100, prompted: 600})
	if got := p.counted(300, 100); got != 700 {
		t.Errorf("after a prompt of 200 counted 600: a request of 200 + 100 costs %d, want 700", got)
	}
	if got := p.counted(0, 0); got != 0 {
		t.Errorf("a request estimated at nothing costs %d", got)
	}
}
