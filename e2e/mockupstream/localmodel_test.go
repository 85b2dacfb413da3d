package mockupstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// localDo sends a chat request for model to s in process with ctx and
// reads its whole answer. It returns the status, or the error.
func localDo(ctx context.Context, s *Server, model string, stream bool) (int, error) {
	body := fmt.Sprintf(`{"model":%q,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer sk-local")
	resp, err := (&http.Client{Transport: s.Transport()}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// finish is when one request's answer ended, after the start of the test.
type finish struct {
	model string
	at    time.Duration
}

// sendAll sends one request per model, in this order of arrival (each
// reaches the line before the next is sent), and returns when each ended.
func sendAll(t *testing.T, s *Server, models ...string) []finish {
	t.Helper()
	begin := time.Now()
	done := make([]finish, len(models))
	var wg sync.WaitGroup
	for i, m := range models {
		wg.Go(func() {
			if code, err := localDo(context.Background(), s, m, false); err != nil || code != http.StatusOK {
				t.Errorf("request %d (%q): status %d, %v", i, m, code, err)
			}
			done[i] = finish{m, time.Since(begin)}
		})
		synctest.Wait()
	}
	wg.Wait()
	return done
}

func wantFinishes(t *testing.T, got []finish, want ...time.Duration) {
	t.Helper()
	for i := range want {
		if got[i].at != want[i] {
			t.Errorf("request %d (%q) done at %v, want %v", i, got[i].model, got[i].at, want[i])
		}
	}
}

// TestLocalModelOneModel: one model loads once, however many requests
// and however late they come, and at most LocalParallel are served at once;
// the others queue, none is refused.
func TestLocalModelOneModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{ModelLoad: time.Second, LocalParallel: 3, Latency: time.Second})
		defer s.Close()
		begin := time.Now()
		wantFinishes(t, sendAll(t, s, "m", "m", "m", "m", "m", "m", "m"),
			2*time.Second, 2*time.Second, 2*time.Second, 3*time.Second, 3*time.Second, 3*time.Second, 4*time.Second)

		time.Sleep(6 * time.Second) // t = 10 s: the model stays loaded
		wantFinishes(t, sendAll(t, s, "m", "m"), time.Second, time.Second)

		st := s.ModelStats()
		if st.Loads != 1 || st.Swaps != 0 || st.MaxServing != 3 || st.MaxModelsPresent != 1 || st.Loaded != "m" {
			t.Errorf("model stats %+v, want 1 load, no swap, 3 served at once, 1 model", st)
		}
		want := []time.Time{begin, begin, begin, begin, begin, begin, begin, begin.Add(10 * time.Second), begin.Add(10 * time.Second)}
		if !slices.Equal(st.Arrivals, want) {
			t.Errorf("arrivals %v, want %v", st.Arrivals, want)
		}
		if gap := st.MinArrivalGap(); gap != 0 {
			t.Errorf("min arrival gap %v, want 0", gap)
		}
		if st := s.Stats(); st.OK != 9 || st.RateLimited != 0 {
			t.Errorf("stats %+v, want 9 OK and no refusal", st)
		}
	})
}

// TestLocalModelInterleavedNeverServesTwoModels: two models sent
// concurrently in no set order. Each run of one model in the line is one
// load then one Latency; no two models are ever served at once.
func TestLocalModelInterleavedNeverServesTwoModels(t *testing.T) {
	const load, latency = time.Second, 100 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{ModelLoad: load, Latency: latency})
		defer s.Close()
		begin := time.Now()
		done := make([]finish, 20)
		var wg sync.WaitGroup
		for i := range done {
			wg.Go(func() {
				m := []string{"a", "b"}[i%2]
				if code, err := localDo(context.Background(), s, m, false); err != nil || code != http.StatusOK {
					t.Errorf("request %d: status %d, %v", i, code, err)
				}
				done[i] = finish{m, time.Since(begin)}
			})
		}
		wg.Wait()

		// Served from its end minus Latency to its end.
		for _, x := range done {
			for _, y := range done {
				if x.model != y.model && x.at-latency < y.at && y.at-latency < x.at {
					t.Fatalf("%s served until %v overlaps %s served until %v", x.model, x.at, y.model, y.at)
				}
			}
		}
		st := s.ModelStats()
		if st.Loads < 2 || st.Swaps != st.Loads-1 || st.MaxModelsPresent != 2 {
			t.Errorf("model stats %+v, want at least 2 loads, one swap fewer, 2 models present", st)
		}
		if took := time.Since(begin); took != time.Duration(st.Loads)*(load+latency) {
			t.Errorf("took %v for %d loads, want %v", took, st.Loads, time.Duration(st.Loads)*(load+latency))
		}
		if st := s.Stats(); st.OK != 20 || st.RateLimited != 0 {
			t.Errorf("stats %+v, want 20 OK and no refusal", st)
		}
	})
}

// TestLocalModelOtherModelWaitsForInFlight: a request for another model
// waits for every request of the loaded model before it to end, and the
// line keeps arrival order: a request for the loaded model that comes after
// it waits behind it.
func TestLocalModelOtherModelWaitsForInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{ModelLoad: time.Second, Latency: time.Second})
		defer s.Close()
		begin := time.Now()
		done := make([]time.Duration, 4)
		var wg sync.WaitGroup
		for i, at := range []struct {
			model string
			at    time.Duration
		}{{"a", 0}, {"a", 1500 * time.Millisecond}, {"b", 1600 * time.Millisecond}, {"a", 1700 * time.Millisecond}} {
			time.Sleep(at.at - time.Since(begin))
			wg.Go(func() {
				if code, err := localDo(context.Background(), s, at.model, false); err != nil || code != http.StatusOK {
					t.Errorf("request %d: status %d, %v", i, code, err)
				}
				done[i] = time.Since(begin)
			})
			synctest.Wait()
		}
		wg.Wait()
		// a loads 0–1 s and is served 1–2 s; the second a, for the loaded
		// model, is served at once (1.5–2.5 s); b waits for both, loads
		// 2.5–3.5 s and is served 3.5–4.5 s; the last a, behind b, loads
		// again 4.5–5.5 s.
		want := []time.Duration{2 * time.Second, 2500 * time.Millisecond, 4500 * time.Millisecond, 6500 * time.Millisecond}
		if !slices.Equal(done, want) {
			t.Errorf("done at %v, want %v", done, want)
		}
		st := s.ModelStats()
		if st.Loads != 3 || st.Swaps != 2 || st.MaxModelsPresent != 2 || st.MaxServing != 2 || st.Loaded != "a" {
			t.Errorf("model stats %+v, want 3 loads, 2 swaps, 2 models present, 2 served at once", st)
		}
		if gap := st.MinArrivalGap(); gap != 100*time.Millisecond {
			t.Errorf("min arrival gap %v, want 100ms", gap)
		}
	})
}

// TestLocalModelWaitsForHeldStream: a stream of the loaded model is in
// flight until it ends, however long; the other model loads only then.
func TestLocalModelWaitsForHeldStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		s := NewInProcess(Config{ModelLoad: time.Second, StreamHold: hold})
		defer s.Close()
		begin := time.Now()
		body := `{"model":"a","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		resp, err := (&http.Client{Transport: s.Transport()}).Do(newRequest(t, t.Context(), s, body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		if _, ok := readEvent(t, r); !ok || time.Since(begin) != time.Second {
			t.Fatalf("first chunk at %v", time.Since(begin))
		}

		var bDone time.Duration
		var wg sync.WaitGroup
		wg.Go(func() {
			if code, err := localDo(context.Background(), s, "b", false); err != nil || code != http.StatusOK {
				t.Errorf("b: status %d, %v", code, err)
			}
			bDone = time.Since(begin)
		})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if st := s.ModelStats(); bDone != 0 || st.Loads != 1 || st.Loaded != "a" || st.MaxModelsPresent != 2 {
			t.Fatalf("while a streams: b done at %v, model stats %+v", bDone, st)
		}
		close(hold) // t = 11 s: a ends, b loads for 1 s
		readEvents(t, r)
		wg.Wait()
		if bDone != 12*time.Second {
			t.Errorf("b done at %v, want 12s", bDone)
		}
		if st := s.ModelStats(); st.Loads != 2 || st.Swaps != 1 || st.Loaded != "b" {
			t.Errorf("model stats %+v, want 2 loads, 1 swap, b loaded", st)
		}
	})
}

