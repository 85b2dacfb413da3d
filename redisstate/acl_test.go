package redisstate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/internal/redistest"
	"github.com/llmproxy/llmproxy/limit"
)

// proxyACL is the ACL rule of a user that may do all the store does and
// no more, as docs/replicas.md gives it: its keys under the prefix, the
// commands the store sends and those its scripts run. In a cluster the
// client also reads which node serves which slot (CLUSTER SLOTS) and,
// once, the server's table of commands (COMMAND; refused, it routes by
// the first argument all the same, and the server logs it), the store
// asks CLUSTER INFO whether every slot is served before it rejoins, and
// the store's auto mode asks INFO whether the server is a cluster node
// (without INFO it takes the server for a standalone one). HELLO and
// AUTH, at each new connection, need no rule.
const proxyACL = "~llmproxy:* resetchannels -@all +ping +info +evalsha +eval +zadd +zrem +pexpire " +
	"+time +get +set +hget +hset +hsetnx +hmget +hgetall +hdel +del +hexists +hincrby +hincrbyfloat +incr " +
	"+zcard +zscore +zremrangebyscore +cluster|slots +cluster|info +command"

// exercise runs through two stores of cfg what the store does on the
// proxy's path: admissions through Redis, a budget learned from headers
// and bound on the other replica, a pause, a refund and a settled cost, a
// renewal, a heartbeat, permits given back, an operator's change read by
// the other replica and a clear, and a clean Close.
func exercise(t *testing.T, cfg Config) {
	t.Helper()
	cfg.ChangesToken = "the fleet's admin token"
	a, b := storeOn(t, cfg), storeOn(t, cfg)
	for _, st := range []*Store{a, b} {
		if st.Status() != "ok" {
			t.Fatalf("status %s", st.Status())
		}
	}
	lim := limit.Config{Concurrency: 8, MaxConcurrency: 8}
	sa, sb := a.Shared("g", lim), b.Shared("g", lim)
	t1, _, ok := admit(t, sa)
	if !ok || t1.Lease == "" {
		t.Fatal("an admission through Redis refused")
	}
	now := time.Now()
	sa.Learn(&t1, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: headerparse.Limits{
		Requests: headerparse.Window{Limit: 10, Remaining: 1, HasRemaining: true, Reset: now.Add(50 * time.Second)}}}, now)
	sa.Settle(&t1, 3)
	t2, _, ok := admit(t, sb)
	if !ok || t2.Lease == "" {
		t.Fatal("b could not send the one request left")
	}
	if _, _, ok := admit(t, sb); ok {
		t.Fatal("b sent past the budget a learned")
	}
	sb.Learn(&t2, limit.Report{Status: 200, Verdict: limit.NotSent}, now)
	sb.Refund(&t2)
	sb.Learn(&t2, limit.Report{Status: 429, Verdict: limit.RateRefused, PauseUntil: now.Add(time.Minute)}, now)
	admit(t, sa) // reads the pause (the refund may have let it go)
	if err := a.renew(); err != nil {
		t.Fatal(err)
	}
	a.heartbeat(a.now())
	if a.peers.Load() != 2 {
		t.Fatalf("%d replicas counted", a.peers.Load())
	}
	sa.Return(&t1, time.Now())
	sb.Return(&t2, time.Now())
	if err := a.PutChange(context.Background(), "route:x:hold", "held"); err != nil {
		t.Fatal(err)
	}
	var heard []string
	b.pollChanges(func(f, v string, _ bool) { heard = append(heard, f+"="+v) }, false)
	if len(heard) != 1 || heard[0] != "route:x:hold=held" {
		t.Fatalf("the other replica read the changes %v", heard)
	}
	sa.Forget()
	a.flush()
	b.flush()
	for _, st := range []*Store{a, b} {
		if testutil.ToFloat64(st.failures) != 0 || st.Status() != "ok" {
			t.Fatalf("a call failed: status %s", st.Status())
		}
		st.Close()
	}
}

// aclUser is the ACL file line of user with password and proxyACL.
func aclUser(user, password string) string {
	return "user " + user + " on >" + password + " " + proxyACL
}

// refusedByACL is what the servers' ACL LOG holds: the commands or keys
// they refused some user, as "user: reason object".
func refusedByACL(t *testing.T, nodes ...*redistest.Server) []string {
	t.Helper()
	var out []string
	for _, n := range nodes {
		cl := n.Client()
		entries, err := cl.Do(context.Background(), "ACL", "LOG").Slice()
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			f := map[string]any{}
			kv, _ := e.([]any)
			for i := 0; i+1 < len(kv); i += 2 {
				f[fmt.Sprint(kv[i])] = kv[i+1]
			}
			out = append(out, fmt.Sprintf("%v: %v %v", f["username"], f["reason"], f["object"]))
		}
	}
	return out
}

// onFailure logs, if t fails, the servers' ACL LOG and the store's log.
func onFailure(t *testing.T, out *lockedBuffer, nodes ...*redistest.Server) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ACL LOG: %s\nthe store's log:\n%s", strings.Join(refusedByACL(t, nodes...), "; "), out.String())
		}
	})
}

