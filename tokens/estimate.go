package tokens

import (
	"strings"
)

const (
	// DefaultMaxOutput is the output reserved for a generation request that
	// sets none of max_completion_tokens, max_tokens or max_output_tokens,
	// and for a request Estimate cannot read. Providers would allow far more
	// (up to the model's limit); this covers a typical reply, and the
	// reservation is settled from the reported usage afterwards.
	DefaultMaxOutput = 256

	// MessageOverhead is added per message (a chat or Anthropic message, a
	// Responses input item, the system prompt or instructions) for the role
	// and delimiter tokens wrapped around its text. OpenAI counts about 3
	// per message plus 3 to prime the reply; 4 covers both.
	MessageOverhead = 4

	// MediaTokens is charged per image, audio, file or document part in
	// place of its bytes, whose base64 data would otherwise be counted as
	// text. A 1024×1024 image is about 765 tokens at OpenAI's high detail
	// and about 1,400 at Anthropic.
	MediaTokens = 1000

	// maxChoices bounds n and best_of (OpenAI allows at most 128).
	maxChoices = 128
)

type api int

const (
	apiUnknown api = iota
	apiChat
	apiCompletions
	apiResponses
	apiEmbeddings
	apiMessages
)

// apiOf tells which API a request path is for by its last segments, so
// route prefixes (/anthropic/v1/messages) and Azure's deployment paths
// (/openai/deployments/x/chat/completions) are recognised too.
func apiOf(path string) api {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimRight(path, "/")
	for _, e := range [...]struct {
		suffix string
		api    api
	}{
		{"/chat/completions", apiChat},
		{"/completions", apiCompletions},
		{"/responses", apiResponses},
		{"/embeddings", apiEmbeddings},
		{"/messages", apiMessages},
	} {
		if strings.HasSuffix(path, e.suffix) || path == e.suffix[1:] {
			return e.api
		}
	}
	return apiUnknown
}

// Estimate returns the tokens to reserve for a request before it is sent:
// its prompt's estimated tokens plus the most output it may produce. path is
// the request path; it is matched on its suffix (/chat/completions,
// /completions, /responses, /embeddings, /messages).
//
// The prompt is the UTF-8 bytes of the text the request carries, divided by
// 4 and rounded up, plus MessageOverhead per message and MediaTokens per
// non-text part. The text is: chat messages' content (a string or parts with
// "text"), tool calls and tool results; Responses instructions and input (a
// string or items); Anthropic system and messages, with tool_use input and
// tool_result content; tool definitions and response formats. Embeddings
// input and legacy completions prompt may be strings or token arrays; tokens
// given as numbers are counted exactly, with no overhead.
//
// The output is max_completion_tokens, else max_tokens, else
// max_output_tokens, else DefaultMaxOutput, times n (or best_of) when
// greater than 1. Embeddings have no output.
//
// A body that is not a valid JSON object, or a path of no known API, is estimated
// as len(body)/4 rounded up plus DefaultMaxOutput. The result is always at
// least 1.
func Estimate(path string, body []byte) int64 {
	return ReadRequest(path, body).Cost
}

func ceilQuarter(n int64) int64 { return (n + 3) / 4 }

// counter tallies the parts of a request that cost tokens.
type counter struct {
	bytes        int64 // text, in UTF-8 bytes
	messageCount int64
	media        int64 // non-text content parts
	exact        int64 // tokens given as token IDs
}

func isMedia(partType string) bool {
	switch partType {
	case "image_url", "input_image", "image",
		"input_audio", "audio",
		"input_file", "file", "document":
		return true
	}
	return false
}
