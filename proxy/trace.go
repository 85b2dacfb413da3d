package proxy

import (
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
