package universe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// state is the limits' counts, per scope, and what is in flight.
type state struct {
	d      Draw
	start  time.Time // the first request's arrival; zero before it
	scopes map[string]*scope
}

type scope struct {
	counters []*counter
	inFlight int
}

func newState(d Draw) *state { return &state{d: d, scopes: make(map[string]*scope)} }

func (s *state) scope(model string) *scope {
	k := model
	if s.d.SharedModels {
		k = ""
	}
	sc, ok := s.scopes[k]
	if !ok {
		sc = &scope{}
		for _, l := range s.d.Limits {
			sc.counters = append(sc.counters, &counter{l: l})
		}
		s.scopes[k] = sc
	}
	return sc
}

// verdict is what the limits say of one request.
type verdict struct {
	ok          bool
	wait        time.Duration // refused: until the limits would admit it, if nothing else is taken
	tokens      bool          // refused by a token limit
	concurrency bool          // refused by the in-flight cap alone
}

// admit decides a request of cost tokens for model at now. A refused one is
// charged when the draw counts refusals and count is set (the omniscient
// sender never sends one).
func (s *state) admit(now time.Time, model string, cost int64, count bool) verdict {
	if s.start.IsZero() {
		s.start = now
	}
	sc := s.scope(model)
	scale := s.d.scale(now.Sub(s.start))
	v := verdict{ok: true}
	for _, c := range sc.counters {
		// A bucket refills at the rate of the time it refills in, whenever
		// it is next looked at.
		for _, ch := range s.d.changes() {
			if at := s.start.Add(ch); c.init && c.l.Shape == Bucket && at.After(c.last) && !at.After(now) {
				c.settle(at, s.d.scale(ch-1))
			}
		}
		c.settle(now, scale)
		units := 1.0
		if c.l.Tokens {
			units = float64(cost)
		}
		if fits, w := c.room(now, units, scale); !fits {
			v.ok = false
			if w > v.wait {
				v.wait, v.tokens = w, c.l.Tokens
			}
		}
	}
	if v.ok && s.d.MaxInFlight > 0 && sc.inFlight >= s.d.MaxInFlight {
		v.ok, v.concurrency = false, true
	}
	if v.ok || (count && s.d.CountRefused) {
		for _, c := range sc.counters {
			units := 1.0
			if c.l.Tokens {
				units = float64(cost)
			}
			c.take(now, units)
		}
	}
	if v.ok {
		sc.inFlight++
	}
	return v
}

func (s *state) release(model string) { s.scope(model).inFlight-- }

// Upstream is a draw's upstream as an http.Handler. It keeps time with
// time.Now, so it runs on a synctest bubble's clock or on the wall's.
type Upstream struct {
	d  Draw
	mu sync.Mutex
	st *state
	// Requests and Refused count what reached it and what it refused.
	requests, refused int64
}

// NewUpstream returns the upstream of d.
func NewUpstream(d Draw) *Upstream { return &Upstream{d: d, st: newState(d)} }

// Stats returns the requests the upstream saw and those it refused.
func (u *Upstream) Stats() (requests, refused int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.requests, u.refused
}

