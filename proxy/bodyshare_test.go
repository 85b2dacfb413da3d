package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// openBody opens a connection to h's proxy and sends a chat request's
// headers, announcing length bytes of body, and then head, the start of
// the body; key ("": none) is its Bearer credential. The connection is
// closed when the test ends, before the harness is.
func openBody(t *testing.T, h *harness, key string, length int64, head []byte) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", h.front.Listener.Addr().String())
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
// 256 connections each announce a 1 MiB body (the whole memory budget,
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
// 512 MiB each (the whole spool budget, were it held as announced) and
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
// A (another credential) gets its bodies held up to half the memory
// budget and no further (429 queue_full saying why), and B's next chat
// still fits.
func TestOneClientHoldsItsShareAndNoMore(t *testing.T) {
	const budget, memory = 1 << 20, 64 << 10 // a share of 512 KiB for each of two
	h := newHarness(t, answering(nil), func(c *Config) {
		c.MaxBufferedBytes, c.MemoryBodyBytes = budget, memory
		c.MinBodyRate = -1
	})
	head := bytes.Repeat([]byte("x"), 40<<10) // held as 64 KiB
	openBody(t, h, "sk-b", memory, head)
	waitFor(t, func() bool { return h.proxy.buffered.Load() == memory })
	held, refused := 0, 0
	for range budget/memory - 1 { // what would fill the budget
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
	if held != budget/2/memory || refused == 0 {
		t.Errorf("A got %d bodies held and %d refused, want %d held", held, refused, budget/2/memory)
	}
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[]}`, "Authorization", "Bearer sk-b")
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != okAnswer {
		t.Fatalf("B's chat while A holds its share: %d %s", resp.StatusCode, got)
	}
}

// TestBodyBudgetShares: a client may hold budget/n while n clients hold
// bytes (itself counted), never less than the floor; clients are told
// apart by address and by credential, each bounded; what is given back
// leaves no client behind.
func TestBodyBudgetShares(t *testing.T) {
	var b bodyBudget
	b.init(1000, 100, "LLMPROXY_X", "kept")
	if b.floor != 100 {
		t.Fatalf("floor %d, want the largest body, 100", b.floor)
	}
	a := bodyClient{addr: 1}
	var mineA int64
	if err := b.take(&a, &mineA, 1000); err != nil || mineA != 1000 || b.Load() != 1000 {
		t.Fatalf("alone, all of it: %v, %d held", err, mineA)
	}
	if err := b.take(&bodyClient{addr: 2}, new(int64), 1); err == nil || !strings.Contains(err.Error(), "bodies kept by the proxy reached LLMPROXY_X") {
		t.Fatalf("past the budget: %v", err)
	}
	b.give(&a, &mineA)
	if mineA != 0 || b.Load() != 0 || len(b.byAddr) != 0 {
		t.Fatalf("given back: %d mine, %d total, %d clients", mineA, b.Load(), len(b.byAddr))
	}
	// Two addresses: 500 each.
	c := bodyClient{addr: 2}
	var mineC int64
	if err := b.take(&c, &mineC, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.take(&a, &mineA, 500); err != nil {
		t.Fatalf("half with two clients: %v", err)
	}
	if err := b.take(&a, &mineA, 1); err == nil || !strings.Contains(err.Error(), "by its address") || !strings.Contains(err.Error(), "500 bytes while 2 clients") {
		t.Fatalf("over half: %v", err)
	}
	if err := b.take(&c, &mineC, 499); err != nil {
		t.Fatalf("the other's half: %v", err)
	}
	b.give(&a, &mineA)
	b.give(&c, &mineC)
	// One credential from many addresses is one client: while another
	// credential holds bytes, it holds half.
	other := bodyClient{addr: 9, cred: 8, hasCred: true}
	var mineOther int64
	if err := b.take(&other, &mineOther, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		var mine int64
		err := b.take(&bodyClient{addr: uint64(10 + i), cred: 7, hasCred: true}, &mine, 100)
		if i < 5 && err != nil {
			t.Fatalf("address %d, %d held: %v", i, b.Load(), err)
		}
		if i == 5 && (err == nil || !strings.Contains(err.Error(), "by its credential")) {
			t.Fatalf("one credential past its share: %v", err)
		}
	}
	if b.byCred[7] != 500 || len(b.byCred) != 2 || len(b.byAddr) != 6 || b.Load() != 501 {
		t.Fatalf("credential holds %d of %d, %d credentials, %d addresses", b.byCred[7], b.Load(), len(b.byCred), len(b.byAddr))
	}
	b.give(&other, &mineOther)
	if _, ok := b.byCred[8]; ok || b.Load() != 500 {
		t.Fatalf("a credential given back is still counted: %v", b.byCred)
	}
	// The floor: with 20 holders a share is 50, but a client may hold 100.
	var f bodyBudget
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
	// A floor is a sixteenth when that is more, and never the budget's
	// whole past it.
	f.init(1600, 10, "", "")
	if f.floor != 100 {
		t.Errorf("floor %d, want 1600/16", f.floor)
	}
	f.init(50, 100, "", "")
	if f.floor != 50 {
		t.Errorf("floor %d, want the budget, 50", f.floor)
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
		return p.clientOf(r)
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
	if odd := req("not-an-address", ""); odd.addr == a1.addr {
		t.Error("an address without a port as another's")
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
// grows by, and a step past the budget refuses the body (429 queue_full
// naming the budget) and gives back the steps before it.
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
