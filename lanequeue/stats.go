package lanequeue

import "time"

// laneStats are a lane's counters; they live and die with the lane.
type laneStats struct {
	admitted    int64
	retries     int64
	cancelled   int64
	rejected    int64
	throttled   int64
	absorbed429 int64
	answers     map[answerKey]int64 // by the status the client got and outcome
	attempts    map[int]int64       // upstream status per attempt (0: no answer)
	pauses      map[string]int64    // pauses this lane's answers started, by reason
	pausedSecs  map[string]float64  // pause time this lane's answers set, by reason
	hist        history
}

// answerKey is how an answer to a client is counted: the status it got (0:
// none was sent) and the outcome.
type answerKey struct {
	Status  int
	Outcome string
}

func (s *laneStats) countAnswer(status int, outcome string, now time.Time) {
	if s.answers == nil {
		s.answers = map[answerKey]int64{}
	}
	s.answers[answerKey{status, outcome}]++
	s.hist.answer(now)
}

func (s *laneStats) countAttempt(status int, now time.Time) {
	if s.attempts == nil {
		s.attempts = map[int]int64{}
	}
	s.attempts[status]++
	if status == 429 {
		s.hist.refusal(now)
	}
}

// countPause adds d of pause for reason, as /lanes and the metrics' label
// show it; started says the pause is new.
func (s *laneStats) countPause(reason string, d time.Duration, started bool) {
	if s.pauses == nil {
		s.pauses, s.pausedSecs = map[string]int64{}, map[string]float64{}
	}
	if started {
		s.pauses[reason]++
	}
	s.pausedSecs[reason] += d.Seconds()
}
