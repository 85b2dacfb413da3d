package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// TestServerErrorsAndCutsAreLoggedAtWarn: an answer the client got as a
// 5xx is logged at warn, a 4xx at debug; a cut answer's line says why,
// and a whole one carries no error.
func TestServerErrorsAndCutsAreLoggedAtWarn(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		switch {
		case strings.Contains(r.URL.Path, "five-hundred"):
			w.WriteHeader(500)
		case strings.Contains(r.URL.Path, "bad"):
			w.WriteHeader(400)
		case strings.Contains(r.URL.Path, "cut"):
			w.Header().Set("Content-Length", "100")
			fmt.Fprint(w, "short")
			return
		}
		fmt.Fprint(w, `{}`)
	}), func(c *Config) { c.MaxRetries = 0 })
	for _, p := range []string{"/v1/five-hundred", "/v1/bad", "/v1/ok"} {
		readAll(t, h.post(p, `{"model":"m"}`).Body)
	}
	// The cut answer may break off before its headers reach the client.
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/cut", strings.NewReader(`{"model":"m"}`))
	if resp, err := testClient.Do(req); err == nil {
		_, _ = readAllErr(resp)
		resp.Body.Close()
	}
	waitFor(t, func() bool { return strings.Count(h.logs.String(), "msg=request ") == 4 })
	lines := map[string]string{}
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if m := regexp.MustCompile(`msg=request .*path=(/v1/[a-z-]+)`).FindStringSubmatch(l); m != nil {
			lines[m[1]] = l
		}
	}
	for path, level := range map[string]string{"/v1/five-hundred": "WARN", "/v1/bad": "DEBUG", "/v1/ok": "DEBUG", "/v1/cut": "WARN"} {
		if !strings.Contains(lines[path], "level="+level) {
			t.Errorf("%s logged as %q, want level %s", path, lines[path], level)
		}
	}
	if !strings.Contains(lines["/v1/cut"], "outcome=upstream_cut") || !strings.Contains(lines["/v1/cut"], " err=") {
		t.Errorf("the cut answer's line %q does not say why", lines["/v1/cut"])
	}
	if strings.Contains(lines["/v1/ok"], " err=") {
		t.Errorf("a whole answer's line %q carries an error", lines["/v1/ok"])
	}
}

// TestCutErrorsNeverShowTheQuery: the reason logged for a cut answer has
// the request's query (where a Gemini key may be) taken out, and is left
// as it is when there is no query.
func TestCutErrorsNeverShowTheQuery(t *testing.T) {
	withKey, _ := url.Parse("https://up.example/v1beta/models/x:streamGenerateContent?alt=sse&key=secret-key")
	err := &url.Error{Op: "Post", URL: withKey.String(), Err: errors.New("stream error near alt=sse&key=secret-key: reset")}
	if got := redactErr(err, withKey); strings.Contains(got, "secret-key") || got != "stream error near …: reset" {
		t.Errorf("redactErr = %q, want the query taken out", got)
	}
	plain, _ := url.Parse("https://up.example/v1/chat/completions")
	if got := redactErr(errors.New("unexpected EOF"), plain); got != "unexpected EOF" {
		t.Errorf("redactErr without a query = %q, want it unchanged", got)
	}
}
