package mockupstream

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable Config.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// start runs a Server for the test's duration.
func start(t testing.TB, cfg Config) *Server {
	t.Helper()
	s := New(cfg)
	t.Cleanup(s.Close)
	return s
}

// send posts body to path with the given headers and returns the response,
// its body not yet read.
func send(t testing.TB, s *Server, path, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// post sends with a Bearer key, reads the whole body and decodes it as JSON.
func post(t testing.TB, s *Server, path, key, body string) (*http.Response, map[string]any) {
	t.Helper()
	return decode(t, send(t, s, path, body, "Authorization", "Bearer "+key))
}

// postAnthropic is post with x-api-key, as Anthropic clients send it.
func postAnthropic(t testing.TB, s *Server, key, body string) (*http.Response, map[string]any) {
	t.Helper()
	return decode(t, send(t, s, "/v1/messages", body, "x-api-key", key, "anthropic-version", "2023-06-01"))
}

func decode(t testing.TB, resp *http.Response) (*http.Response, map[string]any) {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return resp, m
}

// dig walks a decoded JSON value along object keys and array indexes.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[p]
		case int:
			a, _ := v.([]any)
			if p >= len(a) {
				return nil
			}
			v = a[p]
		}
	}
	return v
}

// event is one Server-Sent Event.
type event struct {
	name string
	data string
}

// readEvent reads the next event; ok is false at the end of the stream.
func readEvent(t testing.TB, r *bufio.Reader) (ev event, ok bool) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		case line == "" && err == nil:
			return ev, true
		case line != "":
			t.Fatalf("unexpected SSE line %q", line)
		}
		if err == io.EOF {
			if ev != (event{}) {
				t.Fatalf("stream ended inside event %+v", ev)
			}
			return ev, false
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readEvents reads events to the end of the stream.
func readEvents(t testing.TB, r *bufio.Reader) []event {
	t.Helper()
	var evs []event
	for {
		ev, ok := readEvent(t, r)
		if !ok {
			return evs
		}
		evs = append(evs, ev)
	}
}

func jsonOf(t testing.TB, data string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("data %q: %v", data, err)
	}
	return m
}

// wantHeaders checks header values; "" means the header must be absent.
func wantHeaders(t testing.TB, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}
