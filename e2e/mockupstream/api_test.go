package mockupstream

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestChatCompletion(t *testing.T) {
	s := start(t, Config{})
	resp, body := post(t, s, "/v1/chat/completions", "k", `{"model":"gpt-echo","max_completion_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-request-id") == "" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	if dig(body, "object") != "chat.completion" || dig(body, "model") != "gpt-echo" ||
		dig(body, "choices", 0, "message", "content") != "tok 1 tok 2 tok 3 tok 4 tok 5 " ||
		dig(body, "choices", 0, "finish_reason") != "length" {
		t.Errorf("body = %v", body)
	}
	if u := dig(body, "usage"); fmt.Sprint(u) != "map[completion_tokens:3 prompt_tokens:4 total_tokens:7]" {
		t.Errorf("usage = %v", u)
	}
}

func TestChatStreaming(t *testing.T) {
	for _, includeUsage := range []bool{true, false} {
		t.Run(fmt.Sprint("include_usage=", includeUsage), func(t *testing.T) {
			s := start(t, Config{StreamChunks: 3, CompletionTokens: 2})
			resp := send(t, s, "/v1/chat/completions",
				fmt.Sprintf(`{"model":"gpt-s","stream":true,"stream_options":{"include_usage":%v},"messages":[{"role":"user","content":"hi"}]}`, includeUsage),
				"Authorization", "Bearer k")
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("Content-Type %q", ct)
			}
			evs := readEvents(t, bufio.NewReader(resp.Body))
			want := 3 + 1 + 1 // content, finish, [DONE]
			if includeUsage {
				want++
			}
			if len(evs) != want || evs[len(evs)-1].data != "[DONE]" {
				t.Fatalf("events = %+v", evs)
			}
			for i := range 3 {
				c := jsonOf(t, evs[i].data)
				if c["object"] != "chat.completion.chunk" || c["model"] != "gpt-s" || c["id"] == "" ||
					dig(c, "choices", 0, "index") != 0.0 ||
					dig(c, "choices", 0, "delta", "content") != fmt.Sprintf("tok %d ", i+1) {
					t.Errorf("chunk %d = %v", i, c)
				}
				if role := dig(c, "choices", 0, "delta", "role"); (i == 0) != (role == "assistant") {
					t.Errorf("chunk %d role = %v", i, role)
				}
				if _, has := c["usage"]; has != includeUsage {
					t.Errorf("chunk %d has usage = %v", i, has)
				}
			}
			if fin := jsonOf(t, evs[3].data); dig(fin, "choices", 0, "finish_reason") != "stop" {
				t.Errorf("finish chunk = %v", fin)
			}
			if includeUsage {
				u := jsonOf(t, evs[4].data)
				if choices := u["choices"].([]any); len(choices) != 0 ||
					fmt.Sprint(u["usage"]) != "map[completion_tokens:2 prompt_tokens:4 total_tokens:6]" {
					t.Errorf("usage chunk = %v", u)
				}
			}
		})
	}
}

func TestStreamHoldAndChunkDelay(t *testing.T) {
	hold := make(chan struct{})
	s := start(t, Config{StreamChunks: 3, ChunkDelay: 20 * time.Millisecond, StreamHold: hold})
	resp := send(t, s, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`, "Authorization", "Bearer k")
	r := bufio.NewReader(resp.Body)
	if ev, _ := readEvent(t, r); !strings.Contains(ev.data, "tok 1 ") {
		t.Fatalf("first event %+v", ev)
	}

	rest := make(chan []event)
	go func() { rest <- readEvents(t, r) }()
	select {
	case evs := <-rest:
		t.Fatalf("stream went on while held: %+v", evs)
	case <-time.After(50 * time.Millisecond):
	}
	released := time.Now()
	close(hold)
	select {
	case evs := <-rest:
		if len(evs) != 2+1+1 { // tok 2, tok 3, finish, [DONE]
			t.Errorf("rest = %+v", evs)
		}
		if d := time.Since(released); d < 40*time.Millisecond {
			t.Errorf("two chunk delays took %v", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream still held after close")
	}
}

func TestCloseEndsHeldRequests(t *testing.T) {
	for _, cfg := range []Config{
		{Latency: time.Hour},
		{StreamHold: make(chan struct{})},
	} {
		s := New(cfg)
		failed := make(chan error, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/messages",
				strings.NewReader(`{"model":"c","max_tokens":5,"stream":true,"messages":[]}`))
			req.Header.Set("x-api-key", "k")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			failed <- err
		}()
		for s.Stats().OK == 0 {
			time.Sleep(time.Millisecond)
		}
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("%+v: Close hung on a held request", cfg)
		}
		if err := <-failed; err == nil {
			t.Errorf("%+v: the held request ended cleanly, want a broken response", cfg)
		}
	}
}

