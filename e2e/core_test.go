package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"go.uber.org/goleak"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/proxy"
)

// runParallel runs n calls of f with at most c at once and returns the
// errors in call order.
func runParallel(n, c int, f func(i int) error) []error {
	errs := make([]error, n)
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errs
}

// TestSDKAllSucceedAgainstRateLimitedUpstream: 200 requests at client
// concurrency 50 against an upstream allowing 20 req/s all succeed, with the
// OpenAI SDK's default two retries.
func TestSDKAllSucceedAgainstRateLimitedUpstream(t *testing.T) {
	s := newStack(t, mockupstream.Config{RPM: 1200, Latency: 20 * time.Millisecond}, nil)
	client := s.openai("sk-e2e-rate")
	errs := runParallel(200, 50, func(i int) error {
		resp, err := client.Chat.Completions.New(context.Background(), chatParams("gpt-test", fmt.Sprintf("question %d", i)))
		if err == nil && len(resp.Choices) != 1 {
			err = errors.New("no choice in the answer")
		}
		return err
	})
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 3 {
				t.Errorf("request %d: %v", i, err)
			}
		}
	}
	st := s.mock.Stats()
	if failed > 0 || st.OK != 200 {
		t.Fatalf("%d of 200 failed; upstream answered %d OK, %d rate-limited", failed, st.OK, st.RateLimited)
	}
	t.Logf("upstream: %d requests, %d ok, %d rate-limited", st.Requests, st.OK, st.RateLimited)
}

// TestHardQuotaKeyFailsFastWithoutSDKRetries: a hard-quota 429 reaches the
// client at once, marked x-should-retry: false so the SDK makes no retries
// of its own.
func TestHardQuotaKeyFailsFastWithoutSDKRetries(t *testing.T) {
	s := newStack(t, mockupstream.Config{HardQuotaKeys: []string{"sk-broke"}}, nil)
	client := s.openai("sk-broke")
	var resp *http.Response
	start := time.Now()
	_, err := client.Chat.Completions.New(context.Background(), chatParams("gpt-test", "hi"), option.WithResponseInto(&resp))
	elapsed := time.Since(start)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
		t.Fatalf("err = %v, want a 429 API error", err)
	}
	if got := apiErr.Response.Header.Get("X-Should-Retry"); got != "false" {
		t.Fatalf("x-should-retry = %q, want false", got)
	}
	if n := s.mock.Stats().ByKey["sk-broke"].Requests; n != 1 {
		t.Fatalf("upstream saw %d attempts, want 1 (no proxy or SDK retry)", n)
	}
	if elapsed > time.Second {
		t.Fatalf("hard-quota answer took %v, want well under a second", elapsed)
	}
}

// TestStreamFirstChunkArrivesBeforeUpstreamFinishes: the SDK reads the first
// streamed chunk while the upstream is still holding the rest back.
func TestStreamFirstChunkArrivesBeforeUpstreamFinishes(t *testing.T) {
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	s := newStack(t, mockupstream.Config{StreamHold: hold}, nil)
	client := s.openai("sk-stream", option.WithMaxRetries(0))
	// The headers come with the first chunk: opening the stream waits for
	// them too, so it runs under the test's own short deadline.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type opened struct {
		stream *ssestream.Stream[openai.ChatCompletionChunk]
		ok     bool
	}
	first := make(chan opened, 1)
	go func() {
		stream := client.Chat.Completions.NewStreaming(ctx, chatParams("gpt-test", "stream please"))
		first <- opened{stream, stream.Next()}
	}()
	var stream *ssestream.Stream[openai.ChatCompletionChunk]
	select {
	case o := <-first:
		stream = o.stream
		if !o.ok {
			t.Fatalf("stream ended early: %v", stream.Err())
		}
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("no chunk reached the client while the upstream held the rest")
	}
	defer stream.Close()
	release()
	n := 1
	for stream.Next() {
		n++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 3 {
		t.Fatalf("got %d chunks", n)
	}
}

// TestCancelledClientLeavesNothingBehind: clients that give up while queued
// or while their request is at the upstream leave no slot taken and no
// goroutine running.
func TestCancelledClientLeavesNothingBehind(t *testing.T) {
	before := goleak.IgnoreCurrent()
	hold := make(chan struct{})
	defer close(hold)
	s := newStack(t, mockupstream.Config{StreamHold: hold}, func(c *proxy.Config) {
		c.Lanes.Lane.Concurrency, c.Lanes.Lane.MaxConcurrency = 2, 2
	})
	client := s.openai("sk-cancel", option.WithMaxRetries(0))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ { // 2 streaming at the upstream, 4 queued
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := client.Chat.Completions.NewStreaming(ctx, chatParams("gpt-test", "x"))
			for stream.Next() {
			}
			stream.Close()
		}()
	}
	waitFor(t, func() bool {
		st := s.proxy.States()
		return len(st) == 1 && st[0].InFlight == 2 && st[0].Queued == 4
	})
	cancel()
	wg.Wait()
	waitFor(t, func() bool {
		st := s.proxy.States()
		return st[0].InFlight == 0 && st[0].Queued == 0
	})
	s.close()
	goleak.VerifyNone(t, before)
}

// TestPausedKeyDoesNotSlowAnother: one key's lane paused by a long
// Retry-After does not hold up another key's requests.
func TestPausedKeyDoesNotSlowAnother(t *testing.T) {
	s := newStack(t, mockupstream.Config{}, nil)
	s.mock.SetRetryAfter(60 * time.Second)
	s.mock.InjectFailures("sk-paused", 429)
	paused := s.openai("sk-paused", option.WithMaxRetries(0))
	free := s.openai("sk-free")

	ctx, cancel := context.WithCancel(context.Background())
	pausedDone := make(chan error, 1)
	go func() {
		_, err := paused.Chat.Completions.New(ctx, chatParams("gpt-test", "wait for me"))
		pausedDone <- err
	}()
	waitFor(t, func() bool {
		for _, l := range s.proxy.States() {
			if !l.PausedUntil.IsZero() {
				return true
			}
		}
		return false
	})
	errs := runParallel(20, 10, func(i int) error {
		_, err := free.Chat.Completions.New(context.Background(), chatParams("gpt-test", "go"))
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("free key request %d: %v", i, err)
		}
	}
	select {
	case err := <-pausedDone:
		t.Fatalf("the paused request returned (%v) before its pause ended", err)
	default:
	}
	if ok := s.mock.Stats().ByKey["sk-free"].OK; ok != 20 {
		t.Fatalf("free key: %d OK at the upstream, want 20", ok)
	}
	cancel()
	<-pausedDone
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
