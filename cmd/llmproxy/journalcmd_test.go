package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/state"
)

// journalFile writes a state file in a test directory with run "alpha"'s
// two entries (a JSON answer and a stream) and run "beta"'s one, and
// returns its path, closed.
func journalFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	j, err := st.Journal(time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 5, 4, 10, 30, 0, 0, time.UTC)
	for i, e := range []*state.Entry{
		{Run: "alpha", Occurrence: 1, Path: "/v1/chat/completions", Model: "gpt-a", Status: 200,
			Request: []byte(`{"messages":[],"model":"gpt-a"}`), Body: []byte(`{"id":"one","choices":[]}`)},
		{Run: "alpha", Occurrence: 2, Path: "/v1/chat/completions", Model: "gpt-a", Status: 200, Stream: true,
			Request: []byte(`{"model":"gpt-a","stream":true}`), Body: []byte("data: {\"n\":1}\n\ndata: [DONE]\n\n")},
		{Run: "beta", Occurrence: 1, Path: "/v1/messages", Model: "claude-b", Status: 429,
			Request: []byte(`{"model":"claude-b"}`), Body: []byte(`{"error":{}}`)},
	} {
		e.Key[0], e.Key[1] = 0xfe, byte(i)
		e.RecordedAt = at.Add(time.Duration(i) * time.Minute)
		e.Header = http.Header{"Content-Type": {"application/json"}}
		if err := j.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// journalRun runs `llmproxy journal args...` with env and returns its
// exit code, stdout and stderr.
func journalRun(env map[string]string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), nil, append([]string{"journal"}, args...), env, &out, &errOut, nil)
	return code, out.String(), errOut.String()
}

// exportedLines reads export's output back, a JSON object a line.
func exportedLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("export line %d is not a JSON object: %v\n%s", len(lines)+1, err, sc.Text())
		}
		lines = append(lines, m)
	}
	return lines
}

