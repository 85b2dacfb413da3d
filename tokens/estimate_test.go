package tokens

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// q is ceil(n/4), the prompt tokens of n bytes of text.
func q(n int64) int64 { return (n + 3) / 4 }

func TestEstimate(t *testing.T) {
	bigImage := `data:image/png;base64,` + strings.Repeat("iVBORw0KGgo", 10000)
	tests := []struct {
		name string
		path string
		body string
		want int64
	}{
		// OpenAI Chat Completions.
		{
			name: "chat/string content",
			path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello there"}],"max_tokens":100}`,
			want: q(14+11) + 2*MessageOverhead + 100,
		},
		{
			name: "chat/multimodal parts",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":[{"type":"text","text":"What is in this image?"},{"type":"image_url","image_url":{"url":"` + bigImage + `","detail":"high"}},{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}],"max_completion_tokens":50}`,
			want: q(22) + MessageOverhead + 2*MediaTokens + 50,
		},
		{
			name: "chat/max_completion_tokens wins over max_tokens",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"abcd"}],"max_tokens":1000,"max_completion_tokens":10}`,
			want: 1 + MessageOverhead + 10,
		},
		{
			name: "chat/null max_completion_tokens falls through to max_tokens",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"abcd"}],"max_completion_tokens":null,"max_tokens":30}`,
			want: 1 + MessageOverhead + 30,
		},
		{
			name: "chat/missing max tokens",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"abcd"}]}`,
			want: 1 + MessageOverhead + DefaultMaxOutput,
		},
		{
			name: "chat/n multiplies output",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"abcd"}],"max_tokens":10,"n":3}`,
			want: 1 + MessageOverhead + 3*10,
		},
		{
			name: "chat/n multiplies default output",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"abcd"}],"n":2}`,
			want: 1 + MessageOverhead + 2*DefaultMaxOutput,
		},
		{
			name: "chat/n capped at 128",
			path: "/v1/chat/completions",
			body: `{"messages":[],"max_tokens":1,"n":1e9}`,
			want: maxChoices,
		},
		{
			name: "chat/zero and negative limits ignored",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"abcd"}],"max_completion_tokens":0,"max_tokens":-5,"n":0}`,
			want: 1 + MessageOverhead + DefaultMaxOutput,
		},
		{
			name: "chat/tool calls and tool results",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}],"max_tokens":5}`,
			want: q(16+5) + 2*MessageOverhead + 5,
		},
		{
			name: "chat/tool definitions count whole",
			path: "/v1/chat/completions",
			body: `{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}],"max_tokens":5}`,
			// type function function name f
			want: q(4+8+8+4+1) + 5,
		},
		{
			name: "chat/functions and response_format count whole, other strings not at all",
			path: "/v1/chat/completions",
			body: `{"user":"someone else entirely","messages":[],"functions":[{"name":"ab"}],"response_format":{"type":"json_object"},"max_tokens":5}`,
			// name ab type json_object
			want: q(4+2+4+11) + 5,
		},
		{
			name: "chat/azure deployment path",
			path: "/openai/deployments/gpt-4o/chat/completions",
			body: `{"messages":[{"role":"user","content":"abcd"}],"max_tokens":7}`,
			want: 1 + MessageOverhead + 7,
		},
		{
			name: "chat/query and trailing slash ignored",
			path: "/v1/chat/completions/?api-version=2024-10-21",
			body: `{"messages":[{"role":"user","content":"abcd"}],"max_tokens":7}`,
			want: 1 + MessageOverhead + 7,
		},
		{
			name: "chat/non-ASCII counts bytes",
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"héllo 世界"}],"max_tokens":1}`,
			want: q(6+1+6) + MessageOverhead + 1,
		},
		{
			name: "chat/huge max_tokens does not overflow",
			path: "/v1/chat/completions",
			body: `{"messages":[],"max_tokens":1e300,"n":128}`,
			want: maxCount * maxChoices,
		},

		// Legacy completions.
		{
			name: "completions/prompt string",
			path: "/v1/completions",
			body: `{"prompt":"Once upon a time","max_tokens":16}`,
			want: q(16) + 16,
		},
		{
			name: "completions/best_of multiplies output",
			path: "/v1/completions",
			body: `{"prompt":[1,2,3],"max_tokens":16,"best_of":4,"n":2}`,
			want: 3 + 4*16,
		},

		// OpenAI Responses.
		{
			name: "responses/string input and instructions",
			path: "/v1/responses",
			body: `{"model":"gpt-5","instructions":"Be brief.","input":"Tell me a joke.","max_output_tokens":64}`,
			want: q(9+15) + 2*MessageOverhead + 64,
		},
		{
			name: "responses/items with parts",
			path: "/v1/responses",
			body: `{"input":[{"role":"user","content":[{"type":"input_text","text":"Describe"},{"type":"input_image","image_url":"` + bigImage + `"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"result"},{"type":"reasoning","summary":[{"type":"summary_text","text":"ok"}],"encrypted_content":"` + strings.Repeat("x", 4000) + `"}]}`,
			want: q(8+2+6+2) + 4*MessageOverhead + MediaTokens + DefaultMaxOutput,
		},
		{
			name: "responses/output schema counts",
			path: "/v1/responses",
			body: `{"input":"abcd","text":{"format":{"type":"json_object"}},"max_output_tokens":1}`,
			// abcd, then format type json_object (the top-level key is not counted)
			want: q(4+6+4+11) + MessageOverhead + 1,
		},

		// Embeddings.
		{
			name: "embeddings/string",
			path: "/v1/embeddings",
			body: `{"model":"text-embedding-3-small","input":"hello world"}`,
			want: q(11),
		},
		{
			name: "embeddings/strings",
			path: "/v1/embeddings",
			body: `{"input":["abcd","efgh","ij"],"max_tokens":500}`,
			want: q(10),
		},
		{
			name: "embeddings/token array",
			path: "/v1/embeddings",
			body: `{"input":[1,2,3,4,5]}`,
			want: 5,
		},
		{
			name: "embeddings/token arrays",
			path: "/v1/embeddings",
			body: `{"input":[[1,2],[3,4,5],[]]}`,
			want: 5,
		},
		{
			name: "embeddings/empty input is at least 1",
			path: "/v1/embeddings",
			body: `{"input":""}`,
			want: 1,
		},

		// Anthropic Messages.
		{
			name: "messages/system string under a route prefix",
			path: "/anthropic/v1/messages",
			body: `{"model":"claude-sonnet-4-5","system":"Be kind.","messages":[{"role":"user","content":"Hi!"}],"max_tokens":1024}`,
			want: q(8+3) + 2*MessageOverhead + 1024,
		},
		{
			name: "messages/blocks, image, tool use and result, thinking",
			path: "/v1/messages",
			body: `{"system":[{"type":"text","text":"Sys","cache_control":{"type":"ephemeral"}}],"messages":[` +
				`{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + bigImage + `"}},{"type":"text","text":"What?"}]},` +
				`{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"` + strings.Repeat("s", 1000) + `"},{"type":"tool_use","id":"t","name":"look","input":{"q":"x"}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"found"}]}]}` +
				`],"max_tokens":100}`,
			want: q(3+5+3+2+5) + 4*MessageOverhead + MediaTokens + 100,
		},
		{
			name: "messages/missing max_tokens",
			path: "/v1/messages",
			body: `{"messages":[{"role":"user","content":"abcd"}]}`,
			want: 1 + MessageOverhead + DefaultMaxOutput,
		},

		// Anything else.
		{
			name: "garbage body on a known path",
			path: "/v1/chat/completions",
			body: `not json`,
			want: q(8) + DefaultMaxOutput,
		},
		{
			name: "truncated JSON",
			path: "/v1/messages",
			body: `{"messages":[{"role":"user","content":"ab`,
			want: q(int64(len(`{"messages":[{"role":"user","content":"ab`))) + DefaultMaxOutput,
		},
		{
			name: "JSON array body",
			path: "/v1/chat/completions",
			body: `[1,2,3]`,
			want: q(7) + DefaultMaxOutput,
		},
		{
			name: "null body",
			path: "/v1/responses",
			body: `null`,
			want: 1 + DefaultMaxOutput,
		},
		{
			name: "empty body",
			path: "/v1/chat/completions",
			body: ``,
			want: DefaultMaxOutput,
		},
		{
			name: "unknown path",
			path: "/v1/audio/speech",
			body: `{"input":"abcdefgh","max_tokens":5}`,
			want: q(int64(len(`{"input":"abcdefgh","max_tokens":5}`))) + DefaultMaxOutput,
		},
		{
			name: "wrong field types",
			path: "/v1/chat/completions",
			body: `{"messages":"abcd","max_tokens":"100","n":"2"}`,
			want: 1 + MessageOverhead + DefaultMaxOutput,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Estimate(tt.path, []byte(tt.body)); got != tt.want {
				t.Errorf("Estimate(%q, …) = %d, want %d", tt.path, got, tt.want)
			}
		})
	}
}

