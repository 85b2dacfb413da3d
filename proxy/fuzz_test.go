package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/tokens"
)

// FuzzLaneKey drives the lane key's making from what a client controls:
// the credential headers, the raw query, the path and the body. Whatever
// it gets, nothing panics; the credential found is the one the first
// place holds; no credential of 8 bytes or more shows in the lane's id,
// its String, its State as JSON, or its model and path; and model and path
// stay within their bound.
func FuzzLaneKey(f *testing.F) {
	f.Add("Bearer sk-abcdefgh", "", "", "", "", "/v1/chat/completions", `{"model":"gpt-4o"}`)
	f.Add("", "sk-ant-xyz12345", "", "", "", "/v1/messages", `{"model":"claude"}`)
	f.Add("", "", "azure-key-123", "", "", "/openai/deployments/x/chat/completions", `{}`)
	f.Add("", "", "", "goog-key-1234", "alt=sse", "/v1beta/models/g:streamGenerateContent", `{"contents":[]}`)
	f.Add("", "", "", "", "alt=sse&key=AIzaSy12345678", "/v1beta/models/g:generateContent", `not json`)
	f.Add("Basic dXNlcjpwYXNz", "", "", "", "key=%zz", "/"+strings.Repeat("a", 300), `{"model":"`+strings.Repeat("é", 200)+`"}`)
	f.Fuzz(func(t *testing.T, authz, xAPIKey, apiKey, googKey, rawQuery, path, body string) {
		h := http.Header{}
		for k, v := range map[string]string{"Authorization": authz, "X-Api-Key": xAPIKey, "Api-Key": apiKey, "X-Goog-Api-Key": googKey} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		cred := credentialOf(h, rawQuery)
		// The first place that holds something is the one used.
		var want string
		switch {
		case authz != "":
			want = authz
			if len(authz) > 7 && strings.EqualFold(authz[:7], "bearer ") {
				want = strings.TrimSpace(authz[7:])
			}
		case xAPIKey != "":
			want = xAPIKey
		case apiKey != "":
			want = apiKey
		case googKey != "":
			want = googKey
		default:
			want = queryKey(rawQuery)
		}
		if cred != want {
			t.Fatalf("credential = %q, want %q", cred, want)
		}
		model := tokens.ReadRequest(path, []byte(body)).Model
		key := lanequeue.NewKey("r", cred, path, model)
		for _, f := range [][2]string{{path, key.Path}, {model, key.Model}} {
			if len(f[1]) > 128 || utf8.ValidString(f[0]) && !utf8.ValidString(f[1]) {
				t.Fatalf("%q bounded to %q", f[0], f[1])
			}
		}
		tb := lanequeue.NewTable(lanequeue.TableConfig{})
		slot, err := tb.Acquire(context.Background(), lanequeue.Request{Route: "r", Credential: cred, Path: path, Model: model})
		if err != nil {
			t.Fatal(err)
		}
		slot.Done(200, string(OutcomeOK), -1)
		st, _ := json.Marshal(tb.States())
		shown := slot.ID() + key.String() + string(st)
		if len(cred) >= 8 && strings.Contains(shown, cred) && !strings.Contains(path+body, cred) {
			t.Fatalf("the credential %q shows in %q", cred, shown)
		}
		if cred != "" && key.CredentialHash == lanequeue.HashCredential(cred+"x") {
			t.Fatal("two credentials share a hash")
		}
	})
}

// FuzzModelOfSpool: the scanner that reads a spooled body's model never
// panics, reads the same whether the file gives it all at once or a byte
// at a time, and on any valid JSON object with one top-level key naming
// the model (in any case or escaping, as encoding/json matches it) it
// reads what tokens.ReadRequest reads from the same bytes in memory.
func FuzzModelOfSpool(f *testing.F) {
	f.Add(`{"model":"gpt-4o"}`)
	f.Add(`{"messages":[{"content":"a\"}"}],"n":1,"Model":"x"}`)
	f.Add(`{"\u006dodel":"esc","a":[[{}],null,true,-1.5e3]}`)
	f.Add(`{"model":7}`)
	f.Add(`[1,2]`)
	f.Fuzz(func(t *testing.T, body string) {
		got := modelOfSpool(strings.NewReader(body))
		if bytewise := modelOfSpool(iotest.OneByteReader(strings.NewReader(body))); bytewise != got {
			t.Fatalf("modelOfSpool(%q) = %q whole, %q a byte at a time", body, got, bytewise)
		}
		if !json.Valid([]byte(body)) {
			return
		}
		var top map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &top) != nil {
			return
		}
		// Keys that match "model" as encoding/json does, counted on the
		// raw object (a map would keep one of duplicates).
		dec := json.NewDecoder(strings.NewReader(body))
		dec.Token() // {
		matches := 0
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return
			}
			if strings.EqualFold(k.(string), "model") {
				matches++
			}
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return
			}
		}
		if matches != 1 {
			return
		}
		if want := tokens.ReadRequest("", []byte(body)).Model; got != want && len(body) < 1000 { // a longer model is not read (see modelOfSpool)
			t.Fatalf("modelOfSpool(%q) = %q, tokens.ReadRequest = %q", body, got, want)
		}
	})
}
