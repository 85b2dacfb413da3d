package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPanicBeforeAnyByteStillAbortsTheAnswer: a failure after the status
// went out, before any of the body did, breaks the connection; no JSON
// error is appended to the 200.
func TestPanicBeforeAnyByteStillAbortsTheAnswer(t *testing.T) {
	rt := rtFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: &panickyBody{n: 1}, ContentLength: -1}, nil
	})
	h := newHarness(t, http.NotFoundHandler(), func(c *Config) { c.Transport = rt })
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := testClient.Do(req)
	if err != nil {
		return // broken before the status reached the client: also no JSON appended
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil || strings.Contains(string(body), "internal_error") {
		t.Fatalf("status %d, body %q, err %v: want a broken answer without a JSON error in it", resp.StatusCode, body, err)
	}
}

// TestEveryKindOfStreamIsPassedOnAsItArrives: answers of unknown length
// (chunked JSON lines) and event streams, even ones with a known length,
// reach the client as the upstream sends them, not when it has finished.
func TestEveryKindOfStreamIsPassedOnAsItArrives(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		first, rest := "{\"n\":1}\n", "{\"n\":2}\n"
		if strings.HasSuffix(r.URL.Path, "/sse-known-length") {
			first, rest = "data: {\"n\":1}\n\n", "data: [DONE]\n\n"
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Length", strconv.Itoa(len(first)+len(rest)))
		} else {
			w.Header().Set("Content-Type", "application/x-ndjson") // chunked: no length
		}
		fmt.Fprint(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, rest)
	}), nil)
	if line := firstLineWithin(t, h, "/v1/lines", `{"model":"m"}`); line != "{\"n\":1}\n" {
		t.Errorf("chunked lines: first line %q", line)
	}
	if line := firstLineWithin(t, h, "/v1/sse-known-length", `{"model":"m"}`); line != "data: {\"n\":1}\n" {
		t.Errorf("event stream with a length: first line %q", line)
	}
}

// TestSlowButSteadyAnswerIsNotCut: the idle bound is between bytes, not on
// the whole answer: a stream that sends something every 50 or 100 ms runs well
// past LLMPROXY_MAX_WAIT and arrives whole.
func TestSlowButSteadyAnswerIsNotCut(t *testing.T) {
	// 50 ms gaps are shorter than the bound's rearming period (62.5 ms),
	// 100 ms gaps longer; both well within the 250 ms bound.
	for _, gap := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond} {
		h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			readAllQuiet(r)
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 8 {
				fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(gap)
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
		}), func(c *Config) { c.MaxWait = 250 * time.Millisecond })
		resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
		body, err := readAllErr(resp)
		if err != io.EOF || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("a steady stream, events %v apart, with a 250 ms idle bound: err %v, got %d bytes", gap, err, len(body))
		}
	}
}

// TestUsageMeterHoldsAtMostFourMiB: a JSON answer up to 4 MiB is kept to
// read its usage from; a larger one is passed on unmetered and the copy
// dropped, so an answer's size never grows the proxy past that.
func TestUsageMeterHoldsAtMostFourMiB(t *testing.T) {
	usage := []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7},"pad":"`)
	tail := []byte(`"}`)
	pad := bytes.Repeat([]byte("x"), maxMeteredBody-len(usage)-len(tail))

	var atCap bodyMeter
	for _, p := range [][]byte{usage, pad, tail} {
		atCap.Write(p)
	}
	if u, ok := atCap.Usage(); !ok || u.Total() != 7 {
		t.Fatalf("an answer of exactly 4 MiB: usage %+v, %v; want 7 tokens read", u, ok)
	}

	var over bodyMeter
	for _, p := range [][]byte{usage, pad, []byte("x"), tail} {
		if n, err := over.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v: the answer itself must pass whole", n, err)
		}
	}
	if _, ok := over.Usage(); ok || over.buf != nil {
		t.Fatalf("an answer over 4 MiB was metered (kept %d bytes)", len(over.buf))
	}
}

// TestStopCutsAStreamThatOutlivedItsDeadline: an answer still streaming
// when the request's deadline has passed goes on (the deadline alone does not
// end it), and Stop then cuts it at once.
func TestStopCutsAStreamThatOutlivedItsDeadline(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; r.Context().Err() == nil && i < 200; i++ {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	}), func(c *Config) { c.MaxWait = 250 * time.Millisecond })
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for start := time.Now(); time.Since(start) < 600*time.Millisecond; {
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatalf("the stream ended %v in, past its 250 ms deadline but before Stop: %v", time.Since(start), err)
		}
	}
	h.proxy.Stop()
	cut := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br)
		cut <- err
	}()
	select {
	case err := <-cut:
		if err == nil {
			t.Fatal("the stream ended cleanly at Stop, want it cut")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not cut a stream that outlived its deadline")
	}
}
