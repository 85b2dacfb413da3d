package lanequeue

import (
	"slices"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

// pool is one upstream limit the lanes of a group draw on: its model's
// (providers count limits per credential and model, whatever the
// endpoint), the credential's when the route says its models share one
// (Limits.PerCredential), or several models' once the group found them
// drawing on one (see shareEvidence). It holds the Shared state, the route's
// configured ceilings and the first-answer window. Its fields are guarded by
// its group's mutex.
type pool struct {
	key    string
	seq    int // the order limits of the group were made in
	shared limit.Shared
	// ceil holds the route's configured limits; nil when none are.
	ceil             *limit.Ceiling
	learned          bool          // an answer came back: the first-answer window is over
	firstAnswerUntil time.Time     // set by the first dispatch; see firstAnswerWindow
	unanswered       int           // dispatches whose answer has not been reported
	seen             seen          // what was last reported through onChange
	pass             uint64        // the group's dispatch pass it last held its lanes in
	sent             uint64        // dispatches, for sharing
	firstSeq         uint64        // the group's dispatch count at its first dispatch
	firstAt          time.Time     // and its time
	share            shareEvidence // evidence that it shares the upstream's limit with others
	// mergedInto is the limit this one was found to share, which its lanes
	// draw on from then on; nil while it stands alone.
	mergedInto *pool
	// models are the models whose lanes draw on it, in the order they
	// came (more than one once models were found to share it).
	models []string
	// sharedBy says why several models draw on it: "configured",
	// "headers move together" or refusedTogether; "" when one does.
	sharedBy string
	// admitted: an answer was accepted; spoke: one stated a remaining
	// count; refusedAt: the latest refusal of its lanes. What a trial
	// starts from (see togetherLocked).
	admitted, spoke bool
	refusedAt       time.Time
	// trial is set while limits are joined on it on trial (see
	// togetherLocked); standing is its part in the trial it is joined on.
	trial    *trial
	standing standing
	// arrived counts the requests that came for its lanes.
	arrived uint64
	// quota is a quota an answer said is spent (see quotaHold); each
	// replica keeps its own.
	quota quotaHold
	// heldAt is the group's latest dispatch pass it held its lanes back
	// in for each reason, by limitPause, limitPace and limitConcurrency
	// (see heldLocked).
	heldAt [limitReasons]uint64
	// cleared: an operator cleared what it learned, when and who (nil:
	// never).
	cleared *byOperator
	// perEstimate is what the upstream counts a request's tokens as, per
	// token of tokens.Estimate, learned from the answers' usage; 0 until
	// an answer reported one (see counted, in dispatch.go).
	perEstimate float64
}

func newPool(key string, cfg Config, sh limit.Shared) *pool {
	l := &pool{key: key, shared: sh}
	l.configure(cfg)
	if cfg.Limits.PerCredential {
		l.sharedBy = "configured"
	}
	return l
}

// firstAnswerLocked holds a new limit's lanes to one request in flight
// until its first answer, for at most firstAnswerWindow: a burst before
// anything is known is what causes the first 429s. It reports whether a
// dispatch may go, or else until when it may not. Requires the group's
// mutex held.
func (l *pool) firstAnswerLocked(now time.Time) (time.Time, bool) {
	if !l.learned && l.unanswered > 0 {
		if now.Before(l.firstAnswerUntil) && !l.shared.AnsweredElsewhere() {
			return l.firstAnswerUntil, false
		}
		// Another replica's answer taught the limit, or the first answer
		// is slow: stop waiting for it.
		l.learned = true
	}
	return time.Time{}, true
}

// addModel notes that lanes for models draw on the limit.
func (l *pool) addModel(models ...string) {
	for _, m := range models {
		if !slices.Contains(l.models, m) {
			l.models = append(l.models, m)
		}
	}
}

// maxSharedNames is the most models a lane's state names among those
// sharing its limit; the others are counted. Each lane names the others,
// so a list of them all would grow with the square of the models a
// client makes up.
const maxSharedNames = 8

// sharedWith is the other models drawing on the limit than model, the
// first maxSharedNames of them, how many more there are, and why they
// do; none while it is model's own.
func (l *pool) sharedWith(model string) (others []string, more int, because string) {
	for _, m := range l.models {
		if m == model {
			continue
		}
		if len(others) < maxSharedNames {
			others = append(others, m)
		} else {
			more++
		}
	}
	if len(others) == 0 {
		return nil, 0, ""
	}
	return others, more, l.sharedBy
}

// seen is what the group last reported of itself, to tell changes from
// noise.
type seen struct {
	fromHeaders        bool // View.FromHeaders
	fromRefusals       bool // View.FromRefusals
	shape              string
	corrected          bool
	reqLimit, tokLimit float64
	reqRate            float64
	conc               int
	concAt             time.Time
}

// firstAnswerWindow is how long a new group sends one request at a time while it
// waits for its first answer to learn what the upstream tells about its
// limits. A burst before anything is known is what causes the first 429s.
const firstAnswerWindow = time.Second

// trial is what a limit on trial keeps: the limits joined on it, and how
// many of its refusals counted lately.
type trial struct {
	members  []*pool
	refusals float64
}

// standing is a member's part in a trial: its share of the latest
// dispatches, the refusals that share made likely, and its refusals.
type standing struct {
	share, expected, refused float64
}

// root is the limit l's lanes draw on: l, or the one that took it over.
func (l *pool) root() *pool {
	for l.mergedInto != nil {
		l = l.mergedInto
	}
	return l
}

// silent reports whether l's answers said nothing of counts, while some
// were admitted and its latest was refused.
func (l *pool) silent() bool { return l.admitted && !l.spoke && !l.refusedAt.IsZero() }

// pacedFromRefusals reports whether l said nothing of counts here and its
// state learned a pace from refusals: a replica's state takes a refusal
// here for a limit's, and learns a pace, while the upstream admits
// requests, any replica's (the store tells it), so among replicas l may
// have been admitted only elsewhere (see together). (A short hint also
// sets a pace while nothing is admitted: a closed door that sends one
// can join silent models on trial, which then pace as one until it
// opens and the trial's turns tell them apart.)
func (l *pool) pacedFromRefusals(now time.Time) bool {
	return !l.spoke && l.shared.View(now).FromRefusals()
}

// sentOnTrialLocked counts a dispatch by t, on trial, for a lane made
// with own. Requires g.mu held.
func (t *pool) sentOnTrialLocked(own *pool) {
	for _, m := range t.trial.members {
		m.standing.share *= 1 - shareWeight
		if m == own {
			m.standing.share += shareWeight
		}
	}
}

// shareWeight is the weight of one dispatch in a lane's share of the
// latest dispatches of a trial (see together.go).
const shareWeight = 1.0 / 16

// configure takes cfg's configured limits: a new ceiling (nil when none),
// and a limit they name is known. Requires the group's mutex held.
func (l *pool) configure(cfg Config) {
	l.ceil = nil
	if !cfg.Limits.IsZero() {
		l.ceil = cfg.Limits.Ceiling()
	}
	// A configured limit is known: no need to wait for the first answer
	// to learn one.
	l.learned = l.learned || cfg.Limits.RPM > 0 || cfg.Limits.TPM > 0 || cfg.Limits.Concurrency > 0
}

// forget drops what the limit learned, a spent quota too, as a new limit
// of cfg starts, and notes who asked (m). Requires the group's mutex held.
func (l *pool) forget(cfg Config, m *byOperator) {
	l.shared.Forget()
	l.quota = quotaHold{}
	l.learned, l.firstAnswerUntil = false, time.Time{}
	l.configure(cfg)
	l.seen = seen{}
	l.admitted, l.spoke, l.refusedAt = false, false, time.Time{}
	l.cleared = m
}
