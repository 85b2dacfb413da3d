package headerparse

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrorKind is what an error body says about retrying.
type ErrorKind int

const (
	// KindNone: no recognisable error body (a success, an empty or
	// non-JSON body on a status below 400).
	KindNone ErrorKind = iota
	// KindRateLimit: a retryable rate limit (OpenAI rate_limit_exceeded and
	// slow_down, Anthropic rate_limit_error, Together dynamic_*_limited,
	// Gemini RESOURCE_EXHAUSTED).
	KindRateLimit
	// KindOverloaded: the upstream is overloaded (OpenAI
	// server_is_overloaded, Anthropic overloaded_error); retryable.
	KindOverloaded
	// KindHardQuota: a quota, spend or billing limit that retrying cannot
	// lift (insufficient_quota, credit_balance_exhausted, the spend and
	// usage limit codes, Anthropic enforced_spend_limit_reached and
	// billing_error, any 402 such as OpenRouter's), or a day's quota (see
	// QuotaOf). A message alone names one only on a 429, or on a 403 in
	// Azure API Management's words: a 400's message may echo what the
	// client sent.
	KindHardQuota
	// KindTooLarge: the request can never fit (OpenAI's 429 "Request too
	// large", Anthropic request_too_large, any 413).
	KindTooLarge
	// KindOther: an error that is none of the above; the status decides.
	KindOther
	// KindConcurrency: a retryable refusal because too many requests are
	// in flight, not because of a rate: a rate-limit or overloaded error
	// whose code or message speaks of concurrent or parallel requests
	// (gateways and local servers that cap requests in flight).
	KindConcurrency
)

// Final reports whether retrying can never succeed.
func (k ErrorKind) Final() bool { return k == KindHardQuota || k == KindTooLarge }

func (k ErrorKind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindRateLimit:
		return "rate_limit"
	case KindOverloaded:
		return "overloaded"
	case KindHardQuota:
		return "hard_quota"
	case KindTooLarge:
		return "too_large"
	case KindOther:
		return "other"
	case KindConcurrency:
		return "concurrency"
	}
	return "ErrorKind(" + strconv.Itoa(int(k)) + ")"
}

// ErrorInfo is what ParseError found in an error body.
type ErrorInfo struct {
	Kind ErrorKind
	// Type is error.type; for Gemini, error.status; for Together, a
	// top-level error_type when there is no error.type.
	Type string
	// Code is error.code, a number written in decimal; when there is none,
	// Anthropic's details.error_code.
	Code string
	// Message is error.message, cut to at most maxMessage bytes.
	Message string
	// RetryIn is the wait the body asks for: Gemini's retryDelay, or a
	// message such as "Please try again in 1.574s".
	RetryIn    time.Duration
	HasRetryIn bool
	// renewal says how a quota the body names renews (see QuotaOf); with
	// KindHardQuota only. worded: the message's words alone named the
	// quota, no structured field (a code, a type, a quotaId).
	renewal renewal
	worded  bool
}

const (
	// maxErrorBody bounds the bytes examined: error bodies are small, and a
	// huge body is not one.
	maxErrorBody = 64 << 10
	// maxMessage bounds ErrorInfo.Message, which ends up in logs.
	maxMessage = 300
)

// Code sets, compared in lower case against error.type, error.code and
// details.error_code alike.
var (
	hardQuotaCodes = set("insufficient_quota", "credit_balance_exhausted",
		"organization_spend_limit_exceeded", "project_spend_limit_exceeded",
		"organization_usage_limit_exceeded", "enforced_spend_limit_reached",
		"billing_error", "402")
	tooLargeCodes  = set("request_too_large", "413")
	rateLimitCodes = set("rate_limit_exceeded", "rate_limit_error", "slow_down",
		"rate_limit", "dynamic_request_limited", "dynamic_token_limited", "resource_exhausted",
		"tokens", "requests", "429")
	overloadedCodes = set("overloaded", "server_is_overloaded", "overloaded_error",
		"unavailable", "529")
)

