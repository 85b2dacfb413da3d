package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// TestClientHeaderStaysHere: x-llmproxy-client names the request's client
// on its lane, as /lanes shows, and never reaches the upstream; a name
// that is too long or not visible ASCII is a 400 that names the header.
func TestClientHeaderStaysHere(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(clientHeader)+"|")
		mu.Unlock()
		w.Write([]byte(`{}`))
	}), nil)
	admin := newAdmin(t, h)
	long := strings.Repeat("x", maxClientName)
	for _, name := range []string{"eval/mmlu", long} {
		if resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Llmproxy-Client", name); resp.StatusCode != 200 {
			t.Fatalf("client %q: status %d", name, resp.StatusCode)
		}
	}
	mu.Lock()
	if strings.Join(seen, "") != "||" {
		t.Errorf("upstream saw x-llmproxy-client %q", seen)
	}
	mu.Unlock()
	var body struct{ Lanes []lanequeue.State }
	if err := json.Unmarshal([]byte(admin("/lanes")), &body); err != nil || len(body.Lanes) != 1 {
		t.Fatalf("/lanes: %v, %d lanes", err, len(body.Lanes))
	}
	want := []lanequeue.ClientState{{Name: ""}, {Name: "eval/mmlu", Dispatched: 1}, {Name: long, Dispatched: 1}}
	if got := body.Lanes[0].Clients; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("/lanes clients %+v, want %+v", got, want)
	}

	for _, bad := range []string{long + "x", "two words", "naïve"} {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`, "X-Llmproxy-Client", bad)
		if resp.StatusCode != 400 {
			t.Fatalf("client %q: status %d, want 400", bad, resp.StatusCode)
		}
		if e := decodeErr(t, resp); e.Error.Code != "invalid_client" || !strings.Contains(e.Error.Message, "x-llmproxy-client") {
			t.Errorf("client %q: %+v", bad, e)
		}
	}
}

// TestValidClient: a client's name is up to maxClientName bytes of visible
// ASCII, '!' to '~'; "" is no name.
func TestValidClient(t *testing.T) {
	for name, want := range map[string]bool{
		"": true, "a": true, "!~": true, "user@example.com": true, strings.Repeat("a", maxClientName): true,
		strings.Repeat("a", maxClientName+1): false, "a b": false, " a": false, "a\tb": false, "a\x7f": false, "é": false,
	} {
		if got := validClient(name); got != want {
			t.Errorf("validClient(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestClientHeaderIsNotSentWithAWebSocketUpgrade: a handshake's
// x-llmproxy-client names its client on its lane and stays here too.
func TestClientHeaderIsNotSentWithAWebSocketUpgrade(t *testing.T) {
	up := &realtimeUpstream{}
	seen := make(chan string, 1)
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case seen <- r.Header.Get(clientHeader) + "|":
		default:
		}
		up.ServeHTTP(w, r)
	}), nil)
	admin := newAdmin(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(h.front.URL, "http") + "/v1/realtime?model=gpt-realtime"
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + testKey}, clientHeader: {"voice-eval"}},
	})
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	defer c.Close(websocket.StatusNormalClosure, "")
	if v := <-seen; v != "|" {
		t.Errorf("the upstream's handshake carried x-llmproxy-client %q", v)
	}
	if lanes := admin("/lanes"); !strings.Contains(lanes, `"name": "voice-eval"`) {
		t.Errorf("/lanes does not show the handshake's client: %s", lanes)
	}
}