// TestLocalModelMaxModelsPresent: the most distinct models among the
// requests in the handler at once, waiting ones included; "" is a model;
// a request that gives up waiting leaves the line and the count.
func TestLocalModelMaxModelsPresent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{ModelLoad: time.Second, Latency: 100 * time.Millisecond})
		defer s.Close()
		for _, m := range []string{"a", "b", "", "a"} {
			sendAll(t, s, m) // one after another
		}
		if st := s.ModelStats(); st.MaxModelsPresent != 1 || st.Loads != 4 || st.Swaps != 3 || st.Loaded != "a" {
			t.Errorf("in turn: model stats %+v, want 1 model present, 4 loads, 3 swaps", st)
		}
		sendAll(t, s, "x", "y", "z")
		if st := s.ModelStats(); st.MaxModelsPresent != 3 || st.Loads != 7 || st.Swaps != 6 {
			t.Errorf("together: model stats %+v, want 3 models present, 7 loads, 6 swaps", st)
		}
	})

	synctest.Test(t, func(t *testing.T) {
		s := NewInProcess(Config{ModelLoad: time.Second, Latency: 5 * time.Second})
		defer s.Close()
		begin := time.Now()
		var wg sync.WaitGroup
		var aDone, cDone time.Duration
		wg.Go(func() {
			localDo(context.Background(), s, "a", false)
			aDone = time.Since(begin)
		})
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		wg.Go(func() {
			if _, err := localDo(ctx, s, "b", false); !errors.Is(err, context.Canceled) {
				t.Errorf("b: %v, want canceled", err)
			}
		})
		time.Sleep(2 * time.Second)
		cancel() // b gives up waiting behind a
		time.Sleep(time.Second)
		wg.Go(func() {
			localDo(context.Background(), s, "c", false)
			cDone = time.Since(begin)
		})
		wg.Wait()
		// a: load 0–1 s, served 1–6 s; c: load 6–7 s, served 7–12 s. b
		// never loads, and was gone when c came.
		if aDone != 6*time.Second || cDone != 12*time.Second {
			t.Errorf("a done at %v, c at %v, want 6s and 12s", aDone, cDone)
		}
		if st := s.ModelStats(); st.MaxModelsPresent != 2 || st.Loads != 2 || st.Swaps != 1 || st.Loaded != "c" {
			t.Errorf("model stats %+v, want 2 models present, 2 loads, 1 swap", st)
		}
	})
}

// TestModelStatsOffAndGap: without ModelLoad the stats are zero; the gap
// needs two arrivals.
func TestModelStatsOffAndGap(t *testing.T) {
	s := NewInProcess(Config{})
	defer s.Close()
	if code, err := localDo(context.Background(), s, "m", false); err != nil || code != http.StatusOK {
		t.Fatalf("status %d, %v", code, err)
	}
	st := s.ModelStats()
	if st.Loads != 0 || st.Arrivals != nil || st.MinArrivalGap() != -1 {
		t.Errorf("model stats %+v, gap %v, want zero and -1", st, st.MinArrivalGap())
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st = ModelStats{Arrivals: []time.Time{t0, t0.Add(3 * time.Second), t0.Add(time.Second), t0.Add(5 * time.Second)}}
	if gap := st.MinArrivalGap(); gap != time.Second {
		t.Errorf("gap %v, want 1s", gap)
	}
}
