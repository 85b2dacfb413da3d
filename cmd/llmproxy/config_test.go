package main

import (
	"context"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/redisstate"
)

// startErr runs the program with env and returns its one-line start-up
// error, failing the test when it starts or says more than one line.
func startErr(t *testing.T, env map[string]string) string {
	t.Helper()
	all := map[string]string{"LLMPROXY_ADDR": "127.0.0.1:0", "LLMPROXY_ADMIN_ADDR": "127.0.0.1:0"}
	maps.Copy(all, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // in case it starts
	defer cancel()
	var stderr syncBuffer
	code := run(ctx, nil, nil, all, io.Discard, &stderr, nil)
	out := stderr.String()
	if code == 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q: want a one-line start-up error", code, out)
	}
	return out
}

// TestURLSecretsStayOutOfStartUpErrors: an upstream or route URL refused
// for a query, fragment or credentials may carry a key there; the error
// names the variable and the host, never the secret.
func TestURLSecretsStayOutOfStartUpErrors(t *testing.T) {
	for _, tc := range []struct{ env, val string }{
		{"LLMPROXY_UPSTREAM", "https://x.example/?key=SECRET"},
		{"LLMPROXY_UPSTREAM", "https://x.example/v1?key=SECRET#frag"},
		{"LLMPROXY_UPSTREAM", "https://x.example/v1#SECRET"},
		{"LLMPROXY_UPSTREAM", "https://user:SECRET@x.example"},
		{"LLMPROXY_UPSTREAM", "https://SECRET@x.example"},
		{"LLMPROXY_UPSTREAM", "ftp://x.example/?key=SECRET"},
		{"LLMPROXY_UPSTREAM", "https://x.example/%zz?key=SECRET"},
		{"LLMPROXY_UPSTREAM", "https://user:SECRET@x.example:port/"},
		{"LLMPROXY_UPSTREAM", "x.example/?key=SECRET"},
		{"LLMPROXY_ROUTES", "r=https://x.example/?key=SECRET"},
		{"LLMPROXY_ROUTES", "r=https://u:SECRET@x.example"},
		{"LLMPROXY_ROUTES", "r*=https://x.example/?key=SECRET"},
		{"LLMPROXY_ROUTES", "https://x.example/?key=SECRET"},
		{"LLMPROXY_ROUTES", "r=https://x.example/?key=SECRET,r=https://y.example/?key=SECRET"},
	} {
		t.Run(tc.env+"="+tc.val, func(t *testing.T) {
			out := startErr(t, map[string]string{tc.env: tc.val})
			if !strings.Contains(out, tc.env) {
				t.Errorf("%q does not name %s", out, tc.env)
			}
			if strings.Contains(out, "SECRET") {
				t.Errorf("the start-up error shows the secret: %q", out)
			}
			if !strings.Contains(out, "x.example") {
				t.Errorf("%q does not show which URL", out)
			}
		})
	}
}

// TestRoutesNamedLikeAPIVersionsAreRefused: a route called v1 would take
// every /v1/... request away from the default upstream.
func TestRoutesNamedLikeAPIVersionsAreRefused(t *testing.T) {
	for _, name := range []string{"v1", "v1beta", "v2", "v3", "V1"} {
		out := startErr(t, map[string]string{"LLMPROXY_ROUTES": "anthropic=https://api.anthropic.com," + name + "=https://x.example"})
		if !strings.Contains(out, "LLMPROXY_ROUTES") || !strings.Contains(out, `"`+name+`"`) || !strings.Contains(out, "LLMPROXY_UPSTREAM") {
			t.Errorf("route %s: %q, want an error naming the route and why", name, out)
		}
	}
	if _, err := loadConfig(map[string]string{"LLMPROXY_ROUTES": "openai=https://x.example,v1x=https://y.example"}); err != nil {
		t.Fatalf("other route names: %v", err)
	}
}

