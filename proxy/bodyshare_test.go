package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// openBody opens a connection to h's proxy and sends a chat request's
// headers, announcing length bytes of body, and then head, the start of
// the body; key ("": none) is its Bearer credential. The connection is
// closed when the test ends, before the harness is.
func openBody(t *testing.T, h *harness, key string, length int64, head []byte) net.Conn {
	t.Helper()
	return openBodyFrom(t, h, "", key, length, head)
}

// openBodyFrom is openBody from the loopback address from ("": any).
func openBodyFrom(t *testing.T, h *harness, from, key string, length int64, head []byte) net.Conn {
	t.Helper()
	var d net.Dialer
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	conn, err := d.Dial("tcp", h.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", auth, length)
	if _, err := conn.Write(head); err != nil {
		t.Fatal(err)
	}
	return conn
}

// answerOn reads the answer on conn, waiting within.
func answerOn(t *testing.T, conn net.Conn, within time.Duration) (*http.Response, string, error) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(within))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, "", err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), nil
}

// okAnswer is the upstream's answer in these tests.
const okAnswer = `{"id":"chatcmpl-share","object":"chat.completion","choices":[]}`

// answering is an upstream that reads the body and answers okAnswer,
// sending the body's length on got when got is not nil.
func answering(got chan<- int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if got != nil {
			got <- int(n)
		}
		fmt.Fprint(w, okAnswer)
	})
}