func set(codes ...string) map[string]bool {
	m := make(map[string]bool, len(codes))
	for _, c := range codes {
		m[c] = true
	}
	return m
}

// tooLargePrefix opens a message that decides the kind whatever the codes
// say: OpenAI's, under rate_limit_exceeded. (Anthropic's "You have reached
// your specified API usage limits" is not read: it comes as a 400, whose
// message may start with a field name the client chose.)
const tooLargePrefix = "request too large"

// ParseError classifies an upstream error body. It reads OpenAI's
// {"error":{...}}, Anthropic's {"type":"error","error":{...}} with an
// optional details.error_code (under error or at the top level), Gemini's
// array form [{"error":{"code":429,"status":"RESOURCE_EXHAUSTED",...}}], a
// code that is a string, a number or null, and Together's top-level
// error_type. Only the first 64 KiB are examined.
//
// The body decides. The status is used only when the body names no known
// kind: 402 is KindHardQuota, 413 KindTooLarge, any other status from 400 up
// is KindOther, and below 400 KindNone. A 200 body with an error object
// (an error after streaming began) is classified like any other.
func ParseError(status int, body []byte) ErrorInfo {
	if len(body) > maxErrorBody {
		body = body[:maxErrorBody]
	}
	f, isError := decodeErrorBody(body, status)
	info := ErrorInfo{Type: f.typ, Code: f.code, Message: truncate(f.message, maxMessage)}
	if info.Code == "" {
		info.Code = f.detailCode
	}
	info.RetryIn, info.HasRetryIn = retryIn(f)
	info.Kind = classify(f)
	if r, worded := renewalOf(f, status); r != renewsUnsaid && info.Kind != KindTooLarge {
		info.worded = worded && info.Kind != KindHardQuota
		info.Kind, info.renewal = KindHardQuota, r
	}
	if info.Kind == KindNone || info.Kind == KindOther {
		switch {
		case status == 402:
			info.Kind = KindHardQuota
		case status == 413:
			info.Kind = KindTooLarge
		case isError || status >= 400:
			info.Kind = KindOther
		default:
			info.Kind = KindNone
		}
	}
	return info
}

// errorFields are the strings an error body may carry, as found.
type errorFields struct {
	typ, code, message string
	detailCode         string // details.error_code
	retryDelay         string // Gemini google.rpc.RetryInfo retryDelay
	quotaIDs           string // Gemini google.rpc.QuotaFailure quotaIds, space-separated
}

// envelope is the top level of an error body. Every field is raw so that an
// unexpected JSON type in one field does not hide the others.
type envelope struct {
	Type      json.RawMessage `json:"type"`
	Error     json.RawMessage `json:"error"`
	ErrorType json.RawMessage `json:"error_type"`
	Code      json.RawMessage `json:"code"`
	Message   json.RawMessage `json:"message"`
	Details   json.RawMessage `json:"details"`
}

// errorObject is the object under "error".
type errorObject struct {
	Type    json.RawMessage `json:"type"`
	Code    json.RawMessage `json:"code"`
	Message json.RawMessage `json:"message"`
	Status  json.RawMessage `json:"status"`
	Details json.RawMessage `json:"details"`
}

