package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/proxy"
)

// TestAdminOffLoopbackWithoutATokenWarnsAndServesNoProfiles: an admin
// listener bound to every interface (the image's :9090) without a token
// is said at start to answer only localhost, take no changes and serve no
// profiles, and LLMPROXY_PPROF=true does not serve them there; on
// loopback, or with a token, nothing is said and the profiles are
// served. (The address is only named, not bound: tests listen on
// loopback alone.)
func TestAdminOffLoopbackWithoutATokenWarnsAndServesNoProfiles(t *testing.T) {
	const token = "0123456789abcdef-token"
	p, err := proxy.New(proxy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr, token string
		warned      bool
		pprof, hold int
	}{
		{"[::]:9090", "", true, http.StatusNotFound, http.StatusForbidden},
		{"0.0.0.0:9090", "", true, http.StatusNotFound, http.StatusForbidden},
		{"10.1.2.3:9090", "", true, http.StatusNotFound, http.StatusForbidden},
		{"127.0.0.1:9090", "", false, http.StatusOK, http.StatusOK},
		{"[::]:9090", token, false, http.StatusOK, http.StatusOK},
	} {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		h := p.AdminHandler(proxy.Health{}, adminOptions(config{AdminToken: tc.token, Pprof: true}, tc.addr, log)...)
		serve := func(method, path string) int {
			req := httptest.NewRequest(method, path, nil)
			req.Host = "localhost:9090"
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec.Code
		}
		if got := serve("GET", "/debug/pprof/cmdline"); got != tc.pprof {
			t.Errorf("%s token=%v: /debug/pprof/cmdline %d, want %d", tc.addr, tc.token != "", got, tc.pprof)
		}
		if got := serve("POST", "/admin/routes/default/hold"); got != tc.hold {
			t.Errorf("%s token=%v: a hold %d, want %d", tc.addr, tc.token != "", got, tc.hold)
		}
		_ = serve("POST", "/admin/routes/default/release")
		said := logs.String()
		warned := strings.Contains(said, "level=WARN") && strings.Contains(said, "takes no changes") && strings.Contains(said, "set the token")
		if warned != tc.warned || tc.warned && (!strings.Contains(said, "profiles are off") || !strings.Contains(said, "admin="+tc.addr)) {
			t.Errorf("%s token=%v: warned %v, want %v:\n%s", tc.addr, tc.token != "", warned, tc.warned, said)
		}
	}
}

// TestReadyzSaysRedisIsUnreachableNotWhere: with Redis unreachable,
// /readyz says degraded and that Redis is unreachable, but not the
// client's error, which names Redis' address; the log has that.
func TestReadyzSaysRedisIsUnreachableNotWhere(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t), "LLMPROXY_REDIS_URL": "redis://" + closed + "/0"})
	var body string
	eventually(t, 10*time.Second, "/readyz degraded", func() bool {
		resp, err := http.Get("http://" + pr.admin + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK && strings.Contains(body, "degraded")
	})
	var ready struct{ Status, Reason string }
	_, port, _ := net.SplitHostPort(closed)
	if err := json.Unmarshal([]byte(body), &ready); err != nil || ready.Reason != errRedisUnreachable.Error() || strings.Contains(body, port) {
		t.Errorf("/readyz: %s; want the reason %q alone, not where or the client's error", body, errRedisUnreachable)
	}
	if logs := pr.logs.String(); !strings.Contains(logs, "redis unreachable") {
		t.Errorf("the log does not say why:\n%s", logs)
	}
}

func TestRedisDegradedHidesTheReason(t *testing.T) {
	if err := redisDegraded(func() error { return nil })(); err != nil {
		t.Errorf("up: %v", err)
	}
	if err := redisDegraded(func() error { return errors.New("dial tcp 10.0.0.5:6379: refused") })(); err != errRedisUnreachable {
		t.Errorf("down: %v", err)
	}
}