// TestIdleAnnouncedBodiesDoNotFillTheProxy is issue 49's reproduction:
// 256 connections each announce a 1 MiB body (the whole memory bound,
// were it held as announced) and send a few bytes; a chat from another
// client still gets the upstream's answer, as the bodies hold only what
// arrived.
func TestIdleAnnouncedBodiesDoNotFillTheProxy(t *testing.T) {
	h := newHarness(t, answering(nil), func(c *Config) { c.MinBodyRate = -1 })
	const idle = 256
	for i := range idle {
		openBody(t, h, fmt.Sprintf("sk-idle-%d", i), DefaultMemoryBodyBytes, []byte(`{"model":`))
	}
	waitFor(t, func() bool { return h.proxy.buffered.Load() >= idle*firstChunk }) // each holds what it sent, 16 KiB at most
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[]}`)
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != okAnswer {
		t.Fatalf("a chat beside %d idle bodies: %d %s, want the upstream's 200", idle, resp.StatusCode, got)
	}
}

// TestIdleHugeBodiesLeaveTheSpoolToOthers: four connections announce
// 512 MiB each (the whole spool bound, were it held as announced) and
// send nothing; an upload of 4 MiB from another client is spooled and
// forwarded whole.
func TestIdleHugeBodiesLeaveTheSpoolToOthers(t *testing.T) {
	got := make(chan int, 1)
	h := newHarness(t, answering(got), func(c *Config) {
		c.SpoolDir = t.TempDir()
		c.MinBodyRate = -1
	})
	for range 4 {
		openBody(t, h, "sk-idle", DefaultMaxBodyBytes, nil)
	}
	upload := `{"model":"m","pad":"` + strings.Repeat("x", 4<<20) + `"}`
	resp := h.post("/v1/chat/completions", upload, "Authorization", "Bearer sk-uploader")
	if body := readAll(t, resp.Body); resp.StatusCode != 200 || body != okAnswer {
		t.Fatalf("a 4 MiB upload beside four idle 512 MiB ones: %d %s", resp.StatusCode, body)
	}
	if n := <-got; n != len(upload) {
		t.Fatalf("the upstream got %d bytes, want %d", n, len(upload))
	}
}

// TestTricklingBodyIsRefusedAndLetGo: a body that trickles in under
// MinBodyRate gets 408 body_too_slow naming LLMPROXY_MIN_BODY_RATE, soon
// after BodyRateGrace, and what it held, in memory or spooled, is given
// back.
func TestTricklingBodyIsRefusedAndLetGo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		memory int64
		held   func(p *Proxy) int64
	}{
		{"memory", 0, func(p *Proxy) int64 { return p.buffered.Load() }},
		{"spool", 1 << 10, func(p *Proxy) int64 { return p.spooled.Load() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, answering(nil), func(c *Config) {
				c.SpoolDir = t.TempDir()
				c.MemoryBodyBytes = tc.memory
				c.MinBodyRate = 1000
				c.BodyRateGrace = 500 * time.Millisecond
			})
			start := time.Now()
			conn := openBody(t, h, testKey, 100_000, bytes.Repeat([]byte("x"), 2<<10))
			waitFor(t, func() bool { return tc.held(h.proxy) > 0 })
			stop := make(chan struct{})
			defer close(stop)
			go func() { // 100 bytes a second
				for {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
					if _, err := conn.Write([]byte("xxxxxxxxxx")); err != nil {
						return
					}
				}
			}()
			resp, body, err := answerOn(t, conn, 5*time.Second)
			if err != nil {
				t.Fatalf("after %v: %v, want a 408", time.Since(start), err)
			}
			d := time.Since(start)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, `"code":"body_too_slow"`) ||
				!strings.Contains(body, "LLMPROXY_MIN_BODY_RATE") || !strings.Contains(body, `"type":"invalid_request_error"`) {
				t.Fatalf("%s %s, want 408 body_too_slow naming LLMPROXY_MIN_BODY_RATE", resp.Status, body)
			}
			// 2 KiB at once, then 100 B/s: under 1000 B/s 2.8s in.
			if d < 2*time.Second || d > 4*time.Second {
				t.Errorf("refused after %v, want about 2.8s", d)
			}
			waitFor(t, func() bool { return tc.held(h.proxy) == 0 })
		})
	}
}

// TestBodyFastEnoughIsKept: a body that arrives in pieces, above
// MinBodyRate on average though not in each gap, is forwarded whole.
func TestBodyFastEnoughIsKept(t *testing.T) {
	got := make(chan int, 1)
	h := newHarness(t, answering(got), func(c *Config) {
		c.MinBodyRate = 1000
		c.BodyRateGrace = 200 * time.Millisecond
	})
	body := `{"model":"m","pad":"` + strings.Repeat("x", 2000) + `"}`
	conn := openBody(t, h, testKey, int64(len(body)), []byte(body[:1000]))
	time.Sleep(900 * time.Millisecond) // 1000 bytes by 1.2s are enough
	if _, err := conn.Write([]byte(body[1000:])); err != nil {
		t.Fatal(err)
	}
	resp, answer, err := answerOn(t, conn, 5*time.Second)
	if err != nil || resp.StatusCode != 200 || answer != okAnswer {
		t.Fatalf("%v %v %s, want the upstream's 200", err, resp, answer)
	}
	if n := <-got; n != len(body) {
		t.Fatalf("the upstream got %d bytes, want %d", n, len(body))
	}
}

// TestOneClientHoldsItsShareAndNoMore: while client B holds a body, client
// A (another credential) gets its bodies held up to a third of the memory
// bound (two clients hold bytes: a third is kept for a newcomer) and no further (429 queue_full saying why), and B's next chat
// still fits.
func TestOneClientHoldsItsShareAndNoMore(t *testing.T) {
	const bound, memory = 1 << 20, 64 << 10 // a share of 341 KiB for each of two
	h := newHarness(t, answering(nil), func(c *Config) {
		c.MaxBufferedBytes, c.MemoryBodyBytes = bound, memory
		c.MinBodyRate = -1
	})
	head := bytes.Repeat([]byte("x"), 40<<10) // held as 64 KiB
	openBody(t, h, "sk-b", memory, head)
	waitFor(t, func() bool { return h.proxy.buffered.Load() == memory })
	held, refused := 0, 0
	for range bound/memory - 1 { // what would fill the bound
		before := h.proxy.buffered.Load()
		conn := openBody(t, h, "sk-a", memory, head)
		answered := make(chan string, 1)
		go func() {
			resp, body, err := answerOn(t, conn, 5*time.Second)
			if err == nil {
				body = resp.Status + " " + body
			}
			answered <- body
		}()
		deadline := time.After(5 * time.Second)
	wait:
		for {
			select {
			case body := <-answered:
				if !strings.Contains(body, "429") || !strings.Contains(body, `"code":"queue_full"`) ||
					!strings.Contains(body, "fair share of LLMPROXY_MAX_BUFFERED_BYTES") || !strings.Contains(body, "credential") {
					t.Fatalf("A's body %d: %s, want 429 queue_full over its fair share", held+refused+1, body)
				}
				refused++
				break wait
			case <-deadline:
				t.Fatalf("A's body %d neither held nor refused", held+refused+1)
			case <-time.After(5 * time.Millisecond):
				if h.proxy.buffered.Load() == before+memory {
					held++
					break wait
				}
			}
		}
	}
	if held != bound/3/memory || refused == 0 {
		t.Errorf("A got %d bodies held and %d refused, want %d held", held, refused, bound/3/memory)
	}
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[]}`, "Authorization", "Bearer sk-b")
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != okAnswer {
		t.Fatalf("B's chat while A holds its share: %d %s", resp.StatusCode, got)
	}
}