// TestDurationsHaveUsableFloors: waits so short that every request would
// fail at once are refused at start.
func TestDurationsHaveUsableFloors(t *testing.T) {
	for _, tc := range []struct{ env, val, want string }{
		{"LLMPROXY_MAX_WAIT", "1ns", "minimum 1s"},
		{"LLMPROXY_MAX_WAIT", "999ms", "minimum 1s"},
		{"LLMPROXY_MAX_RETRY_AFTER", "1ns", "minimum 1s"},
		{"LLMPROXY_BODY_TIMEOUT", "10ms", "minimum 1s"},
		{"LLMPROXY_SHUTDOWN_TIMEOUT", "0s", "positive"},
		{"LLMPROXY_IDLE_TIMEOUT", "0s", "positive"},
		{"LLMPROXY_IDLE_TIMEOUT", "-1s", "positive"},
	} {
		out := startErr(t, map[string]string{tc.env: tc.val})
		if !strings.Contains(out, tc.env) || !strings.Contains(out, tc.want) {
			t.Errorf("%s=%s: %q, want it named with %q", tc.env, tc.val, out, tc.want)
		}
	}
	for _, env := range []map[string]string{
		{"LLMPROXY_MAX_WAIT": "1s", "LLMPROXY_MAX_RETRY_AFTER": "1s", "LLMPROXY_BODY_TIMEOUT": "1s"},
		{"LLMPROXY_SHUTDOWN_TIMEOUT": "1ms", "LLMPROXY_IDLE_TIMEOUT": "1ms"},
	} {
		if _, err := loadConfig(env); err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}

// TestUnknownVariablesAreWarnedAbout: a misspelled LLMPROXY_* variable gets
// one warning naming it and, when one is close, the variable meant; its
// value is never shown. The test suite's own LLMPROXY_E2E_* are not warned
// about.
func TestUnknownVariablesAreWarnedAbout(t *testing.T) {
	pr := startProgram(t, map[string]string{
		"LLMPROXY_UPSTREAM": okUpstream(t),
		"LLMPROXY_MAX_WIAT": "SECRET1", "LLMPROXY_UPSTRAEM": "SECRET2", "LLMPROXY_ADMINTOKEN": "SECRET3",
		"LLMPROXY_SOMETHING_ELSE_ENTIRELY": "SECRET4", "LLMPROXY_E2E_REQUIRE_REDIS": "1", "OTHER_MAX_WAIT": "x",
	})
	pr.stop()
	pr.wait(t, 5*time.Second)
	logs := pr.logs.String()
	lines := map[string]string{}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "unknown variable") {
			for _, f := range strings.Fields(l) {
				if name, ok := strings.CutPrefix(f, "name="); ok {
					lines[name] = l
				}
			}
		}
	}
	for name, want := range map[string]string{
		"LLMPROXY_MAX_WIAT": "did_you_mean=LLMPROXY_MAX_WAIT", "LLMPROXY_UPSTRAEM": "did_you_mean=LLMPROXY_UPSTREAM",
		"LLMPROXY_ADMINTOKEN": "did_you_mean=LLMPROXY_ADMIN_TOKEN", "LLMPROXY_SOMETHING_ELSE_ENTIRELY": "",
	} {
		l, ok := lines[name]
		switch {
		case !ok:
			t.Errorf("no warning for %s:\n%s", name, logs)
		case want != "" && !strings.Contains(l, want):
			t.Errorf("warning for %s lacks %s: %s", name, want, l)
		case want == "" && strings.Contains(l, "did_you_mean"):
			t.Errorf("warning for %s suggests a far name: %s", name, l)
		}
	}
	if len(lines) != 4 {
		t.Errorf("%d warnings, want 4:\n%s", len(lines), logs)
	}
	if strings.Contains(logs, "SECRET") {
		t.Errorf("a value was logged:\n%s", logs)
	}
}

// TestLaneConcurrencyIsClampedIntoItsRange: a ceiling or floor that leaves
// the initial concurrency outside moves it in (with an info line), while a
// floor above the ceiling is still an error.
func TestLaneConcurrencyIsClampedIntoItsRange(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want int
	}{
		{map[string]string{"LLMPROXY_LANE_MAX_CONCURRENCY": "8"}, 8},
		{map[string]string{"LLMPROXY_LANE_MAX_CONCURRENCY": "4"}, 4},
		{map[string]string{"LLMPROXY_LANE_MIN_CONCURRENCY": "16"}, 16},
		{map[string]string{"LLMPROXY_LANE_CONCURRENCY": "5000"}, 1024},
	} {
		c, err := loadConfig(tc.env)
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if c.LaneConcurrency != tc.want {
			t.Errorf("%v: LANE_CONCURRENCY %d, want %d", tc.env, c.LaneConcurrency, tc.want)
		}
	}
	out := startErr(t, map[string]string{"LLMPROXY_LANE_MIN_CONCURRENCY": "10", "LLMPROXY_LANE_MAX_CONCURRENCY": "5"})
	// lanequeue's words, with its fields named as the variables.
	if !strings.Contains(out, "LLMPROXY_LANE_MIN_CONCURRENCY: 10 is above LLMPROXY_LANE_MAX_CONCURRENCY=5") {
		t.Errorf("min above max: %q", out)
	}
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t), "LLMPROXY_LANE_MAX_CONCURRENCY": "4"})
	pr.stop()
	pr.wait(t, 5*time.Second)
	if logs := pr.logs.String(); !strings.Contains(logs, "level=INFO") || !strings.Contains(logs, "LLMPROXY_LANE_CONCURRENCY") || !strings.Contains(logs, "to=4") {
		t.Errorf("no info line for the clamped concurrency:\n%s", logs)
	}
}