// request is what the upstream reads of a body.
type request struct {
	Model     string `json:"model"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var q request
	if err == nil {
		err = json.Unmarshal(body, &q)
	}
	if err != nil {
		http.Error(w, `{"error":{"message":"bad body","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	if wait := u.d.arrival(body); wait > 0 && !sleep(r.Context(), wait) {
		return
	}
	cost := u.d.Charge(body)
	u.mu.Lock()
	now := time.Now()
	v := u.st.admit(now, q.Model, cost, true)
	u.requests++
	if !v.ok {
		u.refused++
	}
	u.speak(w.Header(), now, q.Model, v)
	u.mu.Unlock()
	if !v.ok {
		u.refuse(w, q.Model, v)
		return
	}
	released := false
	release := func() {
		if !released {
			released = true
			u.mu.Lock()
			u.st.release(q.Model)
			u.mu.Unlock()
		}
	}
	defer release()
	u.answer(r.Context(), w, q, u.d.Prompt(body), int64(u.d.MaxTokens+1)/2, u.d.answerTime(body), release)
}

// answer waits took and answers, streamed in five parts when asked,
// releasing the request's in-flight place just before its last bytes.
func (u *Upstream) answer(ctx context.Context, w http.ResponseWriter, q request, prompt, completion int64,
	took time.Duration, release func()) {
	anthropic := u.d.Dialect.Anthropic()
	if !q.Stream {
		if !sleep(ctx, took) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		release()
		if anthropic {
			fmt.Fprintf(w, `{"id":"msg_u","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":%d,"output_tokens":%d}}`,
				q.Model, prompt, completion)
			return
		}
		fmt.Fprintf(w, `{"id":"chatcmpl-u","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			q.Model, prompt, completion, prompt+completion)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	f, _ := w.(http.Flusher)
	const parts = 5
	for i := range parts {
		if !sleep(ctx, took/parts) {
			return
		}
		if i == parts-1 {
			release()
		}
		switch {
		case anthropic && i == 0:
			fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_u\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%q,\"content\":[],\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", q.Model, prompt)
			io.WriteString(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
		case anthropic && i < parts-1:
			io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok \"}}\n\n")
		case anthropic:
			io.WriteString(w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
			fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", completion)
			io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		case i < parts-1:
			fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-u\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok \"}}]}\n\n", q.Model)
		default:
			fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-u\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", q.Model)
			fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-u\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
				q.Model, prompt, completion, prompt+completion)
			io.WriteString(w, "data: [DONE]\n\n")
		}
		if f != nil {
			f.Flush()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// speak sets the limit headers the dialect sends on every answer. The
// first request limit and the first token limit are spoken of.
func (u *Upstream) speak(h http.Header, now time.Time, model string, v verdict) {
	sc := u.st.scope(model)
	scale := u.d.scale(now.Sub(u.st.start))
	for _, c := range sc.counters {
		kind := "requests"
		if c.l.Tokens {
			kind = "tokens"
		}
		if h.Get("x-ratelimit-remaining-"+kind) != "" || h.Get("anthropic-ratelimit-"+kind+"-remaining") != "" {
			continue // the first of its kind only
		}
		left, full := c.remaining(now, scale)
		switch u.d.Dialect {
		case OpenAIExact, OpenAIQuantized:
			h.Set("x-ratelimit-limit-"+kind, strconv.FormatFloat(c.stated(scale, u.d.Dialect == OpenAIQuantized), 'f', 0, 64))
			h.Set("x-ratelimit-remaining-"+kind, strconv.FormatFloat(left, 'f', 0, 64))
			h.Set("x-ratelimit-reset-"+kind, full.Round(time.Millisecond).String())
		case AnthropicDown, AnthropicUp, AnthropicSkew:
			at := now.Add(full).Add(u.d.ClockSkew)
			if u.d.Dialect == AnthropicUp {
				at = at.Add(time.Second - time.Nanosecond)
			}
			h.Set("anthropic-ratelimit-"+kind+"-limit", strconv.FormatFloat(c.stated(scale, true), 'f', 0, 64))
			h.Set("anthropic-ratelimit-"+kind+"-remaining", strconv.FormatFloat(left, 'f', 0, 64))
			h.Set("anthropic-ratelimit-"+kind+"-reset", at.UTC().Truncate(time.Second).Format(time.RFC3339))
		case IETF:
			if c.l.Tokens {
				continue
			}
			q, w := c.stated(scale, false), ceilSeconds(c.l.Window)
			if c.l.Shape == Bucket {
				// The time the bucket fills in, in the whole seconds the
				// policy speaks, and what refills over them: stating the
				// burst over a window rounded up would state a third of
				// the rate for a burst of a third of a second.
				w = ceilSeconds(seconds(c.l.capacity(scale) / (c.l.Rate * scale)))
				q = math.Max(q, math.Floor(c.l.Rate*scale*float64(w)))
			}
			h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%.0f;w=%d`, q, w))
			h.Set("RateLimit", fmt.Sprintf(`"default";r=%.0f;t=%d`, left, ceilSeconds(full)))
		case AzureRemaining:
			h.Set("x-ratelimit-remaining-"+kind, strconv.FormatFloat(left, 'f', 0, 64))
		}
	}
	if v.ok {
		return
	}
	wait := v.wait
	if v.concurrency {
		wait = time.Second
	}
	switch u.d.Dialect {
	case AnthropicDown, AnthropicUp, AnthropicSkew, IETF, RetryAfterOnly:
		h.Set("Retry-After", strconv.Itoa(ceilSeconds(wait)))
	case AzureRemaining:
		h.Set("Retry-After", strconv.Itoa(ceilSeconds(wait)))
		h.Set("retry-after-ms", strconv.FormatInt(max(wait.Milliseconds(), 1), 10))
	}
}

// refuse writes the refusal's status and body in the dialect's words.
func (u *Upstream) refuse(w http.ResponseWriter, model string, v verdict) {
	wait := v.wait.Round(time.Millisecond)
	kind := "requests per min (RPM)"
	if v.tokens {
		kind = "tokens per min (TPM)"
	}
	switch u.d.Dialect {
	case Silent503:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "<html><head><title>503 Service Temporarily Unavailable</title></head><body><h1>503</h1></body></html>\n")
		return
	case Silent:
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, "Too Many Requests\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	if v.concurrency {
		io.WriteString(w, `{"error":{"message":"Too many requests at once.","type":"rate_limit_error","code":"rate_limit_exceeded"}}`)
		return
	}
	switch u.d.Dialect {
	case OpenAIExact, OpenAIQuantized, BodyHint:
		fmt.Fprintf(w, `{"error":{"message":"Rate limit reached for %s on %s. Please try again in %s.","type":"%s","param":null,"code":"rate_limit_exceeded"}}`,
			model, kind, max(wait, time.Millisecond), map[bool]string{true: "tokens", false: "requests"}[v.tokens])
	case AnthropicDown, AnthropicUp, AnthropicSkew:
		io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your rate limit."}}`)
	case GeminiRetryInfo:
		fmt.Fprintf(w, `{"error":{"code":429,"message":"Quota exceeded.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"%ds"}]}}`,
			ceilSeconds(wait))
	case AzureRemaining:
		fmt.Fprintf(w, `{"error":{"code":"429","message":"The rate limit of your tier is exceeded. Please retry after %d seconds."}}`, ceilSeconds(wait))
	default:
		io.WriteString(w, `{"error":{"message":"Too many requests.","type":"rate_limit_error"}}`)
	}
}

func ceilSeconds(d time.Duration) int { return int(math.Ceil(d.Seconds())) }