func TestEstimateCountsToolDefinitions(t *testing.T) {
	without := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	with := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather for a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`
	a, b := Estimate("/v1/chat/completions", []byte(without)), Estimate("/v1/chat/completions", []byte(with))
	if b <= a+10 {
		t.Errorf("with tools %d, without %d: tool definitions not counted", b, a)
	}
}

func TestAPIOf(t *testing.T) {
	tests := []struct {
		path string
		want api
	}{
		{"/v1/chat/completions", apiChat},
		{"chat/completions", apiChat},
		{"/v1/completions", apiCompletions},
		{"/v1/responses", apiResponses},
		{"/v1/embeddings", apiEmbeddings},
		{"/v1/messages", apiMessages},
		{"/anthropic/v1/messages", apiMessages},
		{"/v1/messages/count_tokens", apiUnknown},
		{"/v1/responses/resp_123", apiUnknown},
		{"/v1/myresponses", apiUnknown},
		{"", apiUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			if got := apiOf(tt.path); got != tt.want {
				t.Errorf("apiOf(%q) = %d, want %d", tt.path, got, tt.want)
			}
		})
	}
}

// FuzzReadRequestAgreesWithDecoding: on any body and path, the estimate
// is at least 1, and agrees with decoding the whole body into a map
// (estimateByDecoding) wherever that decoding succeeds and no object
// repeats a key (the walk reads a repeated key's text each time); the
// model agrees with decoding into a struct, on every body.
func FuzzReadRequestAgreesWithDecoding(f *testing.F) {
	for _, s := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}],"n":2,"max_tokens":9}`},
		{"/v1/responses", `{"instructions":"x","input":[{"role":"user","content":"hi"}],"max_output_tokens":3}`},
		{"/v1/embeddings", `{"input":[[1,2],[3]]}`},
		{"/anthropic/v1/messages", `{"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/completions", `{"prompt":["a",1],"best_of":3}`},
		{"/v1/chat/completions", `{"Model":"a\u00e9\ud83d\ude00","messages":[{"content":"\ud800x\n\"","tool_calls":[{"function":{"arguments":{"k\u0041":[1,"\u00ff"]}}}]}]}`},
		{"/v1/chat/completions", "{\"model\":\"\xff\",\"messages\":[{\"content\":\"\xe2\x82\"}],\"max_tokens\":1e2}"},
		{"/x", "\x00\xff"},
	} {
		f.Add(s.path, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		got := ReadRequest(path, body)
		if got.Cost < 1 {
			t.Fatalf("ReadRequest(%q, %q).Cost = %d, want >= 1", path, body, got.Cost)
		}
		if want := modelByDecoding(body); got.Model != want {
			t.Errorf("ReadRequest(%q).Model = %q; decoding into a struct gives %q", body, got.Model, want)
		}
		var m map[string]any
		decodes := json.Unmarshal(body, &m) == nil
		if json.Valid(body) && (!decodes || repeatsAKey(body)) {
			return // a number out of float64's range, or a repeated key
		}
		if want := estimateByDecoding(path, body); got.Cost != want {
			t.Errorf("ReadRequest(%q, %q).Cost = %d; decoding gives %d", path, body, got.Cost, want)
		}
	})
}

// modelByDecoding is the body's model as decoding it into a struct reads
// it, "" when that fails.
func modelByDecoding(body []byte) string {
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return ""
	}
	var v struct {
		Model string `json:"model"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return v.Model
}