// TestAdminTokenMustTravelInAHeader: a token a header cannot carry
// unchanged is refused at start, without showing it.
func TestAdminTokenMustTravelInAHeader(t *testing.T) {
	for _, tok := range []string{" SECRET", "SECRET ", "SEC RET", "SECRET\x01", "SECRETé"} {
		out := startErr(t, map[string]string{"LLMPROXY_ADMIN_TOKEN": tok})
		if !strings.Contains(out, "LLMPROXY_ADMIN_TOKEN") || strings.Contains(out, "SECRET") {
			t.Errorf("token %q: %q, want an error naming the variable, not the value", tok, out)
		}
	}
}

// TestAdminTokenHasAMinimumLength: a token shorter than 16 characters is
// refused at start, saying how long one must be and not showing it; 16
// and more are taken, and no token is no token.
func TestAdminTokenHasAMinimumLength(t *testing.T) {
	for _, tok := range []string{"~~", "SECRETSECRETSEC", "SECRET-0123456"} {
		out := startErr(t, map[string]string{"LLMPROXY_ADMIN_TOKEN": tok})
		if !strings.Contains(out, "LLMPROXY_ADMIN_TOKEN") || !strings.Contains(out, "at least 16") || strings.Contains(out, tok) {
			t.Errorf("token of %d characters: %q, want an error naming the variable and the minimum, not the value", len(tok), out)
		}
	}
	for _, tok := range []string{"", "SECRETSECRETSECR", "0123456789abcdef0123456789abcdef"} {
		if _, err := loadConfig(map[string]string{"LLMPROXY_ADMIN_TOKEN": tok}); err != nil {
			t.Errorf("token of %d characters: %v", len(tok), err)
		}
	}
}

// TestTheEnvironmentsDefaultsAreThePackagesOwn: each LLMPROXY_* default
// that a package also applies for a zero setting is that package's own
// default (its Default constant, or its config's WithDefaults), so that
// -h, config.example.env (checked against -h by deploy's tests) and the
// packages cannot drift apart.
func TestTheEnvironmentsDefaultsAreThePackagesOwn(t *testing.T) {
	c, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		name      string
		got, want any
	}{
		{"MAX_RETRIES", c.MaxRetries, proxy.DefaultMaxRetries},
		{"MAX_WAIT", c.MaxWait, proxy.DefaultMaxWait},
		{"MAX_RETRY_AFTER", c.MaxRetryAfter, proxy.DefaultMaxRetryAfter},
		{"MAX_BODY_BYTES", c.MaxBodyBytes, int64(proxy.DefaultMaxBodyBytes)},
		{"MEMORY_BODY_BYTES", c.MemoryBodyBytes, int64(proxy.DefaultMemoryBodyBytes)},
		{"MAX_SPOOL_BYTES", c.MaxSpoolBytes, int64(proxy.DefaultMaxSpoolBytes)},
		{"MAX_BUFFERED_BYTES", c.MaxBufferedBytes, int64(proxy.DefaultMaxBufferedBytes)},
		{"MIN_BODY_RATE", c.MinBodyRate, int64(proxy.DefaultMinBodyRate)},
		{"BODY_TIMEOUT", c.BodyTimeout, proxy.DefaultBodyTimeout},
		{"MAX_QUEUE", c.MaxQueue, lanequeue.Config{}.WithDefaults().MaxQueue},
		{"LANE_CONCURRENCY", c.LaneConcurrency, limit.Config{}.WithDefaults().Concurrency},
		{"LANE_MIN_CONCURRENCY", c.LaneMinConcurrency, limit.Config{}.WithDefaults().MinConcurrency},
		{"LANE_MAX_CONCURRENCY", c.LaneMaxConcurrency, limit.Config{}.WithDefaults().MaxConcurrency},
		{"MAX_LANES", c.MaxLanes, lanequeue.TableConfig{}.WithDefaults().MaxLanes},
		{"LANE_IDLE_TTL", c.LaneIdleTTL, lanequeue.TableConfig{}.WithDefaults().IdleTTL},
		{"REDIS_LEASE_TTL", c.RedisLeaseTTL, redisstate.DefaultLeaseTTL},
		{"REDIS_SLOW", c.RedisSlow, redisstate.DefaultSlow},
	} {
		if d.got != d.want {
			t.Errorf("LLMPROXY_%s defaults to %v, its package to %v", d.name, d.got, d.want)
		}
	}
}

