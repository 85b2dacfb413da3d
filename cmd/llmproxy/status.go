package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/proxy"
	"github.com/llmproxy/llmproxy/state"
)

// adminURL is the base URL of an admin listener address; a wildcard host
// is asked on loopback.
func adminURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, ""
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if port == "" {
		return "http://" + host
	}
	return "http://" + net.JoinHostPort(host, port)
}

// lanesReply is what /lanes answers.
type lanesReply struct {
	Redis string            `json:"redis"`
	Total int               `json:"total"` // lanes in the table; Lanes is the busiest page
	Lanes []lanequeue.State `json:"lanes"`
	// Global is LLMPROXY_GLOBAL_CONCURRENCY's state, when it is set.
	Global *lanequeue.CapStats `json:"global"`
	// LocalRoutes are the local routes' model gates.
	LocalRoutes []lanequeue.GateStats `json:"local_routes"`
	// Routes are the routes an operator changed: limits set, or held.
	Routes []routeReply `json:"routes"`
	// Runs are the runs (x-llmproxy-run) of the last day; LaneSpend
	// what the lanes spent.
	Runs      []runReply       `json:"runs"`
	LaneSpend []laneSpendReply `json:"lane_spend"`
	// Journal is the state file's journal, when there is one.
	Journal *state.Stats `json:"journal"`
}

// runReply is a run's row in /lanes.
type runReply struct {
	Name         string            `json:"name"`
	Key          string            `json:"key"`
	Requests     int               `json:"requests"`
	Failures     int               `json:"failures"`
	InputTokens  int64             `json:"input_tokens"`
	OutputTokens int64             `json:"output_tokens"`
	FlexRefusals int               `json:"flex_refusals"`
	CostUSD      string            `json:"cost_usd"`
	ByTier       map[string]string `json:"cost_by_tier_usd"`
	BudgetUSD    string            `json:"budget_usd"`
	Last         time.Time         `json:"last"`
}

// laneSpendReply is a lane's spend in /lanes.
type laneSpendReply struct {
	Lane    string `json:"lane"`
	CostUSD string `json:"cost_usd"`
}

// status prints the lane table of a running proxy, once or (-w) every
// interval until ctx ends, sending token (LLMPROXY_ADMIN_TOKEN) when set.
// It returns 1 when the proxy cannot be reached.
func status(ctx context.Context, args []string, defaultAdmin, token string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", defaultAdmin, "admin address of the running proxy (default: LLMPROXY_ADMIN_ADDR)")
	watch := fs.Bool("w", false, "refresh in place until interrupted")
	every := fs.Duration("interval", 2*time.Second, "refresh interval with -w")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *admin == "" {
		fmt.Fprintln(stderr, "llmproxy: status: no admin address (LLMPROXY_ADMIN_ADDR is empty; use -admin)")
		return 1
	}
	base := adminURL(*admin)
	client := &http.Client{Timeout: 3 * time.Second}
	for {
		reply, err := fetchLanes(ctx, client, base, token)
		if err != nil {
			if *watch && ctx.Err() != nil {
				return 0 // interrupted while refreshing: that is how -w ends
			}
			fmt.Fprintln(stderr, "llmproxy: status:", err)
			return 1
		}
		if *watch {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home and clear: refresh in place
		}
		printStatus(stdout, reply, base, time.Now())
		if !*watch {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*every):
		}
	}
}