// repeatsAKey reports whether an object in the valid JSON body has a key
// twice.
func repeatsAKey(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].key = true
			}
			continue
		}
		if top != nil && top.object && top.key {
			k := tok.(string)
			if top.keys[k] {
				return true
			}
			top.keys[k], top.key = true, false
			continue
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, &frame{keys: map[string]bool{}, object: d == '{', key: d == '{'})
			continue
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}

// A query string is cut off before the API is recognised, even when the
// path is nothing but a query.
func TestAPIOfQueryOnlyPath(t *testing.T) {
	for _, path := range []string{"?/v1/chat/completions", "?x=/messages"} {
		if got := apiOf(path); got != apiUnknown {
			t.Errorf("apiOf(%q) = %d, want apiUnknown", path, got)
		}
	}
	if got := apiOf("/v1/messages?beta=true"); got != apiMessages {
		t.Errorf("apiOf with a query = %d, want apiMessages", got)
	}
}

// BenchmarkReadRequest: reading a chat request of about 4 KB for its
// model and cost, by the walk and by decoding it twice as the proxy did
// before (into a map for the estimate, into a struct for the model).
func BenchmarkReadRequest(b *testing.B) {
	var msgs []string
	for i := range 12 {
		msgs = append(msgs, `{"role":"user","content":"`+strings.Repeat("Tell me about the weather in Paris. ", 8)+`"}`, `{"role":"assistant","content":[{"type":"text","text":"`+strings.Repeat(`It is mild\n`, 4)+fmt.Sprint(i)+`"}]}`)
	}
	body := []byte(`{"model":"gpt-4o-mini","temperature":0.2,"max_tokens":300,"messages":[` + strings.Join(msgs, ",") + `]}`)
	const path = "/v1/chat/completions"
	if !json.Valid(body) {
		b.Fatal("not JSON")
	}
	if got, want := ReadRequest(path, body).Cost, estimateByDecoding(path, body); got != want {
		b.Fatalf("walk %d, decoding %d", got, want)
	}
	b.Run("walk", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			ReadRequest(path, body)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			estimateByDecoding(path, body)
			modelByDecoding(body)
		}
	})
}