// TestBodyBoundShares: a client may hold bound/(n+1) while n clients
// hold bytes (itself counted), never less than the floor; clients are
// told apart by address and by credential, and a request must fit both
// shares; what is given back leaves no client behind.
func TestBodyBoundShares(t *testing.T) {
	var b bodyBound
	b.init(1000, 100, "LLMPROXY_X", "kept")
	if b.floor != 100 {
		t.Fatalf("floor %d, want the largest body, 100", b.floor)
	}
	a := bodyClient{addr: 1}
	var mineA int64
	if err := b.take(&a, &mineA, 500); err != nil || mineA != 500 || b.Load() != 500 {
		t.Fatalf("alone, half of it: %v, %d held", err, mineA)
	}
	if err := b.take(&a, &mineA, 1); err == nil || !strings.Contains(err.Error(), "by its address") || !strings.Contains(err.Error(), "500 bytes while 1 clients") {
		t.Fatalf("alone, past half: %v", err)
	}
	// A new credential from that address still counts to the address.
	var mineA2 int64
	if err := b.take(&bodyClient{addr: 1, cred: 5, hasCred: true}, &mineA2, 1); err == nil || !strings.Contains(err.Error(), "by its address") {
		t.Fatalf("a new credential from a full address: %v", err)
	}
	if len(b.byCred) != 0 || mineA2 != 0 {
		t.Fatalf("a refused request's credential is counted: %v", b.byCred)
	}
	b.give(&a, &mineA)
	if mineA != 0 || b.Load() != 0 || len(b.byAddr) != 0 {
		t.Fatalf("given back: %d mine, %d total, %d clients", mineA, b.Load(), len(b.byAddr))
	}
	// Two addresses: a third each, a third kept for a newcomer.
	c := bodyClient{addr: 2}
	var mineC int64
	if err := b.take(&c, &mineC, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.take(&a, &mineA, 333); err != nil {
		t.Fatalf("a third with two clients: %v", err)
	}
	if err := b.take(&a, &mineA, 1); err == nil || !strings.Contains(err.Error(), "by its address") || !strings.Contains(err.Error(), "333 bytes while 2 clients") {
		t.Fatalf("over a third: %v", err)
	}
	if err := b.take(&c, &mineC, 332); err != nil {
		t.Fatalf("the other's third: %v", err)
	}
	if err := b.take(&bodyClient{addr: 3}, new(int64), 250); err != nil {
		t.Fatalf("a newcomer beside two full shares: %v", err)
	}
	b = bodyBound{}
	b.init(1000, 100, "LLMPROXY_X", "kept")
	// One credential from many addresses is one client: while another
	// credential holds bytes, it holds a third.
	other := bodyClient{addr: 9, cred: 8, hasCred: true}
	var mineOther int64
	if err := b.take(&other, &mineOther, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		var mine int64
		err := b.take(&bodyClient{addr: uint64(10 + i), cred: 7, hasCred: true}, &mine, 100)
		if i < 3 && err != nil {
			t.Fatalf("address %d, %d held: %v", i, b.Load(), err)
		}
		if i == 3 && (err == nil || !strings.Contains(err.Error(), "by its credential")) {
			t.Fatalf("one credential past its share: %v", err)
		}
	}
	if b.byCred[7] != 300 || len(b.byCred) != 2 || len(b.byAddr) != 4 || b.Load() != 301 {
		t.Fatalf("credential holds %d of %d, %d credentials, %d addresses", b.byCred[7], b.Load(), len(b.byCred), len(b.byAddr))
	}
	b.give(&other, &mineOther)
	if _, ok := b.byCred[8]; ok || b.Load() != 300 {
		t.Fatalf("a credential given back is still counted: %v", b.byCred)
	}
	// The whole bound: a floor as large as it lets one client fill it,
	// and the next is refused naming the bound.
	var w bodyBound
	w.init(1000, 1000, "LLMPROXY_X", "kept")
	if err := w.take(&a, new(int64), 1000); err != nil {
		t.Fatalf("a floor of the whole bound: %v", err)
	}
	if err := w.take(&bodyClient{addr: 2}, new(int64), 1); err == nil || !strings.Contains(err.Error(), "bodies kept by the proxy reached LLMPROXY_X") {
		t.Fatalf("past the bound: %v", err)
	}
	// The floor: with 20 holders a share is 47, but a client may hold 100.
	var f bodyBound
	f.init(1000, 100, "LLMPROXY_X", "kept")
	for i := range 19 {
		if err := f.take(&bodyClient{addr: uint64(i)}, new(int64), 1); err != nil {
			t.Fatal(err)
		}
	}
	last := bodyClient{addr: 99}
	var mine int64
	if err := f.take(&last, &mine, 100); err != nil {
		t.Fatalf("the floor with 20 clients: %v", err)
	}
	if err := f.take(&last, &mine, 1); err == nil {
		t.Fatal("past the floor with 20 clients: held")
	}
	// A floor is a sixteenth when that is more, and never the bound's
	// whole past it.
	f.init(1600, 10, "", "")
	if f.floor != 100 {
		t.Errorf("floor %d, want 1600/16", f.floor)
	}
	f.init(50, 100, "", "")
	if f.floor != 50 {
		t.Errorf("floor %d, want the bound, 50", f.floor)
	}
}

// TestClientOfTellsClientsApart: a client is its address without the
// port, and its credential when it sends one.
func TestClientOfTellsClientsApart(t *testing.T) {
	p := &Proxy{bodySeed: maphash.MakeSeed()}
	req := func(remote, key string) bodyClient {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		r.RemoteAddr = remote
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
		return p.clientOf(r, credentialOf(r.Header, r.URL.RawQuery))
	}
	a1, a2 := req("10.0.0.1:1000", ""), req("10.0.0.1:2000", "")
	if a1 != a2 || a1.hasCred {
		t.Errorf("one address, two ports: %+v %+v", a1, a2)
	}
	if b := req("10.0.0.2:1000", ""); b.addr == a1.addr {
		t.Error("two addresses as one")
	}
	k1, k2 := req("10.0.0.1:1000", "sk-1"), req("10.0.0.1:1000", "sk-2")
	if !k1.hasCred || !k2.hasCred || k1.cred == k2.cred || k1.addr != a1.addr {
		t.Errorf("two keys from one address: %+v %+v", k1, k2)
	}
	if odd := req("not-an-address", ""); odd.addr == a1.addr || odd != req("not-an-address", "") {
		t.Error("an address without a port as another's")
	}
	if m := req("[::ffff:10.0.0.1]:3000", ""); m.addr != a1.addr {
		t.Error("an IPv4-mapped address as another client than its IPv4 one")
	}
	v6 := req("[2001:db8:1:2::1]:1000", "")
	if same := req("[2001:db8:1:2:ffff:ffff:ffff:ffff]:2000", ""); same.addr != v6.addr {
		t.Error("two addresses of one IPv6 /64 as two clients")
	}
	for _, other := range []string{"[2001:db8:1:3::1]:1000", "[2001:db9:1:2::1]:1000", "[3001:db8:1:2::1]:1000"} {
		if req(other, "").addr == v6.addr {
			t.Errorf("%s as one client with 2001:db8:1:2::1", other)
		}
	}
}

// TestPacedDue: a body is due at its timeout, or sooner at grace plus
// what arrived over the rate; without a rate, at its timeout.
func TestPacedDue(t *testing.T) {
	began := time.Unix(1000, 0)
	in := paced{began: began, rate: 1000, grace: 2 * time.Second, timeout: 10 * time.Second}
	for _, c := range []struct {
		got    int64
		at     time.Duration
		byRate bool
	}{
		{0, 2 * time.Second, true},
		{500, 2500 * time.Millisecond, true},
		{7999, 9999 * time.Millisecond, true},
		{8000, 10 * time.Second, false},
		{8200, 10 * time.Second, false},
		{9000, 10 * time.Second, false},
	} {
		in.got = c.got
		at, byRate := in.due()
		if at != began.Add(c.at) || byRate != c.byRate {
			t.Errorf("%d bytes: due %v (by rate %v), want %v (%v)", c.got, at.Sub(began), byRate, c.at, c.byRate)
		}
	}
	in.rate, in.got = 1, 1<<62 // past what a Duration holds
	if at, byRate := in.due(); at != began.Add(10*time.Second) || byRate {
		t.Errorf("%d bytes at 1 B/s: due %v (by rate %v), want the timeout", in.got, at.Sub(began), byRate)
	}
	in.rate, in.grace, in.got = 1000, 1500*time.Millisecond, 8200 // 8.5s of rate: 8.2s is within
	if at, byRate := in.due(); at != began.Add(9700*time.Millisecond) || !byRate {
		t.Errorf("8200 bytes after a 1.5s grace: due %v (by rate %v), want 9.7s by rate", at.Sub(began), byRate)
	}
	in.rate, in.got, in.grace = 1000, 0, 20*time.Second // a grace past the timeout
	if at, byRate := in.due(); at != began.Add(10*time.Second) || byRate {
		t.Errorf("grace past the timeout: due %v (by rate %v), want the timeout", at.Sub(began), byRate)
	}
	in.rate, in.got = 0, 0
	if at, byRate := in.due(); at != began.Add(10*time.Second) || byRate {
		t.Errorf("no rate: due %v (by rate %v), want the timeout", at.Sub(began), byRate)
	}
}

// TestBodyPastItsTimeoutIsRefused: a body that stops arriving gets 400
// body_read_error naming LLMPROXY_BODY_TIMEOUT once BodyTimeout passes,
// and gives back what it held.
func TestBodyPastItsTimeoutIsRefused(t *testing.T) {
	h := newHarness(t, answering(nil), func(c *Config) {
		c.MinBodyRate = -1
		c.BodyTimeout = time.Second
	})
	start := time.Now()
	conn := openBody(t, h, testKey, 1000, []byte(`{"model":`))
	resp, body, err := answerOn(t, conn, 5*time.Second)
	if err != nil {
		t.Fatalf("after %v: %v, want a 400", time.Since(start), err)
	}
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":"body_read_error"`) || !strings.Contains(body, "within 1s (LLMPROXY_BODY_TIMEOUT)") {
		t.Fatalf("%s %s, want 400 body_read_error naming LLMPROXY_BODY_TIMEOUT", resp.Status, body)
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 3*time.Second {
		t.Errorf("refused after %v, want about 1s", d)
	}
	waitFor(t, func() bool { return h.proxy.buffered.Load() == 0 })
}

// TestBodyIsCountedAsItGrows: a body's memory is counted in the steps it
// grows by, and a step past the bound refuses the body (429 queue_full
// naming the bound) and gives back the steps before it.
func TestBodyIsCountedAsItGrows(t *testing.T) {
	h := newHarness(t, answering(nil), func(c *Config) {
		c.MaxBufferedBytes = 20 << 10 // the first 16 KiB, not the next
		c.MinBodyRate = -1
	})
	conn := openBody(t, h, testKey, 64<<10, bytes.Repeat([]byte("x"), 8<<10))
	waitFor(t, func() bool { return h.proxy.buffered.Load() == firstChunk })
	if _, err := conn.Write(bytes.Repeat([]byte("x"), 10<<10)); err != nil {
		t.Fatal(err)
	}
	resp, body, err := answerOn(t, conn, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 || !strings.Contains(body, `"code":"queue_full"`) || !strings.Contains(body, "bodies held in memory by the proxy reached LLMPROXY_MAX_BUFFERED_BYTES") {
		t.Fatalf("%s %s, want 429 queue_full naming LLMPROXY_MAX_BUFFERED_BYTES", resp.Status, body)
	}
	if !resp.Close {
		t.Error("the refusal keeps the connection: a half-read body's must close")
	}
	// The server does not wait for the rest of the body either.
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); !closedConn(err) {
		t.Errorf("after the refusal: %d bytes, %v; want the connection closed", n, err)
	}
	waitFor(t, func() bool { return h.proxy.buffered.Load() == 0 })
}

// slowReader gives its bytes a few at a time, every tick.
type slowReader struct {
	left int
	tick time.Duration
}

func (s *slowReader) Read(b []byte) (int, error) {
	if s.left == 0 {
		return 0, io.EOF
	}
	time.Sleep(s.tick)
	n := min(len(b), s.left, 10)
	s.left -= n
	return n, nil
}

// TestSlowBodyIsRefusedWithoutADeadline: where the response writer cannot
// set a read deadline, a body under MinBodyRate is still refused, at its
// first read past its due time.
func TestSlowBodyIsRefusedWithoutADeadline(t *testing.T) {
	p, err := New(Config{Transport: cannedTransport{}, MinBodyRate: 1000, BodyRateGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/chat/completions", &slowReader{left: 1000, tick: 20 * time.Millisecond})
	r.ContentLength = 1000
	w := httptest.NewRecorder()
	start := time.Now()
	p.ServeHTTP(w, r)
	if d := time.Since(start); w.Code != http.StatusRequestTimeout || !strings.Contains(w.Body.String(), "body_too_slow") || d > 1500*time.Millisecond {
		t.Fatalf("%d %s after %v, want 408 body_too_slow soon after 200ms", w.Code, w.Body, d)
	}
	if p.buffered.Load() != 0 {
		t.Fatalf("%d bytes still held", p.buffered.Load())
	}
}

// TestIdleBodiesFromOneAddressHoldNothing is the review's reproduction
// with a small bound: more connections than the bound has first chunks
// (1 MiB / 16 KiB) announce 64 KiB each from one address, each with a new
// credential, and send nothing: they hold nothing, and a chat from
// another address gets through.
func TestIdleBodiesFromOneAddressHoldNothing(t *testing.T) {
	const bound, memory = 1 << 20, 64 << 10
	h := newHarness(t, answering(nil), func(c *Config) {
		c.MaxBufferedBytes, c.MemoryBodyBytes = bound, memory
		c.MinBodyRate = -1
	})
	const idle = bound/firstChunk + 40
	for i := range idle {
		openBodyFrom(t, h, "127.0.0.2", fmt.Sprintf("sk-idle-%d", i), memory, nil)
	}
	time.Sleep(300 * time.Millisecond) // their handlers wait for the bodies
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[]}`)
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != okAnswer {
		t.Fatalf("a chat beside %d idle bodies from another address: %d %s, want the upstream's 200", idle, resp.StatusCode, got)
	}
	if n := h.proxy.buffered.Load(); n != 0 {
		t.Fatalf("%d idle bodies that sent nothing hold %d bytes, want none", idle, n)
	}
}

// TestOneAddressAloneHoldsHalf: the same crowd of connections from one
// address, each sending its first bytes, holds half the memory bound at
// most (the rest are refused 429 queue_full by its address), and a chat
// from another address gets through.
func TestOneAddressAloneHoldsHalf(t *testing.T) {
	const bound, memory = 1 << 20, 64 << 10
	h := newHarness(t, answering(nil), func(c *Config) {
		c.MaxBufferedBytes, c.MemoryBodyBytes = bound, memory
		c.MinBodyRate = -1
	})
	const idle = bound/firstChunk + 40
	conns := make([]net.Conn, idle)
	for i := range conns {
		conns[i] = openBodyFrom(t, h, "127.0.0.2", fmt.Sprintf("sk-idle-%d", i), memory, []byte(`{"model":`))
	}
	answers := make(chan string, idle)
	for _, conn := range conns {
		go func() {
			resp, body, err := answerOn(t, conn, time.Second)
			if err != nil {
				body = "" // held, waiting for the rest
			} else {
				body = resp.Status + " " + body
			}
			answers <- body
		}()
	}
	refused := 0
	for range idle {
		body := <-answers
		if body == "" {
			continue
		}
		if !strings.HasPrefix(body, "429") || !strings.Contains(body, "fair share") || !strings.Contains(body, "by its address") {
			t.Fatalf("%s, want 429 queue_full over the address's share", body)
		}
		refused++
	}
	if n := h.proxy.buffered.Load(); n != bound/2 || refused != idle-bound/2/firstChunk {
		t.Fatalf("one address holds %d bytes with %d of %d refused, want half the bound, %d, and %d refused", n, refused, idle, bound/2, idle-bound/2/firstChunk)
	}
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[]}`)
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != okAnswer {
		t.Fatalf("a chat from another address: %d %s, want the upstream's 200", resp.StatusCode, got)
	}
}

// spoolFiles is how many files the process has open in dir (spools are
// removed from dir as soon as they are made, so only their descriptors
// show them); -1 where /proc does not tell.
func spoolFiles(dir string) int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, fd := range fds {
		if to, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(to, dir+string(os.PathSeparator)) {
			n++
		}
	}
	return n
}

// TestIdleSpooledBodiesMakeNoSpool: connections announcing bodies past
// MemoryBodyBytes and sending nothing make no spool file and hold
// nothing; once one sends its first bytes, its spool is made.
func TestIdleSpooledBodiesMakeNoSpool(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, answering(nil), func(c *Config) {
		c.SpoolDir, c.MemoryBodyBytes = dir, 1<<10
		c.MinBodyRate = -1
	})
	if spoolFiles(dir) < 0 {
		t.Skip("no /proc/self/fd to count spool files by")
	}
	for range 50 {
		openBody(t, h, testKey, 100<<10, nil)
	}
	time.Sleep(300 * time.Millisecond) // their handlers wait for the bodies
	if n := spoolFiles(dir); n != 0 || h.proxy.spooled.Load() != 0 || h.proxy.buffered.Load() != 0 {
		t.Fatalf("50 idle spooled bodies: %d spool files, %d bytes spooled, %d in memory; want none", n, h.proxy.spooled.Load(), h.proxy.buffered.Load())
	}
	openBody(t, h, testKey, 100<<10, []byte(`{`))
	waitFor(t, func() bool { return spoolFiles(dir) == 1 && h.proxy.spooled.Load() == 1 })
}

