package mockupstream

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"strings"
)

// obj is a JSON object under construction.
type obj = map[string]any

// pieces are the answer's text, one piece per streamed content chunk.
func (s *Server) pieces() []string {
	p := make([]string, s.cfg.StreamChunks)
	for i := range p {
		p[i] = fmt.Sprintf("tok %d ", i+1)
	}
	return p
}

// truncated reports whether the answer stopped at the request's max tokens.
func (s *Server) truncated(q *request) bool {
	return int64(s.cfg.CompletionTokens) > q.maxTokens
}

// streamPieces calls emit for each piece, with ChunkDelay between pieces and
// StreamHold after the first. It reports false if the request or the server
// ended first.
func (s *Server) streamPieces(ctx context.Context, emit func(i int, text string)) bool {
	for i, p := range s.pieces() {
		if i > 0 && !s.sleep(ctx, s.cfg.ChunkDelay) {
			return false
		}
		emit(i, p)
		if i == 0 && !s.hold(ctx) {
			return false
		}
	}
	return true
}

// eventStream writes Server-Sent Events.
type eventStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startEventStream(w http.ResponseWriter) *eventStream {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &eventStream{w: w, rc: http.NewResponseController(w)}
}

// send writes one event, named if name is not empty, with v as JSON data.
// The last event of a stream is not flushed: net/http sends it when the
// handler has returned and released its in-flight slot.
func (e *eventStream) send(name string, v any, flush bool) {
	data, err := json.Marshal(v)
	if err != nil {
		panic("mockupstream: " + err.Error())
	}
	if name != "" {
		fmt.Fprintf(e.w, "event: %s\n", name)
	}
	fmt.Fprintf(e.w, "data: %s\n\n", data)
	if flush {
		e.rc.Flush()
	}
}

// answerChat answers /v1/chat/completions, naming the tier that serves it
// on the answer and on every chunk, as OpenAI does.
func (s *Server) answerChat(ctx context.Context, w http.ResponseWriter, q *request) bool {
	id, created := s.newID("chatcmpl-mock-"), s.now().Unix()
	finish := "stop"
	if s.truncated(q) {
		finish = "length"
	}
	usage := obj{
		"prompt_tokens":     q.promptTokens,
		"completion_tokens": q.completionTokens,
		"total_tokens":      q.promptTokens + q.completionTokens,
	}
	if !q.stream {
		writeJSON(w, http.StatusOK, obj{
			"id": id, "object": "chat.completion", "created": created, "model": q.model,
			"service_tier": servedTier(q),
			"choices": []any{obj{
				"index":         0,
				"message":       obj{"role": "assistant", "content": strings.Join(s.pieces(), "")},
				"finish_reason": finish,
			}},
			"usage": usage,
		})
		return true
	}

	chunk := func(choices []any) obj {
		c := obj{"id": id, "object": "chat.completion.chunk", "created": created, "model": q.model,
			"service_tier": servedTier(q), "choices": choices}
		if q.includeUsage {
			c["usage"] = nil // as OpenAI does on every chunk but the last
		}
		return c
	}
	ev := startEventStream(w)
	ok := s.streamPieces(ctx, func(i int, text string) {
		delta := obj{"content": text}
		if i == 0 {
			delta["role"] = "assistant"
		}
		ev.send("", chunk([]any{obj{"index": 0, "delta": delta, "finish_reason": nil}}), true)
	})
	if !ok {
		return false
	}
	ev.send("", chunk([]any{obj{"index": 0, "delta": obj{}, "finish_reason": finish}}), true)
	if q.includeUsage {
		last := chunk([]any{})
		last["usage"] = usage
		ev.send("", last, true)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	return true
}

// answerResponses answers /v1/responses, naming the tier that serves it in
// the response object.
func (s *Server) answerResponses(ctx context.Context, w http.ResponseWriter, q *request) bool {
	id, msgID, created := s.newID("resp_mock_"), s.newID("msg_mock_"), s.now().Unix()
	response := func(status string, text string, usage any) obj {
		output := []any{}
		if status == "completed" {
			output = []any{obj{
				"type": "message", "id": msgID, "status": "completed", "role": "assistant",
				"content": []any{obj{"type": "output_text", "text": text, "annotations": []any{}}},
			}}
		}
		if status == "completed" && s.truncated(q) {
			status = "incomplete"
		}
		return obj{"id": id, "object": "response", "created_at": created, "status": status,
			"model": q.model, "service_tier": servedTier(q), "output": output, "usage": usage}
	}
	usage := obj{
		"input_tokens":  q.promptTokens,
		"output_tokens": q.completionTokens,
		"total_tokens":  q.promptTokens + q.completionTokens,
	}
	text := strings.Join(s.pieces(), "")
	if !q.stream {
		writeJSON(w, http.StatusOK, response("completed", text, usage))
		return true
	}

	ev := startEventStream(w)
	seq := 0
	send := func(typ string, fields obj, flush bool) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		ev.send(typ, fields, flush)
	}
	send("response.created", obj{"response": response("in_progress", "", nil)}, true)
	ok := s.streamPieces(ctx, func(_ int, piece string) {
		send("response.output_text.delta", obj{"item_id": msgID, "output_index": 0, "content_index": 0, "delta": piece}, true)
	})
	if ok {
		send("response.completed", obj{"response": response("completed", text, usage)}, false)
	}
	return ok
}