func TestAnthropicMessages(t *testing.T) {
	clock := newFakeClock()
	s := start(t, Config{RPM: 60, RequestBurst: 5, TPM: 6000, TokenBurst: 1000, Now: clock.Now})
	// 11+8 runes over 2 items: ceil(19/4)+6 = 11 prompt tokens; cost 11+5.
	const body = `{"model":"claude-echo","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hello there"}]}]}`
	resp, msg := postAnthropic(t, s, "k", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %v", resp.StatusCode, msg)
	}
	if dig(msg, "type") != "message" || dig(msg, "role") != "assistant" || dig(msg, "model") != "claude-echo" ||
		!strings.HasPrefix(dig(msg, "id").(string), "msg_") ||
		dig(msg, "content", 0, "type") != "text" || dig(msg, "content", 0, "text") != "tok 1 tok 2 tok 3 tok 4 tok 5 " ||
		dig(msg, "stop_reason") != "max_tokens" ||
		dig(msg, "usage", "input_tokens") != 11.0 || dig(msg, "usage", "output_tokens") != 5.0 {
		t.Errorf("message = %v", msg)
	}
	wantHeaders(t, resp.Header, map[string]string{
		"anthropic-ratelimit-requests-limit":     "5",
		"anthropic-ratelimit-requests-remaining": "4",
		"anthropic-ratelimit-requests-reset":     "2026-03-01T12:00:01Z",
		"anthropic-ratelimit-tokens-limit":       "1000",
		"anthropic-ratelimit-tokens-remaining":   "984",
		"anthropic-ratelimit-tokens-reset":       "2026-03-01T12:00:01Z", // 16 tokens at 100/s
		"x-ratelimit-limit-requests":             "",
	})
	if resp.Header.Get("request-id") == "" {
		t.Error("no request-id")
	}

	for range 4 {
		postAnthropic(t, s, "k", body)
	}
	resp, e := postAnthropic(t, s, "k", body)
	if resp.StatusCode != http.StatusTooManyRequests || dig(e, "type") != "error" ||
		dig(e, "error", "type") != "rate_limit_error" || dig(e, "request_id") != resp.Header.Get("request-id") {
		t.Errorf("429: %d %v", resp.StatusCode, e)
	}
	wantHeaders(t, resp.Header, map[string]string{"Retry-After": "1", "anthropic-ratelimit-requests-remaining": "0"})
}

func TestAnthropicStreaming(t *testing.T) {
	s := start(t, Config{StreamChunks: 2, CompletionTokens: 4})
	resp := send(t, s, "/v1/messages", `{"model":"claude-s","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"abcd"}]}`, "x-api-key", "k")
	evs := readEvents(t, bufio.NewReader(resp.Body))
	var names []string
	for _, ev := range evs {
		names = append(names, ev.name)
		if typ := jsonOf(t, ev.data)["type"]; typ != ev.name {
			t.Errorf("event %s has type %v", ev.name, typ)
		}
	}
	if got := strings.Join(names, " "); got != "message_start content_block_start ping content_block_delta content_block_delta content_block_stop message_delta message_stop" {
		t.Fatalf("events: %s", got)
	}
	start := jsonOf(t, evs[0].data)
	if dig(start, "message", "model") != "claude-s" || dig(start, "message", "usage", "input_tokens") != 4.0 {
		t.Errorf("message_start = %v", start)
	}
	if d := jsonOf(t, evs[4].data); dig(d, "delta", "type") != "text_delta" || dig(d, "delta", "text") != "tok 2 " {
		t.Errorf("delta = %v", d)
	}
	if d := jsonOf(t, evs[6].data); dig(d, "usage", "output_tokens") != 4.0 || dig(d, "delta", "stop_reason") != "end_turn" {
		t.Errorf("message_delta = %v", d)
	}
}

