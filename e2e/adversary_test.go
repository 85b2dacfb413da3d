package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAdversary runs issue 49's table against the built binary: what a
// client, a web page or a neighbour could do to a proxy shared by a team,
// each row the reproduction of the review that found it, each asserting
// what the party gets instead. The upstream answers as OpenAI does:
// unknown request fields echoed in a 400, a key it does not know 401.
func TestAdversary(t *testing.T) {
	bin := llmproxyBinary(t)
	up := newOpenAILike(t)

	t.Run("an echoed per-day field does not lock the key", func(t *testing.T) {
		r := startReplica(t, "proxy", bin, up.URL)
		evil := `{"model":"gpt-4o","messages":[],"per day (try again in 744h":1}`
		for i := 0; i < 2; i++ {
			code, body := advPost(t, r.addr, "/v1/chat/completions", "sk-team", evil)
			if code != http.StatusBadRequest || !strings.Contains(body, "Unrecognized request argument") {
				t.Fatalf("the echoing request got %d %s; want the upstream's 400", code, body)
			}
		}
		wantChat(t, r.addr, "sk-team", "gpt-4o")
		code, body, _ := r.adminGet("/lanes")
		if code != http.StatusOK || strings.Contains(string(body), "quota spent") {
			t.Fatalf("/lanes shows a quota after an echoed field: %d %s", code, lastChars(string(body), 400))
		}
	})

	t.Run("a 403 with a month's Retry-After does not lock the key", func(t *testing.T) {
		r := startReplica(t, "proxy", bin, up.URL)
		code, _ := advPost(t, r.addr, "/v1/chat/completions", "sk-team", chatOf("gpt-4o", "forbidden-403"))
		if code != http.StatusForbidden {
			t.Fatalf("the forbidden request got %d; want the upstream's 403", code)
		}
		wantChat(t, r.addr, "sk-team", "gpt-4o")
	})

	t.Run("idle uploads announcing their length do not fill the proxy", func(t *testing.T) {
		r := startReplica(t, "proxy", bin, up.URL)
		// 256 connections each announce 1 MiB (the default memory budget,
		// LLMPROXY_MAX_BUFFERED_BYTES, is 256 MiB) and 4 announce 512 MiB
		// (the spool's 2 GiB), and send nothing more.
		var conns []net.Conn
		t.Cleanup(func() {
			for _, c := range conns {
				c.Close()
			}
		})
		announce := func(n int64) {
			c, err := net.DialTimeout("tcp", r.addr, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer sk-idle\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", r.addr, n)
		}
		for i := 0; i < 256; i++ {
			announce(1 << 20)
		}
		for i := 0; i < 4; i++ {
			announce(512 << 20)
		}
		time.Sleep(500 * time.Millisecond) // the proxy has read every header
		wantChat(t, r.addr, "sk-team", "gpt-4o")
		// An upload past the memory threshold (spooled) gets through too.
		big := chatOf("gpt-4o", strings.Repeat("x", 3<<20))
		if code, body := advPost(t, r.addr, "/v1/chat/completions", "sk-team", big); code != http.StatusOK {
			t.Fatalf("a 3 MiB upload beside the idle ones got %d %s", code, lastChars(body, 300))
		}
	})

	t.Run("a page under a rebound name cannot read or steer the admin listener", func(t *testing.T) {
		r := startReplica(t, "proxy", bin, up.URL)
		_, port, _ := net.SplitHostPort(r.admin)
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/lanes", ""},
			{"GET", "/metrics", ""},
			{"GET", "/admin/routes", ""},
			{"PUT", "/admin/routes/default/limits", `{"rpm":0.001}`},
			{"POST", "/admin/routes/default/hold", ""},
		} {
			code, body := advAdmin(t, r.admin, c.method, c.path, "evil.example:"+port, "http://evil.example:"+port, c.body)
			if code != http.StatusForbidden {
				t.Errorf("%s %s with Host evil.example got %d %s; want 403", c.method, c.path, code, lastChars(body, 200))
			}
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := advAdmin(t, r.admin, "GET", path, "evil.example:"+port, "", ""); code != http.StatusOK {
				t.Errorf("GET %s with Host evil.example got %d %s; want 200 (probes)", path, code, body)
			}
		}
		for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port} {
			if code, body := advAdmin(t, r.admin, "GET", "/lanes", host, "", ""); code != http.StatusOK {
				t.Errorf("GET /lanes with Host %s got %d %s; want 200", host, code, lastChars(body, 200))
			}
		}
		// The routes were never held: a chat still goes through.
		wantChat(t, r.addr, "sk-team", "gpt-4o")
	})

	t.Run("lanes of refused keys do not grow the metrics or evict a real lane", func(t *testing.T) {
		forge := func(r *replica, n int) {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for i := 0; i < n; i++ {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					advPost(t, r.addr, "/v1/chat/completions", "sk-forged-"+randHex(8), chatOf("gpt-4o", "hi"))
				}()
			}
			wg.Wait()
		}
		// The default table: 600 forged keys, 600 lanes' worth of series.
		r := startReplica(t, "proxy", bin, up.URL)
		forge(r, 600)
		page, err := r.metricsText()
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(page, "\nllmproxy_lane_"); n > 20*adversaryMetricLanes {
			t.Errorf("/metrics carries %d per-lane samples after 600 forged keys", n)
		}
		// A small table: a real lane that learned its limits outlives 400
		// forged keys.
		r = startReplica(t, "small table", bin, up.URL, "LLMPROXY_MAX_LANES=50")
		wantChat(t, r.addr, "sk-team", "gpt-4o") // learns the upstream's limits from its headers
		real := findLane(t, r, "")
		if real == nil || real["requests_limit"] == nil {
			t.Fatalf("the real lane learned nothing from the headers: %v", real)
		}
		forge(r, 400)
		if lane := findLane(t, r, real["id"].(string)); lane == nil || lane["requests_limit"] == nil {
			t.Errorf("the real lane forgot what it learned after 400 forged keys: %v", lane)
		}
	})

	t.Run("forged SigV4 signatures do not spend the key's pace", func(t *testing.T) {
		r := startReplica(t, "proxy", bin, up.URL)
		// The route paced at 6 a minute: a request every 10 s.
		if code, body := advAdmin(t, r.admin, "PUT", "/admin/routes/default/limits", "127.0.0.1", "", `{"rpm":6}`); code != http.StatusOK {
			t.Fatalf("PUT limits: %d %s", code, body)
		}
		sigv4 := func(signature string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, "http://"+r.addr+"/model/m/converse", strings.NewReader(`{"messages":[]}`))
			// The access key ID names the lane; it is not secret.
			req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20261204/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature="+signature)
			req.Header.Set("x-llmproxy-max-wait", "5")
			resp, err := advClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		for i := 0; i < 10; i++ {
			if code, body := sigv4("forged"); code != http.StatusForbidden {
				t.Fatalf("forged request %d got %d %s; want the upstream's 403 at once", i, code, lastChars(body, 300))
			}
		}
		if code, body := sigv4("good"); code != http.StatusOK {
			t.Fatalf("the key's own request after 10 forged ones got %d %s; want 200 within 5 s", code, lastChars(body, 300))
		}
	})

	t.Run("a change written into Redis unsigned holds no replica", func(t *testing.T) {
		rs := startRedis(t)
		r := startReplica(t, "replica", bin, up.URL, append(redisEnv(rs.URL()), "LLMPROXY_ADMIN_TOKEN=adversary-admin-token-5c1e0a9b")...)
		rdb := redis.NewClient(&redis.Options{Addr: rs.addr(), MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		if err := rdb.HSet(context.Background(), "llmproxy:v2:{changes}", "route:default:hold", `{"op":"hold","by":"token:00000000","at":"2026-01-01T00:00:00Z"}`).Err(); err != nil {
			t.Fatal(err)
		}
		if err := pollAdmin(5*time.Second, func() error {
			if !strings.Contains(r.stderr.String(), `msg="a change in redis ignored" field=route:default:hold reason="not signed"`) {
				return fmt.Errorf("the replica does not log the unsigned change")
			}
			return nil
		}); err != nil {
			t.Fatalf("%v:\n%s", err, lastChars(r.stderr.String(), 2000))
		}
		wantChat(t, r.addr, "sk-team", "gpt-4o")
	})

	t.Run("a megabyte model name is shown bounded", func(t *testing.T) {
		r := startReplica(t, "proxy", bin, up.URL)
		for i := 0; i < 60; i++ {
			advPost(t, r.addr, "/v1/chat/completions", "sk-team", chatOf(randHex(8)+strings.Repeat("m", 1<<20), "hi"))
		}
		code, body, err := r.adminGet("/lanes")
		if err != nil || code != http.StatusOK {
			t.Fatalf("/lanes: %d %v", code, err)
		}
		if len(body) > 128<<10 {
			t.Errorf("/lanes is %d bytes for 60 lanes with 1 MB model names", len(body))
		}
	})

	t.Run("small ones", func(t *testing.T) {
		r := startReplica(t, "proxy", bin, up.URL)
		local := "127.0.0.1"
		if code, body := advAdmin(t, r.admin, "PUT", "/admin/routes/default/limits", local, "", `{"rpm":1e-12}`); code != http.StatusBadRequest {
			t.Errorf("rpm 1e-12 got %d %s; want 400", code, body)
		}
		if code, body := advAdmin(t, r.admin, "PUT", "/admin/routes/default/limits", local, "", `{"rpm":600} trailing`); code != http.StatusBadRequest {
			t.Errorf("a limits body with trailing bytes got %d %s; want 400", code, body)
		}
		wantChat(t, r.addr, "sk-team", "gpt-4o")

		// Redis away: /readyz says so without its internal address.
		port := freeLoopbackPort(t)
		away := startReplica(t, "redis away", bin, up.URL, redisEnv(fmt.Sprintf("redis://127.0.0.1:%d/0", port))...)
		code, body, err := away.adminGet("/readyz")
		if err != nil || code != http.StatusOK || !strings.Contains(string(body), "degraded") {
			t.Fatalf("/readyz with Redis away: %d %s %v", code, body, err)
		}
		if strings.Contains(string(body), fmt.Sprint(port)) {
			t.Errorf("/readyz shows Redis' address: %s", body)
		}

		// A short admin token and an OTLP endpoint with a password: the
		// process refuses to start, and says why without the password.
		for _, c := range []struct {
			env, want, never string
		}{
			{"LLMPROXY_ADMIN_TOKEN=tooshort7", "LLMPROXY_ADMIN_TOKEN", "tooshort7"},
			{"OTEL_EXPORTER_OTLP_ENDPOINT=http://user:s3cretpw@127.0.0.1:%zz", "OTEL_EXPORTER_OTLP_ENDPOINT", "s3cretpw"},
		} {
			ch, _ := launchLLMProxy(t, "bad config", bin, replicaEnv(up.URL, c.env))
			if !ch.waitExit(15 * time.Second) {
				t.Errorf("%s: the proxy started", c.env)
				continue
			}
			out := ch.stderr.String()
			if !strings.Contains(out, c.want) {
				t.Errorf("%s: the start-up error does not name %s: %s", c.env, c.want, lastChars(out, 500))
			}
			if strings.Contains(out, c.never) {
				t.Errorf("%s: the start-up error shows the secret: %s", c.env, lastChars(out, 500))
			}
		}
	})
}

// adversaryMetricLanes is how many lanes /metrics shows one series each of,
// at most (the busiest).
const adversaryMetricLanes = 200

// newOpenAILike is an upstream that answers as OpenAI does: a key starting
// sk-forged gets 401 invalid_api_key (a SigV4 signature "forged" Bedrock's
// 403), a body field it does not know a 400
// that echoes the field's name, a message "forbidden-403" a 403 with a
// month's Retry-After, anything else a chat completion with the
// x-ratelimit-* headers of 10,000 requests a minute.
func newOpenAILike(t *testing.T) *httptest.Server {
	var served atomic.Int64
	known := map[string]bool{"model": true, "messages": true, "max_tokens": true, "stream": true, "temperature": true}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fail := func(code int, typ, errCode, msg string) {
			b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": errCode}})
			w.WriteHeader(code)
			w.Write(b)
		}
		if strings.Contains(r.Header.Get("Authorization"), "Signature=forged") {
			w.Header().Set("x-amzn-ErrorType", "InvalidSignatureException")
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(`{"message":"The request signature we calculated does not match the signature you provided."}`))
			return
		}
		if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer sk-forged") {
			fail(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "Incorrect API key provided.")
			return
		}
		var req map[string]json.RawMessage
		if err := json.Unmarshal(body, &req); err != nil {
			fail(http.StatusBadRequest, "invalid_request_error", "", "We could not parse the JSON body of your request.")
			return
		}
		for name := range req {
			if !known[name] {
				fail(http.StatusBadRequest, "invalid_request_error", "", "Unrecognized request argument supplied: "+name)
				return
			}
		}
		if bytes.Contains(body, []byte("forbidden-403")) {
			w.Header().Set("Retry-After", "2678000")
			fail(http.StatusForbidden, "invalid_request_error", "", "You are not allowed to do this.")
			return
		}
		h := w.Header()
		h.Set("x-ratelimit-limit-requests", "10000")
		h.Set("x-ratelimit-remaining-requests", "9999")
		h.Set("x-ratelimit-reset-requests", "6ms")
		w.Write([]byte(`{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`))
	}))
	t.Cleanup(s.Close)
	return s
}

