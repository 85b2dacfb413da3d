package tokens_test

import (
	"fmt"
	"io"

	"github.com/llmproxy/llmproxy/tokens"
)

func Example() {
	// Before sending: reserve the estimate.
	body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello in French."}],"max_tokens":20}`)
	fmt.Println("reserve", tokens.Estimate("/v1/chat/completions", body))

	// While streaming the response to the client: watch for usage.
	var s tokens.StreamScanner
	io.WriteString(&s, "data: {\"choices\":[{\"delta\":{\"content\":\"Bonjour\"}}],\"usage\":null}\n\n")
	io.WriteString(&s, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":13,\"completion_tokens\":2,\"total_tokens\":15}}\n\n")
	io.WriteString(&s, "data: [DONE]\n\n")

	// Afterwards: settle the reservation with what was used.
	if u, ok := s.Usage(); ok {
		fmt.Println("used", u.Input, "+", u.Output, "=", u.Total())
	}
	// Output:
	// reserve 29
	// used 13 + 2 = 15
}
