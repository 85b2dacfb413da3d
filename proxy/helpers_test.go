package proxy

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// blockingUpstream answers nothing until release is closed or the
// request's context ends; arrived receives each request's model.
func blockingUpstream(release <-chan struct{}, arrived chan<- string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readAllQuiet(r)
		select {
		case arrived <- body:
		default:
		}
		select {
		case <-release:
			fmt.Fprint(w, `{}`)
		case <-r.Context().Done():
		}
	})
}

func readAllQuiet(r *http.Request) string {
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := r.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// oneSlotTaken is a proxy whose lane has one slot, taken by a request the
// upstream holds until release is called (defer it, so a failing test
// ends too); first yields that request's status, arrived the bodies of any
// later request the upstream gets.
func oneSlotTaken(t *testing.T) (h *harness, release func(), arrived chan string, first chan int) {
	ch, arrived, first := make(chan struct{}), make(chan string, 4), make(chan int, 1)
	release = sync.OnceFunc(func() { close(ch) })
	h = newHarness(t, blockingUpstream(ch, arrived), func(c *Config) {
		c.Lanes.Lane = lanequeue.Config{Concurrency: 1, MaxConcurrency: 1}
	})
	go func() {
		resp := h.post("/v1/chat/completions", `{"model":"m","who":"first"}`)
		readAll(t, resp.Body)
		first <- resp.StatusCode
	}()
	<-arrived
	return h, release, arrived, first
}

// settleUpstream learns a large token window on the first answer, which
// refills a few tokens a second, then answers without headers with the
// usage given (below 0: none), plainly or as a stream.
func settleUpstream(stream bool, used int) http.Handler {
	var n atomic.Int32
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		if n.Add(1) == 1 {
			w.Header().Set("X-Ratelimit-Limit-Tokens", "1000000")
			w.Header().Set("X-Ratelimit-Remaining-Tokens", "500000")
			w.Header().Set("X-Ratelimit-Reset-Tokens", "100000s")
			fmt.Fprint(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			return
		}
		if used < 0 {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[]}`)
			return
		}
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, used-5, 5, used)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", used-5, 5, used)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
}

// readAllErr reads a body that may break off.
func readAllErr(resp *http.Response) (string, error) {
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String(), err
		}
	}
}

// firstLineWithin reads the first line of the answer to a POST of body to
// path, or fails the test after 5 s: the proxy held it back.
func firstLineWithin(t *testing.T, h *harness, path, body string) string {
	t.Helper()
	resp := h.post(path, body)
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		return line
	case <-time.After(5 * time.Second):
		t.Fatal("the first line did not reach the client while the upstream was still sending")
		return ""
	}
}