// TestUnreadBodyClosesTheConnection: a request the proxy answers without
// reading its body (a bad x-llmproxy-max-wait, an absolute-form target,
// a length past MaxBodyBytes) gets its answer, and the connection is closed at once, not kept while
// the server waits for a body the client announced and does not send.
func TestUnreadBodyClosesTheConnection(t *testing.T) {
	h := newHarness(t, answering(nil), func(c *Config) { c.MaxBodyBytes = 100_000 })
	for _, tc := range []struct {
		name, target, header, want string
		status                     int
	}{
		{"bad max-wait", "/v1/chat/completions", "X-Llmproxy-Max-Wait: soon\r\n", `"code":"invalid_max_wait"`, 400},
		{"absolute-form", "http://elsewhere.example/v1/chat/completions", "", `"code":"absolute_uri"`, 400},
		{"too large", "/v1/chat/completions", "", `"code":"request_too_large"`, 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", h.front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: 200000\r\n\r\n", tc.target, tc.header)
			_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("%s %s, want a %d with %s", resp.Status, body, tc.status, tc.want)
			}
			if !resp.Close {
				t.Error("the answer does not say Connection: close")
			}
			if n, err := br.Read(make([]byte, 1)); !closedConn(err) {
				t.Fatalf("after the answer: %d bytes, %v; want the connection closed", n, err)
			}
		})
	}
}

