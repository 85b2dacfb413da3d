package lanequeue

import (
	"context"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// accept reports an accepted answer with these limits.
func accept(s *Slot, lim headerparse.Limits) {
	report(s, Report{Status: 200, Verdict: Accepted, Limits: lim})
}

// refuse reports a rate refusal with the upstream's hint (0: none).
func refuse(s *Slot, hint time.Duration) {
	report(s, Report{Status: 429, Verdict: RateRefused, Hint: hint})
}

// report reports r for s's dispatch; a slot already answered is first sent
// again, which must be possible at once.
func report(s *Slot, r Report) {
	s.lane.g.mu.Lock()
	answered := s.phase != phaseSent
	s.lane.g.mu.Unlock()
	if answered {
		done := make(chan error, 1)
		go func() { done <- s.WaitRetry(context.Background(), 0) }()
		select {
		case err := <-done:
			if err != nil {
				panic("resend: " + err.Error())
			}
		case <-time.After(5 * time.Second):
			panic("resend blocked")
		}
	}
	s.Report(r)
}

// pause holds the lane's group until t, as a refusal's report would.
func pause(l *Lane, until time.Time) {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	sh := l.g.shared.(*Memory)
	if until.After(sh.pausedUntil) {
		sh.pausedUntil = until
	}
}

// pastProbe ends the lane group's probe: tests of what follows start there.
func pastProbe(l *Lane) {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	l.g.learned = true
}

// shared is the lane's in-process shared state, for white-box checks.
func shared(l *Lane) *Memory { return l.g.shared.(*Memory) }
