package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// sub runs `llmproxy args...` against pr's admin listener with env
// besides, and returns its exit code, stdout and stderr.
func (pr *program) sub(env map[string]string, args ...string) (int, string, string) {
	all := map[string]string{"LLMPROXY_ADMIN_ADDR": pr.admin}
	for k, v := range env {
		all[k] = v
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), nil, args, all, &out, &errOut, nil)
	return code, out.String(), errOut.String()
}

// TestSubcommandsChangeARunningProxy: `llmproxy limits` reads and changes
// a route's limits, `hold` holds its requests (they wait; `status` says
// so) until `release`, `clear` clears a lane; each change is one log line
// of the proxy's naming who asked; bad input is the proxy's 400 (exit 1)
// or a usage error (exit 2).
func TestSubcommandsChangeARunningProxy(t *testing.T) {
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t)})
	mustSub := func(want string, args ...string) string {
		t.Helper()
		code, out, errOut := pr.sub(nil, args...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("llmproxy %s: exit %d, want %q in\n%s%s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out
	}
	out := mustSub("ROUTE", "limits")
	for _, want := range []string{"default", "anthropic", "none"} {
		if !strings.Contains(out, want) {
			t.Errorf("limits lists no %q:\n%s", want, out)
		}
	}
	mustSub("rpm 600, concurrency 4, min gap 200ms (ceiling)", "limits", "default", "rpm=600", "concurrency=4", "min_gap=200ms")
	mustSub("by local at", "limits", "default")
	mustSub("rpm 600, min gap 200ms (start)", "limits", "default", "concurrency=none", "mode=start")
	if code, _, errOut := pr.sub(nil, "limits", "default", "rpm=lots"); code != 1 || !strings.Contains(errOut, "rpm") || !strings.Contains(errOut, "400") {
		t.Fatalf("a bad rpm: exit %d, %s", code, errOut)
	}
	if code, _, errOut := pr.sub(nil, "limits", "nope", "rpm=1"); code != 1 || !strings.Contains(errOut, `no route "nope"`) {
		t.Fatalf("an unknown route: exit %d, %s", code, errOut)
	}
	out = mustSub("default", "limits", "default", "reset")
	if strings.Contains(out, "rpm 600") || !strings.Contains(out, "none") {
		t.Fatalf("after reset:\n%s", out)
	}
	mustSub("hold: route default, by local at", "hold", "route", "default")
	answered := make(chan answer, 1)
	go func() { answered <- post(pr.proxy, "m") }()
	eventually(t, 5*time.Second, "the request queued", func() bool { q, _ := pr.underWay(t); return q == 1 })
	mustSub("held (route) since", "status")
	mustSub("route default: held by local since", "status")
	mustSub("release: route default", "release", "route", "default")
	if a := <-answered; a.status != 200 {
		t.Fatalf("after the release: %v", a)
	}
	lane := pr.lanes(t).Lanes[0].ID
	mustSub("clear: lane "+lane, "clear", "lane", lane)
	if code, _, errOut := pr.sub(nil, "hold", "lane", "abcdef012345"); code != 1 || !strings.Contains(errOut, "no lane abcdef012345") {
		t.Fatalf("an unknown lane: exit %d, %s", code, errOut)
	}
	for _, args := range [][]string{{"hold", "default"}, {"release", "route"}, {"clear", "key", "x"}, {"limits", "default", "rpm"}, {"limits", "-bogus"}} {
		if code, _, errOut := pr.sub(nil, args...); code != 2 || !strings.Contains(errOut, "usage:") {
			t.Errorf("llmproxy %s: exit %d, want 2 with the usage: %s", strings.Join(args, " "), code, errOut)
		}
	}
	for _, want := range []string{
		`msg="admin change" route=default op=limits by=local limits="600 rpm, concurrency 4, min gap 200ms, as ceiling"`,
		`msg="admin change" route=default op=hold by=local`, `msg="admin change" lane=` + lane + ` op=clear by=local`,
	} {
		if !strings.Contains(pr.logs.String(), want) {
			t.Errorf("the proxy's log lacks %s:\n%s", want, pr.logs)
		}
	}
}

// TestSubcommandsSendTheAdminToken: with an admin token the subcommands
// send LLMPROXY_ADMIN_TOKEN; without it, or with another, they say so.
func TestSubcommandsSendTheAdminToken(t *testing.T) {
	const token = "op-token-5e1f-0a9c2d"
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t), "LLMPROXY_ADMIN_TOKEN": token})
	sum := sha256.Sum256([]byte(token))
	code, out, errOut := pr.sub(map[string]string{"LLMPROXY_ADMIN_TOKEN": token}, "hold", "route", "anthropic")
	if code != 0 || !strings.Contains(out, "by token:"+hex.EncodeToString(sum[:4])) {
		t.Fatalf("with the token: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := pr.sub(nil, "release", "route", "anthropic"); code != 1 || !strings.Contains(errOut, "LLMPROXY_ADMIN_TOKEN is not set") {
		t.Fatalf("without the token: exit %d, %s", code, errOut)
	}
	if code, _, errOut := pr.sub(map[string]string{"LLMPROXY_ADMIN_TOKEN": "other-token-0123456789"}, "limits"); code != 1 || !strings.Contains(errOut, "LLMPROXY_ADMIN_TOKEN is not the proxy's") {
		t.Fatalf("with another token: exit %d, %s", code, errOut)
	}
	if strings.Contains(pr.logs.String(), token) {
		t.Fatal("the proxy logged the token")
	}
}

