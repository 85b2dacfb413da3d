// Package tracing makes llmproxy's OpenTelemetry traces: a server span
// for each client request, a span for each of its waits in its lane, and
// a client span for each upstream attempt, with the GenAI semantic
// conventions' attributes where they apply. An incoming W3C traceparent
// is continued, and each attempt sends its own span's upstream. Setup
// builds the exporter from the OTEL_* environment.
//
// It is told only what may be shown: callers pass a lane's short hash,
// never a credential, and no header, query or body reaches a span. What
// a client names, the model and the path, is bounded as a lane's key
// bounds it (see package bound). A nil
// *Tracer starts nothing, and every method of a nil *Request or *Wait
// does nothing, so a proxy without traces pays a nil check.
package tracing

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmproxy/llmproxy/internal/bound"
)

// The attributes of llmproxy's own (the others are OpenTelemetry's
// semantic conventions').
const (
	attrRequestID     = attribute.Key("llmproxy.request_id")
	attrRoute         = attribute.Key("llmproxy.route")
	attrLane          = attribute.Key("llmproxy.lane")
	attrPriority      = attribute.Key("llmproxy.priority")
	attrClient        = attribute.Key("llmproxy.client")
	attrOutcome       = attribute.Key("llmproxy.outcome")
	attrRetries       = attribute.Key("llmproxy.retries")
	attrAhead         = attribute.Key("llmproxy.wait.ahead")
	attrReasons       = attribute.Key("llmproxy.wait.reasons")
	attrRetryWait     = attribute.Key("llmproxy.wait.retry")
	attrBackoff       = attribute.Key("llmproxy.wait.backoff_ms")
	attrAttempt       = attribute.Key("llmproxy.attempt")
	attrVerdict       = attribute.Key("llmproxy.verdict")
	attrAction        = attribute.Key("llmproxy.action")
	attrNextWait      = attribute.Key("llmproxy.retry.wait_ms")
	attrUpstreamReqID = attribute.Key("llmproxy.upstream_request_id")
	attrCostUSD       = attribute.Key("llmproxy.cost_usd")
	attrServedTier    = attribute.Key("llmproxy.served_tier")
	attrRun           = attribute.Key("llmproxy.run")
)

// scope is the instrumentation scope the spans are made under.
const scope = "github.com/llmproxy/llmproxy"

// Tracer makes the spans of the proxy's requests.
type Tracer struct {
	tracer trace.Tracer
}

// New returns a Tracer whose spans tp makes.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer(scope)}
}

// Request is the trace of one client request: its server span, and what
// its attempt spans share.
type Request struct {
	t    *Tracer
	ctx  context.Context // holds the server span
	span trace.Span
	// genAI are the request's gen_ai.* attributes (see Describe), which
	// each attempt span carries too, under attemptName.
	genAI       []attribute.KeyValue
	client      string // x-llmproxy-client's name; "" for none
	attemptName string
	attempts    int
	open        *attempt // the latest attempt
}

// Start begins the server span of r, the request id's, on route ("" for
// the default upstream), continuing the trace of r's traceparent when it
// has a valid one.
func (t *Tracer) Start(r *http.Request, route, id string) *Request {
	if t == nil {
		return nil
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(r.Header))
	pattern := "/*"
	if route != "" {
		pattern = "/" + route + "/*"
	}
	method := knownMethod(r.Method)
	ctx, span := t.tracer.Start(ctx, method+" "+pattern, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		semconv.HTTPRequestMethodKey.String(method), semconv.URLPath(bound.Field(r.URL.Path)), semconv.HTTPRoute(pattern),
		attrRoute.String(route), attrRequestID.String(id)))
	return &Request{t: t, ctx: ctx, span: span, attemptName: method}
}

// knownMethod is method when it is one of HTTP's, else "_OTHER", as the
// semantic conventions name it: a span name must not take any string a
// client sends.
func knownMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method
	}
	return "_OTHER"
}

// Describe notes what the request asks of which provider: its model
// (gen_ai.request.model), its operation (gen_ai.operation.name, see
// Operation) and its provider (gen_ai.provider.name, see ProviderName);
// and the client it names (llmproxy.client, on its waits too). Empty ones
// are left out; a long model is shortened as a lane's key shortens it. The attempt spans are named after the operation and the
// model, as the GenAI conventions name them.
func (rq *Request) Describe(model, operation, provider, client string) {
	if rq == nil {
		return
	}
	rq.client = client
	model = bound.Field(model)
	if client != "" {
		rq.span.SetAttributes(attrClient.String(client))
	}
	for _, kv := range []attribute.KeyValue{semconv.GenAIRequestModelKey.String(model),
		semconv.GenAIOperationNameKey.String(operation), semconv.GenAIProviderNameKey.String(provider)} {
		if kv.Value.AsString() != "" {
			rq.genAI = append(rq.genAI, kv)
		}
	}
	if operation != "" {
		rq.attemptName = operation
		if model != "" {
			rq.attemptName += " " + model
		}
	}
	rq.span.SetAttributes(rq.genAI...)
}

// Wait is the span of one wait of a request in its lane.
type Wait struct {
	rq   *Request
	span trace.Span
}