// TestAPackagesErrorNamesTheVariables: a package's words keep their own
// terms and quoted names; only the field that is wrong, and a field
// given with its value, become LLMPROXY_* names.
func TestAPackagesErrorNamesTheVariables(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"LLMPROXY_REDIS_URL": "http://u:secret@127.0.0.1"},
			"LLMPROXY_REDIS_URL: the scheme is not redis:// or rediss:// (the value is not shown: it may hold a password)"},
		{map[string]string{"LLMPROXY_REDIS_URL": "redis://u:secret@127.0.0.1", "LLMPROXY_REDIS_MODE": "sentinel"},
			"LLMPROXY_REDIS_SENTINEL_MASTER: missing: sentinel mode needs the name the Sentinels know the primary by"},
		{map[string]string{"LLMPROXY_REDIS_URL": "redis://u:secret@127.0.0.1", "LLMPROXY_REDIS_CA": "/nonexistent/ca.pem"},
			"LLMPROXY_REDIS_CA: set, but the URL is redis://; TLS is rediss://"},
		{map[string]string{"LLMPROXY_REDIS_URL": "rediss://u:secret@127.0.0.1", "LLMPROXY_REDIS_PASSWORD_FILE": "/nonexistent/pw"},
			"LLMPROXY_REDIS_PASSWORD_FILE: cannot read /nonexistent/pw: no such file or directory"},
		{map[string]string{"LLMPROXY_ROUTES": "Routes=https://a.example,Routes=https://b.example"},
			`LLMPROXY_ROUTES: route "Routes" given twice`},
		{map[string]string{"LLMPROXY_LANE_MIN_CONCURRENCY": "10", "LLMPROXY_LANE_MAX_CONCURRENCY": "5"},
			"LLMPROXY_LANE_MIN_CONCURRENCY: 10 is above LLMPROXY_LANE_MAX_CONCURRENCY=5"},
	} {
		_, err := loadConfig(tc.env)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
}

// TestAdminTokenFromAFile: LLMPROXY_ADMIN_TOKEN_FILE gives the token
// without its line end, and is checked as the token is; a missing or
// empty file, or both variables set, stop the start without showing a
// token.
func TestAdminTokenFromAFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const tok = "0123456789abcdef-from-a-file"
	for _, content := range []string{tok, tok + "\n", tok + "\r\n"} {
		c, err := loadConfig(map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": write("ok", content)})
		if err != nil || c.AdminToken != tok {
			t.Errorf("%q: token %q, %v", content, c.AdminToken, err)
		}
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": write("short", "SECRET\n")}, "LLMPROXY_ADMIN_TOKEN_FILE: too short"},
		{map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": write("spaced", "SECRET SECRET SECRET\n")}, "LLMPROXY_ADMIN_TOKEN_FILE: use visible ASCII"},
		{map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": write("empty", "\n")}, "LLMPROXY_ADMIN_TOKEN_FILE: " + filepath.Join(dir, "empty") + " is empty"},
		{map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": write("big", strings.Repeat("S", 4097))}, "larger than 4096 bytes"},
		{map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": filepath.Join(dir, "missing")}, "LLMPROXY_ADMIN_TOKEN_FILE: open "},
		{map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": write("both", tok), "LLMPROXY_ADMIN_TOKEN": "SECRET-0123456789abcdef"}, "not both"},
	} {
		_, err := loadConfig(tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%v: %v, want %q and no token", tc.env, err, tc.want)
		}
	}
	if _, err := loadConfig(map[string]string{"LLMPROXY_ADMIN_TOKEN_FILE": write("max", strings.Repeat("S", 4096))}); err != nil {
		t.Errorf("a token of 4096 characters: %v", err)
	}
}
