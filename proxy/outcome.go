package proxy

// Outcome is how a client request's answer ended: the outcome label of
// llmproxy_requests_total and the keys of a lane's Outcomes (the lane
// counts it as the label the proxy gives, see lanequeue.Slot.Done).
type Outcome string

// The outcomes, one per way an answer ends.
const (
	OutcomeOK            Outcome = "ok"             // a 1xx–3xx answer passed on whole
	OutcomeUpstreamError Outcome = "upstream_error" // the upstream's own 4xx/5xx passed on
	OutcomeProxyError    Outcome = "proxy_error"    // an error the proxy made
	OutcomeUpstreamCut   Outcome = "upstream_cut"   // the upstream's answer broke off after the status went out
	OutcomeClientGone    Outcome = "client_gone"    // the client left before or while being answered
	OutcomeClientStalled Outcome = "client_stalled" // the client accepted nothing for the idle bound and was cut
)

// allOutcomes lists every outcome.
var allOutcomes = []Outcome{OutcomeOK, OutcomeUpstreamError, OutcomeProxyError, OutcomeUpstreamCut, OutcomeClientGone, OutcomeClientStalled}

// Failed reports whether the client did not get the answer it asked for
// through no doing of its own: every outcome but ok and client_gone.
func (o Outcome) Failed() bool { return o != OutcomeOK && o != OutcomeClientGone }
