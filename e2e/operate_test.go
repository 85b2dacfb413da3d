package e2e

// Changes an operator makes on one replica's admin listener reach the
// other replicas through Redis: two replicas of the binary on a real
// redis-server.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/e2e/mockupstream"
	"github.com/llmproxy/llmproxy/lanequeue"
)

// adminSend sends method path with body to the replica's admin listener
// and fails the test unless it answers 200.
func (r *replica) adminSend(t *testing.T, method, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+r.admin+path, strings.NewReader(body))
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s %s: %d %s", r.name, method, path, resp.StatusCode, b)
	}
}

// operatedLanes is what /lanes says of the lanes and the routes changed.
type operatedLanes struct {
	Lanes  []lanequeue.State `json:"lanes"`
	Routes []struct {
		Route  string `json:"route"`
		Limits struct {
			RPM float64 `json:"rpm"`
		} `json:"limits"`
		Held *struct {
			By string `json:"by"`
		} `json:"held"`
	} `json:"routes"`
}

func (r *replica) operatedLanes() (operatedLanes, error) {
	var l operatedLanes
	code, body, err := r.adminGet("/lanes")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/lanes answered %d", code)
	}
	if err == nil {
		err = json.Unmarshal(body, &l)
	}
	return l, err
}

// seenWithin polls the replica's /lanes every 10 ms until ok says it
// shows what it should, for at most d, and reports how long that took.
func seenWithin(t *testing.T, r *replica, d time.Duration, what string, ok func(operatedLanes) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		l, err := r.operatedLanes()
		if err == nil && ok(l) {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: %s not on /lanes within %v (%v): %+v", r.name, what, d, err, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// changeSeenWithin bounds how long a change made on one replica may take
// to show on another's /lanes in these tests.
const changeSeenWithin = 10 * time.Second

// operateToken is the admin token of the replicas that share changes;
// operateBy is how their logs name who made one.
const operateToken = "e2e-fleet-admin-token-5f0c2a9e7d31b84c"

var operateBy = func() string {
	sum := sha256.Sum256([]byte(operateToken))
	return "token:" + hex.EncodeToString(sum[:4])
}()

// TestAChangeOnOneReplicaReachesTheOther: limits set on replica A's admin
// listener are on replica B's /lanes at its next poll of the changes, and
// B paces by them; a hold made on A holds B's requests (they wait) until A's
// release; a replica started later has the limits in force from its
// start.
func TestAChangeOnOneReplicaReachesTheOther(t *testing.T) {
	rs := startRedis(t)
	bin := llmproxyBinary(t)
	mock := startMockUpstream(t, mockupstream.Config{Latency: 10 * time.Millisecond})
	// The replicas share only changes signed with their admin token.
	env := append(redisEnv(rs.URL()), "LLMPROXY_ADMIN_TOKEN="+operateToken)
	reps := startReplicas(t, 2, bin, mock.URL(), env...)
	waitRedisOK(t, reps)
	a, b := reps[0], reps[1]
	client := loadClient(t)
	if _, err := sendChat(context.Background(), client, b.addr); err != nil {
		t.Fatal(err)
	}

	// B polls every 250 ms (DefaultChangesEvery, held by redisstate's
	// TestChangesArePolledEveryQuarterSecondByDefault), so an idle machine
	// shows a change within a second; the bound here is one a loaded
	// machine running every package's tests at once meets.
	a.adminSend(t, "PUT", "/admin/routes/default/limits", `{"rpm": 120}`)
	took := seenWithin(t, b, changeSeenWithin, "the limits set on A", func(l operatedLanes) bool {
		return len(l.Lanes) == 1 && l.Lanes[0].RuntimeLimits != nil && l.Lanes[0].RuntimeLimits.RPM == 120 &&
			len(l.Routes) == 1 && l.Routes[0].Limits.RPM == 120
	})
	t.Logf("B showed A's limits after %v", took.Round(time.Millisecond))

	// 120 a minute: B's requests start 500 ms apart.
	var mu sync.Mutex
	var ends []time.Time
	var wg sync.WaitGroup
	sent := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := sendChat(context.Background(), client, b.addr); err != nil {
				t.Error(err)
			}
			mu.Lock()
			ends = append(ends, time.Now())
			mu.Unlock()
		}()
	}
	wg.Wait()
	last := ends[0]
	for _, e := range ends {
		if e.After(last) {
			last = e
		}
	}
	// The first went no sooner than they were sent, the fourth 1.5 s
	// after it.
	if took := last.Sub(sent); took < 1500*time.Millisecond {
		t.Errorf("B answered four requests %v after they were sent; at 120 a minute they start 500ms apart (≥ 1.5s)", took)
	}

	a.adminSend(t, "POST", "/admin/routes/default/hold", "")
	seenWithin(t, b, changeSeenWithin, "A's hold", func(l operatedLanes) bool {
		return len(l.Lanes) == 1 && l.Lanes[0].Held == "route" && len(l.Routes) == 1 && l.Routes[0].Held != nil
	})
	served := mock.Stats().Requests
	answered := make(chan error, 1)
	go func() { _, err := sendChat(context.Background(), client, b.addr); answered <- err }()
	seenWithin(t, b, 5*time.Second, "the held request queued", func(l operatedLanes) bool { return l.Lanes[0].Queued == 1 })
	if n := mock.Stats().Requests; n != served {
		t.Fatalf("a request held on B reached the upstream (%d, was %d)", n, served)
	}
	a.adminSend(t, "POST", "/admin/routes/default/release", "")
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("after A's release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B's held request still waits 10s after A's release")
	}

	c := startReplica(t, "replica 2", bin, mock.URL(), env...)
	code, body, err := c.adminGet("/admin/routes/default/limits")
	if err != nil || code != http.StatusOK || !strings.Contains(string(body), `"rpm": 120`) {
		t.Fatalf("a replica started later: %d %s (%v)", code, body, err)
	}
	if !strings.Contains(a.stderr.String(), `msg="admin change" route=default op=limits by=`+operateBy) ||
		!strings.Contains(b.stderr.String(), `msg="admin change from another replica" route=default op=hold by=`+operateBy) {
		t.Errorf("the replicas' logs lack the changes:\nA:\n%s\nB:\n%s", lastChars(a.stderr.String(), 2000), lastChars(b.stderr.String(), 2000))
	}

	// Whoever can write to Redis cannot hold the route: a hold written
	// straight into the hash, unsigned, and one made by a replica of
	// another admin token, are not taken, and B logs each.
	rdb := redis.NewClient(&redis.Options{Addr: rs.addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.HSet(context.Background(), "llmproxy:v2:{changes}", "route:default:hold", `{"op":"hold","by":"local","at":"2026-01-01T00:00:00Z"}`).Err(); err != nil {
		t.Fatal(err)
	}
	other := startReplica(t, "replica of another token", bin, mock.URL(), append(redisEnv(rs.URL()), "LLMPROXY_ADMIN_TOKEN=e2e-another-admin-token-88c1d0b5a4f2")...)
	other.adminSend(t, "POST", "/admin/routes/anthropic/hold", "")
	ignored := func(reason string) string {
		return `msg="a change in redis ignored" field=route:anthropic:hold reason="` + reason
	}
	deadline := time.Now().Add(changeSeenWithin)
	for !strings.Contains(b.stderr.String(), ignored("wrong signature")) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	logs := b.stderr.String()
	if !strings.Contains(logs, `msg="a change in redis ignored" field=route:default:hold reason="not signed"`) || !strings.Contains(logs, ignored("wrong signature")) {
		t.Fatalf("B does not log the forged and the foreign change:\n%s", lastChars(logs, 3000))
	}
	if strings.Contains(logs, operateToken) {
		t.Fatal("B's log holds the admin token")
	}
	l, err := b.operatedLanes()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range l.Routes {
		if r.Held != nil {
			t.Fatalf("B holds route %s after changes not signed with its token", r.Route)
		}
	}
}
