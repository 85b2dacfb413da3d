package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// The subcommands that change a running proxy's lanes, through its admin
// endpoints (/admin/...), sending LLMPROXY_ADMIN_TOKEN when set:
//
//	llmproxy limits [ROUTE [reset | SETTING=VALUE ...]]
//	llmproxy hold|release|clear route ROUTE
//	llmproxy hold|release|clear lane LANE
const operateUsage = `usage:
  llmproxy limits [-admin ADDR]                         every route's limits and holds
  llmproxy limits [-admin ADDR] ROUTE                   one route's
  llmproxy limits [-admin ADDR] ROUTE SETTING=VALUE...  change them: rpm, tpm, concurrency,
                                                        min_gap (200ms), mode (ceiling or start);
                                                        a setting left out stays, =0 or =none clears it
  llmproxy limits [-admin ADDR] ROUTE reset             back to its LLMPROXY_ROUTE_<NAME>_* settings
  llmproxy hold|release|clear [-admin ADDR] route ROUTE
  llmproxy hold|release|clear [-admin ADDR] lane LANE
ROUTE is a route's name, or default for LLMPROXY_UPSTREAM; LANE a lane's ID
as llmproxy status shows it. Changes last until the proxy stops.
`

// operate runs the subcommand cmd (limits, hold, release or clear) with
// args against the admin listener (defaultAdmin unless -admin), and
// returns the exit code: 0 done, 1 the proxy refused or was not reached,
// 2 a usage error.
func operate(ctx context.Context, cmd string, args []string, defaultAdmin, token string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, operateUsage) }
	admin := fs.String("admin", defaultAdmin, "admin address of the running proxy (default: LLMPROXY_ADMIN_ADDR)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	method, path, body, err := operation(cmd, fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "llmproxy: %s: %v\n%s", cmd, err, operateUsage)
		return 2
	}
	if *admin == "" {
		fmt.Fprintf(stderr, "llmproxy: %s: no admin address (LLMPROXY_ADMIN_ADDR is empty; use -admin)\n", cmd)
		return 1
	}
	reply, err := ask(ctx, method, adminURL(*admin)+path, body, token)
	if err != nil {
		fmt.Fprintf(stderr, "llmproxy: %s: %v\n", cmd, err)
		return 1
	}
	printOperated(stdout, cmd, reply)
	return 0
}

// operation is the request that args of cmd ask for: method, path and a
// JSON body (nil: none).
func operation(cmd string, args []string) (method, path string, body []byte, err error) {
	if cmd == "limits" {
		return limitsOperation(args)
	}
	if len(args) != 2 || args[0] != "route" && args[0] != "lane" {
		return "", "", nil, fmt.Errorf("want route ROUTE or lane LANE, not %q", strings.Join(args, " "))
	}
	return http.MethodPost, "/admin/" + args[0] + "s/" + args[1] + "/" + cmd, nil, nil
}

// limitsOperation is the request of `llmproxy limits` with args.
func limitsOperation(args []string) (method, path string, body []byte, err error) {
	switch {
	case len(args) == 0:
		return http.MethodGet, "/admin/routes", nil, nil
	case len(args) == 1:
		return http.MethodGet, "/admin/routes/" + args[0] + "/limits", nil, nil
	case len(args) == 2 && args[1] == "reset":
		return http.MethodDelete, "/admin/routes/" + args[0] + "/limits", nil, nil
	}
	fields := map[string]json.RawMessage{}
	for _, a := range args[1:] {
		name, value, ok := strings.Cut(a, "=")
		if !ok || name == "" {
			return "", "", nil, fmt.Errorf("%q is not SETTING=VALUE", a)
		}
		fields[strings.ToLower(name)] = settingValue(value)
	}
	body, _ = json.Marshal(fields)
	return http.MethodPut, "/admin/routes/" + args[0] + "/limits", body, nil
}

// settingValue is a setting's value as the endpoint takes it: null for
// "none" or nothing, a number as it is, anything else a string (the
// proxy says what it cannot use, naming the setting).
func settingValue(v string) json.RawMessage {
	if v == "" || strings.EqualFold(v, "none") {
		return json.RawMessage("null")
	}
	if _, err := strconv.ParseFloat(v, 64); err == nil && json.Valid([]byte(v)) {
		return json.RawMessage(v)
	}
	b, _ := json.Marshal(v)
	return b
}

// ask sends method url with body to the admin listener and returns the
// body of its 200; any other answer is an error, in the proxy's words.
func ask(ctx context.Context, method, url string, body []byte, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return b, nil
	}
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	msg := resp.Status
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		msg = strings.TrimPrefix(e.Error.Message, "llmproxy: ")
	}
	if resp.StatusCode == http.StatusUnauthorized {
		msg += " (LLMPROXY_ADMIN_TOKEN " + map[bool]string{true: "is not set", false: "is not the proxy's"}[token == ""] + ")"
	}
	return nil, fmt.Errorf("%s %s: %d: %s", method, url, resp.StatusCode, msg)
}

// routeReply is a route's limits and hold as /admin/routes answers them.
type routeReply struct {
	Route      string      `json:"route"`
	Limits     *limitsView `json:"limits"`
	Configured *limitsView `json:"configured"`
	Set        *byAt       `json:"set"`
	Held       *byAt       `json:"held"`
}

type limitsView struct {
	RPM         float64 `json:"rpm"`
	TPM         float64 `json:"tpm"`
	Concurrency int     `json:"concurrency"`
	MinGap      string  `json:"min_gap"`
	Mode        string  `json:"mode"`
}

type byAt struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// String is the limits in words: "rpm 600, concurrency 4 (ceiling)";
// "none".
func (l *limitsView) String() string {
	if l == nil {
		return "none"
	}
	var parts []string
	if l.RPM > 0 {
		parts = append(parts, "rpm "+strconv.FormatFloat(l.RPM, 'g', -1, 64))
	}
	if l.TPM > 0 {
		parts = append(parts, "tpm "+strconv.FormatFloat(l.TPM, 'g', -1, 64))
	}
	if l.Concurrency > 0 {
		parts = append(parts, "concurrency "+strconv.Itoa(l.Concurrency))
	}
	if l.MinGap != "" {
		parts = append(parts, "min gap "+l.MinGap)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ") + " (" + l.Mode + ")"
}

// printOperated writes what the proxy answered cmd: the routes' limits
// for limits, else the change made.
func printOperated(w io.Writer, cmd string, reply []byte) {
	if cmd != "limits" {
		var c struct {
			Route, Lane, Op, By string
			At                  time.Time
		}
		_ = json.Unmarshal(reply, &c)
		target := "route " + c.Route
		if c.Lane != "" {
			target = "lane " + c.Lane
		}
		fmt.Fprintf(w, "%s: %s, by %s at %s\n", c.Op, target, c.By, c.At.Local().Format("15:04:05"))
		return
	}
	var all struct{ Routes []routeReply }
	if json.Unmarshal(reply, &all) != nil || all.Routes == nil {
		var one routeReply
		_ = json.Unmarshal(reply, &one)
		all.Routes = []routeReply{one}
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tLIMITS\tCONFIGURED\tSET AT RUN TIME\tHELD\t")
	for _, r := range all.Routes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", r.Route, r.Limits, r.Configured, since(r.Set, "by"), since(r.Held, "held by"))
	}
	tw.Flush()
}

// since says who and when: "by local at 14:02"; "-" for nobody.
func since(m *byAt, what string) string {
	if m == nil {
		return "-"
	}
	return what + " " + m.By + " at " + m.At.Local().Format("15:04")
}