func TestEmbeddings(t *testing.T) {
	s := start(t, Config{TPM: 600, TokenBurst: 100})
	// 8 runes in 2 inputs: 2+6 = 8 tokens, charged without an output reserve.
	resp, body := post(t, s, "/v1/embeddings", "k", `{"model":"emb","input":["abcd","efgh"]}`)
	if resp.StatusCode != http.StatusOK || dig(body, "model") != "emb" {
		t.Fatalf("%d %v", resp.StatusCode, body)
	}
	wantHeaders(t, resp.Header, map[string]string{"x-ratelimit-remaining-tokens": "92"})
	if dig(body, "usage", "prompt_tokens") != 8.0 || dig(body, "usage", "total_tokens") != 8.0 {
		t.Errorf("usage = %v", dig(body, "usage"))
	}
	data := body["data"].([]any)
	if len(data) != 2 || dig(data, 1, "index") != 1.0 || len(dig(data, 0, "embedding").([]any)) != 8 {
		t.Fatalf("data = %v", data)
	}
	_, again := post(t, s, "/v1/embeddings", "k", `{"model":"emb","input":"efgh"}`)
	if fmt.Sprint(dig(again, "data", 0, "embedding")) != fmt.Sprint(dig(data, 1, "embedding")) {
		t.Error("equal inputs embed differently")
	}
}

func TestResponses(t *testing.T) {
	s := start(t, Config{StreamChunks: 2})
	resp, body := post(t, s, "/v1/responses", "k", `{"model":"gpt-r","input":"abcdefgh","max_output_tokens":3}`)
	if resp.StatusCode != http.StatusOK || dig(body, "object") != "response" || dig(body, "model") != "gpt-r" ||
		dig(body, "output", 0, "content", 0, "text") != "tok 1 tok 2 " {
		t.Fatalf("%d %v", resp.StatusCode, body)
	}
	if u := fmt.Sprint(dig(body, "usage")); u != "map[input_tokens:5 output_tokens:3 total_tokens:8]" {
		t.Errorf("usage = %s", u)
	}

	stream := send(t, s, "/v1/responses", `{"model":"gpt-r","stream":true,"input":[{"role":"user","content":"abcd"}]}`, "Authorization", "Bearer k")
	evs := readEvents(t, bufio.NewReader(stream.Body))
	if len(evs) != 4 || evs[0].name != "response.created" || evs[1].name != "response.output_text.delta" || evs[3].name != "response.completed" {
		t.Fatalf("events = %+v", evs)
	}
	if done := jsonOf(t, evs[3].data); dig(done, "response", "status") != "completed" ||
		fmt.Sprint(dig(done, "response", "usage")) != "map[input_tokens:4 output_tokens:8 total_tokens:12]" {
		t.Errorf("completed = %v", done)
	}
}

func TestClientErrors(t *testing.T) {
	s := start(t, Config{})
	for _, tc := range []struct {
		name, path, body string
		header           []string
		status           int
		errType          string // OpenAI error.type, or Anthropic's
	}{
		{"no key", "/v1/chat/completions", chatBody, nil, 401, "invalid_request_error"},
		{"no key anthropic", "/v1/messages", chatBody, nil, 401, "authentication_error"},
		{"bad json", "/v1/chat/completions", `{"model":`, []string{"Authorization", "Bearer k"}, 400, "invalid_request_error"},
		{"not an object", "/v1/embeddings", `[1]`, []string{"api-key", "k"}, 400, "invalid_request_error"},
		{"bad json anthropic", "/v1/messages", `nope`, []string{"x-api-key", "k"}, 400, "invalid_request_error"},
		{"unknown path", "/v1/completions/x", chatBody, []string{"Authorization", "Bearer k"}, 404, "invalid_request_error"},
		{"no /v1 prefix", "/chat/completions", chatBody, []string{"Authorization", "Bearer k"}, 404, "invalid_request_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := decode(t, send(t, s, tc.path, tc.body, tc.header...))
			if resp.StatusCode != tc.status || dig(body, "error", "type") != tc.errType {
				t.Errorf("got %d %v, want %d %s", resp.StatusCode, body, tc.status, tc.errType)
			}
		})
	}
	resp, err := http.Get(s.URL() + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d", resp.StatusCode)
	}
	if st := s.Stats(); st.Requests != 0 {
		t.Errorf("rejected before admission, yet stats = %+v", st)
	}
}