func fetchLanes(ctx context.Context, c *http.Client, base, token string) (lanesReply, error) {
	var r lanesReply
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/lanes", nil)
	if err != nil {
		return r, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return r, fmt.Errorf("cannot reach %s: %w", base, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized && token == "":
		return r, fmt.Errorf("%s/lanes answered %s: the proxy has an admin token; set LLMPROXY_ADMIN_TOKEN to it", base, resp.Status)
	case resp.StatusCode == http.StatusUnauthorized:
		return r, fmt.Errorf("%s/lanes answered %s: LLMPROXY_ADMIN_TOKEN is not the proxy's admin token", base, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return r, fmt.Errorf("%s/lanes answered %s", base, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&r); err != nil {
		return r, fmt.Errorf("%s/lanes: %w", base, err)
	}
	return r, nil
}

// printStatus writes one line per lane, busiest first: where it goes, how
// far it got, why it waits, and what its group believes limits it and why.
func printStatus(w io.Writer, r lanesReply, base string, now time.Time) {
	shared := r.Redis
	if shared == "" {
		shared = "off"
	}
	lanes := strconv.Itoa(len(r.Lanes))
	if r.Total > len(r.Lanes) {
		lanes = fmt.Sprintf("%d busiest of %d", len(r.Lanes), r.Total)
	}
	fmt.Fprintf(w, "llmproxy at %s  %s lanes  redis: %s  %s\n", base, lanes, shared, now.Format("15:04:05"))
	if g := r.Global; g != nil {
		fmt.Fprintf(w, "global cap: %d/%d in use, %d groups waiting, at most %d so far\n", g.InUse, g.Limit, g.Waiting, g.Most)
	}
	for _, lr := range r.LocalRoutes {
		fmt.Fprintf(w, "local route /%s: %s loaded, %d in flight, %d waiting for their model, %d swaps, %d avoided\n",
			lr.Route, orDash(lr.Loaded), lr.InFlight, lr.Waiting, lr.Swaps, lr.SwapsAvoided)
	}
	for _, rt := range r.Routes {
		var parts []string
		if rt.Held != nil {
			parts = append(parts, "held by "+rt.Held.By+" since "+rt.Held.At.Local().Format("15:04"))
		}
		if rt.Set != nil {
			parts = append(parts, rt.Limits.String()+" set at run time "+since(rt.Set, "by"))
		}
		fmt.Fprintf(w, "route %s: %s\n", rt.Route, strings.Join(parts, "; "))
	}
	fmt.Fprintln(w)
	sort.SliceStable(r.Lanes, func(i, j int) bool {
		a, b := r.Lanes[i], r.Lanes[j]
		if a.Queued+a.InFlight != b.Queued+b.InFlight {
			return a.Queued+a.InFlight > b.Queued+b.InFlight
		}
		return a.LastUsed.After(b.LastUsed)
	})
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tROUTE\tPATH\tMODEL\tKEY\tQUEUED\tIN FLIGHT\tLIMIT\tDONE\tFAILED\t429s ABSORBED\tREQ/S\tTOK/S\tDRAINS IN\tWAITING\tCONFIGURED\tBELIEVES\t")
	for _, s := range r.Lanes {
		route := s.Route
		if route == "" {
			route = "-"
		}
		queued := strconv.Itoa(s.Queued)
		if s.QueuedLow > 0 {
			queued += fmt.Sprintf(" (%d low)", s.QueuedLow)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			s.ID, route, s.Path, orDash(short(s.Model, 32)), orDash(s.KeyHash), queued, s.InFlight, s.Concurrency,
			s.Outcomes[string(proxy.OutcomeOK)], failed(s), s.Absorbed429, rate(s.RequestsPerSecond), rate(s.TokensPerSecond),
			drainsIn(s), waiting(s, now), orDash(configured(s)), orDash(believes(s)))
	}
	tw.Flush()
	for _, s := range r.Lanes {
		if n := notes(s); n != "" {
			fmt.Fprintf(w, "%s: %s\n", s.ID, n)
		}
	}
	printSpend(w, r)
	printJournal(w, r.Journal)
}

// printJournal writes the journal's size, when there is one.
func printJournal(w io.Writer, j *state.Stats) {
	if j == nil {
		return
	}
	bound := "no bound"
	if j.MaxBytes > 0 {
		bound = fmt.Sprintf("of %.1f MiB", float64(j.MaxBytes)/(1<<20))
	}
	fmt.Fprintf(w, "\njournal: %d answers, %.1f MiB %s (file %.1f MiB)\n", j.Entries, float64(j.Bytes)/(1<<20), bound, float64(j.FileBytes)/(1<<20))
}

// printSpend writes the runs' rows, and what the lanes spent, when there
// are any.
func printSpend(w io.Writer, r lanesReply) {
	if len(r.LaneSpend) > 0 {
		var parts []string
		for _, l := range r.LaneSpend {
			parts = append(parts, l.Lane+" $"+l.CostUSD)
		}
		fmt.Fprintf(w, "\nspend by lane: %s\n", strings.Join(parts, ", "))
	}
	if len(r.Runs) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tKEY\tREQUESTS\tFAILED\tTOKENS IN\tTOKENS OUT\tCOST\tBY TIER\tBUDGET\tFLEX REFUSALS\tLAST\t")
	for _, run := range r.Runs {
		tiers := make([]string, 0, len(run.ByTier))
		for t, c := range run.ByTier {
			tiers = append(tiers, t+" $"+c)
		}
		sort.Strings(tiers)
		budget := "-"
		if run.BudgetUSD != "" {
			budget = "$" + run.BudgetUSD
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t$%s\t%s\t%s\t%d\t%s\t\n", short(run.Name, 32), run.Key, run.Requests, run.Failures,
			run.InputTokens, run.OutputTokens, run.CostUSD, orDash(strings.Join(tiers, ", ")), budget, run.FlexRefusals, run.Last.Local().Format("15:04:05"))
	}
	tw.Flush()
}

// notes says, for a line under the table, what a lane has beyond its
// row: a spent quota, its WebSocket sessions, this replica's share of the
// shared limits while Redis is away, and its clients' queues; "" when
// none.
func notes(s lanequeue.State) string {
	var parts []string
	if s.Quota != "" {
		parts = append(parts, s.Quota)
	}
	if s.Sessions > 0 {
		parts = append(parts, plural(s.Sessions, "WebSocket session"))
	}
	if sh := s.Share; sh != nil {
		share := fmt.Sprintf("Redis away: this replica keeps to 1/%d of the shared limits, concurrency %d", sh.Replicas, sh.Concurrency)
		if sh.RequestsPerSecond > 0 {
			share += ", " + perSecond(sh.RequestsPerSecond)
		}
		if sh.TokensPerSecond > 0 {
			share += ", tokens " + perSecond(sh.TokensPerSecond)
		}
		parts = append(parts, share)
	}
	if len(s.Clients) > 0 {
		var cs []string
		for _, c := range s.Clients {
			cs = append(cs, fmt.Sprintf("%s %d queued, %d sent", short(c.Name, 32), c.Queued, c.Dispatched))
		}
		parts = append(parts, "clients: "+strings.Join(cs, "; "))
	}
	return strings.Join(parts, "; ")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// configured is what the lane's route configures: "600rpm c8 gap50ms
// ceiling", and "(run time)" when an operator set it; "" when nothing.
func configured(s lanequeue.State) string {
	c := s.Configured
	if c == nil {
		if s.RuntimeLimits != nil {
			return "none (run time)"
		}
		return ""
	}
	var parts []string
	if c.RPM > 0 {
		parts = append(parts, strconv.FormatFloat(c.RPM, 'g', -1, 64)+"rpm")
	}
	if c.TPM > 0 {
		parts = append(parts, strconv.FormatFloat(c.TPM, 'g', -1, 64)+"tpm")
	}
	if c.Concurrency > 0 {
		parts = append(parts, "c"+strconv.Itoa(c.Concurrency))
	}
	if c.MinGapSecs > 0 {
		parts = append(parts, "gap"+time.Duration(c.MinGapSecs*float64(time.Second)).String())
	}
	if s.RuntimeLimits != nil {
		parts = append(parts, c.Mode, "(run time)")
		return strings.Join(parts, " ")
	}
	return strings.Join(append(parts, c.Mode), " ")
}

// failed counts the lane's answers that failed (see proxy.Outcome.Failed).
func failed(s lanequeue.State) int64 {
	var n int64
	for outcome, c := range s.Outcomes {
		if proxy.Outcome(outcome).Failed() {
			n += c
		}
	}
	return n
}

func rate(r float64) string {
	if r <= 0 {
		return "-"
	}
	return strconv.FormatFloat(r, 'g', 3, 64)
}

// believes says in words what the lane's group believes limits it and
// why: its request rate and where that comes from, its concurrency limit
// when the upstream showed one, which of the two binds, and whether
// refusals overruled the headers. "" while it believes nothing.
func believes(s lanequeue.State) string {
	var parts []string
	from := s.RateFrom
	if from == "" {
		from = s.Learned // a proxy that does not say more
	}
	switch from {
	case "":
	case "headers":
		switch {
		case s.RequestsPerSecond > 0:
			parts = append(parts, "rate "+perSecond(s.RequestsPerSecond)+" from headers")
		case s.TokensPerSecond > 0:
			parts = append(parts, "tokens "+perSecond(s.TokensPerSecond)+" from headers")
		default:
			parts = append(parts, "limits from headers")
		}
	default: // learned from behaviour: what the upstream admitted
		r := s.AdmittedRate
		if r <= 0 {
			r = s.RequestsPerSecond
		}
		if r > 0 {
			parts = append(parts, "rate "+perSecond(r)+" learned from "+from)
		} else {
			parts = append(parts, "rate learned from "+from)
		}
	}
	conc := "concurrency " + strconv.Itoa(s.Concurrency)
	switch c := s.ConcurrencyFrom; {
	case c == "":
	case c == "words":
		parts = append(parts, conc+" named by the upstream")
	case strings.HasPrefix(c, "refusals"):
		parts = append(parts, conc+" learned from "+c)
	default:
		parts = append(parts, conc+" from "+c)
	}
	if s.Bound != "" {
		parts = append(parts, "bound: "+s.Bound)
	}
	if s.Corrected {
		parts = append(parts, "corrected by refusals")
	}
	if s.Shape != "" {
		parts = append(parts, s.Shape)
	}
	if len(s.SharesLimitWith) > 0 {
		parts = append(parts, sharesWith(s.SharesLimitWith, s.SharesLimitWithMore, s.SharedBecause))
	}
	return strings.Join(parts, ", ")
}

// sharesWith says which other models draw on a lane's limit and why:
// "shares a limit with gpt-4o, gpt-4.1 (headers move together)", or with
// more than three (those named and more not named) "with 5 other
// models".
func sharesWith(models []string, more int, because string) string {
	with := strings.Join(models, ", ")
	if n := len(models) + more; n > 3 {
		with = strconv.Itoa(n) + " other models"
	}
	s := "shares a limit with " + with
	if because != "" {
		s += " (" + because + ")"
	}
	return s
}

// perSecond writes a rate with three significant digits at most, as
// 19.6/s, 0.05/s or 1234/s.
func perSecond(r float64) string {
	if r >= 999.5 {
		return strconv.FormatFloat(r, 'f', 0, 64) + "/s"
	}
	return strconv.FormatFloat(r, 'g', 3, 64) + "/s"
}

// drainsIn is the proxy's estimate of when the lane's pool has sent
// what waits now.
func drainsIn(s lanequeue.State) string {
	if s.Queued == 0 {
		return "-"
	}
	if s.DrainSeconds <= 0 {
		return "?"
	}
	return (time.Duration(s.DrainSeconds * float64(time.Second))).Round(time.Second).String()
}

func waiting(s lanequeue.State, now time.Time) string {
	if s.Held != "" {
		return "held (" + s.Held + ") since " + s.HeldSince.Local().Format("15:04")
	}
	if s.PausedUntil.IsZero() || !s.PausedUntil.After(now) {
		return "-"
	}
	why := s.PauseReason
	if why == "" {
		why = "paused"
	}
	return why + " " + s.PausedUntil.Sub(now).Round(100*time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// short cuts s to n runes with an ellipsis.
func short(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return strings.TrimSpace(s)
}

// healthcheck asks the admin listener's /healthz; it is the container's
// HEALTHCHECK, since the image has no shell or curl.
func healthcheck(adminAddr string, stderr io.Writer) int {
	if adminAddr == "" {
		fmt.Fprintln(stderr, "llmproxy: healthcheck: LLMPROXY_ADMIN_ADDR is empty")
		return 1
	}
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(adminURL(adminAddr) + "/healthz")
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy: healthcheck:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(stderr, "llmproxy: healthcheck: status", resp.StatusCode)
		return 1
	}
	return 0
}
