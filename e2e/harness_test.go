// Package e2e drives the proxy end to end: the project's mock upstream
// behind it and real, unmodified clients in front of it.
package e2e

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/upstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stack is a mock upstream with the proxy in front of it.
type stack struct {
	mock      *mockupstream.Server
	proxy     *proxy.Proxy
	front     *httptest.Server
	transport *http.Transport
	clients   []*http.Client
}

// newStack starts the mock with mcfg and a proxy to it; mod may change the
// proxy's config. Everything stops when the test ends.
func newStack(t testing.TB, mcfg mockupstream.Config, mod func(*proxy.Config)) *stack {
	t.Helper()
	s := &stack{mock: mockupstream.New(mcfg), transport: upstream.NewTransport()}
	u, _ := url.Parse(s.mock.URL())
	cfg := proxy.Config{
		Upstream:   u,
		Routes:     []proxy.Route{{Name: "anthropic", URL: u}},
		MaxRetries: 10,
		MaxWait:    2 * time.Minute,
		Transport:  s.transport,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.proxy = p
	s.front = httptest.NewServer(p)
	t.Cleanup(s.close)
	return s
}

func (s *stack) close() {
	for _, c := range s.clients {
		c.CloseIdleConnections()
	}
	s.front.Close()
	s.transport.CloseIdleConnections()
	s.mock.Close()
}

// openai returns an unmodified OpenAI SDK client pointed at the proxy, with
// the SDK's default retries.
func (s *stack) openai(key string, opts ...option.RequestOption) openai.Client {
	base := []option.RequestOption{
		option.WithBaseURL(s.front.URL + "/v1"),
		option.WithAPIKey(key),
		option.WithHTTPClient(s.httpClient()),
	}
	return openai.NewClient(append(base, opts...)...)
}

// httpClient is a client for an SDK under test; its idle connections are
// closed when the stack stops, so no goroutine outlives the test. A request
// the proxy never answers fails its test after a minute, not at the test
// binary's timeout.
func (s *stack) httpClient() *http.Client {
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	s.clients = append(s.clients, hc)
	return hc
}

func chatParams(model, prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}
}
