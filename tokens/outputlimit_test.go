package tokens

import "testing"

// TestOutputLimitedSaysWhetherTheBodySetsALimit: a body's own limit, of
// any of the three names, is told from DefaultMaxOutput's guess, even
// where the two are equal.
func TestOutputLimitedSaysWhetherTheBodySetsALimit(t *testing.T) {
	for _, c := range []struct {
		path, body string
		want       bool
	}{
		{"/v1/chat/completions", `{"model":"m","messages":[]}`, false},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"set max_tokens please"}]}`, false},
		{"/v1/chat/completions", `{"model":"m","n":2,"messages":[]}`, false},
		{"/v1/chat/completions", `{"model":"m","max_tokens":256,"messages":[]}`, true},
		{"/v1/chat/completions", `{"model":"m","max_completion_tokens":10,"messages":[]}`, true},
		{"/v1/responses", `{"model":"m","max_output_tokens":10,"input":"x"}`, true},
		{"/v1/chat/completions", `{"model":"m","max_tokens":0,"messages":[]}`, false},
		{"/unknown", `{"max_tokens":10}`, false},
	} {
		if got := ReadRequest(c.path, []byte(c.body)).OutputLimited; got != c.want {
			t.Errorf("%s %s: OutputLimited %v, want %v", c.path, c.body, got, c.want)
		}
	}
}