// TestTheStoreWorksAsAnACLUserLimitedToItsKeysAndCommands: as a user
// that may touch only llmproxy:* keys with only proxyACL's commands, the
// store does all it does and the server refuses it nothing, the password
// given in the URL or in a file; the password is in no line the store
// logs (go-redis' own at debug included), nor with a wrong one.
func TestTheStoreWorksAsAnACLUserLimitedToItsKeysAndCommands(t *testing.T) {
	t.Parallel()
	redistest.Need(t, "redis-server")
	const pw = "acl-Pa55word-3d8e"
	srv, err := redistest.Start(redistest.Options{Password: "admin-Pa55-0c1f", ACL: []string{aclUser("proxy", pw)}})
	stopAtEnd(t, srv, err)
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"in the URL": {URL: fmt.Sprintf("redis://proxy:%s@%s", pw, srv.Addr()), Prefix: "llmproxy:url:"},
		"in a file":  {URL: fmt.Sprintf("redis://proxy@%s", srv.Addr()), PasswordFile: pwFile, Prefix: "llmproxy:file:"},
	} {
		logger, out := capturedLog()
		cfg.Logger, cfg.Timeout, cfg.LeaseTTL = logger, 5*time.Second, time.Minute
		onFailure(t, out, srv)
		exercise(t, cfg)
		if refused := refusedByACL(t, srv); len(refused) > 0 {
			t.Fatalf("password %s: the server refused the store: %s", name, strings.Join(refused, "; "))
		}
		if strings.Contains(out.String(), pw) {
			t.Fatalf("password %s: it is in the store's log:\n%s", name, out.String())
		}
	}
	// Wrong: local, and saying why, without either password.
	wrong := "not-" + pw
	ok, said := connectsOrSays(t, Config{URL: fmt.Sprintf("redis://proxy:%s@%s", wrong, srv.Addr())}, wrong)
	if ok || !strings.Contains(said, "WRONGPASS") {
		t.Fatalf("a wrong password: shared %v, want local and WRONGPASS in the log:\n%s", ok, said)
	}
	if _, ready, _ := strings.Cut(said, "\nReady: "); !strings.Contains(ready, "WRONGPASS") {
		t.Errorf("with a wrong password, Ready (/readyz's reason) does not say why: %q", ready)
	}
	if strings.Contains(said, pw) {
		t.Fatalf("the right password in what a wrong one logged:\n%s", said)
	}
}

// TestTheACLSufficesThroughAClusterAndSentinels: the same user, on every
// node of a Redis Cluster, or on a primary the Sentinels name, is refused
// nothing either.
func TestTheACLSufficesThroughAClusterAndSentinels(t *testing.T) {
	t.Parallel()
	redistest.Need(t, "redis-server", "redis-cli", "redis-sentinel")
	const pw = "acl-Pa55word-5e60"
	opt := redistest.Options{ACL: []string{aclUser("proxy", pw)}}
	c, err := redistest.StartCluster(opt)
	stopAtEnd(t, c, err)
	s, err := redistest.StartSentinel("acl-main", opt)
	stopAtEnd(t, s, err)
	withUser := func(url string) string { return strings.Replace(url, "redis://", "redis://proxy:"+pw+"@", 1) }
	for name, tc := range map[string]struct {
		cfg   Config
		nodes []*redistest.Server
	}{
		"cluster":  {Config{URL: withUser(c.URL())}, c.Nodes},
		"sentinel": {Config{URL: withUser(s.URL()), SentinelMaster: "acl-main"}, []*redistest.Server{s.Primary, s.Replica}},
	} {
		logger, out := capturedLog()
		tc.cfg.Logger, tc.cfg.Timeout, tc.cfg.LeaseTTL = logger, 5*time.Second, time.Minute
		onFailure(t, out, tc.nodes...)
		exercise(t, tc.cfg)
		if refused := refusedByACL(t, tc.nodes...); len(refused) > 0 {
			t.Errorf("%s: the servers refused the store: %s", name, strings.Join(refused, "; "))
		}
		if strings.Contains(out.String(), pw) {
			t.Errorf("%s: the password is in the store's log:\n%s", name, out.String())
		}
	}
}

// TestTheACLNamesEveryCommandTheScriptsRunAndTheDocsGiveIt: each
// command a script calls is allowed by proxyACL (a branch the tests above
// do not reach runs under the ACL too), and docs/replicas.md gives the
// operator that very rule.
func TestTheACLNamesEveryCommandTheScriptsRunAndTheDocsGiveIt(t *testing.T) {
	allowed := map[string]bool{}
	for _, r := range strings.Fields(proxyACL) {
		if c, ok := strings.CutPrefix(r, "+"); ok {
			allowed[c] = true
		}
	}
	calls := regexp.MustCompile(`redis\.p?call\(\s*'([A-Za-z]+)'`)
	seen := 0
	for _, sc := range []script{admitScript, learnScript, giveBackScript, heartbeatScript, forgetScript, apartScript} {
		for _, m := range calls.FindAllStringSubmatch(sc.text, -1) {
			seen++
			if !allowed[strings.ToLower(m[1])] {
				t.Errorf("a script calls %s, which the ACL does not allow", m[1])
			}
		}
	}
	if seen == 0 {
		t.Fatal("no redis.call found in the scripts")
	}
	doc, err := os.ReadFile("../docs/replicas.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), proxyACL) {
		t.Errorf("docs/replicas.md does not give the ACL rule:\n%s", proxyACL)
	}
}
