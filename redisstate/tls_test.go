package redisstate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/redistest"
)

// tlsServer is a redis-server speaking TLS only, with a certificate of
// a CA made for the test, and a password; clientCerts makes it require a
// client certificate.
func tlsServer(t *testing.T, password string, clientCerts bool) (*redistest.Server, *redistest.TLS) {
	t.Helper()
	redistest.Need(t, "redis-server")
	tl, err := redistest.NewTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redistest.Start(redistest.Options{TLS: tl, ClientCerts: clientCerts, Password: password})
	stopAtEnd(t, srv, err)
	return srv, tl
}

// connectsOrSays is a store of cfg, captured log: whether it shares, and
// if not, what it logged and what Ready says; a password given must
// appear in neither.
func connectsOrSays(t *testing.T, cfg Config, password string) (bool, string) {
	t.Helper()
	logger, out := capturedLog()
	cfg.Logger, cfg.Timeout = logger, 2*time.Second
	st := storeOn(t, cfg)
	ready := ""
	if err := st.Ready(); err != nil {
		ready = err.Error()
	}
	said := out.String() + "\nReady: " + ready
	if strings.Contains(said, password) {
		t.Errorf("the password is in the store's log or Ready:\n%s", said)
	}
	if st.Status() != "ok" {
		return false, said
	}
	tk, _, ok := admit(t, st.Shared("g", groupCfg))
	if !ok || tk.Lease == "" {
		t.Fatalf("shared, but admit: ok %v, lease %q", ok, tk.Lease)
	}
	return true, said
}

// TestTLSWithTheCAFile: rediss:// with the CA that signed the server's
// certificate shares; without it the store starts local (no error: the
// proxy runs) and its log says the certificate is not trusted, without
// the password.
func TestTLSWithTheCAFile(t *testing.T) {
	t.Parallel()
	const pw = "tls-Pa55word-9f2c"
	srv, tl := tlsServer(t, pw, false)
	url := fmt.Sprintf("rediss://:%s@%s", pw, srv.Addr())
	if ok, said := connectsOrSays(t, Config{URL: url, CAFile: tl.CA}, pw); !ok {
		t.Fatalf("with the CA: not shared:\n%s", said)
	}
	ok, said := connectsOrSays(t, Config{URL: url}, pw)
	if ok || !strings.Contains(said, "certificate signed by unknown authority") {
		t.Fatalf("without the CA: shared %v, want local and a log saying the certificate is not trusted:\n%s", ok, said)
	}
	if _, ready, _ := strings.Cut(said, "\nReady: "); !strings.Contains(ready, "certificate signed by unknown authority") {
		t.Errorf("without the CA, Ready (/readyz's reason) does not say why: %q", ready)
	}
	if ok, said := connectsOrSays(t, Config{URL: strings.Replace(url, "rediss://", "redis://", 1)}, pw); ok {
		t.Fatalf("plain text to a TLS port shared:\n%s", said)
	}
}

// TestTLSWithAClientCertificate: a server that requires a client
// certificate shares with a store given CertFile and KeyFile, and not
// with one given only the CA.
func TestTLSWithAClientCertificate(t *testing.T) {
	t.Parallel()
	const pw = "tls-Pa55word-71ab"
	srv, tl := tlsServer(t, pw, true)
	url := fmt.Sprintf("rediss://:%s@%s", pw, srv.Addr())
	if ok, said := connectsOrSays(t, Config{URL: url, CAFile: tl.CA, CertFile: tl.ClientCert, KeyFile: tl.ClientKey}, pw); !ok {
		t.Fatalf("with a client certificate: not shared:\n%s", said)
	}
	if ok, said := connectsOrSays(t, Config{URL: url, CAFile: tl.CA}, pw); ok {
		t.Fatalf("without a client certificate: shared:\n%s", said)
	} else {
		t.Logf("without a client certificate the store says:\n%s", said)
	}
}