// TestJournalCommandReadsAndPrunesTheFile: with no proxy holding the
// state file, ls lists its runs and totals, show an entry a line, export
// the entries as JSON lines, and rm removes a run, then every entry.
func TestJournalCommandReadsAndPrunesTheFile(t *testing.T) {
	env := map[string]string{"LLMPROXY_STATE": journalFile(t), "LLMPROXY_ADMIN_ADDR": ""}
	code, out, errOut := journalRun(env, "ls")
	if code != 0 || errOut != "" {
		t.Fatalf("ls: exit %d: %s", code, errOut)
	}
	first := time.Date(2026, 5, 4, 10, 30, 0, 0, time.UTC).Local().Format("2006-01-02 15:04:05")
	for _, want := range []string{"RUN", "alpha  2", "beta   1", first, "total: 2 runs, 3 entries"} {
		if !strings.Contains(out, want) {
			t.Errorf("ls lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = journalRun(env, "show", "alpha")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(rows) != 3 || !strings.Contains(rows[1], "fe0000000000") || !strings.Contains(rows[2], "fe0100000000") ||
		!strings.Contains(rows[2], "yes") || !strings.Contains(rows[1], "gpt-a") || strings.Contains(out, "choices") {
		t.Fatalf("show alpha: exit %d\n%s", code, out)
	}
	if code, out, _ = journalRun(env, "show"); code != 0 || !strings.HasPrefix(out, "RUN") || !strings.Contains(out, "claude-b") {
		t.Fatalf("show: exit %d\n%s", code, out)
	}
	code, out, _ = journalRun(env, "export")
	lines := exportedLines(t, out)
	if code != 0 || len(lines) != 3 {
		t.Fatalf("export: exit %d, %d lines\n%s", code, len(lines), out)
	}
	if a, ok := lines[0]["answer"].(map[string]any); !ok || a["id"] != "one" || lines[0]["key"] != "fe0000000000" || lines[0]["recorded_at"] != "2026-05-04T10:30:00Z" {
		t.Errorf("the first entry: %v", lines[0])
	}
	if lines[1]["answer"] != "data: {\"n\":1}\n\ndata: [DONE]\n\n" || lines[1]["stream"] != true {
		t.Errorf("the stream: %v", lines[1])
	}
	if r, ok := lines[2]["request"].(map[string]any); !ok || r["model"] != "claude-b" || lines[2]["status"] != 429.0 {
		t.Errorf("beta's entry: %v", lines[2])
	}
	if code, out, _ = journalRun(env, "export", "beta"); code != 0 || len(exportedLines(t, out)) != 1 {
		t.Fatalf("export beta: exit %d\n%s", code, out)
	}
	if code, out, _ = journalRun(env, "rm", "alpha"); code != 0 || out != "removed 2 entries of run alpha\n" {
		t.Fatalf("rm alpha: exit %d, %q", code, out)
	}
	if _, out, _ = journalRun(env, "ls"); strings.Contains(out, "alpha") || !strings.Contains(out, "total: 1 runs, 1 entries") {
		t.Fatalf("ls after rm alpha:\n%s", out)
	}
	if code, out, _ = journalRun(env, "rm", "--all"); code != 0 || out != "removed 1 entry, every run's\n" {
		t.Fatalf("rm --all: exit %d, %q", code, out)
	}
}

// TestJournalCommandSaysWhatItNeeds: rm without a run, an unknown verb
// or stray arguments are usage errors (2), as is no LLMPROXY_STATE; a
// state file that is not there is exit 1, and is not made.
func TestJournalCommandSaysWhatItNeeds(t *testing.T) {
	env := map[string]string{"LLMPROXY_STATE": journalFile(t)}
	for _, args := range [][]string{{"rm"}, {"rm", "a", "b"}, {"rm", "a", "-all"}, {}, {"nope"}, {"ls", "x"}, {"show", "a", "b"}, {"export", "-all"}, {"-bogus", "ls"}} {
		code, _, errOut := journalRun(env, args...)
		if code != 2 || !strings.Contains(errOut, "usage:") {
			t.Errorf("journal %s: exit %d, want 2 with the usage: %s", strings.Join(args, " "), code, errOut)
		}
	}
	if _, _, errOut := journalRun(env, "rm"); !strings.Contains(errOut, "journal rm RUN") || !strings.Contains(errOut, "journal rm -all") {
		t.Errorf("rm without a run does not say what to do: %s", errOut)
	}
	if code, _, errOut := journalRun(nil, "ls"); code != 2 || !strings.Contains(errOut, "LLMPROXY_STATE is not set") {
		t.Errorf("no LLMPROXY_STATE: exit %d, %s", code, errOut)
	}
	missing := filepath.Join(t.TempDir(), "none.db")
	if code, _, errOut := journalRun(map[string]string{"LLMPROXY_STATE": missing}, "ls"); code != 1 || !strings.Contains(errOut, "LLMPROXY_STATE") {
		t.Errorf("a missing file: exit %d, %s", code, errOut)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("ls made the state file")
	}
}

// TestJournalCommandGoesThroughTheRunningProxy: while a proxy holds the
// state file, ls, show, export and rm reach its journal through its
// admin listener, sending the admin token; without the token they say
// so; with no admin address they say that.
func TestJournalCommandGoesThroughTheRunningProxy(t *testing.T) {
	const token = "journal-token-7c1e-55aa90"
	path := journalFile(t)
	pr := startProgram(t, map[string]string{"LLMPROXY_UPSTREAM": okUpstream(t), "LLMPROXY_STATE": path,
		"LLMPROXY_JOURNAL": "record", "LLMPROXY_ADMIN_TOKEN": token,
		"LLMPROXY_JOURNAL_TTL": "0"}) // journalFile's entries are of a fixed day: the sweep would take them
	req, _ := http.NewRequest("POST", "http://"+pr.proxy+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-live"}`))
	req.Header.Set("Authorization", "Bearer sk-journal-secret")
	req.Header.Set("X-Llmproxy-Run", "live")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	env := map[string]string{"LLMPROXY_STATE": path, "LLMPROXY_ADMIN_ADDR": pr.admin, "LLMPROXY_ADMIN_TOKEN": token}
	eventually(t, 5*time.Second, "the live run recorded", func() bool {
		_, out, _ := journalRun(env, "ls")
		return strings.Contains(out, "total: 3 runs, 4 entries")
	})
	code, out, errOut := journalRun(env, "ls")
	if code != 0 || !strings.Contains(out, "live") || !strings.Contains(errOut, "asking the proxy at http://"+pr.admin) {
		t.Fatalf("ls through the proxy: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = journalRun(env, "export", "live")
	lines := exportedLines(t, out)
	if code != 0 || len(lines) != 1 || lines[0]["model"] != "gpt-live" || strings.Contains(out, "sk-journal-secret") {
		t.Fatalf("export live through the proxy: exit %d\n%s", code, out)
	}
	if a, ok := lines[0]["answer"].(map[string]any); !ok || a["ok"] != true {
		t.Errorf("the live answer: %v", lines[0])
	}
	if code, out, _ = journalRun(env, "show", "alpha"); code != 0 || strings.Count(out, "fe0") != 2 {
		t.Fatalf("show alpha through the proxy: exit %d\n%s", code, out)
	}
	if code, out, errOut = journalRun(env, "rm", "alpha"); code != 0 || out != "removed 2 entries of run alpha\n" {
		t.Fatalf("rm alpha through the proxy: exit %d, %q %s", code, out, errOut)
	}
	noToken := map[string]string{"LLMPROXY_STATE": path, "LLMPROXY_ADMIN_ADDR": pr.admin}
	if code, _, errOut := journalRun(noToken, "export"); code != 1 || !strings.Contains(errOut, "LLMPROXY_ADMIN_TOKEN is not set") {
		t.Fatalf("export without the token: exit %d, %s", code, errOut)
	}
	if code, _, errOut := journalRun(noToken, "ls"); code != 1 || !strings.Contains(errOut, "LLMPROXY_ADMIN_TOKEN is not set") {
		t.Fatalf("ls without the token: exit %d, %s", code, errOut)
	}
	noAdmin := map[string]string{"LLMPROXY_STATE": path, "LLMPROXY_ADMIN_ADDR": ""}
	if code, _, errOut := journalRun(noAdmin, "ls"); code != 1 || !strings.Contains(errOut, "no admin address") {
		t.Fatalf("no admin address: exit %d, %s", code, errOut)
	}
	if strings.Contains(pr.logs.String(), "sk-journal-secret") {
		t.Fatal("the proxy logged the API key")
	}
}
