package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// program is run started on free loopback ports, as main starts it: stop
// is the first SIGTERM, again takes the later ones.
type program struct {
	proxy, admin string
	stop         context.CancelFunc
	again        chan os.Signal
	logs         *syncBuffer
	done         chan struct{}
	code         int
}

func startProgram(t *testing.T, env map[string]string) *program {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	pr := &program{stop: stop, again: make(chan os.Signal, 1), logs: &syncBuffer{}, done: make(chan struct{})}
	all := map[string]string{"LLMPROXY_ADDR": "127.0.0.1:0", "LLMPROXY_ADMIN_ADDR": "127.0.0.1:0"}
	maps.Copy(all, env)
	addrs := make(chan [2]string, 1)
	go func() {
		defer close(pr.done)
		pr.code = run(ctx, pr.again, nil, all, io.Discard, pr.logs, func(p, a string) { addrs <- [2]string{p, a} })
	}()
	select {
	case a := <-addrs:
		pr.proxy, pr.admin = a[0], a[1]
	case <-pr.done:
		t.Fatalf("exited %d before listening: %s", pr.code, pr.logs)
	}
	t.Cleanup(func() {
		stop()
		select {
		case pr.again <- syscall.SIGTERM: // do not wait out a long drain
		default:
		}
		<-pr.done
	})
	return pr
}

// wait returns the exit code, failing the test if run takes longer.
func (pr *program) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-pr.done:
		return pr.code
	case <-time.After(within):
		t.Fatalf("still running %v after the stop", within)
		return -1
	}
}

// lanes is the admin listener's /lanes.
func (pr *program) lanes(t *testing.T) lanesReply {
	t.Helper()
	resp, err := http.Get("http://" + pr.admin + "/lanes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r lanesReply
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// underWay is queued and in-flight requests over all lanes.
func (pr *program) underWay(t *testing.T) (queued, inFlight int) {
	for _, l := range pr.lanes(t).Lanes {
		queued += l.Queued
		inFlight += l.InFlight
	}
	return queued, inFlight
}

func (pr *program) readyz(t *testing.T) int {
	t.Helper()
	resp, err := http.Get("http://" + pr.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// answer is what a client got: the status, the error code of a JSON error
// body, Retry-After, or the transport error.
type answer struct {
	status int
	code   string
	retry  string
	body   string
	err    error
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d code=%q Retry-After=%q body=%q", a.status, a.code, a.retry, a.body)
}

// post sends a chat request with the given model and reports its answer.
func post(addr, model string) answer {
	c := http.Client{Timeout: 20 * time.Second}
	resp, err := c.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"`+model+`"}`))
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), body: string(b), err: err}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil {
		a.code = e.Error.Code
	}
	return a
}

// eventually polls cond every few milliseconds for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after %v: %s", d, what)
		}
	}
}

// silentUpstream accepts requests and never answers them; it lets go when
// the proxy cancels or the test ends.
func silentUpstream(t *testing.T) string {
	quit := make(chan struct{})
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-quit:
		}
	}))
	t.Cleanup(func() { close(quit) }) // runs before the server's Close
	return up
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newUpstream serves h on loopback until the test ends and returns its URL.
func newUpstream(t *testing.T, h http.Handler) string {
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	return up.URL
}