func TestKeyHeaders(t *testing.T) {
	s := start(t, Config{})
	send(t, s, "/v1/chat/completions", chatBody, "Authorization", "Bearer bearer", "x-api-key", "ignored")
	send(t, s, "/v1/chat/completions", chatBody, "x-api-key", "anthropic-style", "api-key", "ignored")
	send(t, s, "/v1/chat/completions", chatBody, "api-key", "azure-style")
	st := s.Stats()
	for _, k := range []string{"bearer", "anthropic-style", "azure-style"} {
		if st.ByKey[k].OK != 1 {
			t.Errorf("ByKey[%s] = %+v", k, st.ByKey[k])
		}
	}
	if len(st.ByKey) != 3 {
		t.Errorf("keys: %v", st.ByKey)
	}
}

func TestConcurrentStats(t *testing.T) {
	s := start(t, Config{Latency: time.Millisecond})
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for range 10 {
				req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(chatBody))
				req.Header.Set("Authorization", fmt.Sprint("Bearer key", g%3))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	var sum int64
	for _, k := range st.ByKey {
		sum += k.OK
	}
	if st.Requests != 200 || st.OK != 200 || sum != 200 || st.MaxInFlightSeen < 1 || st.MaxInFlightSeen > 20 {
		t.Errorf("stats = %+v", st)
	}
}

func TestPromptTokenRule(t *testing.T) {
	for _, tc := range []struct {
		name, path, body   string
		prompt, completion int64
		cost               int64
	}{
		{"empty chat", "/v1/chat/completions", `{"messages":[]}`, 0, 8, 16},
		{"one message", "/v1/chat/completions", `{"messages":[{"role":"user","content":"abcde"}]}`, 2 + 3, 8, 5 + 16},
		{"content parts", "/v1/chat/completions", `{"max_tokens":4,"messages":[{"content":[{"type":"text","text":"abcd"},{"type":"image_url"}]},{"content":"ab"}]}`, 2 + 6, 4, 8 + 4},
		{"unicode runes", "/v1/chat/completions", `{"messages":[{"content":"ééééé"}]}`, 2 + 3, 8, 5 + 16},
		{"anthropic system", "/v1/messages", `{"max_tokens":100,"system":[{"type":"text","text":"abcd"}],"messages":[{"content":"abcd"}]}`, 2 + 6, 8, 8 + 100},
		{"responses instructions", "/v1/responses", `{"max_output_tokens":2,"instructions":"abcd","input":"abcd"}`, 2 + 6, 2, 8 + 2},
		{"embedding token ids", "/v1/embeddings", `{"input":[1,2,3]}`, 3, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := parseRequest([]byte(tc.body), endpoints[tc.path], 8)
			if err != nil {
				t.Fatal(err)
			}
			if q.promptTokens != tc.prompt || q.completionTokens != tc.completion || q.cost != tc.cost {
				t.Errorf("prompt %d completion %d cost %d, want %d %d %d",
					q.promptTokens, q.completionTokens, q.cost, tc.prompt, tc.completion, tc.cost)
			}
		})
	}
}

func BenchmarkChatCompletion(b *testing.B) {
	s := start(b, Config{RPM: 1 << 30, TPM: 1 << 40})
	b.ReportAllocs()
	for b.Loop() {
		resp, _ := post(b, s, "/v1/chat/completions", "k", chatBody)
		if resp.StatusCode != http.StatusOK {
			b.Fatal(resp.Status)
		}
	}
}