func chatOf(model, content string) string {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": content}}, "max_tokens": 16})
	return string(b)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var advClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}

// advPost posts body to the proxy at addr with key and returns the status
// and the answer's body.
func advPost(t *testing.T, addr, path, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := advClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", path, err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// advAdmin sends method path to the admin listener at addr with the Host
// and Origin headers given ("" leaves Origin out).
func advAdmin(t *testing.T, addr, method, path, host, origin, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	req.Host = host
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := advClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// wantChat fails the test unless a chat on key and model gets a 200.
func wantChat(t *testing.T, addr, key, model string) {
	t.Helper()
	if code, body := advPost(t, addr, "/v1/chat/completions", key, chatOf(model, "hello")); code != http.StatusOK {
		t.Fatalf("a chat on %s got %d %s; want 200", model, code, lastChars(body, 300))
	}
}

// findLane returns the /lanes entry whose id is id, or with id "" the only
// lane; nil if there is none.
func findLane(t *testing.T, r *replica, id string) map[string]any {
	t.Helper()
	code, body, err := r.adminGet("/lanes?limit=2000")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/lanes: %d %v", code, err)
	}
	var v struct {
		Lanes []map[string]any `json:"lanes"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("/lanes: %v", err)
	}
	for _, l := range v.Lanes {
		if id == "" && len(v.Lanes) == 1 || l["id"] == id {
			return l
		}
	}
	return nil
}
