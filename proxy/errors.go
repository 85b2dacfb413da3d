package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// errorReply describes an error the proxy itself answers with.
type errorReply struct {
	status     int
	typ, code  string
	msg        string
	retryAfter time.Duration // > 0: send Retry-After
	noRetry    bool          // send x-should-retry: false
}

// writeError sends an OpenAI-format error. Every proxy-made message starts
// with "llmproxy: " so users can tell it from the upstream's.
func writeError(w http.ResponseWriter, status int, typ, code, msg string, extra http.Header) {
	h := w.Header()
	for k, vs := range extra {
		h[k] = vs
	}
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apiError{Error: apiErrorBody{Message: "llmproxy: " + msg, Type: typ, Code: code}})
}

func (e errorReply) write(w http.ResponseWriter) {
	extra := http.Header{}
	if e.retryAfter > 0 {
		secs := int64((e.retryAfter + time.Second - 1) / time.Second)
		extra.Set("Retry-After", strconv.FormatInt(secs, 10))
		extra.Set("Retry-After-Ms", strconv.FormatInt(e.retryAfter.Milliseconds(), 10))
	}
	if e.noRetry {
		extra.Set("X-Should-Retry", "false")
	}
	writeError(w, e.status, e.typ, e.code, e.msg, extra)
}
