package mockupstream

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"unicode/utf8"
)

// maxBody bounds the request bodies the server reads.
const maxBody = 8 << 20

// defaultMaxTokens is the output reserve when a request sets no maximum.
const defaultMaxTokens = 16

// endpoint is one mounted API path.
type endpoint struct {
	dialect    dialect
	embeddings bool // charged prompt tokens only
	flex       bool // honours "service_tier": "flex"
	// answer writes the answer and reports whether it wrote all of it.
	answer func(s *Server, ctx context.Context, w http.ResponseWriter, q *request) bool
}

// endpoints are the only paths served; everything else is a 404.
var endpoints = map[string]endpoint{
	"/v1/chat/completions": {dialect: openAI, flex: true, answer: (*Server).answerChat},
	"/v1/responses":        {dialect: openAI, flex: true, answer: (*Server).answerResponses},
	"/v1/embeddings":       {dialect: openAI, embeddings: true, answer: (*Server).answerEmbeddings},
	"/v1/messages":         {dialect: anthropic, answer: (*Server).answerMessages},
}

// request is what the answers need from a parsed request body.
type request struct {
	model            string
	stream           bool
	includeUsage     bool     // chat: stream_options.include_usage
	flex             bool     // asks for, and is served at, the flex tier
	inputs           []string // embeddings: the text of each input
	promptTokens     int64
	maxTokens        int64 // the completion cap: the request's, or defaultMaxTokens
	completionTokens int64 // what usage reports
	cost             int64 // what admission charges the token bucket
}

// requestBody is the union of the request fields of all four endpoints.
type requestBody struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Messages            []any `json:"messages"`     // chat, Anthropic
	System              any   `json:"system"`       // Anthropic
	Input               any   `json:"input"`        // Responses, embeddings
	Instructions        any   `json:"instructions"` // Responses
	MaxTokens           int64 `json:"max_tokens"`
	MaxCompletionTokens int64 `json:"max_completion_tokens"`
	MaxOutputTokens     int64 `json:"max_output_tokens"`
	ServiceTier         any   `json:"service_tier"` // any: only "flex" matters
}

// parseRequest reads a body and applies the token rule of the package doc.
func parseRequest(body []byte, ep endpoint, completionTokens int64) (*request, error) {
	var b requestBody
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, err
	}
	q := &request{model: b.Model, stream: b.Stream, flex: ep.flex && b.ServiceTier == "flex"}
	if b.StreamOptions != nil {
		q.includeUsage = b.StreamOptions.IncludeUsage
	}

	var texts []string
	texts = append(texts, textsOf(b.Messages)...)
	if ep.embeddings {
		q.inputs = textsOf(b.Input)
		texts = append(texts, q.inputs...)
	} else {
		texts = append(texts, textsOf(b.Input)...)
	}
	for _, extra := range []any{b.System, b.Instructions} {
		if t := textOf(extra); t != "" {
			texts = append(texts, t)
		}
	}
	runes := 0
	for _, t := range texts {
		runes += utf8.RuneCountInString(t)
	}
	q.promptTokens = int64((runes+3)/4 + 3*len(texts))

	q.maxTokens = defaultMaxTokens
	for _, m := range []int64{b.MaxTokens, b.MaxCompletionTokens, b.MaxOutputTokens} {
		if m > 0 {
			q.maxTokens = m
			break
		}
	}
	q.completionTokens = min(completionTokens, q.maxTokens)
	q.cost = q.promptTokens + q.maxTokens
	if ep.embeddings {
		q.completionTokens, q.cost = 0, q.promptTokens
	}
	return q, nil
}

// textsOf splits v into items: a string is one item, each element of an
// array is one, except that an array of token ids is one item with no text.
func textsOf(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		if len(v) > 0 {
			if _, isTokenID := v[0].(float64); isTokenID {
				return []string{""}
			}
		}
		texts := make([]string, len(v))
		for i, item := range v {
			texts[i] = textOf(item)
		}
		return texts
	}
	return nil
}

// textOf gathers the text of a message, content part or input item: strings,
// recursively through arrays and the "content" and "text" fields of objects.
func textOf(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []any:
		var s string
		for _, item := range v {
			s += textOf(item)
		}
		return s
	case map[string]any:
		return textOf(v["text"]) + textOf(v["content"])
	}
	return ""
}