// TestReadRequestRefusesWhatIsNotJSON: a body that is not valid JSON has
// no model and the estimate of a body of no known API, however close to
// JSON it comes; one that is valid, at the edges of the grammar, is read.
func TestReadRequestRefusesWhatIsNotJSON(t *testing.T) {
	const path = "/v1/chat/completions"
	deep := strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)
	for _, body := range []string{
		`{"model":"m","messages":[]} x`, `{"model":"m","messages":[]`, `{"model":"m",}`, `{"model":"m" "n":1}`,
		`{"model":"m","n":01}`, `{"model":"m","n":1.}`, `{"model":"m","n":-}`, `{"model":"m","n":1e}`, `{"model":"m","n":.5}`,
		`{"model":"m","x":tru}`, `{"model":"m","x":nul}`, `{"model":"m","x":True}`,
		`{"model":"m","x":"\q"}`, `{"model":"m","x":"\u12"}`, "{\"model\":\"m\",\"x\":\"a\nb\"}", `{"model":"m","x":"open}`,
		`{"model":"m",1:2}`, `{"model":"m","x"}`, `{"model":"m","x":[1,]}`, `{"model":"m","x":[1 2]}`,
		`{"model":"m","x":` + "[" + deep + "]" + `}`, `{"model":"m","x":"\u12g4"}`, `{"model":"m","x":"\uD83D\uDE0G"}`,
	} {
		got := ReadRequest(path, []byte(body))
		want := ceilQuarter(int64(len(body))) + DefaultMaxOutput
		if got.Model != "" || got.Cost != want || json.Valid([]byte(body)) {
			t.Errorf("ReadRequest(%.60q) = %+v, want no model and cost %d (json.Valid: %v)", body, got, want, json.Valid([]byte(body)))
		}
	}
	for _, body := range []string{
		` {"model":"m","x":[-0.5e+3,0,1E9,true,false,null,{},[],"\u00e9\/\b\f\n\r\t\"\\\u0000"]} `,
		`{"model":"m","x":` + deep[1:len(deep)-1] + `}`,
		// Depth is of nesting, not of how many there were, empty or not.
		`{"model":"m","x":[` + strings.Repeat("[],", maxDepth) + `[]],"y":[` + strings.Repeat("{},", maxDepth) + `{}]}`,
		`{"model":"m","x":[` + strings.Repeat("[1],", maxDepth) + `[1]],"y":[` + strings.Repeat(`{"a":1},`, maxDepth) + `{"a":1}]}`,
		// The deepest an object may be, as the deepest an array may be above.
		`{"model":"m","x":` + strings.Repeat("[", maxDepth-2) + "{}" + strings.Repeat("]", maxDepth-2) + `}`,
	} {
		if got := ReadRequest(path, []byte(body)); got.Model != "m" || !json.Valid([]byte(body)) {
			t.Errorf("ReadRequest(%.60q) = %+v, want model m", body, got)
		}
	}
}

