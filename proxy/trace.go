package proxy

import (
	"net/http"

	"github.com/llmproxy/llmproxy/internal/tracing"
	"github.com/llmproxy/llmproxy/upstream"
)

// A request's trace (Config.Tracer, see internal/tracing) is req.trace,
// nil without a Tracer; the calls below are made only with one, so that
// a proxy without traces does none of their work.

// routeProviders is each route's gen_ai.provider.name, by its name ("" for
// the default upstream).
func routeProviders(cfg Config) map[string]string {
	m := map[string]string{"": tracing.ProviderName("", cfg.Upstream)}
	for _, rt := range cfg.Routes {
		m[rt.Name] = tracing.ProviderName(rt.Name, rt.URL)
	}
	return m
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

// traceAnswer records on req's trace the latest attempt's answer, res,
// and the decision d on it.
func traceAnswer(req *request, res upstream.Result, d decision) {
	status, id, errType := 0, "", "transport_error" // no answer: a transport error
	if res.Resp != nil {
		status, id, errType = res.Resp.StatusCode, req.upstreamID, ""
	} else if res.Unreachable {
		errType = "unreachable"
	}
	req.trace.Answered(status, id, errType, d.report.Verdict.String(), d.action.String(), d.wait)
}
