package mockupstream

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// localChat sends a chat request for model to s in-process and returns
// when its answer is done.
func localChat(t *testing.T, s *Server, model string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.URL()+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)))
	req.Header.Set("Authorization", "Bearer sk-local")
	resp, err := (&http.Client{Transport: s.Transport()}).Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestLocalModelServerLoadsOneModelAtATime: a, b, a arrive at once: a
// loads (2 s) and is served (0.1 s); b waits for it, loads and is served;
// the second a, behind b in the line, loads again.
func TestLocalModelServerLoadsOneModelAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{ModelLoad: 2 * time.Second, Latency: 100 * time.Millisecond})
		defer s.Close()
		begin := time.Now()
		done := make([]time.Duration, 3)
		var wg sync.WaitGroup
		for i, m := range []string{"a", "b", "a"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code := localChat(t, s, m); code != 200 {
					t.Errorf("%s: status %d", m, code)
				}
				done[i] = time.Since(begin)
			}()
			synctest.Wait()
		}
		wg.Wait()
		want := []time.Duration{2100 * time.Millisecond, 4200 * time.Millisecond, 6300 * time.Millisecond}
		for i := range want {
			if done[i] != want[i] {
				t.Errorf("request %d done at %v, want %v", i, done[i], want[i])
			}
		}
		if st := s.ModelStats(); st.Loads != 3 || st.Swaps != 2 || st.MaxModelsPresent != 2 || st.Loaded != "a" {
			t.Errorf("stats %+v, want 3 loads, 2 swaps, 2 models present at once, a loaded", st)
		}
	})
}

// TestLocalModelServerServesInParallelUpToItsBound: 10 requests for one
// model, 4 at a time: one load, 3 rounds of 0.5 s.
func TestLocalModelServerServesInParallelUpToItsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{ModelLoad: time.Second, LocalParallel: 4, Latency: 500 * time.Millisecond})
		defer s.Close()
		begin := time.Now()
		var wg sync.WaitGroup
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				localChat(t, s, "m")
			}()
		}
		wg.Wait()
		if took := time.Since(begin); took != 2500*time.Millisecond {
			t.Errorf("took %v, want 1s load + 3 × 0.5s", took)
		}
		if st := s.ModelStats(); st.Loads != 1 || st.Swaps != 0 || st.MaxModelsPresent != 1 {
			t.Errorf("stats %+v, want one load", st)
		}
		if st := s.Stats(); st.MaxInFlightSeen != 10 || st.OK != 10 {
			t.Errorf("server stats %+v", st)
		}
	})
}

// TestLocalModelServerSocket: the same on a real socket: two models sent
// together never are served together.
func TestLocalModelServerSocket(t *testing.T) {
	s := New(Config{ModelLoad: 50 * time.Millisecond, LocalParallel: 2, Latency: 10 * time.Millisecond})
	defer s.Close()
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"m%d","messages":[{"role":"user","content":"hi"}]}`, i%2)
			req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-local")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		}()
	}
	wg.Wait()
	if st := s.ModelStats(); st.Loads < 2 || st.Swaps != st.Loads-1 || st.MaxModelsPresent != 2 {
		t.Errorf("stats %+v", st)
	}
}
