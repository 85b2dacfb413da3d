package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/proxy"
)

// TestRefusalsFromASecondClientDoNotUseUpRetries: another client, not
// behind the proxy, uses the same key at full speed, so the upstream turns
// the proxy's requests away more often than LLMPROXY_MAX_RETRIES (2 here)
// allows. Those 429s are absorbed by waiting, bounded by each request's
// deadline and not by the retry count: every proxied request gets a 200
// before its deadline, and some needed more re-sends than the retry limit.
func TestRefusalsFromASecondClientDoNotUseUpRetries(t *testing.T) {
	const (
		key         = "sk-shared-key"
		requests    = 150
		concurrency = 20
		maxRetries  = 2
		maxWait     = 15 * time.Second
		body        = `{"model":"gpt-shared","messages":[{"role":"user","content":"question"}]}`
	)
	s := newStack(t, mockupstream.Config{RPM: 1200, RequestBurst: 4, Latency: 5 * time.Millisecond},
		func(c *proxy.Config) { c.MaxRetries = maxRetries })

	// The second client: four loops straight to the upstream, each trying
	// again soon after a refusal, until the proxied work is done, 5 s have
	// passed or 6,000 attempts were made.
	direct := s.httpClient()
	hammerCtx, stopHammer := context.WithTimeout(context.Background(), 5*time.Second)
	defer stopHammer()
	var hammerSent, hammerOK atomic.Int64
	var hammers sync.WaitGroup
	var hammerEnd atomic.Int64
	hammerStart := time.Now()
	for range 4 {
		hammers.Add(1)
		go func() {
			defer hammers.Done()
			defer func() { hammerEnd.Store(int64(time.Since(hammerStart))) }()
			for hammerCtx.Err() == nil && hammerSent.Add(1) <= 6000 {
				req, _ := http.NewRequestWithContext(hammerCtx, "POST", s.mock.URL()+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := direct.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					hammerOK.Add(1)
					continue
				}
				select {
				case <-hammerCtx.Done():
				case <-time.After(3 * time.Millisecond):
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the second client has the key's limit first

	hc := s.httpClient()
	var mostRetries, slowest atomic.Int64
	start := time.Now()
	errs := runParallel(requests, concurrency, func(i int) error {
		req, _ := http.NewRequest("POST", s.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Stainless-Timeout", strconv.Itoa(int(maxWait/time.Second)))
		sent := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(sent)
		for m := slowest.Load(); int64(took) > m && !slowest.CompareAndSwap(m, int64(took)); m = slowest.Load() {
		}
		n, _ := strconv.ParseInt(resp.Header.Get("X-Llmproxy-Retries"), 10, 64)
		for m := mostRetries.Load(); n > m && !mostRetries.CompareAndSwap(m, n); m = mostRetries.Load() {
		}
		switch {
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("status %d after %d retries in %v: %.200s", resp.StatusCode, n, took.Round(time.Millisecond), b)
		case took > maxWait:
			return fmt.Errorf("200 after %v, past its %v deadline", took.Round(time.Millisecond), maxWait)
		}
		return nil
	})
	took := time.Since(start)
	stopHammer()
	hammers.Wait()

	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 5 {
				t.Errorf("request %d: %v", i, err)
			}
		}
	}
	st := s.mock.Stats()
	t.Logf("%d proxied requests in %v, the slowest %v, at most %d re-sends for one; second client: %d sent, %d ok, for %v; upstream: %d requests, %d ok, %d rate-limited",
		requests, took.Round(time.Millisecond), time.Duration(slowest.Load()).Round(time.Millisecond), mostRetries.Load(), min(hammerSent.Load(), 6000), hammerOK.Load(), time.Duration(hammerEnd.Load()).Round(time.Millisecond), st.Requests, st.OK, st.RateLimited)
	if failed > 0 {
		t.Fatalf("%d of %d proxied requests failed", failed, requests)
	}
	// Without this the test would not show that refusals are not counted.
	if mostRetries.Load() <= maxRetries {
		t.Fatalf("no request needed more than %d re-sends: the second client did not contend", maxRetries)
	}
}
