package universe

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
)

// Send sends request i of d to the proxy whose base URL is base (no /v1)
// and reads the whole answer; nil only for a 200 whose stream, when it
// streams, came to its end.
func Send(ctx context.Context, hc *http.Client, base string, d Draw, i int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+d.Path(), bytes.NewReader(d.Body(i)))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer sk-universe")
	req.Header.Set("x-api-key", "sk-universe")
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return Check(d, resp.StatusCode, body)
}

// Check says whether an answer of status and body to one of d's requests
// came whole.
func Check(d Draw, status int, body []byte) error {
	if status != http.StatusOK {
		return fmt.Errorf("status %d: %s", status, bytes.TrimSpace(body))
	}
	end := "[DONE]"
	if d.Dialect.Anthropic() {
		end = "message_stop"
	}
	if d.Stream && !bytes.Contains(body, []byte(end)) {
		return fmt.Errorf("stream without its end: %q", body)
	}
	return nil
}