// answerEmbeddings answers /v1/embeddings with a small vector per input,
// derived from its text so that equal inputs embed equally. It never streams.
func (s *Server) answerEmbeddings(_ context.Context, w http.ResponseWriter, q *request) bool {
	data := make([]any, len(q.inputs))
	for i, text := range q.inputs {
		data[i] = obj{"object": "embedding", "index": i, "embedding": embed(text)}
	}
	writeJSON(w, http.StatusOK, obj{
		"object": "list", "data": data, "model": q.model,
		"usage": obj{"prompt_tokens": q.promptTokens, "total_tokens": q.promptTokens},
	})
	return true
}

// embed maps text to 8 numbers in [-1, 1).
func embed(text string) []float64 {
	h := fnv.New64a()
	h.Write([]byte(text))
	x := h.Sum64()
	v := make([]float64, 8)
	for i := range v {
		x = x*6364136223846793005 + 1442695040888963407 // an LCG step
		v[i] = float64(x>>11)/(1<<52) - 1
	}
	return v
}

// answerMessages answers Anthropic's /v1/messages.
func (s *Server) answerMessages(ctx context.Context, w http.ResponseWriter, q *request) bool {
	id := s.newID("msg_mock_")
	stop := "end_turn"
	if s.truncated(q) {
		stop = "max_tokens"
	}
	message := func(content []any, stopReason any, outputTokens int64) obj {
		return obj{
			"id": id, "type": "message", "role": "assistant", "model": q.model,
			"content": content, "stop_reason": stopReason, "stop_sequence": nil,
			"usage": obj{"input_tokens": q.promptTokens, "output_tokens": outputTokens},
		}
	}
	if !q.stream {
		text := strings.Join(s.pieces(), "")
		writeJSON(w, http.StatusOK, message([]any{obj{"type": "text", "text": text}}, stop, q.completionTokens))
		return true
	}

	ev := startEventStream(w)
	send := func(typ string, fields obj, flush bool) {
		fields["type"] = typ
		ev.send(typ, fields, flush)
	}
	send("message_start", obj{"message": message([]any{}, nil, min(1, q.completionTokens))}, true)
	send("content_block_start", obj{"index": 0, "content_block": obj{"type": "text", "text": ""}}, true)
	send("ping", obj{}, true)
	ok := s.streamPieces(ctx, func(_ int, text string) {
		send("content_block_delta", obj{"index": 0, "delta": obj{"type": "text_delta", "text": text}}, true)
	})
	if !ok {
		return false
	}
	send("content_block_stop", obj{"index": 0}, true)
	send("message_delta", obj{
		"delta": obj{"stop_reason": stop, "stop_sequence": nil},
		"usage": obj{"output_tokens": q.completionTokens},
	}, true)
	send("message_stop", obj{}, false)
	return true
}
