package front

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// backend is an httptest server that answers its own name, and an admin
// one whose /readyz answers ready.
func backend(t *testing.T, name string, ready int) Backend {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, name+":"+string(body))
	}))
	t.Cleanup(srv.Close)
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(ready) }))
	t.Cleanup(admin.Close)
	return Backend{Addr: srv.Listener.Addr().String(), Admin: admin.Listener.Addr().String()}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestFrontSkipsUnreadyAndRefusing: of three backends, one refuses
// connections while its probe still says ready (it has just stopped
// listening), one is not ready, one works. Every request is answered by
// the working one, its body sent again after each refused try.
func TestFrontSkipsUnreadyAndRefusing(t *testing.T) {
	refusing := backend(t, "refusing", http.StatusOK)
	refusing.Addr = closedAddr(t)
	unready := backend(t, "unready", http.StatusServiceUnavailable)
	working := backend(t, "working", http.StatusOK)
	fr, err := Start(Config{Backends: []Backend{refusing, unready, working}})
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	const n = 10
	for i := range n {
		resp, err := client.Post("http://"+fr.Addr()+"/v1/x", "text/plain", strings.NewReader("hello"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "working:hello" {
			t.Errorf("request %d: %d %q, want 200 \"working:hello\"", i, resp.StatusCode, body)
		}
	}
	st := fr.Stats()
	if st.Answered[0] != 0 || st.Answered[1] != 0 || st.Answered[2] != n {
		t.Errorf("answers by backend %v, want [0 0 %d]", st.Answered, n)
	}
	// Round robin starts at each backend in turn: the refusing one came
	// first for about a third of them.
	if st.Failovers == 0 {
		t.Error("no try failed over, yet one backend refuses connections")
	}
	if st.Failed != 0 {
		t.Errorf("%d requests failed", st.Failed)
	}
}
