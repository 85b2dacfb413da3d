package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/lanequeue"
)

// anthropic returns an unmodified Anthropic SDK client pointed at the
// proxy's /anthropic route, as ANTHROPIC_BASE_URL would.
func (s *stack) anthropic(key string, opts ...aoption.RequestOption) anthropic.Client {
	base := []aoption.RequestOption{
		aoption.WithBaseURL(s.front.URL + "/anthropic"),
		aoption.WithAPIKey(key),
		aoption.WithHTTPClient(s.httpClient()),
	}
	return anthropic.NewClient(append(base, opts...)...)
}

func messageParams(prompt string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "claude-test",
		MaxTokens: 64,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))},
	}
}

func laneFor(s *stack, route, key, path, model string) (lanequeue.State, bool) {
	id := lanequeue.Key{Route: route, CredentialHash: lanequeue.HashCredential(key), Path: path, Model: model}.ID()
	for _, st := range s.proxy.States() {
		if st.ID == id {
			return st, true
		}
	}
	return lanequeue.State{}, false
}

func TestOpenAISDKChatStreamEmbeddings(t *testing.T) {
	s := newStack(t, mockupstream.Config{RPM: 600, TPM: 200000}, nil)
	client := s.openai("sk-openai-sdk")
	ctx := context.Background()

	chat, err := client.Chat.Completions.New(ctx, chatParams("gpt-test", "hello"))
	if err != nil || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" || chat.Usage.PromptTokens == 0 {
		t.Fatalf("chat: %v %+v", err, chat)
	}

	stream := client.Chat.Completions.NewStreaming(ctx, chatParams("gpt-test", "stream"))
	var text string
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 {
			text += c.Choices[0].Delta.Content
		}
	}
	if err := stream.Err(); err != nil || text == "" {
		t.Fatalf("stream: %v, text %q", err, text)
	}

	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "text-embedding-test",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", "b"}},
	})
	if err != nil || len(emb.Data) != 2 || len(emb.Data[0].Embedding) == 0 {
		t.Fatalf("embeddings: %v %+v", err, emb)
	}

	// Each endpoint and model is its own lane, and the chat lane learned the
	// upstream's limits from its headers.
	st, ok := laneFor(s, "", "sk-openai-sdk", "/v1/chat/completions", "gpt-test")
	if !ok || st.RequestsLimit == 0 || st.TokensLimit == 0 {
		t.Fatalf("chat lane %+v (found %v): limits not learned", st, ok)
	}
	if _, ok := laneFor(s, "", "sk-openai-sdk", "/v1/embeddings", "text-embedding-test"); !ok {
		t.Fatal("no embeddings lane")
	}
}

func TestAnthropicSDKThroughRoute(t *testing.T) {
	s := newStack(t, mockupstream.Config{RPM: 1200, Latency: 20 * time.Millisecond}, nil)
	client := s.anthropic("sk-ant-e2e")
	ctx := context.Background()

	errs := runParallel(100, 25, func(i int) error {
		msg, err := client.Messages.New(ctx, messageParams(fmt.Sprintf("question %d", i)))
		if err == nil && (len(msg.Content) == 0 || msg.Usage.InputTokens == 0) {
			err = errors.New("empty message")
		}
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if ok := s.mock.Stats().ByKey["sk-ant-e2e"].OK; ok != 100 {
		t.Fatalf("upstream answered %d OK, want 100", ok)
	}

	stream := client.Messages.NewStreaming(ctx, messageParams("stream"))
	var text string
	for stream.Next() {
		if d, ok := stream.Current().AsAny().(anthropic.ContentBlockDeltaEvent); ok {
			text += d.Delta.Text
		}
	}
	if err := stream.Err(); err != nil || text == "" {
		t.Fatalf("stream: %v, text %q", err, text)
	}

	// The x-api-key credential keys the lane, and the anthropic-ratelimit-*
	// headers taught it the upstream's request budget.
	st, ok := laneFor(s, "anthropic", "sk-ant-e2e", "/v1/messages", "claude-test")
	if !ok || st.RequestsLimit != 20 {
		t.Fatalf("anthropic lane %+v (found %v): want the learned request limit 20", st, ok)
	}
}

func TestAnthropicHardQuotaFailsFast(t *testing.T) {
	s := newStack(t, mockupstream.Config{HardQuotaKeys: []string{"sk-ant-broke"}}, nil)
	client := s.anthropic("sk-ant-broke")
	_, err := client.Messages.New(context.Background(), messageParams("hi"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
		t.Fatalf("err = %v, want a 429", err)
	}
	if n := s.mock.Stats().ByKey["sk-ant-broke"].Requests; n != 1 {
		t.Fatalf("upstream saw %d attempts, want 1", n)
	}
}

// TestOpenAISDKStreamChunksArriveAsProduced: chunks reach the SDK spread
// over the time the upstream takes to produce them, not in one piece.
func TestOpenAISDKStreamChunksArriveAsProduced(t *testing.T) {
	const chunks, gap = 5, 80 * time.Millisecond
	s := newStack(t, mockupstream.Config{StreamChunks: chunks, ChunkDelay: gap}, nil)
	client := s.openai("sk-stream-timing")
	stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams("gpt-test", "x"))
	var arrivals []time.Time
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			arrivals = append(arrivals, time.Now())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(arrivals) != chunks {
		t.Fatalf("got %d content chunks, want %d", len(arrivals), chunks)
	}
	// Buffering would deliver them together; produced gap apart, the first
	// and last must be at least a good part of (chunks-1)*gap apart.
	if spread := arrivals[len(arrivals)-1].Sub(arrivals[0]); spread < (chunks-1)*gap/2 {
		t.Fatalf("chunks arrived within %v: buffered, not streamed", spread)
	}
}
