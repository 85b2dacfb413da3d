package lanequeue

import "math"

// An upstream counts a request's prompt its own way (its tokenizer, the
// whole JSON body), and its token limits are in its count; the output it
// reserves is the request's max_tokens either way. A limit learns how many
// of the upstream's prompt tokens one token of the proxy's estimate is,
// from the prompt tokens the answers' usage reported against the estimate,
// and charges its budgets, and the route's ceiling, in the upstream's
// count: the prompt scaled, the output as reserved.

// Bounds of a believable count per estimated token, and how much of each
// new reading moves it once one is known.
const (
	minPerEstimate  = 0.2
	maxPerEstimate  = 10
	perEstimateGain = 0.25
)

// learnCount takes an answer's usage (the prompt tokens it counted, below
// 1: none said) of a request whose prompt was estimated at estimate.
// Requires the group's mutex held.
func (l *pool) learnCount(estimate, used int64) {
	if estimate <= 0 || used <= 0 {
		return
	}
	r := math.Min(math.Max(float64(used)/float64(estimate), minPerEstimate), maxPerEstimate)
	if l.perEstimate == 0 {
		l.perEstimate = r
		return
	}
	l.perEstimate += perEstimateGain * (r - l.perEstimate)
}

// learnCountOf learns from s's answer: its prompt, the part of its cost
// that is not output, against what the upstream counted it as.
func (l *pool) learnCountOf(s *Slot) { l.learnCount(s.cost-s.output, s.prompted) }

// counted is what a request estimated at estimate tokens, output of them
// reserved for its output, costs in the upstream's count, as far as the
// answers have shown it. Requires the group's mutex held.
func (l *pool) counted(estimate, output int64) int64 {
	prompt := estimate - output
	if l.perEstimate == 0 || prompt <= 0 {
		return estimate
	}
	return max(1, int64(math.Round(float64(prompt)*l.perEstimate))+output)
}

// PromptCounted tells the slot what the upstream counted its request's
// prompt as: its answer's usage (input tokens). Call it before Done; the
// lane's limit learns from it how the upstream counts.
func (s *Slot) PromptCounted(tokens int64) { s.prompted = tokens }