// serveHTTP routes, authenticates, parses, turns flex away or admits,
// waits Latency, answers and bills.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	ep, ok := endpoints[r.URL.Path]
	if !ok {
		writeError(w, openAI, "", apiError{status: http.StatusNotFound, typ: "invalid_request_error",
			code: "unknown_url", message: fmt.Sprintf("Unknown request URL: %s %s.", r.Method, r.URL.Path)})
		return
	}
	d := ep.dialect
	requestID := s.newID("req_mock_")
	if d == anthropic {
		w.Header().Set("request-id", requestID)
	} else {
		w.Header().Set("x-request-id", requestID)
	}
	key, q, ok := s.readRequest(w, r, ep, requestID)
	if !ok || s.turnFlexAway(w, requestID, key, q) || !s.arrive(r.Context()) {
		return
	}

	a := s.admit(key, q.model, q.cost)
	if s.cfg.RefusalStatus == http.StatusServiceUnavailable &&
		(a.verdict == rateLimited || a.verdict == overConcurrency) {
		// The limiter in front of the upstream answers; the upstream never
		// sees the request, so nothing of its own (request id) is sent.
		w.Header().Del("request-id")
		w.Header().Del("x-request-id")
		writeNginx503(w)
		return
	}
	if !s.cfg.NoHeaders && !s.cfg.NoLimitHeaders {
		s.setLimitHeaders(w.Header(), s.headerForm(d), a.levels)
	}
	if !s.cfg.NoHeaders && !s.cfg.NoRetryAfter && a.wait > 0 {
		// A quota's renewal is stated in whole seconds, as Groq and Azure
		// API Management state it.
		setRetryAfter(w.Header(), a.wait, s.cfg.RetryAfterSeconds || a.verdict == overHardQuota)
	}
	if a.verdict != admitted {
		writeError(w, d, requestID, s.rejection(d, a, q.cost))
		return
	}
	// Deferred calls run before net/http sends the buffered end of the
	// response, so a client that has read the whole answer finds the slot
	// already free and the answer billed.
	defer s.release(key, q.model)
	if s.models != nil {
		leave, ok := s.models.enter(r.Context(), q.model)
		if !ok {
			return
		}
		defer leave()
	}
	if s.sleep(r.Context(), s.latency(q.flex)) && ep.answer(s, r.Context(), w, q) {
		s.bill(key, q)
	}
}

// readRequest checks the method and the API key and parses the body of a
// request to ep. If any is wrong it answers the error and reports false.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, ep endpoint, requestID string) (key string, q *request, ok bool) {
	d := ep.dialect
	if r.Method != http.MethodPost {
		e := invalidRequest(fmt.Sprintf("%s %s is not supported; use POST.", r.Method, r.URL.Path))
		e.status = http.StatusMethodNotAllowed
		writeError(w, d, requestID, e)
		return "", nil, false
	}
	key = apiKey(r)
	if key == "" {
		writeError(w, d, requestID, missingKey(d))
		return "", nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, d, requestID, invalidRequest("could not read the request body: "+err.Error()))
		return "", nil, false
	}
	q, err = parseRequest(body, ep, int64(s.cfg.CompletionTokens))
	if err != nil {
		writeError(w, d, requestID, invalidRequest("We could not parse the JSON body of your request: "+err.Error()))
		return "", nil, false
	}
	return key, q, true
}

// turnFlexAway answers a flex request that is not served, before
// admission: a 400 for a model outside FlexModels, or a 429 for a
// FlexRefuseShare draw. It reports whether it answered. Neither answer
// carries rate-limit headers or a retry-after, and the ledger counts
// both.
func (s *Server) turnFlexAway(w http.ResponseWriter, requestID, key string, q *request) bool {
	if !q.flex {
		return false
	}
	if s.cfg.FlexModels != nil && !slices.Contains(s.cfg.FlexModels, q.model) {
		s.countFlexTurnedAway(key, true)
		writeError(w, openAI, requestID, flexUnsupported(q.model))
		return true
	}
	if s.cfg.FlexRefuseShare <= 0 {
		return false
	}
	s.mu.Lock()
	refused := s.flexDraw.Float64() < s.cfg.FlexRefuseShare
	s.mu.Unlock()
	if refused {
		s.countFlexTurnedAway(key, false)
		writeError(w, openAI, requestID, flexUnavailable())
	}
	return refused
}

// servedTier is the top-level "service_tier" of an OpenAI answer to q.
func servedTier(q *request) string {
	if q.flex {
		return "flex"
	}
	return "default"
}

// headerForm is the dialect of the rate-limit headers on a path of dialect d.
func (s *Server) headerForm(d dialect) dialect {
	switch s.cfg.HeaderForm {
	case "openai":
		return openAI
	case "anthropic":
		return anthropic
	case "ietf":
		return ietf
	}
	return d
}
