package mockupstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

const streamChat = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`

// newRequest builds a chat request with a Bearer key for an in-process
// server.
func newRequest(t testing.TB, ctx context.Context, s *Server, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("Content-Type", "application/json")
	return req
}

func TestInProcessRunsOnFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{RPM: 60, Latency: 200 * time.Millisecond, StreamChunks: 5, ChunkDelay: 100 * time.Millisecond})
		defer s.Close()
		if s.URL() != "http://mock.invalid" {
			t.Errorf("URL = %q", s.URL())
		}
		client := &http.Client{Transport: s.Transport()}
		start := time.Now()
		at := func() time.Duration { return time.Since(start) }

		req := newRequest(t, t.Context(), s, streamChat)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if at() != 200*time.Millisecond {
			t.Errorf("header at %v, want 200ms (Latency)", at())
		}
		if resp.StatusCode != 200 || resp.Status != "200 OK" || resp.Proto != "HTTP/1.1" || resp.ProtoMajor != 1 ||
			resp.ProtoMinor != 1 || resp.ContentLength != -1 || resp.Request == nil ||
			resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("x-ratelimit-limit-requests") != "1" {
			t.Fatalf("response %+v", resp)
		}
		r := bufio.NewReader(resp.Body)
		for i := range 5 {
			ev, ok := readEvent(t, r)
			if !ok || !strings.Contains(ev.data, `"content":"tok `+strconv.Itoa(i+1)+` "`) {
				t.Fatalf("chunk %d: %+v", i, ev)
			}
			if want := time.Duration(200+100*i) * time.Millisecond; at() != want {
				t.Errorf("chunk %d at %v, want %v", i, at(), want)
			}
		}
		rest := readEvents(t, r) // finish, usage, [DONE], then EOF
		if len(rest) != 3 || rest[2].data != "[DONE]" {
			t.Errorf("end of stream = %+v", rest)
		}
		if at() != 600*time.Millisecond {
			t.Errorf("end at %v, want 600ms", at())
		}

		// The bucket (1 request, 1 a second) took its request at 0: at
		// 600ms it lacks 0.4 of one.
		resp, err = client.Do(newRequest(t, t.Context(), s, chatBody))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if at() != 600*time.Millisecond || resp.StatusCode != 429 || resp.ContentLength != int64(len(body)) ||
			!strings.Contains(string(body), "Please try again in 400ms.") {
			t.Fatalf("refusal at %v: %d, length %d, %s", at(), resp.StatusCode, resp.ContentLength, body)
		}
		wantHeaders(t, resp.Header, map[string]string{
			"Retry-After":                    "1",
			"retry-after-ms":                 "400",
			"x-ratelimit-limit-requests":     "1",
			"x-ratelimit-remaining-requests": "0",
			"x-ratelimit-reset-requests":     "400ms",
		})

		time.Sleep(400 * time.Millisecond)
		resp, err = client.Do(newRequest(t, t.Context(), s, chatBody))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 || at() != 1200*time.Millisecond {
			t.Errorf("after the wait: %d at %v, want 200 at 1.2s", resp.StatusCode, at())
		}
		if st := s.Stats(); st.Requests != 3 || st.OK != 2 || st.RateLimited != 1 {
			t.Errorf("stats = %+v", st)
		}
	})
}

func TestInProcessCancelMidStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{MaxInFlight: 1, StreamChunks: 5, ChunkDelay: time.Second})
		defer s.Close()
		start := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		resp, err := s.Transport().RoundTrip(newRequest(t, ctx, s, streamChat))
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(resp.Body)
		if _, ok := readEvent(t, r); !ok {
			t.Fatal("no first chunk")
		}
		time.Sleep(1500 * time.Millisecond)
		cancel()
		if _, err := io.ReadAll(r); !errors.Is(err, context.Canceled) {
			t.Errorf("read after cancel: %v, want context.Canceled", err)
		}
		synctest.Wait() // the handler has returned
		if time.Since(start) != 1500*time.Millisecond {
			t.Errorf("handler ran until %v", time.Since(start))
		}
		// Its slot is free at once.
		resp, err = s.Transport().RoundTrip(newRequest(t, t.Context(), s, chatBody))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("next request: %v %v", resp, err)
		}
		resp.Body.Close()
	})
}

func TestInProcessBodyCloseEndsHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{MaxInFlight: 1, StreamChunks: 5, ChunkDelay: time.Second})
		defer s.Close()
		resp, err := s.Transport().RoundTrip(newRequest(t, t.Context(), s, streamChat))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		synctest.Wait()
		resp, err = s.Transport().RoundTrip(newRequest(t, t.Context(), s, chatBody))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("next request: %v %v", resp, err)
		}
		resp.Body.Close()
		if s.Stats().RateLimited != 0 {
			t.Errorf("stats = %+v", s.Stats())
		}
	})
}

func TestInProcessCancelBeforeHeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{MaxInFlight: 1, Latency: time.Second})
		defer s.Close()
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err := s.Transport().RoundTrip(newRequest(t, ctx, s, chatBody))
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("err %v at %v, want the deadline at 300ms", err, time.Since(start))
		}
		synctest.Wait()
		resp, err := s.Transport().RoundTrip(newRequest(t, t.Context(), s, chatBody))
		if err != nil || resp.StatusCode != 200 || time.Since(start) != 1300*time.Millisecond {
			t.Fatalf("next request: %v %v at %v", resp, err, time.Since(start))
		}
		resp.Body.Close()
	})
}

func TestInProcessCloseAbortsResponses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		s := NewInProcess(Config{Latency: time.Second, StreamHold: hold})
		held, err := s.Transport().RoundTrip(newRequest(t, t.Context(), s, streamChat))
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(held.Body)
		if _, ok := readEvent(t, r); !ok {
			t.Fatal("no first chunk")
		}

		// One request still in its Latency when the server closes.
		early := make(chan error)
		go func() {
			_, err := s.Transport().RoundTrip(newRequest(t, t.Context(), s, chatBody))
			early <- err
		}()
		synctest.Wait()

		s.Close() // the handlers' waits panic with http.ErrAbortHandler
		if err := <-early; !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("request before its header: %v, want an unexpected EOF", err)
		}
		if _, err := io.ReadAll(r); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("held stream: %v, want an unexpected EOF", err)
		}
		if _, err := s.Transport().RoundTrip(newRequest(t, t.Context(), s, chatBody)); err == nil {
			t.Error("a closed server answered")
		}
	})
}

func TestTransportOfListeningServer(t *testing.T) {
	s := start(t, Config{RPM: 600})
	req := newRequest(t, t.Context(), s, chatBody)
	if !strings.HasPrefix(req.URL.String(), "http://127.0.0.1:") {
		t.Fatalf("URL %s", req.URL)
	}
	resp, err := s.Transport().RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, body := decode(t, resp)
	if resp.StatusCode != 200 || dig(body, "object") != "chat.completion" || resp.Header.Get("x-ratelimit-limit-requests") != "10" {
		t.Errorf("%d %v %v", resp.StatusCode, resp.Header, body)
	}
	// The listener still answers, and both count in the same buckets.
	post(t, s, "/v1/chat/completions", "k", chatBody)
	if st := s.Stats(); st.OK != 2 {
		t.Errorf("stats = %+v", st)
	}
}
