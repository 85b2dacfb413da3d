package main

// The client side: N requests at client concurrency C, each sent to the
// next live replica in turn, with the OpenAI or the Anthropic Go SDK as
// loadbench sends them (e2e/internal/benchcells), but with the SDK's
// retries off so that every answer but a whole 200 shows.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/internal/benchcells"
	"github.com/llmproxy/llmproxy/e2e/universe"
)

// The API keys the clients send; they are never printed.
const (
	apiKey          = "sk-replicabench"
	anthropicAPIKey = "sk-ant-replicabench"
)

// targets hands out the replicas round-robin; drop takes one out of the
// turn.
type targets struct {
	clients   []openai.Client
	anthropic []anthropic.Client // through each replica's /anthropic route
	// keyed are each replica's clients with the API keys of a row that
	// spreads its load over several (scenario.keys).
	keyed [][]openai.Client
	hc    *http.Client
	addrs []string
	mu    sync.Mutex
	live  []int
	next  int
}

// newTargets is the replicas at addrs, each with a client for each of
// keys API keys (0: one).
func newTargets(hc *http.Client, addrs []string, keys int) *targets {
	t := &targets{hc: hc, addrs: addrs}
	for i, a := range addrs {
		t.clients = append(t.clients, openai.NewClient(
			option.WithBaseURL("http://"+a+"/v1"),
			option.WithAPIKey(apiKey),
			option.WithHTTPClient(hc),
			option.WithMaxRetries(0),
		))
		var keyed []openai.Client
		for k := range keys {
			keyed = append(keyed, openai.NewClient(option.WithBaseURL("http://"+a+"/v1"),
				option.WithAPIKey(fmt.Sprintf("%s-%d", apiKey, k)), option.WithHTTPClient(hc), option.WithMaxRetries(0)))
		}
		t.keyed = append(t.keyed, keyed)
		t.anthropic = append(t.anthropic, anthropic.NewClient(
			aoption.WithBaseURL("http://"+a+"/anthropic"),
			aoption.WithAPIKey(anthropicAPIKey),
			aoption.WithHTTPClient(hc),
			aoption.WithMaxRetries(0),
		))
		t.live = append(t.live, i)
	}
	return t
}

// send sends request i of sc to replica target and reads the whole answer;
// nil only for a whole 200 answer.
func (t *targets) send(ctx context.Context, sc *scenario, target, i int) error {
	var err error
	switch {
	case sc.draw != nil:
		return universe.Send(ctx, t.hc, "http://"+t.addrs[target], *sc.draw, i)
	case sc.keys > 1:
		_, err = benchcells.Chat(ctx, t.keyed[target][i%sc.keys], i, sc.modelOf(i), sc.stream)
		return err
	case sc.anthropic:
		_, err = benchcells.Message(ctx, t.anthropic[target], i, sc.stream)
	default:
		_, err = benchcells.Chat(ctx, t.clients[target], i, sc.modelOf(i), sc.stream)
	}
	return err
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
func runLoad(ctx context.Context, l *loadRun, ts *targets, sc *scenario, reqTimeout time.Duration) []outcome {
	defer close(l.done)
	outs := make([]outcome, l.n)
	sem := make(chan struct{}, sc.c)
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
			o.err = ts.send(rctx, sc, target, i)
			o.end = time.Now()
			outs[i] = o
			l.completed.Add(1)
		}()
	}
	wg.Wait()
	return outs
}

// describe is a failure in a line: the status and error type the SDK kept,
// never the request's headers.
func describe(err error) string {
	var oErr *openai.Error
	var aErr *anthropic.Error
	switch {
	case errors.As(err, &oErr):
		return fmt.Sprintf("status %d %s", oErr.StatusCode, oErr.Message)
	case errors.As(err, &aErr):
		return fmt.Sprintf("status %d %s", aErr.StatusCode, aErr.Type())
	}
	return err.Error()
}