// TestStringsCountTheirDecodedLength: a string counts the UTF-8 bytes
// encoding/json decodes it to: escapes resolved, a surrogate pair joined
// into one character, a lone surrogate and a byte that is not UTF-8
// replaced by U+FFFD.
func TestStringsCountTheirDecodedLength(t *testing.T) {
	for _, raw := range []string{`"abc"`, `""`, `"\u00e9"`, `"\u00E9"`, `"\u0000"`, `"\uffff"`, `"\uABCD"`, `"\uabcd"`,
		`"\u0f0F"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"\ud800x"`, `"\ud800\u0041"`, `"\udc00"`, `"\ud83d\ud83d\ude00"`,
		`"\ud83d"`, `"\n\t\\\/\"\b\f\r"`, "\"\xff\"", "\"\xe2\x82\"", "\"\xe2\x82\xac\"", "\"\x80\"", "\"é€😀\""} {
		var s string
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		w := walker{b: []byte(raw)}
		n := w.str()
		if w.bad || w.i != len(raw) || n != int64(len(s)) {
			t.Errorf("%q: length %d (end %d, bad %v), decoded %d", raw, n, w.i, w.bad, len(s))
		}
	}
}

// TestKeysAndModelsAreReadDecoded: a key spelt with escapes is the key it
// decodes to, and the model is its decoded string.
func TestKeysAndModelsAreReadDecoded(t *testing.T) {
	const path = "/v1/chat/completions"
	plain := ReadRequest(path, []byte(`{"messages":[{"content":"abcdefgh"}],"max_tokens":7}`))
	escaped := ReadRequest(path, []byte(`{"\u006dessages":[{"\u0063ontent":"abcdefgh"}],"max_tok\u0065ns":7}`))
	if escaped.Cost != plain.Cost {
		t.Errorf("escaped keys cost %d, plain %d", escaped.Cost, plain.Cost)
	}
	// A count spelt with a leading zero and an exponent is still a count.
	if got, want := ReadRequest(path, []byte(`{"messages":[{"content":"abcdefgh"}],"max_tokens":0.7e1}`)).Cost, plain.Cost; got != want {
		t.Errorf("max_tokens 0.7e1: cost %d, want %d as for 7", got, want)
	}
	for body, want := range map[string]string{
		`{"model":"gpt-4o"}`: "gpt-4o", `{"model":"a\u00e9"}`: "aé", `{"model":"\u0061"}`: "a", "{\"model\":\"é\"}": "é",
		"{\"model\":\"\x80\"}": "\ufffd", `{"MODEL":"x","model":null}`: "x", `{"model":"x","Model":1}`: "",
	} {
		if got := ReadRequest(path, []byte(body)).Model; got != want {
			t.Errorf("%s: model %q, want %q", body, got, want)
		}
	}
}
