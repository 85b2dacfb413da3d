package proxy

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
)

// spoolHarness is a proxy whose bodies over 1 KiB are spooled to a
// directory of the test's own, in front of up.
func spoolHarness(t *testing.T, up http.Handler, mod func(*Config)) (*harness, string) {
	t.Helper()
	dir := t.TempDir()
	return newHarness(t, up, func(c *Config) {
		c.MemoryBodyBytes = 1 << 10
		c.SpoolDir = dir
		if mod != nil {
			mod(c)
		}
	}), dir
}

// openSpools counts this process's open files in dir (Linux: /proc), and
// the names still in dir.
func openSpools(t *testing.T, dir string) (open, named int) {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	if runtime.GOOS != "linux" {
		return 0, len(names)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, dir) {
			open++
		}
	}
	return open, len(names)
}

// gauge reads a gauge's value from /metrics.
func gauge(t *testing.T, metrics, name string) string {
	t.Helper()
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("%s not in /metrics", name)
	return ""
}

// countingUpstream refuses the first refusals attempts with a bare 429
// and answers the rest 200; it keeps each attempt's body hash and length,
// and, while the first 200's body is read, what the proxy holds.
type countingUpstream struct {
	mu       sync.Mutex
	refusals int
	sums     [][32]byte
	during   func()
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.sums = append(u.sums, sha256.Sum256(b))
	refuse := len(u.sums) <= u.refusals
	during := u.during
	u.mu.Unlock()
	if refuse {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	if during != nil {
		during()
	}
	fmt.Fprint(w, `{"ok":true}`)
}

// TestALargeBodyIsSpooledAndSentAgainWhole: a body over MemoryBodyBytes,
// of known or unknown length, is held in a spool file, not in memory:
// the upstream gets it whole on every attempt (a 429 absorbed, then a
// 200); while the request is under way the spool counts in
// llmproxy_spooled_request_bytes and nothing in the memory gauge, its
// file is already gone from the directory (Unix); after it, no spool is
// open and both gauges are back at 0.
func TestALargeBodyIsSpooledAndSentAgainWhole(t *testing.T) {
	// No garbage collection meanwhile: a spool the proxy failed to close
	// would be closed by the runtime's finalizer, and go unseen.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			up := &countingUpstream{refusals: 1}
			h, dir := spoolHarness(t, up, nil)
			admin := newAdmin(t, h)
			var duringMetrics string
			var duringOpen, duringNamed int
			up.during = func() {
				duringMetrics = admin("/metrics")
				duringOpen, duringNamed = openSpools(t, dir)
			}
			payload := bytes.Repeat([]byte(`{"model":"m","input":"0123456789abcdef"}`), 5000) // 200 KB
			var src io.Reader = bytes.NewReader(payload)
			if chunked {
				src = io.MultiReader(bytes.NewReader(payload)) // no length known
			}
			req, _ := http.NewRequest("POST", h.front.URL+"/v1/files", src)
			req.Header.Set("Authorization", "Bearer "+testKey)
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			want := sha256.Sum256(payload)
			if len(up.sums) != 2 || up.sums[0] != want || up.sums[1] != want {
				t.Fatalf("the upstream got %d attempts, want 2 with the whole body each", len(up.sums))
			}
			if got := gauge(t, duringMetrics, "llmproxy_spooled_request_bytes"); got != fmt.Sprint(len(payload)) {
				t.Errorf("spooled bytes while under way: %s, want %d", got, len(payload))
			}
			if got := gauge(t, duringMetrics, "llmproxy_buffered_request_bytes"); got != "0" {
				t.Errorf("bytes held in memory while under way: %s, want 0", got)
			}
			if runtime.GOOS == "linux" && (duringOpen != 1 || duringNamed != 0) {
				t.Errorf("while under way: %d spools open, %d named in the directory; want 1 open, already removed", duringOpen, duringNamed)
			}
			waitFor(t, func() bool { o, n := openSpools(t, dir); return o == 0 && n == 0 })
			after := admin("/metrics")
			if gauge(t, after, "llmproxy_spooled_request_bytes") != "0" || gauge(t, after, "llmproxy_buffered_request_bytes") != "0" {
				t.Errorf("gauges after the request: spooled %s, memory %s; want 0, 0",
					gauge(t, after, "llmproxy_spooled_request_bytes"), gauge(t, after, "llmproxy_buffered_request_bytes"))
			}
		})
	}
}

