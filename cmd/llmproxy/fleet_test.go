package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/buildinfo"
	"github.com/llmproxy/llmproxy/internal/redistest"
	"github.com/llmproxy/llmproxy/proxy"
)

// fleetReplica is a proxy as serve builds it on Redis at url with token,
// and its admin handler.
func fleetReplica(t *testing.T, url, token string, out io.Writer) http.Handler {
	t.Helper()
	cfg, err := loadConfig(map[string]string{"LLMPROXY_REDIS_URL": url, "LLMPROXY_ADMIN_TOKEN": token, "LLMPROXY_UPSTREAM": "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	p, health, closeStore, err := newProxy(cfg, buildinfo.Info{}, slog.New(slog.NewTextHandler(out, nil)), new(atomic.Bool), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	return p.AdminHandler(health, proxy.RequireToken(token), proxy.ListenerAddr("127.0.0.1:9090"))
}

// adminCall is h's answer to method path from this host, with the token.
func adminCall(h http.Handler, method, path, body, token string) (int, string) {
	req := httptest.NewRequestWithContext(context.Background(), method, path, strings.NewReader(body))
	req.RemoteAddr = "127.0.0.1:5000"
	req.Host = "127.0.0.1:9090"
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestReplicasShareChangesOnlyWithAnAdminToken: replicas built as serve
// builds them share an admin change through Redis when they have the
// admin token (the changes are signed with it); without one a change
// stays on the replica it was made on, and each says so at start.
func TestReplicasShareChangesOnlyWithAnAdminToken(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not found")
	}
	srv, err := redistest.Start(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	const warning = "LLMPROXY_ADMIN_TOKEN is unset: admin changes (limits, holds, clears) stay on the replica they are made on"
	for _, token := range []string{"fleet-admin-token-0123456789abcdef0123456789", ""} {
		var out syncBuffer
		a, b := fleetReplica(t, srv.URL(), token, &out), fleetReplica(t, srv.URL(), token, &out)
		route := "/admin/routes/default/limits"
		if code, body := adminCall(a, "PUT", route, `{"rpm": 77}`, token); code != http.StatusOK {
			t.Fatalf("token %q: PUT %d %s", token, code, body)
		}
		shared := false
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !shared; time.Sleep(20 * time.Millisecond) {
			_, body := adminCall(b, "GET", route, "", token)
			shared = strings.Contains(body, `"rpm":77`) || strings.Contains(body, `"rpm": 77`)
		}
		if shared != (token != "") {
			t.Errorf("token %q: the other replica has the change: %v", token, shared)
		}
		if warned := strings.Count(out.String(), warning); warned != map[bool]int{true: 0, false: 2}[token != ""] {
			t.Errorf("token %q: the warning logged %d times:\n%s", token, warned, out.String())
		}
		if token != "" && strings.Contains(out.String(), token) {
			t.Errorf("the log holds the token:\n%s", out.String())
		}
		// The next round starts from an empty hash.
		cl := srv.Client()
		cl.FlushAll(context.Background())
		cl.Close()
	}
}
