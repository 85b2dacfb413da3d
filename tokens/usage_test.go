package tokens

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestFromBody(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		want   Usage
		wantOK bool
	}{
		{
			name:   "openai chat",
			body:   `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`,
			want:   Usage{Input: 19, Output: 10},
			wantOK: true,
		},
		{
			name:   "openai responses",
			body:   `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":123}}`,
			want:   Usage{Input: 36, Output: 87},
			wantOK: true,
		},
		{
			name:   "openai embeddings",
			body:   `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			want:   Usage{Input: 8},
			wantOK: true,
		},
		{
			name:   "anthropic with cache",
			body:   `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":6,"service_tier":"standard"}}`,
			want:   Usage{Input: 2112, Output: 6, Cached: 2000, Tier: "standard"},
			wantOK: true,
		},
		{
			name:   "anthropic null cache fields",
			body:   `{"usage":{"input_tokens":12,"cache_creation_input_tokens":null,"cache_read_input_tokens":null,"output_tokens":6}}`,
			want:   Usage{Input: 12, Output: 6},
			wantOK: true,
		},
		{
			name:   "unbroken-down total counts as output",
			body:   `{"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":40}}`,
			want:   Usage{Input: 10, Output: 30},
			wantOK: true,
		},
		{
			name:   "total only",
			body:   `{"usage":{"total_tokens":40}}`,
			want:   Usage{Input: 40},
			wantOK: true,
		},
		{
			name:   "float counts",
			body:   `{"usage":{"prompt_tokens":10.0,"completion_tokens":5e0}}`,
			want:   Usage{Input: 10, Output: 5},
			wantOK: true,
		},
		{
			name:   "odd fields are skipped, the rest kept",
			body:   `{"usage":{"prompt_tokens":"10","completion_tokens":-5,"total_tokens":{}}}`,
			want:   Usage{},
			wantOK: true,
		},
		{
			name:   "huge counts are clamped",
			body:   `{"usage":{"input_tokens":1e300,"output_tokens":1e300,"cache_read_input_tokens":1e300}}`,
			want:   Usage{Input: 2 * maxCount, Output: maxCount, Cached: maxCount},
			wantOK: true,
		},
		{name: "no usage", body: `{"id":"x","choices":[]}`},
		{name: "null usage", body: `{"usage":null}`},
		{name: "empty usage", body: `{"usage":{}}`},
		{name: "usage not an object", body: `{"usage":"lots"}`},
		{name: "not json", body: `<html>502 Bad Gateway</html>`},
		{name: "empty", body: ``},
		{name: "array", body: `[{"usage":{"prompt_tokens":1}}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := FromBody([]byte(tt.body))
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("FromBody = %+v, %v; want %+v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestUsageTotal(t *testing.T) {
	if got := (Usage{Input: 3, Output: 4}).Total(); got != 7 {
		t.Errorf("Total = %d, want 7", got)
	}
}

// When total_tokens exceeds the output and no input field is given, the
// difference is the input.
func TestFromBodyTotalWithOutputOnly(t *testing.T) {
	for _, body := range []string{
		`{"usage":{"completion_tokens":5,"total_tokens":40}}`,
		`{"usage":{"output_tokens":5,"total_tokens":40}}`,
	} {
		if got, ok := FromBody([]byte(body)); !ok || got != (Usage{Input: 35, Output: 5}) {
			t.Errorf("FromBody(%s) = %+v, %v; want {35 5}, true", body, got, ok)
		}
	}
}

// TestFromBodyFindsTheTopLevelUsage: the scan takes the top-level key as
// encoding/json would (case folded, escapes decoded, the last one), skips
// strings and nesting that look like it, and refuses what is not a whole
// JSON object.
func TestFromBodyFindsTheTopLevelUsage(t *testing.T) {
	u := Usage{Input: 3, Output: 4}
	for _, tt := range []struct {
		name, body string
		want       Usage
		ok         bool
	}{
		{"case folded", `{"Usage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
		{"escaped key", `{"\u0075sage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
		{"the last one", `{"usage":{"prompt_tokens":9},"usage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
		{"spaces", " \n{ \"usage\" :\t{\"prompt_tokens\":3,\"completion_tokens\":4} }\r\n", u, true},
		{"look-alikes skipped", `{"a":"\"usage\":{\"prompt_tokens\":1}","b":{"usage":{"prompt_tokens":1}},"c":[{"usage":1},"}"],"usage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
		{"only nested", `{"b":{"usage":{"prompt_tokens":1}}}`, Usage{}, false},
		{"truncated", `{"usage":{"prompt_tokens":3,"completion_tokens":4}`, Usage{}, false},
		{"truncated after", `{"usage":{"prompt_tokens":3},"id":"x`, Usage{}, false},
		{"trailing garbage", `{"usage":{"prompt_tokens":3}} x`, Usage{}, false},
		{"no colon", `{"usage" {"prompt_tokens":3}}`, Usage{}, false},
		{"no comma", `{"id":1 "usage":{"prompt_tokens":3}}`, Usage{}, false},
		{"unquoted key", `{usage:{"prompt_tokens":3}}`, Usage{}, false},
		{"empty object", `{}`, Usage{}, false},
		{"empty value", `{"usage":}`, Usage{}, false},
		{"literals before", `{"n":-1.5e3,"t":true,"f":false,"z":null,"usage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
		{"only a brace", `{`, Usage{}, false},
		{"only a brace and space", "{ \n", Usage{}, false},
		{"ends after a key", `{"usage"`, Usage{}, false},
		{"ends after a colon", `{"usage":`, Usage{}, false},
		{"ends after a comma", `{"a":1,`, Usage{}, false},
		{"ends in a literal", `{"a":1`, Usage{}, false},
		{"ends in a string", `{"a":"x`, Usage{}, false},
		{"ends in a key", `{"a`, Usage{}, false},
		{"ends inside the usage", `{"usage":{"prompt_tokens":3`, Usage{}, false},
		{"ends in a nested string", `{"usage":{"a":"}`, Usage{}, false},
		{"escaped quote in a string", `{"a":"\"}","usage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
		{"array value", `{"a":[1,[2,{"b":"]"}]],"usage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
		{"string key not first", `{"a":{},"usage":{"prompt_tokens":3,"completion_tokens":4}}`, u, true},
	} {
		got, ok := FromBody([]byte(tt.body))
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: FromBody = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzFromBodyAgreesWithDecoding: on any body, what is not valid JSON
// included, the walk reads what decoding the whole body reads, unless the
// body has more than one top-level usage key (a decoder merges them into
// one struct; the walk takes the last).
func FuzzFromBodyAgreesWithDecoding(f *testing.F) {
	for _, s := range []string{`{"usage":{"prompt_tokens":19,"completion_tokens":10}}`, `{"id":"x","usage":null}`,
		`{"a":[1,{"b":"}"}],"USAGE":{"total_tokens":40}}`, `[1]`, `"usage"`, `{"usage":{"input_tokens":1e300}}`,
		`{"service_tier":"flex","usage":{"prompt_tokens":19,"prompt_tokens_details":{"cached_tokens":3}}}`,
		`{"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":3},"service_tier":"x-1"},"service_tier":5}`,
		`{"usage":1,"service_tier":"priority"}`, `{"usage":{"cache_read_input_tokens":2,"service_tier":"\u0062atch"}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if json.Valid(body) && usageKeys(body) > 1 {
			return // duplicate keys decode into one struct; the walk takes the last
		}
		want, wantOK := usageByDecoding(body)
		if got, ok := FromBody(body); got != want || ok != wantOK {
			t.Errorf("FromBody(%q) = %+v, %v; decoding the whole body gives %+v, %v", body, got, ok, want, wantOK)
		}
	})
}

// usageKeys counts body's top-level keys that decoding takes for "usage".
func usageKeys(body []byte) int {
	d := json.NewDecoder(bytes.NewReader(body))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return 0
	}
	n := 0
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return 0
		}
		if k, _ := t.(string); strings.EqualFold(k, "usage") {
			n++
		}
		var skip json.RawMessage
		if d.Decode(&skip) != nil {
			return 0
		}
	}
	return n
}

// BenchmarkFromBody reads the usage of a chat answer of about 4 KB: by the
// scan, and by decoding the whole body as FromBody did before.
func BenchmarkFromBody(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("All work and no play makes Jack a dull boy. \\n", 90) +
		`"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":900,"total_tokens":919}}`)
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := FromBody(body); !ok {
				b.Fatal("no usage")
			}
		}
	})
	b.Run("decode whole body", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r struct {
				Usage *usageFields `json:"usage"`
			}
			if json.Unmarshal(body, &r) != nil || r.Usage == nil {
				b.Fatal("no usage")
			}
		}
	})
}

// TestFromBodyCachedAndTier: the cached part of the input from each
// provider's field, and the tier from the top level or else the usage.
func TestFromBodyCachedAndTier(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		want       Usage
		ok         bool
	}{
		{"chat cached and tier", `{"service_tier":"default","usage":{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0}}}`,
			Usage{Input: 2006, Output: 300, Cached: 1920, Tier: "default"}, true},
		{"tier after the usage", `{"usage":{"prompt_tokens":5,"completion_tokens":1},"service_tier":"flex"}`,
			Usage{Input: 5, Output: 1, Tier: "flex"}, true},
		{"responses cached", `{"object":"response","service_tier":"priority","usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":64},"output_tokens":7,"total_tokens":107}}`,
			Usage{Input: 100, Output: 7, Cached: 64, Tier: "priority"}, true},
		{"anthropic cache read and usage tier", `{"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":500,"output_tokens":3,"service_tier":"batch"}}`,
			Usage{Input: 510, Output: 3, Cached: 500, Tier: "batch"}, true},
		{"top-level tier wins", `{"service_tier":"scale","usage":{"input_tokens":1,"output_tokens":1,"service_tier":"standard"}}`,
			Usage{Input: 1, Output: 1, Tier: "scale"}, true},
		{"an odd top-level tier leaves the usage's", `{"service_tier":null,"usage":{"input_tokens":1,"output_tokens":1,"service_tier":"priority"}}`,
			Usage{Input: 1, Output: 1, Tier: "priority"}, true},
		{"counts without cached", `{"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"audio_tokens":4}}}`,
			Usage{Input: 9, Output: 2}, true},
		{"details not an object", `{"usage":{"prompt_tokens":9,"prompt_tokens_details":7,"input_tokens_details":null}}`,
			Usage{Input: 9}, true},
		{"cached null", `{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":null}}}`,
			Usage{Input: 9}, true},
		{"chat details before responses details", `{"usage":{"prompt_tokens":9,"input_tokens_details":{"cached_tokens":2},"prompt_tokens_details":{"cached_tokens":4}}}`,
			Usage{Input: 9, Cached: 4}, true},
		{"details before cache reads", `{"usage":{"prompt_tokens":9,"cache_read_input_tokens":8,"prompt_tokens_details":{"cached_tokens":5}}}`,
			Usage{Input: 9, Cached: 5}, true},
		{"cached at most the input", `{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":50}}}`,
			Usage{Input: 9, Cached: 9}, true},
		{"the last details count", `{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":3},"prompt_tokens_details":{"x":1}}}`,
			Usage{Input: 9, Cached: 3}, true},
		{"nested tier ignored", `{"choices":[{"service_tier":"flex"}],"usage":{"prompt_tokens":1}}`,
			Usage{Input: 1}, true},
		{"tier without usage", `{"service_tier":"flex"}`, Usage{Tier: "flex"}, false},
		{"tier with null usage", `{"service_tier":"flex","usage":null}`, Usage{Tier: "flex"}, false},
		{"usage tier without counts", `{"usage":{"service_tier":"standard"}}`, Usage{Tier: "standard"}, false},
		{"tier of invalid JSON", `{"service_tier":"flex","usage":{"prompt_tokens":1}`, Usage{}, false},
		{"other tier names", `{"service_tier":"Tier_3-b","usage":{"prompt_tokens":1}}`, Usage{Input: 1, Tier: "Tier_3-b"}, true},
		{"32 bytes", `{"service_tier":"` + strings.Repeat("t", 32) + `","usage":{"prompt_tokens":1}}`, Usage{Input: 1, Tier: strings.Repeat("t", 32)}, true},
		{"33 bytes", `{"service_tier":"` + strings.Repeat("t", 33) + `","usage":{"prompt_tokens":1}}`, Usage{Input: 1}, true},
		{"empty", `{"service_tier":"","usage":{"prompt_tokens":1}}`, Usage{Input: 1}, true},
		{"empty keeps the earlier", `{"service_tier":"flex","service_tier":"","usage":{"prompt_tokens":1,"service_tier":"scale","service_tier":""}}`, Usage{Input: 1, Tier: "flex"}, true},
		{"one byte", `{"service_tier":"x","usage":{"prompt_tokens":1}}`, Usage{Input: 1, Tier: "x"}, true},
		{"space", `{"service_tier":"on demand","usage":{"prompt_tokens":1}}`, Usage{Input: 1}, true},
		{"escaped", `{"service_tier":"fle\u0078","usage":{"prompt_tokens":1}}`, Usage{Input: 1}, true},
		{"not ASCII", `{"service_tier":"flé","usage":{"prompt_tokens":1}}`, Usage{Input: 1}, true},
		{"number", `{"service_tier":1,"usage":{"prompt_tokens":1}}`, Usage{Input: 1}, true},
		{"key folded as a decoder does", `{"Service_Tier":"flex","usage":{"prompt_tokens":1}}`, Usage{Input: 1, Tier: "flex"}, true},
		{"the last valid one", `{"service_tier":"flex","service_tier":"priority","service_tier":false,"usage":{"prompt_tokens":1}}`, Usage{Input: 1, Tier: "priority"}, true},
	} {
		got, ok := FromBody([]byte(tt.body))
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: FromBody = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
		if wantD, okD := usageByDecoding([]byte(tt.body)); got != wantD || ok != okD {
			t.Errorf("%s: FromBody = %+v, %v; decoding gives %+v, %v", tt.name, got, ok, wantD, okD)
		}
	}
}

// TestTierNamesDoNotAllocate: a tier name providers send is read without
// allocating; another is read as itself.
func TestTierNamesDoNotAllocate(t *testing.T) {
	for _, name := range knownTiers {
		body := []byte(`{"service_tier":"` + name + `","usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1}}}`)
		var u Usage
		if a := testing.AllocsPerRun(50, func() { u, _ = FromBody(body) }); a != 0 {
			t.Errorf("%s: FromBody allocates %v times, want 0", name, a)
		}
		if u.Tier != name {
			t.Errorf("%s: Tier = %q", name, u.Tier)
		}
	}
	if got, ok := tierOf([]byte(`"Default"`)); !ok || got != "Default" {
		t.Errorf(`tierOf("Default") = %q, %v; want it as it is`, got, ok)
	}
}