// TestSpoolsPastMaxSpoolBytesAreRefused: a body that would take all
// spooled bodies past MaxSpoolBytes gets 429 queue_full with Retry-After,
// whether its length is known up front or found out as it arrives, and
// leaves nothing spooled; the upstream never sees it.
func TestSpoolsPastMaxSpoolBytesAreRefused(t *testing.T) {
	up := &countingUpstream{}
	h, dir := spoolHarness(t, up, func(c *Config) { c.MaxSpoolBytes = 64 << 10 })
	payload := bytes.Repeat([]byte("x"), 100<<10)
	for _, chunked := range []bool{false, true} {
		var src io.Reader = bytes.NewReader(payload)
		if chunked {
			src = io.MultiReader(bytes.NewReader(payload))
		}
		req, _ := http.NewRequest("POST", h.front.URL+"/v1/files", src)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		e := decodeErr(t, resp)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || e.Error.Code != "queue_full" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("chunked=%v: status %d code %q Retry-After %q; want 429 queue_full with Retry-After", chunked, resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After"))
		}
		if !strings.Contains(e.Error.Message, "LLMPROXY_MAX_SPOOL_BYTES") {
			t.Errorf("the message does not name the bound: %q", e.Error.Message)
		}
	}
	if len(up.sums) != 0 {
		t.Fatalf("the upstream saw %d refused bodies", len(up.sums))
	}
	waitFor(t, func() bool { o, n := openSpools(t, dir); return o == 0 && n == 0 && h.proxy.spooled.Load() == 0 })
}

// TestAClientThatStopsMidUploadFreesItsSpool: a client that sends half a
// large body and hangs up leaves no spool open and nothing counted.
func TestAClientThatStopsMidUploadFreesItsSpool(t *testing.T) {
	up := &countingUpstream{}
	h, dir := spoolHarness(t, up, nil)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/files", pr)
	req.ContentLength = 1 << 20
	done := make(chan error, 1)
	go func() {
		resp, err := testClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	pw.Write(bytes.Repeat([]byte("y"), 256<<10))
	waitFor(t, func() bool { return h.proxy.spooled.Load() > 0 })
	pw.CloseWithError(fmt.Errorf("client gone"))
	<-done
	waitFor(t, func() bool { o, n := openSpools(t, dir); return o == 0 && n == 0 && h.proxy.spooled.Load() == 0 })
	if len(up.sums) != 0 {
		t.Fatalf("the upstream saw %d half bodies", len(up.sums))
	}
}

// TestNewRemovesSpoolsLeftByACrash: spool files left in the spool
// directory are removed when a proxy starts; other files are not.
func TestNewRemovesSpoolsLeftByACrash(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, spoolPrefix+"123456")
	other := filepath.Join(dir, "keep-me")
	for _, f := range []string{left, other} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := New(Config{SpoolDir: dir, Logger: logger}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("the crashed proxy's spool is still there (%v)", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file was removed: %v", err)
	}
	if !strings.Contains(logs.String(), "removed request bodies spooled before a crash") || !strings.Contains(logs.String(), "files=1") {
		t.Errorf("no log line for the one spool removed: %q", logs.String())
	}
	// Nothing to remove, nothing said.
	var quiet syncBuffer
	if _, err := New(Config{SpoolDir: dir, Logger: slog.New(slog.NewTextHandler(&quiet, nil))}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(quiet.String(), "spooled before a crash") {
		t.Errorf("a start with no spool left logged %q", quiet.String())
	}
}

// TestABodyOfExactlyMemoryBodyBytesStaysInMemory: a body of unknown
// length as long as MemoryBodyBytes, no longer, is held in memory; one
// byte more goes to a spool.
func TestABodyOfExactlyMemoryBodyBytesStaysInMemory(t *testing.T) {
	up := &countingUpstream{}
	h, _ := spoolHarness(t, up, nil)
	for _, c := range []struct {
		size    int
		spooled bool
	}{{1 << 10, false}, {1<<10 + 1, true}} {
		var spooled int64
		up.during = func() { spooled = h.proxy.spooled.Load() }
		req, _ := http.NewRequest("POST", h.front.URL+"/v1/files", io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("b"), c.size))))
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		resp.Body.Close()
		if (spooled > 0) != c.spooled {
			t.Errorf("a body of %d bytes (memory bound %d): %d bytes spooled", c.size, 1<<10, spooled)
		}
	}
}

