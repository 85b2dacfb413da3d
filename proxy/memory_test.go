package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// TestLaneFieldsAreBounded: sixty requests with distinct 100 KB model
// names and long paths make sixty lanes whose model and path are short,
// still distinct, and valid UTF-8; /lanes stays small.
func TestLaneFieldsAreBounded(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) }), func(c *Config) {
		c.MaxBodyBytes = 1 << 20
	})
	for i := range 60 {
		model := strings.Repeat("é", 50<<10) + fmt.Sprint(i) // 100 KB, distinct at the end
		path := "/v1/" + strings.Repeat("p", 4<<10) + fmt.Sprint(i)
		readAll(t, h.post(path, `{"model":"`+model+`"}`).Body)
	}
	states := h.proxy.States()
	models, paths := map[string]bool{}, map[string]bool{}
	for _, s := range states {
		if len(s.Model) > 160 || len(s.Path) > 160 || !utf8.ValidString(s.Model) {
			t.Fatalf("a lane holds a model of %d bytes and a path of %d", len(s.Model), len(s.Path))
		}
		models[s.Model], paths[s.Path] = true, true
	}
	if len(states) != 60 || len(models) != 60 || len(paths) != 60 {
		t.Fatalf("%d lanes, %d models, %d paths: long values must stay apart", len(states), len(models), len(paths))
	}
	if n := len(newAdmin(t, h)("/lanes")); n > 200<<10 {
		t.Fatalf("/lanes is %d bytes for 60 lanes", n)
	}
}

// TestBufferedBodiesAreBounded: with room for two 4 KiB bodies, a third
// request while two wait gets 429 queue_full with Retry-After, whether its
// length is known or not; once they are done the room is back.
func TestBufferedBodiesAreBounded(t *testing.T) {
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock() // also when the test fails: the upstream's handlers must end
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		fmt.Fprint(w, `{}`)
	}), func(c *Config) {
		c.MaxBufferedBytes = 10 << 10
		c.Lanes.Lane.Concurrency, c.Lanes.Lane.MaxConcurrency = 1, 1
	})
	body := `{"model":"m","pad":"` + strings.Repeat("x", 4<<10) + `"}`
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readAll(t, h.post("/v1/chat/completions", body).Body)
		}()
	}
	waitFor(t, func() bool { s := laneState(h.proxy, "m"); return s.InFlight+s.Queued == 2 })
	if got := h.proxy.buffered.Load(); got != 2*int64(len(body)) {
		t.Fatalf("held %d bytes, want %d", got, 2*len(body))
	}
	known := h.post("/v1/chat/completions", body)
	if e := decodeErr(t, known); known.StatusCode != 429 || e.Error.Code != "queue_full" || known.Header.Get("Retry-After") == "" {
		t.Fatalf("known length: %d %s", known.StatusCode, e.Error.Code)
	}
	req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions", io.MultiReader(strings.NewReader(body))) // no length: chunked
	req.Header.Set("Authorization", "Bearer "+testKey)
	chunked, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer chunked.Body.Close()
	if e := decodeErr(t, chunked); chunked.StatusCode != 429 || e.Error.Code != "queue_full" {
		t.Fatalf("chunked: %d %s", chunked.StatusCode, e.Error.Code)
	}
	unblock()
	wg.Wait()
	laneIdle(t, h.proxy)
	waitFor(t, func() bool { return h.proxy.buffered.Load() == 0 })
	if r := h.post("/v1/chat/completions", body); r.StatusCode != 200 {
		t.Fatalf("after the others ended: %d", r.StatusCode)
	}
}
