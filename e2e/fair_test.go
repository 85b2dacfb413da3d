package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
)

// dispatchLog numbers the proxy's upstream attempts in the order they
// start, by the x-llmproxy-request-id the proxy gives each request (an
// answer carries it too), so that a test can tell how many dispatches a
// request waited for without reading a clock.
type dispatchLog struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    int
	at   map[string]int // request id → the number of its first attempt
}

func (d *dispatchLog) RoundTrip(r *http.Request) (*http.Response, error) {
	d.mu.Lock()
	d.n++
	if id := r.Header.Get("X-Llmproxy-Request-Id"); d.at[id] == 0 {
		d.at[id] = d.n
	}
	d.mu.Unlock()
	return d.next.RoundTrip(r)
}

// count is how many attempts have started.
func (d *dispatchLog) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// of is the number of the first attempt of the request whose answer is
// resp.
func (d *dispatchLog) of(resp *http.Response) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at[resp.Header.Get("X-Llmproxy-Request-Id")]
}

// TestASmallClientIsNotBehindABigOneOnItsLane: a big run queues bigN
// requests on a key; then a small run on the same key sends smallN, two at
// a time. Naming their clients (x-llmproxy-client), each small request is
// sent upstream within a few dispatches of its arrival, whatever the big
// run has queued; unnamed, the lane is one FIFO and the small run's first
// request waits for what was queued before it. Counted in dispatches, not
// time: the upstream limit is configured on the route (no refusals,
// nothing retried), and the small run starts once the big run has queued
// most of its requests.
func TestASmallClientIsNotBehindABigOneOnItsLane(t *testing.T) {
	const bigN, queuedFirst, smallN = 300, 200, 6
	for _, named := range []bool{true, false} {
		t.Run(fmt.Sprintf("named %v", named), func(t *testing.T) {
			log := &dispatchLog{at: map[string]int{}}
			s := newStack(t, mockupstream.Config{RPM: 12000, Latency: 20 * time.Millisecond}, func(c *proxy.Config) {
				c.Default.Limits = limit.Limits{RPM: 6000} // 100 a second: the big run lasts about 3 s
				log.next = c.Transport
				c.Transport = log
			})
			big, small := s.openai("sk-e2e-fair"), s.openai("sk-e2e-fair")
			as := func(name string) []option.RequestOption {
				if !named {
					return nil
				}
				return []option.RequestOption{option.WithHeader("X-Llmproxy-Client", name)}
			}
			bigDone := make(chan []error, 1)
			go func() {
				bigDone <- runParallel(bigN, bigN, func(i int) error {
					_, err := big.Chat.Completions.New(context.Background(), chatParams("gpt-test", fmt.Sprintf("big %d", i)), as("big")...)
					return err
				})
			}()
			waitForQueue(t, s.proxy, queuedFirst)

			waited := make([]int, smallN)
			errs := runParallel(smallN, 2, func(i int) error {
				var resp *http.Response
				sent := log.count()
				_, err := small.Chat.Completions.New(context.Background(), chatParams("gpt-test", fmt.Sprintf("small %d", i)),
					append(as("small"), option.WithResponseInto(&resp))...)
				if err == nil {
					waited[i] = log.of(resp) - sent
				}
				return err
			})
			for i, err := range append(errs, <-bigDone...) {
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			t.Logf("dispatches each small request waited for: %v", waited)
			if named {
				// The lane's two clients take turns: one of the big run's
				// at most, and those granted before it arrived whose
				// attempts had not started yet (at most the concurrency
				// limit, 8 to start); unnamed it would wait for the 200
				// or more queued before it.
				const most = 20
				for i, w := range waited {
					if w > most {
						t.Errorf("small request %d waited for %d dispatches, want at most %d", i, w, most)
					}
				}
				wantClients(t, s.proxy, map[string]int64{"": 0, "big": bigN, "small": smallN})
				return
			}
			if waited[0] < queuedFirst/2 {
				t.Errorf("unnamed, the small run's first request waited for %d dispatches, want the queue before it (%d or more)", waited[0], queuedFirst/2)
			}
			wantClients(t, s.proxy, nil)
		})
	}
}

// waitForQueue waits until the proxy's lanes hold at least n waiters.
func waitForQueue(t *testing.T, p *proxy.Proxy, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		queued := 0
		for _, st := range p.States() {
			queued += st.Queued
		}
		if queued >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lanes hold %d waiters after 30 s, want %d", queued, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wantClients checks that the one lane shows these clients with these
// dispatches (nil: no clients).
func wantClients(t *testing.T, p *proxy.Proxy, want map[string]int64) {
	t.Helper()
	states := p.States()
	if len(states) != 1 {
		t.Fatalf("%d lanes, want 1", len(states))
	}
	got := map[string]int64{}
	for _, c := range states[0].Clients {
		got[c.Name] = c.Dispatched
	}
	if want == nil && states[0].Clients != nil || len(got) != len(want) {
		t.Fatalf("clients on /lanes %+v, want %v", states[0].Clients, want)
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("client %q dispatched %d, want %d (clients %+v)", name, got[name], n, []lanequeue.ClientState(states[0].Clients))
		}
	}
}
