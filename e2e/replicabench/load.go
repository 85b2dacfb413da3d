package main

// The client side: N chat requests at client concurrency C, each sent to
// the next live replica in turn, with the OpenAI Go SDK as loadbench sends
// them, but with the SDK's retries off so that every answer but a whole
// 200 shows.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

const maxTokens = 100

// apiKey is what the clients send; it is never printed.
const apiKey = "sk-replicabench"

// prompt is the same size for every request, as in loadbench.
func prompt(i int) string { return fmt.Sprintf("question %06d", i) }

// targets hands out the replicas round-robin; drop takes one out of the
// turn.
type targets struct {
	clients []openai.Client
	mu      sync.Mutex
	live    []int
	next    int
}

func newTargets(hc *http.Client, addrs []string) *targets {
	t := &targets{}
	for i, a := range addrs {
		t.clients = append(t.clients, openai.NewClient(
			option.WithBaseURL("http://"+a+"/v1"),
			option.WithAPIKey(apiKey),
			option.WithHTTPClient(hc),
			option.WithMaxRetries(0),
		))
		t.live = append(t.live, i)
	}
	return t
}

func (t *targets) pick() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.live[t.next%len(t.live)]
	t.next++
	return i
}

func (t *targets) drop(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, v := range t.live {
		if v == i {
			t.live = append(t.live[:k], t.live[k+1:]...)
			return
		}
	}
}

// outcome is one request.
type outcome struct {
	target     int
	start, end time.Time
	err        error // nil: a whole 200 answer
}

// loadRun is a load under way; completed counts the requests that ended.
type loadRun struct {
	n         int
	completed atomic.Int64
	done      chan struct{}
}

// waitCompleted waits until k requests have ended; false if the load or
// ctx ended first.
func (l *loadRun) waitCompleted(ctx context.Context, k int) bool {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for l.completed.Load() < int64(k) {
		select {
		case <-l.done:
			return l.completed.Load() >= int64(k)
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// runLoad sends n requests, at most c at a time, each bounded by
// reqTimeout and by ctx, and returns their outcomes once all have ended.
func runLoad(ctx context.Context, l *loadRun, ts *targets, c int, stream bool, reqTimeout time.Duration) []outcome {
	defer close(l.done)
	outs := make([]outcome, l.n)
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	for i := range l.n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			// Not sent: the run's deadline passed or it was interrupted.
			for k := i; k < l.n; k++ {
				outs[k] = outcome{target: -1, err: ctx.Err()}
			}
			wg.Wait()
			return outs
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			target := ts.pick()
			rctx, cancel := context.WithTimeout(ctx, reqTimeout)
			defer cancel()
			o := outcome{target: target, start: time.Now()}
			o.err = chat(rctx, ts.clients[target], i, stream)
			o.end = time.Now()
			outs[i] = o
			l.completed.Add(1)
		}()
	}
	wg.Wait()
	return outs
}

// chat sends request i and reads the whole answer; nil only for a 200
// that carries a choice (a stream: read to its usage chunk).
func chat(ctx context.Context, client openai.Client, i int, stream bool) error {
	params := chatParams(i, stream)
	if !stream {
		c, err := client.Chat.Completions.New(ctx, params)
		if err == nil && len(c.Choices) == 0 {
			err = errors.New("200 without a choice")
		}
		return err
	}
	s := client.Chat.Completions.NewStreaming(ctx, params)
	defer s.Close()
	var usage bool
	for s.Next() {
		usage = usage || s.Current().Usage.TotalTokens > 0
	}
	if err := s.Err(); err != nil {
		return err
	}
	// A stream cut short may end quietly; the usage chunk, the last before
	// [DONE], shows the answer arrived whole.
	if !usage {
		return errors.New("stream ended before its usage chunk")
	}
	return nil
}

// chatParams is request i, as loadbench sends it.
func chatParams(i int, stream bool) openai.ChatCompletionNewParams {
	params := openai.ChatCompletionNewParams{
		Model:     "gpt-bench",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt(i))},
		MaxTokens: openai.Int(maxTokens),
	}
	if stream {
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	}
	return params
}

// describe is a failure in a line: the status and error type the SDK kept,
// never the request's headers.
func describe(err error) string {
	var oErr *openai.Error
	if errors.As(err, &oErr) {
		return fmt.Sprintf("status %d %s", oErr.StatusCode, oErr.Message)
	}
	return err.Error()
}