// StartWait begins the span of a wait in the request's lane: its first
// ("lane wait"), or ("retry wait") one for a retry, which first waited
// backoff of its own.
func (rq *Request) StartWait(retry bool, backoff time.Duration) *Wait {
	if rq == nil {
		return nil
	}
	name, attrs := "lane wait", []attribute.KeyValue{attrRetryWait.Bool(retry)}
	if retry {
		name = "retry wait"
		attrs = append(attrs, attrBackoff.Int64(backoff.Milliseconds()))
	}
	_, span := rq.t.tracer.Start(rq.ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return &Wait{rq: rq, span: span}
}

// Queued is what a wait in a lane met.
type Queued struct {
	Lane     string   // the lane's short hash, as x-llmproxy-lane shows it
	Priority string   // high or low
	Ahead    int      // waiters ahead of it in its queue when it joined
	Reasons  []string // why it waited (see lanequeue.Slot.Waited)
	// Failure is the error code the wait ended the request with; "" when
	// it was granted.
	Failure string
}

// End ends the wait with what it met; the lane and the priority are the
// server span's too.
func (w *Wait) End(q Queued) {
	if w == nil {
		return
	}
	lane := []attribute.KeyValue{attrLane.String(q.Lane), attrPriority.String(q.Priority)}
	w.rq.span.SetAttributes(lane...)
	w.span.SetAttributes(lane...)
	if w.rq.client != "" {
		w.span.SetAttributes(attrClient.String(w.rq.client))
	}
	w.span.SetAttributes(attrAhead.Int(q.Ahead))
	if len(q.Reasons) > 0 {
		w.span.SetAttributes(attrReasons.StringSlice(q.Reasons))
	}
	if q.Failure != "" {
		w.span.SetAttributes(semconv.ErrorTypeKey.String(q.Failure))
		w.span.SetStatus(codes.Error, q.Failure)
	}
	w.span.End()
}

// attempt is the client span of one upstream attempt.
type attempt struct {
	span  trace.Span
	ended bool
}

// end ends the attempt's span; later calls do nothing.
func (a *attempt) end() {
	if a == nil || a.ended {
		return
	}
	a.ended = true
	a.span.End()
}

// StartAttempt begins the client span of the upstream attempt out, about
// to be sent, and sets out's traceparent (and tracestate) to the span's.
// The span carries out's URL without its query, which may hold a key, and
// with its path bounded.
func (rq *Request) StartAttempt(out *http.Request) {
	if rq == nil {
		return
	}
	rq.open.end()
	rq.attempts++
	u := out.URL
	attrs := append([]attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(knownMethod(out.Method)),
		semconv.ServerAddress(u.Hostname()), semconv.ServerPort(port(u)),
		semconv.URLFull((&url.URL{Scheme: u.Scheme, Host: u.Host, Path: bound.Field(u.Path)}).String()),
		attrAttempt.Int(rq.attempts),
	}, rq.genAI...)
	ctx, span := rq.t.tracer.Start(rq.ctx, rq.attemptName, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(out.Header))
	rq.open = &attempt{span: span}
}

// port is u's port, or its scheme's.
func port(u *url.URL) int {
	if p, err := strconv.Atoi(u.Port()); err == nil {
		return p
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// Answered records the latest attempt's answer and what the proxy
// decided of it: the status (0: none came, and errType names the
// failure), the upstream's request id, the verdict on the upstream's
// capacity (limit.Verdict's), the action (pass, retry, give_up) and, for
// a retry, the wait before the next attempt. A status from 400 up marks
// the span an error, as the conventions of client spans do. A retried
// attempt's span ends here, its answer let go; any other's ends with the
// request, once its answer went to the client.
func (rq *Request) Answered(status int, upstreamID, errType, verdict, action string, next time.Duration) {
	if rq == nil || rq.open == nil {
		return
	}
	span := rq.open.span
	span.SetAttributes(attrVerdict.String(verdict), attrAction.String(action))
	if status > 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	if upstreamID != "" {
		span.SetAttributes(attrUpstreamReqID.String(upstreamID))
	}
	if errType == "" && status >= 400 {
		errType = strconv.Itoa(status)
	}
	if errType != "" {
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, errType)
	}
	if action == "retry" {
		span.SetAttributes(attrNextWait.Int64(next.Milliseconds()))
		rq.open.end()
	}
}

// Usage records the tokens the answer's usage counted, on the request's
// span and on its latest attempt's, whose answer it was.
func (rq *Request) Usage(input, output int64) {
	if rq == nil {
		return
	}
	usage := []attribute.KeyValue{semconv.GenAIUsageInputTokens(int(input)), semconv.GenAIUsageOutputTokens(int(output))}
	rq.span.SetAttributes(usage...)
	if rq.open != nil && !rq.open.ended {
		rq.open.span.SetAttributes(usage...)
	}
}

// Cost records what the answer cost, in dollars, and the service tier
// that served it, on the request's span.
func (rq *Request) Cost(usd float64, tier, run string) {
	if rq == nil {
		return
	}
	attrs := []attribute.KeyValue{attrCostUSD.Float64(usd), attrServedTier.String(tier)}
	if run != "" {
		attrs = append(attrs, attrRun.String(run))
	}
	rq.span.SetAttributes(attrs...)
}

// End ends the request's spans: its latest attempt's, whose answer ended
// with it, and the server span, with the status the client got (0: none
// was sent), how the answer ended and the retries made. broke, when not
// "", says why the answer broke off after its status went out, which
// marks both spans errors; so does a status from 500 up the server span.
func (rq *Request) End(status int, outcome string, retries int, broke string) {
	if rq == nil {
		return
	}
	if broke != "" && rq.open != nil && !rq.open.ended {
		rq.open.span.SetStatus(codes.Error, broke)
	}
	rq.open.end()
	rq.span.SetAttributes(attrOutcome.String(outcome), attrRetries.Int(retries))
	if status > 0 {
		rq.span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	if broke != "" {
		rq.span.SetAttributes(semconv.ErrorTypeKey.String(outcome))
		rq.span.SetStatus(codes.Error, broke)
	} else if status >= 500 {
		rq.span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		rq.span.SetStatus(codes.Error, outcome)
	}
	rq.span.End()
}
