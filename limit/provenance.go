package limit

// RateFrom says where a group's request pace comes from. Code compares
// the values; String is what /lanes, the logs and the dashboard show.
type RateFrom uint8

const (
	rateUnknown  RateFrom = iota // nothing learned yet
	rateHeaders                  // the upstream's rate-limit headers
	rateAdmitted                 // measured between refusals
	rateSending                  // what the group sent before its first refusals, lowered by later ones
	rateHint                     // one request per "try again in"
	rateProbe                    // a probe above it met no refusal
	rateReplicas                 // the pace other replicas learned, at this one's first refusal
)

var rateFromText = [...]string{"", "headers", "admitted rate", "sending rate", "hint", "probe", "replicas"}

func (f RateFrom) String() string {
	if int(f) < len(rateFromText) {
		return rateFromText[f]
	}
	return "unknown"
}

// Bound is what the behaviour of an upstream without headers says it
// limits.
type Bound uint8

const (
	boundUnknown     Bound = iota // not known, or learned from headers
	BoundRate                     // the pace binds
	BoundConcurrency              // the number in flight binds
)

var boundText = [...]string{"", "rate", "concurrency"}

func (b Bound) String() string {
	if int(b) < len(boundText) {
		return boundText[b]
	}
	return "unknown"
}