// TestBodyDeadlineRunsFromTheStart: whatever answers a request without
// reading its body and without unread's Connection: close, the server's
// read of the rest ends at BodyTimeout from the request's start, and the
// answer goes out then; it does not wait for the body forever.
func TestBodyDeadlineRunsFromTheStart(t *testing.T) {
	h := newHarness(t, answering(nil), func(c *Config) { c.BodyTimeout = time.Second })
	front := httptest.NewServer(h.proxy.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	defer front.Close()
	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	resp, _, err := answerOn(t, conn, 4*time.Second)
	if err != nil {
		t.Fatalf("no answer after %v: %v", time.Since(start), err)
	}
	if d := time.Since(start); resp.StatusCode != http.StatusNoContent || d < 900*time.Millisecond || d > 3*time.Second {
		t.Fatalf("%s after %v, want the 204 about 1s in", resp.Status, d)
	}
}

// closedConn is whether err, from a read, says the peer closed the
// connection: an end, or a reset where it closed with bytes unread.
func closedConn(err error) bool {
	return err == io.EOF || errors.Is(err, syscall.ECONNRESET)
}

// TestBodyRateGraceDefaultsToFiveSeconds: a Config without BodyRateGrace
// gives a body the 5 s the docs name before its rate is held to
// MinBodyRate.
func TestBodyRateGraceDefaultsToFiveSeconds(t *testing.T) {
	p, err := New(Config{Transport: cannedTransport{}})
	if err != nil {
		t.Fatal(err)
	}
	if p.cfg.BodyRateGrace != 5*time.Second {
		t.Fatalf("BodyRateGrace defaults to %v, want 5s", p.cfg.BodyRateGrace)
	}
}
