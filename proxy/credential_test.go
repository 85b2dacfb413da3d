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

// TestSigV4KeysItsLaneOnTheSignerNotTheSignature: ten requests signed
// with one access key, each with its own date and signature, share one
// lane; another access key, region or service gets its own; neither the
// access key nor a signature shows in the lane id, /lanes or the log.
func TestSigV4KeysItsLaneOnTheSignerNotTheSignature(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{}`)
	}), nil)
	auth := func(akid, date, region, service string, sig int) string {
		return fmt.Sprintf("AWS4-HMAC-SHA256 Credential=%s/%s/%s/%s/aws4_request, SignedHeaders=host;x-amz-date, Signature=%064x",
			akid, date, region, service, sig)
	}
	send := func(a string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", h.front.URL+"/model/anthropic.claude-x/invoke", strings.NewReader(`{"messages":[]}`))
		req.Header.Set("Authorization", a)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		return resp.Header.Get("X-Llmproxy-Lane")
	}
	first := send(auth("AKIDSECRETONE", "20261124", "us-east-1", "bedrock", 0))
	for i := 1; i < 10; i++ {
		if l := send(auth("AKIDSECRETONE", fmt.Sprintf("202611%02d", 10+i), "us-east-1", "bedrock", i)); l != first {
			t.Fatalf("request %d signed by the same key got lane %s, the first %s", i, l, first)
		}
	}
	others := map[string]string{
		"another access key": send(auth("AKIDSECRETTWO", "20261124", "us-east-1", "bedrock", 0)),
		"another region":     send(auth("AKIDSECRETONE", "20261124", "eu-west-1", "bedrock", 0)),
		"another service":    send(auth("AKIDSECRETONE", "20261124", "us-east-1", "bedrock-runtime", 0)),
	}
	for what, l := range others {
		if l == first {
			t.Errorf("%s shares the first key's lane %s", what, l)
		}
	}
	admin := newAdmin(t, h)
	shown := admin("/lanes") + admin("/metrics") + h.logs.String()
	for _, secret := range []string{"AKIDSECRET", "Signature", "0000000000000000000000000000000000000000000000000000000000000009"} {
		if strings.Contains(shown, secret) {
			t.Errorf("%q shows in /lanes, /metrics or the log", secret)
		}
	}
}

// TestSigV4CredentialReadsOnlyAWholeCredential: the signer is the access
// key ID, region and service; a scheme in any case is read; a Credential=
// without its five parts, or another scheme, is not SigV4 (the header is
// then keyed whole).
func TestSigV4CredentialReadsOnlyAWholeCredential(t *testing.T) {
	cases := []struct {
		auth, want string
		ok         bool
	}{
		{"AWS4-HMAC-SHA256 Credential=AKID/20261124/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=ab", "sigv4 AKID/us-east-1/bedrock", true},
		{"aws4-hmac-sha256 SignedHeaders=host,Credential=AKID/20261124/eu-west-1/s3/aws4_request,Signature=ab", "sigv4 AKID/eu-west-1/s3", true},
		{"AWS4-HMAC-SHA256 Credential=AKID/20261124/us-east-1/bedrock, Signature=ab", "", false},
		{"AWS4-HMAC-SHA256 Credential=AKID/20261124/us-east-1/bedrock/other, Signature=ab", "", false},
		{"AWS4-HMAC-SHA256 Credential=/20261124/us-east-1/bedrock/aws4_request", "", false},
		{"AWS4-HMAC-SHA256 Signature=ab", "", false},
		{"AWS4-HMAC-SHA256 ", "", false},
		{"Basic QUtJRDpzZWNyZXQ=", "", false},
	}
	for _, c := range cases {
		got, ok := sigV4Credential(c.auth)
		if got != c.want || ok != c.ok {
			t.Errorf("sigV4Credential(%q) = %q, %v; want %q, %v", c.auth, got, ok, c.want, c.ok)
		}
	}
}