// TestSubcommandsNeedAProxy: no admin address, or one that does not
// answer, is exit 1 with a line that says so.
func TestSubcommandsNeedAProxy(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), nil, []string{"hold", "route", "default"}, map[string]string{"LLMPROXY_ADMIN_ADDR": ""}, &out, &errOut, nil); code != 1 || !strings.Contains(errOut.String(), "no admin address") {
		t.Fatalf("no admin address: exit %d, %s", code, errOut.String())
	}
	errOut.Reset()
	if code := run(context.Background(), nil, []string{"limits", "-admin", "127.0.0.1:1"}, nil, &out, &errOut, nil); code != 1 || !strings.Contains(errOut.String(), "cannot reach") {
		t.Fatalf("nobody there: exit %d, %s", code, errOut.String())
	}
}

// TestSettingValuesGoAsTheProxyReadsThem: numbers go as numbers, none or
// nothing as null, the rest as strings for the proxy to judge.
func TestSettingValuesGoAsTheProxyReadsThem(t *testing.T) {
	for in, want := range map[string]string{"600": "600", "1e3": "1e3", "none": "null", "NONE": "null", "": "null",
		"200ms": `"200ms"`, "start": `"start"`, "0x10": `"0x10"`, "Inf": `"Inf"`} {
		if got := string(settingValue(in)); got != want {
			t.Errorf("%q goes as %s, want %s", in, got, want)
		}
	}
	_, _, body, err := limitsOperation([]string{"default", "RPM=600", "min_gap=1s"})
	if err != nil || string(body) != `{"min_gap":"1s","rpm":600}` {
		t.Fatalf("body %s (%v)", body, err)
	}
}

// TestStatusShowsWhatOperatorsChanged: a held lane waits "held", a
// route changed at run time gets a line, and its limits say "(run
// time)".
func TestStatusShowsWhatOperatorsChanged(t *testing.T) {
	at := time.Date(2026, 11, 28, 14, 2, 0, 0, time.Local)
	var out bytes.Buffer
	printStatus(&out, lanesReply{
		Lanes: []lanequeue.State{{ID: "beef00000003", Path: "/v1/x", Held: "lane", HeldSince: at, Queued: 3,
			Configured: nil, RuntimeLimits: &lanequeue.RuntimeLimits{SetAt: at, By: "local"}}},
		Routes: []routeReply{{Route: "default", Limits: &limitsView{RPM: 600, Mode: "ceiling"}, Set: &byAt{By: "token:ab12cd34", At: at},
			Held: &byAt{By: "local", At: at}}},
	}, "http://127.0.0.1:9090", at)
	for _, want := range []string{"held (lane) since 14:02", "none (run time)",
		"route default: held by local since 14:02; rpm 600 (ceiling) set at run time by token:ab12cd34 at 14:02\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	printOperated(&out, "limits", []byte(`{"route":"default","limits":{"tpm":9000,"mode":"start"},"configured":{"mode":"ceiling"}}`))
	if s := out.String(); !strings.Contains(s, "default  tpm 9000 (start)  none") || !strings.Contains(s, "-") {
		t.Errorf("one route's limits:\n%s", s)
	}
}
