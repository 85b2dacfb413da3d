package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/proxy"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
)

// TestNothingLostUnderFaults: three tenants' evals at once against an
// upstream that paces at 50 requests a second per key, holds at most 16
// in flight per key and throws storms at two of them (six 429s with
// Retry-After 1 then two 500s and two 503s; eight 529s: each within what
// one request's LLMPROXY_MAX_RETRIES absorbs), while sixty other clients
// give up at a random moment. Every request whose client waited gets a 200 answer;
// afterwards no lane holds a slot or a queued request and no body is held.
// The figures (makespan, upstream refusals) are logged for
// docs/reliability.md; LLMPROXY_E2E_LOG=1 shows the proxy's log.
func TestNothingLostUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	s := newStack(t, mockupstream.Config{RPM: 3000, MaxInFlight: 16, Latency: 20 * time.Millisecond}, func(c *proxy.Config) {
		if os.Getenv("LLMPROXY_E2E_LOG") != "" {
			c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
	})
	s.mock.InjectFailures("sk-rel-a", repeat(429, 6)...)
	s.mock.InjectFailures("sk-rel-a", append(repeat(500, 2), repeat(503, 2)...)...)
	s.mock.InjectFailures("sk-rel-b", repeat(529, 8)...)
	keys := []string{"sk-rel-a", "sk-rel-b", "sk-rel-c"}
	const perKey = 150
	hc := s.httpClient()
	send := func(ctx context.Context, key string, i int) (int, error) {
		body := fmt.Sprintf(`{"model":"gpt-rel","messages":[{"role":"user","content":"question %d"}]}`, i)
		req, _ := http.NewRequestWithContext(ctx, "POST", s.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return resp.StatusCode, err
		}
		return resp.StatusCode, nil
	}
	var quitters atomic.Int32
	start := time.Now()
	errs := runParallel(len(keys)*perKey+60, 90, func(i int) error {
		if i%7 == 0 && quitters.Load() < 60 { // a client that gives up
			quitters.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(300))*time.Millisecond)
			defer cancel()
			_, _ = send(ctx, keys[i%3], i)
			return nil
		}
		code, err := send(context.Background(), keys[i%3], i)
		if err == nil && code != 200 {
			err = fmt.Errorf("status %d", code)
		}
		return err
	})
	took := time.Since(start)
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 5 {
				t.Errorf("request %d: %v", i, err)
			}
		}
	}
	waitFor(t, func() bool {
		for _, st := range s.proxy.States() {
			if st.Queued != 0 || st.InFlight != 0 {
				return false
			}
		}
		return true
	})
	st := s.mock.Stats()
	t.Logf("%d requests (%d clients gave up) in %v; upstream: %d requests, %d ok, %d refused for rate or concurrency, %d injected faults; %d failed",
		len(errs), quitters.Load(), took.Round(time.Millisecond), st.Requests, st.OK, st.RateLimited, st.Injected, failed)
	if failed > 0 {
		t.Fatalf("%d requests lost", failed)
	}
}

func repeat(status, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = status
	}
	return out
}