// decodeErrorBody extracts the fields of a JSON error body, reporting
// whether it held an error at all. A success body, or any body on a status
// below 400 without an "error" member, holds none.
func decodeErrorBody(body []byte, status int) (errorFields, bool) {
	body = bytes.TrimSpace(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf")))
	if len(body) > 0 && body[0] == '[' { // Gemini's OpenAI-compatible endpoint
		var list []json.RawMessage
		if json.Unmarshal(body, &list) != nil || len(list) == 0 {
			return errorFields{}, false
		}
		body = list[0]
	}
	var env envelope
	if len(body) == 0 || body[0] != '{' || json.Unmarshal(body, &env) != nil {
		return errorFields{}, false
	}
	var f errorFields
	var obj errorObject
	switch {
	case isJSONObject(env.Error) && json.Unmarshal(env.Error, &obj) == nil:
		f.typ = jsonScalar(obj.Type)
		if f.typ == "" {
			f.typ = jsonScalar(obj.Status)
		}
		f.code = jsonScalar(obj.Code)
		f.message = jsonScalar(obj.Message)
		f.detailCode, f.retryDelay, f.quotaIDs = scanDetails(obj.Details)
	case jsonScalar(env.Error) != "": // {"error":"message"}
		f.message = jsonScalar(env.Error)
	}
	// The top level carries the error when there is no error object
	// (Together's error_type) and Anthropic's details may sit there. Its
	// type is only "error" in Anthropic bodies, and in a success body it
	// is something else entirely, so it is read only on an error status.
	if f.typ == "" {
		f.typ = jsonScalar(env.ErrorType)
	}
	if f.detailCode == "" && f.retryDelay == "" && f.quotaIDs == "" {
		f.detailCode, f.retryDelay, f.quotaIDs = scanDetails(env.Details)
	}
	if status >= 400 && isJSONAbsent(env.Error) {
		if top := jsonScalar(env.Type); f.typ == "" && top != "error" {
			f.typ = top
		}
		if f.code == "" {
			f.code = jsonScalar(env.Code)
		}
		if f.message == "" {
			f.message = jsonScalar(env.Message)
		}
	}
	return f, f != errorFields{}
}

// scanDetails finds details.error_code in an object (Anthropic), and
// among an array of objects (Gemini's error.details) the first error_code,
// the first retryDelay (google.rpc.RetryInfo) and the quotaId of every
// violation (google.rpc.QuotaFailure), space-separated.
func scanDetails(raw json.RawMessage) (errorCode, retryDelay, quotaIDs string) {
	var one struct {
		ErrorCode  json.RawMessage `json:"error_code"`
		RetryDelay json.RawMessage `json:"retryDelay"`
		Violations []struct {
			QuotaID json.RawMessage `json:"quotaId"`
		} `json:"violations"`
	}
	if isJSONObject(raw) {
		if json.Unmarshal(raw, &one) == nil {
			return jsonScalar(one.ErrorCode), jsonScalar(one.RetryDelay), ""
		}
		return "", "", ""
	}
	var many []json.RawMessage
	if json.Unmarshal(raw, &many) != nil {
		return "", "", ""
	}
	var ids []string
	for _, item := range many {
		one.ErrorCode, one.RetryDelay, one.Violations = nil, nil, nil
		if !isJSONObject(item) || json.Unmarshal(item, &one) != nil {
			continue
		}
		if errorCode == "" {
			errorCode = jsonScalar(one.ErrorCode)
		}
		if retryDelay == "" {
			retryDelay = jsonScalar(one.RetryDelay)
		}
		for _, v := range one.Violations {
			if id := jsonScalar(v.QuotaID); id != "" {
				ids = append(ids, id)
			}
		}
	}
	return errorCode, retryDelay, strings.Join(ids, " ")
}

// isJSONAbsent reports whether a member was missing or null.
func isJSONAbsent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func isJSONObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

// jsonScalar renders a JSON string or number as text; null, booleans,
// objects, arrays and invalid JSON give "".
func jsonScalar(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch c := raw[0]; {
	case c == '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	case c == '-' || c >= '0' && c <= '9':
		var n json.Number
		if json.Unmarshal(raw, &n) == nil {
			return n.String()
		}
	}
	return ""
}

// classify names the kind the fields describe, or KindNone. The final kinds
// are checked first: a spend cap arrives as Anthropic's rate_limit_error,
// and a request too large as OpenAI's rate_limit_exceeded.
func classify(f errorFields) ErrorKind {
	codes := [...]string{strings.ToLower(f.typ), strings.ToLower(f.code), strings.ToLower(f.detailCode)}
	message := strings.ToLower(strings.TrimSpace(f.message))
	has := func(set map[string]bool) bool {
		for _, c := range codes {
			if set[c] {
				return true
			}
		}
		return false
	}
	switch {
	case has(hardQuotaCodes):
		return KindHardQuota
	case has(tooLargeCodes) || strings.HasPrefix(message, tooLargePrefix):
		return KindTooLarge
	case (has(rateLimitCodes) || has(overloadedCodes)) && speaksOfConcurrency(codes[:], message):
		return KindConcurrency
	case has(rateLimitCodes):
		return KindRateLimit
	case has(overloadedCodes):
		return KindOverloaded
	}
	return KindNone
}

// concurrencyWords mark a refusal by the number of requests in flight.
var concurrencyWords = [...]string{"concurren", "parallel request", "in flight", "in-flight"}

// speaksOfConcurrency reports whether the codes or message of a refusal
// name concurrency as its cause.
func speaksOfConcurrency(codes []string, message string) bool {
	for _, w := range concurrencyWords {
		if strings.Contains(message, w) {
			return true
		}
		for _, c := range codes {
			if strings.Contains(c, w) {
				return true
			}
		}
	}
	return false
}

// retryIn reads the wait a body asks for: Gemini's retryDelay ("7s"), else a
// Go duration following "try again in " or "retry in " in the message
// ("Please try again in 1.574s.", "in 20ms", "in 6m0s"), else Azure
// OpenAI's "retry after N seconds" (or "second"), else Azure API
// Management's "replenished in d.hh:mm:ss" (a quota's renewal). Waits that
// are negative or beyond monthHorizon are ignored.
func retryIn(f errorFields) (time.Duration, bool) {
	if d, ok := boundedDuration(f.retryDelay); ok {
		return d, true
	}
	message := strings.ToLower(f.message)
	for _, phrase := range [...]string{"try again in ", "retry in ", "retry after ", "replenished in "} {
		i := strings.Index(message, phrase)
		if i < 0 {
			continue
		}
		word, rest, _ := strings.Cut(message[i+len(phrase):], " ")
		word = strings.TrimRight(word, ".,;:)")
		if phrase == "replenished in " {
			if d, ok := timeSpan(word); ok && d <= monthHorizon {
				return d, true
			}
			continue
		}
		if phrase == "retry after " {
			// A count of seconds: "retry after 7 seconds."
			if unit, _, _ := strings.Cut(rest, " "); isDecimal(word) && strings.HasPrefix(unit, "second") {
				word += "s"
			}
		}
		if d, ok := boundedDuration(word); ok {
			return d, true
		}
	}
	return 0, false
}

// timeSpan reads a .NET TimeSpan as Azure API Management writes one,
// [d.]hh:mm:ss, the seconds with a fraction or not; ok is false for
// anything else.
func timeSpan(v string) (time.Duration, bool) {
	hours, rest, ok := strings.Cut(v, ":")
	minutes, seconds, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 {
		return 0, false
	}
	days, h, hasDays := strings.Cut(hours, ".")
	if !hasDays {
		days, h = "0", hours
	}
	var d time.Duration
	for _, part := range [...]struct {
		v    string
		unit time.Duration
	}{{days, 24 * time.Hour}, {h, time.Hour}, {minutes, time.Minute}} {
		if part.v == "" || len(part.v) > 4 || strings.Trim(part.v, "0123456789") != "" {
			return 0, false
		}
		n, _ := strconv.Atoi(part.v)
		d += time.Duration(n) * part.unit
	}
	s, ok := parseDelay(seconds, time.Second)
	return d + s, ok
}

func boundedDuration(v string) (time.Duration, bool) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d < 0 || d > monthHorizon {
		return 0, false
	}
	return d, true
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