// TestARequestWithoutABodyGoesWithoutOne: a GET, and a POST with an empty
// body, reach the upstream with no body and no chunked encoding.
func TestARequestWithoutABodyGoesWithoutOne(t *testing.T) {
	type seen struct {
		te     []string
		length int64
	}
	got := make(chan seen, 2)
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.TransferEncoding, r.ContentLength}
		fmt.Fprint(w, `{}`)
	}), nil)
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, h.front.URL+"/v1/models", nil)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		resp.Body.Close()
		if s := <-got; len(s.te) != 0 || s.length != 0 {
			t.Errorf("%s without a body reached the upstream with Transfer-Encoding %v, Content-Length %d", method, s.te, s.length)
		}
	}
}

// TestASpooledBodyKeysTheLaneByItsModel: a spooled JSON body's model keys
// its lane as the same body in memory would.
func TestASpooledBodyKeysTheLaneByItsModel(t *testing.T) {
	h, _ := spoolHarness(t, &countingUpstream{}, nil)
	pad := strings.Repeat("z", 2<<10)
	small := h.post("/v1/chat/completions", `{"model":"m-one","messages":[]}`)
	big := h.post("/v1/chat/completions", `{"messages":[{"role":"user","content":"`+pad+`"}],"model":"m-one"}`)
	other := h.post("/v1/chat/completions", `{"model":"m-two","messages":[{"role":"user","content":"`+pad+`"}]}`)
	for _, r := range []*http.Response{small, big, other} {
		readAll(t, r.Body)
	}
	if a, b := small.Header.Get("X-Llmproxy-Lane"), big.Header.Get("X-Llmproxy-Lane"); a != b {
		t.Errorf("model m-one in memory got lane %s, spooled %s", a, b)
	}
	if a, b := big.Header.Get("X-Llmproxy-Lane"), other.Header.Get("X-Llmproxy-Lane"); a == b {
		t.Errorf("spooled bodies of models m-one and m-two share lane %s", a)
	}
}

// TestModelOfSpoolReadsOnlyTheTopLevelModel: the top-level "model" string
// wherever it is, past values of any kind and size, escapes decoded; a
// nested "model", a model that is not a string, or a body that is not a
// JSON object, or not valid JSON up to the model, gives "".
func TestModelOfSpoolReadsOnlyTheTopLevelModel(t *testing.T) {
	long := strings.Repeat("a", 100<<10)
	cases := map[string]string{
		`{"model":"gpt-x"}`: "gpt-x",
		` {"messages":[{"role":"user","content":"` + long + `"}], "n":2, "stream":true, "x":null, "model" : "gpt-y"}`: "gpt-y",
		`{"a":{"model":"inner","b":[1,{"c":"]}\"{"}]},"model":"outer"}`:                                               "outer",
		`{"` + long + `":1,"model":"after-a-long-key"}`:                                                               "after-a-long-key",
		`{"model":"caf\u00e9\"q"}`:           "café\"q",
		`{"Model":"cased"}`:                  "cased",
		`{"\u006dodel":"escaped-key"}`:       "escaped-key",
		`{"a":{"model":"inner"}}`:            "",
		`{"model":7}`:                        "",
		`["model","x"]`:                      "",
		`not json`:                           "",
		``:                                   "",
		`{"model":"unterminated`:             "",
		`{"model":"first","model":"second"}`: "first",
		`{"x":1 "model":"y"}`:                "",
		`{"x":tru,"model":"y"}`:              "",
		`{"x":"` + long:                      "",
		`{"model":"` + long + `"}`:           "",
		`{"model":"` + strings.Repeat("m", 1022) + `"}`: strings.Repeat("m", 1022),
		`{"model":"` + strings.Repeat("m", 1023) + `"}`: "",
	}
	for in, want := range cases {
		if got := modelOfSpool(strings.NewReader(in)); got != want {
			show := in
			if len(show) > 60 {
				show = show[:60] + "…"
			}
			t.Errorf("modelOfSpool(%q) = %q, want %q", show, got, want)
		}
	}
}

// TestBodiesExactlyFillingTheBufferCapAreTaken: LLMPROXY_MAX_BUFFERED_BYTES
// is the most that may be held, not one byte less, for bodies of known
// and of unknown length.
func TestBodiesExactlyFillingTheBufferCapAreTaken(t *testing.T) {
	body := `{"model":"m","pad":"` + strings.Repeat("x", 1000) + `"}`
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAllQuiet(r)
		fmt.Fprint(w, `{}`)
	}), func(c *Config) { c.MaxBufferedBytes = int64(len(body)) })
	if resp := h.post("/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("known length at the cap: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", io.MultiReader(strings.NewReader(body)))
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("unknown length at the cap: %d", resp.StatusCode)
	}
	if over := h.post("/v1/chat/completions", body+" "); over.StatusCode != 429 {
		t.Fatalf("one byte over the cap: %d, want 429", over.StatusCode)
	}
}
