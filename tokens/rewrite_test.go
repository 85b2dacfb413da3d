package tokens

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"
)

// rewrite calls f on a copy of body and fails the test if f changed it.
func rewrite(t *testing.T, body string, f func([]byte) ([]byte, bool)) (string, bool) {
	t.Helper()
	in := []byte(body)
	out, ok := f(in)
	if string(in) != body {
		t.Errorf("%s: the input was changed to %s", body, in)
	}
	if len(in) > 0 && len(out) > 0 && &in[0] == &out[0] && ok {
		t.Errorf("%s: the output shares the input's memory", body)
	}
	if ok && cap(out) != len(out) {
		t.Errorf("%s: the output has room for %d bytes, holds %d: a body kept to send again should not carry spare room", body, cap(out), len(out))
	}
	return string(out), ok
}

func TestSetServiceTier(t *testing.T) {
	for _, tt := range []struct {
		name, body, key, tier, want string
		ok                          bool
	}{
		{"insert", `{"model":"gpt-4o","messages":[]}`, "service_tier", "flex", `{"service_tier":"flex","model":"gpt-4o","messages":[]}`, true},
		{"insert into an empty object", `{}`, "service_tier", "flex", `{"service_tier":"flex"}`, true},
		{"insert into an empty object with spaces", " \n{ }\n", "service_tier", "flex", " \n{\"service_tier\":\"flex\" }\n", true},
		{"replace", `{"model":"m","service_tier":"auto","n":1}`, "service_tier", "priority", `{"model":"m","service_tier":"priority","n":1}`, true},
		{"replace a value of another kind", `{"service_tier" : {"a":[1,"}"]} ,"n":1}`, "service_tier", "flex", `{"service_tier" : "flex" ,"n":1}`, true},
		{"replace every one", `{"service_tier":null,"x":1,"service_tier":"auto"}`, "service_tier", "flex", `{"service_tier":"flex","x":1,"service_tier":"flex"}`, true},
		{"escaped key matches", `{"service\u005ftier":"auto"}`, "service_tier", "flex", `{"service\u005ftier":"flex"}`, true},
		{"another case is another key", `{"Service_Tier":"auto"}`, "service_tier", "flex", `{"service_tier":"flex","Service_Tier":"auto"}`, true},
		{"nested keys are left", `{"metadata":{"service_tier":"auto"}}`, "service_tier", "flex", `{"service_tier":"flex","metadata":{"service_tier":"auto"}}`, true},
		{"camel case key", `{"contents":[]}`, "serviceTier", "FLEX", `{"serviceTier":"FLEX","contents":[]}`, true},
		{"tier quoted", `{}`, "service_tier", `a"b\`, `{"service_tier":"a\"b\\"}`, true},
		{"array", `[{"service_tier":"auto"}]`, "service_tier", "flex", `[{"service_tier":"auto"}]`, false},
		{"string", `"x"`, "service_tier", "flex", `"x"`, false},
		{"invalid", `{"model":"m",}`, "service_tier", "flex", `{"model":"m",}`, false},
		{"truncated", `{"service_tier":"auto"`, "service_tier", "flex", `{"service_tier":"auto"`, false},
		{"trailing garbage", `{} {}`, "service_tier", "flex", `{} {}`, false},
		{"empty", ``, "service_tier", "flex", ``, false},
	} {
		got, ok := rewrite(t, tt.body, func(b []byte) ([]byte, bool) { return SetServiceTier(b, tt.key, tt.tier) })
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: SetServiceTier = %s, %v; want %s, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestIncludeUsage(t *testing.T) {
	for _, tt := range []struct {
		name, body, want string
		added            bool
	}{
		{"insert", `{"model":"m","stream":true}`, `{"stream_options":{"include_usage":true},"model":"m","stream":true}`, true},
		{"into options", `{"stream":true,"stream_options":{}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"beside another option", `{"stream":true,"stream_options":{"include_obfuscation":false}}`, `{"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}}`, true},
		{"false made true", `{"stream_options":{"include_usage":false},"stream":true}`, `{"stream_options":{"include_usage":true},"stream":true}`, true},
		{"null made true", `{"stream_options":{"include_usage":null},"stream":true}`, `{"stream_options":{"include_usage":true},"stream":true}`, true},
		{"null options", `{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"spaces", "{ \"stream\" : true , \"stream_options\" : { \"include_usage\" : false } }", "{ \"stream\" : true , \"stream_options\" : { \"include_usage\" : true } }", true},
		{"every options object", `{"stream_options":null,"stream":true,"stream_options":{"include_usage":false,"include_usage":false}}`,
			`{"stream_options":{"include_usage":true},"stream":true,"stream_options":{"include_usage":true,"include_usage":true}}`, true},
		{"the last options count", `{"stream":true,"stream_options":{"include_usage":true},"stream_options":{}}`,
			`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":true}}`, true},
		{"the last include_usage counts", `{"stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`,
			`{"stream":true,"stream_options":{"include_usage":true,"include_usage":true}}`, true},
		{"nested ones are left", `{"stream":true,"metadata":{"stream_options":{"include_usage":false}}}`,
			`{"stream_options":{"include_usage":true},"stream":true,"metadata":{"stream_options":{"include_usage":false}}}`, true},
		{"already on", `{"stream":true,"stream_options":{"include_usage":true}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, false},
		{"already on, last one", `{"stream":true,"stream_options":{"include_usage":false},"stream_options":{"include_usage":true}}`,
			`{"stream":true,"stream_options":{"include_usage":false},"stream_options":{"include_usage":true}}`, false},
		{"not streamed", `{"stream":false}`, `{"stream":false}`, false},
		{"no stream", `{"model":"m"}`, `{"model":"m"}`, false},
		{"stream as a string", `{"stream":"true"}`, `{"stream":"true"}`, false},
		{"the last stream counts", `{"stream":true,"stream":false}`, `{"stream":true,"stream":false}`, false},
		{"nested stream", `{"x":{"stream":true}}`, `{"x":{"stream":true}}`, false},
		{"another case is another key", `{"Stream":true}`, `{"Stream":true}`, false},
		{"options of another kind", `{"stream":true,"stream_options":[]}`, `{"stream":true,"stream_options":[]}`, false},
		{"invalid", `{"stream":true,}`, `{"stream":true,}`, false},
		{"truncated", `{"stream":true`, `{"stream":true`, false},
		{"array", `[{"stream":true}]`, `[{"stream":true}]`, false},
	} {
		got, added := rewrite(t, tt.body, IncludeUsage)
		if got != tt.want || added != tt.added {
			t.Errorf("%s: IncludeUsage = %s, %v; want %s, %v", tt.name, got, added, tt.want, tt.added)
		}
	}
}

// decodeObject decodes a JSON object as a decoder would, numbers kept as
// written; ok is false when b is not one.
func decodeObject(b []byte) (m map[string]any, ok bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if d.Decode(&m) != nil || m == nil || d.InputOffset() != int64(len(bytes.TrimRight(b, " \t\r\n"))) {
		return nil, false
	}
	return m, json.Valid(b)
}

// FuzzSetServiceTier: on any body, a JSON object comes out as it went in
// but for the key, which says the tier; anything else comes out as it is.
func FuzzSetServiceTier(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"service_tier":"auto"}`, `{"service_tier":1,"service_tier":{}}`, `[1]`, `{"a":"\u00e9"}`, ` { "b" : [ ] } `} {
		f.Add([]byte(s), "service_tier", "flex")
	}
	f.Fuzz(func(t *testing.T, body []byte, key, tier string) {
		if !utf8.ValidString(key) {
			return // a decoder would take it for another key
		}
		in := bytes.Clone(body)
		out, ok := SetServiceTier(body, key, tier)
		if !bytes.Equal(body, in) {
			t.Fatalf("input changed")
		}
		want, isObject := decodeObject(body)
		if ok != isObject {
			t.Fatalf("SetServiceTier(%q) ok = %v; it is a JSON object: %v", body, ok, isObject)
		}
		if !ok {
			if !bytes.Equal(out, body) {
				t.Fatalf("not an object, yet changed to %q", out)
			}
			return
		}
		got, isObject := decodeObject(out)
		if !isObject {
			t.Fatalf("SetServiceTier(%q) = %q, not a JSON object", body, out)
		}
		var s string
		_ = json.Unmarshal(quote(tier), &s) // tier as JSON carries it
		want[key] = s
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("SetServiceTier(%q, %q, %q) = %q, decoding to %v; want %v", body, key, tier, out, got, want)
		}
	})
}

// FuzzIncludeUsage: on any body, what comes out decodes to what went in,
// but for stream_options.include_usage, true when it was added.
func FuzzIncludeUsage(f *testing.F) {
	for _, s := range []string{`{"stream":true}`, `{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"a":1}}`,
		`{"stream":true,"stream_options":{"include_usage":true}}`, `{"stream":false}`, `[1]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in := bytes.Clone(body)
		out, added := IncludeUsage(body)
		if !bytes.Equal(body, in) {
			t.Fatalf("input changed")
		}
		want, _ := decodeObject(body)
		if !added {
			if !bytes.Equal(out, body) {
				t.Fatalf("IncludeUsage(%q) = %q, false: changed", body, out)
			}
			if want["stream"] != true {
				return
			}
			switch opts := want["stream_options"].(type) {
			case nil:
				t.Fatalf("IncludeUsage(%q) added no stream_options to a streamed request", body)
			case map[string]any:
				if opts["include_usage"] != true {
					t.Fatalf("IncludeUsage(%q) set no include_usage in a streamed request", body)
				}
			}
			return
		}
		got, isObject := decodeObject(out)
		if !isObject || want["stream"] != true {
			t.Fatalf("IncludeUsage(%q) = %q, true", body, out)
		}
		opts, _ := want["stream_options"].(map[string]any)
		if opts == nil {
			opts = map[string]any{}
		}
		opts["include_usage"] = true
		want["stream_options"] = opts
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("IncludeUsage(%q) = %q, decoding to %v; want %v", body, out, got, want)
		}
	})
}

// An earlier stream_options of another kind is left as it is; the last
// one counts.
func TestIncludeUsageTheLastOptionsCount(t *testing.T) {
	body := `{"stream":true,"stream_options":1,"stream_options":{}}`
	want := `{"stream":true,"stream_options":1,"stream_options":{"include_usage":true}}`
	if got, added := rewrite(t, body, IncludeUsage); got != want || !added {
		t.Errorf("IncludeUsage = %s, %v; want %s, true", got, added, want)
	}
	body = `{"stream":true,"stream_options":{},"stream_options":"x"}`
	if got, added := rewrite(t, body, IncludeUsage); got != body || added {
		t.Errorf("IncludeUsage = %s, %v; want it as it is, false", got, added)
	}
}
