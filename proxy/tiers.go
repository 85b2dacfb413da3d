package proxy

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmproxy/llmproxy/internal/bound"
	"github.com/llmproxy/llmproxy/upstream"
)

// flexField is the body's field that asks for a service tier on path:
// OpenAI's service_tier on chat, completions and responses, Gemini's
// serviceTier on generateContent; "" where there is none.
func flexField(path string) string {
	switch {
	case strings.HasSuffix(path, "/chat/completions"), strings.HasSuffix(path, "/completions"),
		strings.HasSuffix(path, "/responses"):
		return "service_tier"
	case strings.HasSuffix(path, ":generateContent"), strings.HasSuffix(path, ":streamGenerateContent"):
		return "serviceTier"
	}
	return ""
}

// flexAnswer is what an answer to a flex attempt says of flex.
type flexAnswer uint8

// statusCapacityExceeded is Groq's refusal of a flex request it has no
// capacity for.
const statusCapacityExceeded = 498

// flexAnswerOf reads res, the answer to a flex attempt on path: OpenAI's
// 429 "Resource Unavailable" (code resource_unavailable), Groq's 498
// capacity_exceeded, Gemini's 503 (a flex request shed under load), and a
// 400 whose message names flex or the service tier (a model without
// flex).
func flexAnswerOf(res upstream.Result, path string) flexAnswer {
	if res.Resp == nil || res.Quota.Spent {
		return flexServed
	}
	e := res.Error
	switch st := res.Resp.StatusCode; {
	case st == statusCapacityExceeded, st == http.StatusServiceUnavailable && flexField(path) == "serviceTier":
		return flexBusy
	case st == http.StatusTooManyRequests && (strings.EqualFold(e.Code, "resource_unavailable") ||
		strings.EqualFold(e.Code, "capacity_exceeded") || containsFold(e.Message, "resource unavailable")):
		return flexBusy
	case st == http.StatusBadRequest && (containsFold(e.Message, "flex") || containsFold(e.Message, "service_tier") ||
		containsFold(e.Message, "service tier")):
		return flexUnsupported
	}
	return flexServed
}

// containsFold reports whether s holds sub in any case.
func containsFold(s, sub string) bool { return strings.Contains(strings.ToLower(s), sub) }

// flexBackoff is the wait after a request's n-th flex refusal in a row,
// given a jitter draw rnd in [0, 1): 250 ms, doubled at each refusal up to
// a second, less up to half. A capacity refusal says nothing of when
// capacity comes back, and a run's last requests wait on its unluckiest:
// long waits would make its tail (with a third of flex requests refused,
// one in 250 is refused five times in a row).
func flexBackoff(n int, rnd float64) time.Duration {
	d := min(250*time.Millisecond<<min(max(n-1, 0), 2), time.Second)
	return time.Duration(float64(d) * (1 - rnd/2))
}

// tierMemory is what the proxy learned of tiers, by route and model:
// the models that have no flex, and how long their standard answers
// take. It holds at most maxTierMemory of each.
type tierMemory struct {
	mu       sync.Mutex
	noFlexes map[string]bool
	std      map[string]time.Duration
}

// maxTierMemory bounds the models tierMemory keeps (model names are the
// clients' words).
const maxTierMemory = 4096

// tierKey is route's and model's key, the model bounded as a lane's is
// (a body may name a model of a megabyte).
func tierKey(route, model string) string { return route + "\x00" + bound.Field(model) }

func (t *tierMemory) noFlex(route, model string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.noFlexes[tierKey(route, model)]
}

func (t *tierMemory) markNoFlex(route, model string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.noFlexes == nil {
		t.noFlexes = map[string]bool{}
	}
	if len(t.noFlexes) < maxTierMemory {
		t.noFlexes[tierKey(route, model)] = true
	}
}

// noteStandard learns how long a standard answer of model took to its
// headers: a moving average, a quarter of each new one.
func (t *tierMemory) noteStandard(route, model string, took time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.std == nil {
		t.std = map[string]time.Duration{}
	}
	k := tierKey(route, model)
	old, ok := t.std[k]
	switch {
	case ok:
		t.std[k] = old + (took-old)/4
	case len(t.std) < maxTierMemory:
		t.std[k] = took
	}
}

// flexUntil is when a flex request that arrived at arrived, with its
// deadline, must go at standard: what is left then is three standard
// answers' time (a second at least), or half its budget while no
// standard answer has been seen, and never more than half.
func (t *tierMemory) flexUntil(route, model string, arrived, deadline time.Time) time.Time {
	t.mu.Lock()
	took, ok := t.std[tierKey(route, model)]
	t.mu.Unlock()
	half := deadline.Sub(arrived) / 2
	reserve := half
	if ok {
		reserve = min(half, max(time.Second, 3*took))
	}
	return deadline.Add(-reserve)
}

const (
	flexServed      flexAnswer = iota // an answer like any other
	flexBusy                          // no flex capacity now: try again, or at standard
	flexUnsupported                   // the model has no flex
)
