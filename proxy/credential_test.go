package proxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestEveryProviderCredentialKeysItsOwnLane: keys sent in each place a big
// provider takes one give each tenant its own lane; the same key in the
// same place gives the same lane; none of them shows in /lanes, the
// metrics or the log.
func TestEveryProviderCredentialKeysItsOwnLane(t *testing.T) {
	var upstreamQuery []string
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamQuery = append(upstreamQuery, r.URL.RawQuery)
		fmt.Fprint(w, `{}`)
	}), nil)
	send := func(path string, hdr ...string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", h.front.URL+path, strings.NewReader(`{"model":"gemini-x"}`))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		return resp.Header.Get("X-Llmproxy-Lane")
	}
	const p = "/v1beta/models/gemini-x:generateContent"
	secrets := []string{"goog-secret-one", "goog-secret-two", "query-secret-one", "query-secret-two", "azure-secret-one", "anthropic-secret-one"}
	lanes := []string{
		send(p, "X-Goog-Api-Key", secrets[0]),
		send(p, "X-Goog-Api-Key", secrets[1]),
		send(p + "?alt=sse&key=" + secrets[2]),
		send(p + "?key=" + secrets[3]),
		send(p, "Api-Key", secrets[4]),
		send(p, "X-Api-Key", secrets[5]),
		send(p), // no key at all
	}
	seen := map[string]int{}
	for i, l := range lanes {
		if j, dup := seen[l]; dup {
			t.Errorf("requests %d and %d share lane %s", j, i, l)
		}
		seen[l] = i
	}
	if again := send(p + "?key=" + secrets[3]); again != lanes[3] {
		t.Errorf("the same query key got lane %s, then %s", lanes[3], again)
	}
	if again := send(p, "X-Goog-Api-Key", secrets[0]); again != lanes[0] {
		t.Errorf("the same x-goog-api-key got lane %s, then %s", lanes[0], again)
	}
	if q, _ := url.ParseQuery(upstreamQuery[2]); q.Get("key") != secrets[2] || q.Get("alt") != "sse" {
		t.Errorf("the upstream got query %q, want the key and alt passed on", upstreamQuery[2])
	}
	admin := newAdmin(t, h)
	shown := admin("/lanes") + admin("/metrics") + h.logs.String()
	for _, s := range secrets {
		if strings.Contains(shown, s) {
			t.Errorf("%s shows in /lanes, /metrics or the log", s)
		}
	}
}

// TestQueryKey: the key parameter wherever it is in the query, unescaped,
// and a malformed escape still a key of its own.
func TestQueryKey(t *testing.T) {
	for q, want := range map[string]string{
		"":                   "",
		"key=abc":            "abc",
		"alt=sse&key=a%2Bb":  "a+b",
		"monkey=x&key=y":     "y",
		"key=&key=second":    "second",
		"key=%zz":            "%zz",
		"keys=x":             "",
		"alt=sse&key=k&key=": "k",
	} {
		if got := queryKey(q); got != want {
			t.Errorf("queryKey(%q) = %q, want %q", q, got, want)
		}
	}
}

// newAdmin serves h's admin endpoints for the test and returns a getter of
// their bodies.
func newAdmin(t *testing.T, h *harness) func(path string) string {
	t.Helper()
	srv := httptest.NewServer(h.proxy.AdminHandler(Health{}))
	t.Cleanup(srv.Close)
	return func(path string) string {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return readAll(t, resp.Body)
	}
}
