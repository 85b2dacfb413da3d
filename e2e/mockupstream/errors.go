package mockupstream

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
)

// dialect is the provider a path imitates; it picks header names and error
// bodies.
type dialect int

const (
	openAI dialect = iota
	anthropic
	ietf // header form only: no path speaks it
)

// apiError is an error response before it is rendered in a dialect.
type apiError struct {
	status  int
	typ     string // error.type
	code    string // OpenAI error.code; "" renders as null
	param   string // OpenAI error.param; "" renders as null
	message string
	detail  string // Anthropic error.details.error_code; "" = no details
	// gemini renders the body in Gemini's form: {"error":{"code",
	// "message","status","details"}}, typ as status, with a RetryInfo
	// detail of retryDelay when it is not empty.
	gemini     bool
	retryDelay string
	// quotaID, with gemini, adds a google.rpc.QuotaFailure detail whose
	// violation names this quota.
	quotaID string
	// apim renders the body as Azure API Management does:
	// {"statusCode":...,"message":...}.
	apim bool
}

// writeError sends e as OpenAI's {"error":{...}} or Anthropic's
// {"type":"error","error":{...},"request_id":...}, or Gemini's.
func writeError(w http.ResponseWriter, d dialect, requestID string, e apiError) {
	var body any
	if e.apim {
		writeJSON(w, e.status, obj{"statusCode": e.status, "message": e.message})
		return
	}
	if e.gemini {
		inner := obj{"code": e.status, "message": e.message, "status": e.typ}
		var details []any
		if e.quotaID != "" {
			details = append(details, obj{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
				"violations": []any{obj{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", "quotaId": e.quotaID}}})
		}
		if e.retryDelay != "" {
			details = append(details, obj{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": e.retryDelay})
		}
		if details != nil {
			inner["details"] = details
		}
		writeJSON(w, e.status, obj{"error": inner})
		return
	}
	if d == anthropic {
		inner := map[string]any{"type": e.typ, "message": e.message}
		if e.detail != "" {
			inner["details"] = map[string]any{"error_code": e.detail}
		}
		body = map[string]any{"type": "error", "error": inner, "request_id": requestID}
	} else {
		var code, param any
		if e.code != "" {
			code = e.code
		}
		if e.param != "" {
			param = e.param
		}
		body = map[string]any{"error": map[string]any{
			"message": e.message, "type": e.typ, "param": param, "code": code,
		}}
	}
	writeJSON(w, e.status, body)
}

// writeJSON sends v as a JSON response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic("mockupstream: " + err.Error()) // only our own maps reach here
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// invalidRequest is a 400 in either dialect.
func invalidRequest(message string) apiError {
	return apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: message}
}

// missingKey is the 401 sent when no API key header is present.
func missingKey(d dialect) apiError {
	if d == anthropic {
		return apiError{status: http.StatusUnauthorized, typ: "authentication_error",
			message: "x-api-key header is required"}
	}
	return apiError{status: http.StatusUnauthorized, typ: "invalid_request_error",
		message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."}
}

// flexUnavailable is the 429 of a flex request refused for capacity
// (Config.FlexRefuseShare): no retry-after, and not a rate limit.
func flexUnavailable() apiError {
	return apiError{status: http.StatusTooManyRequests, typ: "server_error", code: "resource_unavailable",
		message: "Resource Unavailable: flex capacity is exhausted; retry later or use service_tier auto."}
}

// flexUnsupported is the 400 of a flex request for a model that does not
// offer flex (Config.FlexModels).
func flexUnsupported(model string) apiError {
	e := invalidRequest(fmt.Sprintf("Flex processing is not available for model %s.", model))
	e.param, e.code = "service_tier", "unsupported_value"
	return e
}

// failureTexts gives each injectable status its OpenAI type and code,
// Anthropic type and message.
var failureTexts = map[int]struct{ openAIType, openAICode, anthropicType, message string }{
	http.StatusRequestTimeout:      {"timeout", "", "timeout_error", "Request timed out."},
	http.StatusInternalServerError: {"server_error", "", "api_error", "The server had an error while processing your request. Sorry about that!"},
	http.StatusBadGateway:          {"server_error", "", "api_error", "Bad gateway."},
	http.StatusServiceUnavailable:  {"server_error", "server_is_overloaded", "api_error", "The server is overloaded or not ready yet."},
	http.StatusGatewayTimeout:      {"timeout", "", "timeout_error", "Gateway timeout."},
	529:                            {"server_error", "overloaded", "overloaded_error", "Overloaded"},
	http.StatusTooManyRequests:     {"requests", "rate_limit_exceeded", "rate_limit_error", "Rate limit reached for requests (injected). Please try again in 1s."},
}

// injectedError is the body for a status scripted with InjectFailures;
// noHint leaves the wait out of the 429's message.
func injectedError(d dialect, status int, noHint bool) apiError {
	t, ok := failureTexts[status]
	if status == http.StatusTooManyRequests && noHint {
		t.message = "Rate limit reached for requests (injected)."
	}
	if !ok {
		t.openAIType, t.anthropicType = "invalid_request_error", "invalid_request_error"
		if status >= 500 {
			t.openAIType, t.anthropicType = "server_error", "api_error"
		}
		t.message = fmt.Sprintf("Injected failure %d %s.", status, http.StatusText(status))
	}
	if d == anthropic {
		return apiError{status: status, typ: t.anthropicType, message: t.message}
	}
	return apiError{status: status, typ: t.openAIType, code: t.openAICode, message: t.message}
}

// rejection is the error body for a request admission turned away, worded
// as NoHint and ConcurrencyUnnamed ask.
func (s *Server) rejection(d dialect, a admission, cost int64) apiError {
	e := apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error"}
	if d == openAI {
		e.typ, e.code = a.dimension, "rate_limit_exceeded"
	}
	// hint is the sentence that names the wait, or nothing under NoHint.
	hint := ""
	if !s.cfg.NoHint {
		switch s.cfg.HintForm {
		case "azure":
			hint = fmt.Sprintf(" Please retry after %d seconds.", ceilSeconds(a.wait))
		case "":
			hint = fmt.Sprintf(" Please try again in %s.", ceilMillis(a.wait))
		}
	}
	if s.cfg.HintForm == "gemini" && (a.verdict == rateLimited || a.verdict == overConcurrency) {
		g := apiError{status: http.StatusTooManyRequests, typ: "RESOURCE_EXHAUSTED", gemini: true,
			message: "Resource has been exhausted (e.g. check quota)."}
		if !s.cfg.NoHint {
			g.retryDelay = fmt.Sprintf("%ds", ceilSeconds(a.wait))
		}
		return g
	}
	switch a.verdict {
	case injectedFailure:
		return injectedError(d, a.status, s.cfg.NoHint)
	case overHardQuota:
		if q, ok := s.quotaError(a); ok {
			return q
		}
		if d == anthropic {
			e.detail = "enforced_spend_limit_reached"
			e.message = "Your organization has reached its spend limit. Requests will fail until access resumes."
			return e
		}
		e.typ, e.code = "insufficient_quota", "insufficient_quota"
		e.message = "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
	case overConcurrency:
		if d == openAI {
			e.typ = "requests"
		}
		if s.cfg.ConcurrencyUnnamed {
			e.message = "Rate limit reached for requests." + hint
		} else {
			e.message = fmt.Sprintf("Rate limit reached for requests: too many concurrent requests for this key (concurrency limit %d).%s", s.cfg.MaxInFlight, hint)
		}
	case tooLarge:
		e.message = fmt.Sprintf("Request too large for tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.", a.limit, cost)
	case rateLimited:
		requested, unit := int64(1), "RPM"
		if a.dimension == "tokens" {
			requested, unit = cost, "TPM"
		}
		e.message = fmt.Sprintf("Rate limit reached for %s per min (%s) in organization org-mock: Limit %d, Used %d, Requested %d.%s",
			a.dimension, unit, a.limit, a.limit-a.remaining, requested, hint)
	}
	return e
}

// quotaError is the body of a spent quota in the QuotaForm that names
// one; ok is false for the form by path.
func (s *Server) quotaError(a admission) (e apiError, ok bool) {
	switch s.cfg.QuotaForm {
	case "gemini-day":
		return apiError{status: http.StatusTooManyRequests, typ: "RESOURCE_EXHAUSTED", gemini: true, retryDelay: "60s",
			quotaID: "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
			message: "You exceeded your current quota, please check your plan and billing details."}, true
	case "groq-day":
		hint := ""
		if !s.cfg.NoHint {
			hint = fmt.Sprintf(" Please try again in %s.", ceilMillis(a.wait))
		}
		return apiError{status: http.StatusTooManyRequests, typ: "requests", code: "rate_limit_exceeded",
			message: fmt.Sprintf("Rate limit reached for model `mock` in organization `org_mock` service tier `on_demand` on requests per day (RPD): Limit %d, Used %d, Requested 1.%s",
				a.limit, a.limit, hint)}, true
	case "apim":
		// A .NET TimeSpan: [d.]hh:mm:ss.
		secs := ceilSeconds(a.wait)
		span := fmt.Sprintf("%02d:%02d:%02d", secs/3600%24, secs/60%60, secs%60)
		if days := secs / 86400; days > 0 {
			span = fmt.Sprintf("%d.%s", days, span)
		}
		return apiError{status: http.StatusForbidden, apim: true,
			message: "Out of call volume quota. Quota will be replenished in " + span + "."}, true
	}
	return apiError{}, false
}

// nginx503Page is the body nginx sends with its default 503 page, the one
// limit_req and limit_conn refuse with unless configured otherwise.
const nginx503Page = "<html>\r\n" +
	"<head><title>503 Service Temporarily Unavailable</title></head>\r\n" +
	"<body>\r\n" +
	"<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n" +
	"<hr><center>nginx</center>\r\n" +
	"</body>\r\n" +
	"</html>\r\n"

// writeNginx503 refuses the way a default nginx limiter does.
func writeNginx503(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Server", "nginx")
	h.Set("Content-Type", "text/html")
	h.Set("Content-Length", strconv.Itoa(len(nginx503Page)))
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, nginx503Page)
}

// setLimitHeaders reports lv as OpenAI's x-ratelimit-* headers (reset as a
// Go duration until full), Anthropic's anthropic-ratelimit-* headers (reset
// as the RFC 3339 time, in whole seconds rounded up unless ResetRoundDown,
// the limit is full, on the upstream's clock, ClockAhead of the caller's)
// or the IETF draft's RateLimit-* fields for the request limit.
// Unlimited dimensions are left out.
func (s *Server) setLimitHeaders(h http.Header, d dialect, lv levels) {
	if d == ietf {
		if l := lv.requests; l != nil {
			h.Set("RateLimit-Limit", strconv.FormatInt(l.limit, 10))
			h.Set("RateLimit-Remaining", strconv.FormatInt(l.remaining, 10))
			h.Set("RateLimit-Reset", strconv.FormatInt(ceilSeconds(l.untilFull), 10))
			h.Set("RateLimit-Policy", fmt.Sprintf("%d;w=%d", l.limit, max(1, ceilSeconds(l.span))))
		}
		return
	}
	for _, dim := range []struct {
		name string
		l    *level
	}{{"requests", lv.requests}, {"tokens", lv.tokens}} {
		if dim.l == nil {
			continue
		}
		limit := strconv.FormatInt(dim.l.limit, 10)
		remaining := strconv.FormatInt(dim.l.remaining, 10)
		if d == anthropic {
			prefix := "anthropic-ratelimit-" + dim.name + "-"
			h.Set(prefix+"limit", limit)
			h.Set(prefix+"remaining", remaining)
			reset := lv.at.Add(s.cfg.ClockAhead).Add(dim.l.untilFull)
			if !s.cfg.ResetRoundDown {
				reset = reset.Add(time.Second - 1) // whole seconds, rounded up, as Anthropic sends them
			}
			h.Set(prefix+"reset", reset.Truncate(time.Second).UTC().Format(time.RFC3339))
			continue
		}
		h.Set("x-ratelimit-limit-"+dim.name, limit)
		h.Set("x-ratelimit-remaining-"+dim.name, remaining)
		h.Set("x-ratelimit-reset-"+dim.name, ceilMillis(dim.l.untilFull).String())
	}
}

// setRetryAfter advertises wait as Retry-After (whole seconds, rounded up,
// at least 1) and, unless seconds, retry-after-ms (milliseconds, rounded
// up).
func setRetryAfter(h http.Header, wait time.Duration, seconds bool) {
	secs := max(1, int64(math.Ceil(wait.Seconds())))
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	if !seconds {
		h.Set("retry-after-ms", strconv.FormatInt(int64(ceilMillis(wait)/time.Millisecond), 10))
	}
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// ceilMillis rounds d up to a whole millisecond.
func ceilMillis(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		d += time.Millisecond - r
	}
	return d
}
