package proxy

import (
	"net/http"

	"github.com/llmproxy/llmproxy/internal/tracing"
)

// waited ends req's wait in its lane, for its slot (in serve) or for a
// retry (in forward), which ended with err: it ends the wait's span,
// begun as wait (nil without a trace), and refuses req when it did not
// get through. It reports whether req goes on.
func (p *Proxy) waited(w http.ResponseWriter, r *http.Request, req *request, wait *tracing.Wait, err error) bool {
	if wait != nil {
		p.endWait(wait, r, req, err)
	}
	if err != nil {
		p.refuse(w, r, req, err)
		return false
	}
	return true
}

// endWait ends the span of req's wait in its lane, which ended with err:
// where it stood and why it waited when it was granted, else the error
// code its client gets (client_gone when it left).
func (p *Proxy) endWait(wait *tracing.Wait, r *http.Request, req *request, err error) {
	q := tracing.Queued{Lane: req.laneID, Priority: req.priority.String()}
	if err == nil {
		q.Ahead, q.Reasons = req.slot.Waited()
	} else {
		q.Failure = p.waitFailure(r, err)
	}
	wait.End(q)
}

// waitFailure is the error code a wait that ended with err gives its
// client: none, as it left (client_gone); shutting_down once Stop was
// called (a lane's every error gives way to it); else its answer's.
func (p *Proxy) waitFailure(r *http.Request, err error) string {
	if r.Context().Err() != nil {
		return string(OutcomeClientGone)
	}
	if p.stopping() {
		return replies[failShutdown].code
	}
	return replyFor(err, p.cfg.Clock.Now()).code
}

// refuse answers a request that never got a slot, or lost it waiting.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, req *request, err error) {
	if r.Context().Err() != nil {
		req.outcome = OutcomeClientGone // nobody to answer
		return
	}
	setLLMHeaders(w.Header(), req)
	p.failRequest(w, req, err)
}
