package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmproxy/llmproxy/state"
)

// `llmproxy journal` reads and prunes the journal in LLMPROXY_STATE's
// file. It opens the file itself; while a proxy holds it (one process
// at a time), it asks that proxy's admin listener instead (/journal,
// sending LLMPROXY_ADMIN_TOKEN when set).
const journalUsage = `usage:
  llmproxy journal [-admin ADDR] ls             the runs kept: entries, bytes, first and last
                                                recorded; then the totals
  llmproxy journal [-admin ADDR] show [RUN]     an entry a line: occurrence, time, path, model,
                                                stream, status, key (12 hex digits of its hash),
                                                request and answer bytes
  llmproxy journal [-admin ADDR] export [RUN]   the entries as JSON lines, with their requests and
                                                answers, to stdout
  llmproxy journal [-admin ADDR] rm RUN | -all  remove a run's entries, or every entry
The journal is LLMPROXY_STATE's file. While a proxy has it open, these ask
that proxy's admin listener (LLMPROXY_ADMIN_ADDR, or -admin ADDR).
`

// journalLockWait is how long the subcommand waits for the state file
// before it asks the proxy that holds it.
const journalLockWait = 100 * time.Millisecond

// journalOverview is the journal's size and runs, as GET /journal
// answers them.
type journalOverview struct {
	Stats state.Stats      `json:"stats"`
	Runs  []state.RunStats `json:"runs"`
}

// journalSource is where the subcommand finds the journal: the state
// file, or the running proxy that holds it.
type journalSource interface {
	overview() (journalOverview, error)
	// lines writes run's entries ("": every run's) as JSON lines: what
	// is "show" (state.Summary) or "export".
	lines(what, run string, w io.Writer) error
	// remove removes run's entries ("": every entry).
	remove(run string) (int, error)
}

// journalCommand runs `llmproxy journal args` and returns the exit code:
// 0 done, 1 the journal could not be read or changed, 2 a usage error or
// no LLMPROXY_STATE.
func journalCommand(ctx context.Context, args []string, cfg config, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("journal", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, journalUsage) }
	admin := fs.String("admin", cfg.AdminAddr, "admin address of the proxy that holds the state file (default: LLMPROXY_ADMIN_ADDR)")
	all := fs.Bool("all", false, "rm: every entry")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	verb := fs.Arg(0)
	if verb != "" {
		if err := fs.Parse(fs.Args()[1:]); err != nil { // the flags after the verb
			return 2
		}
	}
	run, err := journalArgs(verb, fs.Args(), *all)
	if err != nil {
		fmt.Fprintf(stderr, "llmproxy: journal: %v\n%s", err, journalUsage)
		return 2
	}
	if cfg.State == "" {
		fmt.Fprintln(stderr, "llmproxy: journal: LLMPROXY_STATE is not set: set it to the state file that keeps the journal")
		return 2
	}
	src, closeSrc, err := openJournal(ctx, cfg, *admin, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "llmproxy: journal:", err)
		return 1
	}
	defer closeSrc()
	if err := journalDo(src, verb, run, stdout); err != nil {
		fmt.Fprintf(stderr, "llmproxy: journal %s: %v\n", verb, err)
		return 1
	}
	return 0
}

// journalArgs checks the arguments of verb, and returns the run they
// name ("": every run).
func journalArgs(verb string, rest []string, all bool) (string, error) {
	if all && verb != "rm" {
		return "", errors.New("-all goes with rm")
	}
	switch verb {
	case "ls":
		if len(rest) == 0 {
			return "", nil
		}
		return "", errors.New("ls takes no arguments")
	case "show", "export":
		if len(rest) <= 1 {
			return strings.Join(rest, ""), nil
		}
		return "", fmt.Errorf("%s takes one RUN at most", verb)
	case "rm":
		switch {
		case all && len(rest) == 0:
			return "", nil
		case !all && len(rest) == 1 && rest[0] != "":
			return rest[0], nil
		}
		return "", errors.New("say which entries go: journal rm RUN for a run's (journal ls lists the runs), or journal rm -all for every one")
	case "":
		return "", errors.New("want ls, show, export or rm")
	}
	return "", fmt.Errorf("unknown %q: want ls, show, export or rm", verb)
}

// openJournal opens cfg's state file, or, while another process holds
// it, says so on stderr and asks the proxy at admin.
func openJournal(ctx context.Context, cfg config, admin string, stderr io.Writer) (journalSource, func(), error) {
	if _, err := os.Stat(cfg.State); err != nil {
		return nil, nil, fmt.Errorf("LLMPROXY_STATE: %w (a proxy makes the file when it starts with it)", err)
	}
	st, err := state.OpenTimeout(cfg.State, journalLockWait)
	switch {
	case errors.Is(err, state.ErrLocked):
		if admin == "" {
			return nil, nil, fmt.Errorf("%v (a running proxy?), and there is no admin address to ask it (LLMPROXY_ADMIN_ADDR is empty; use -admin)", err)
		}
		base := adminURL(admin)
		fmt.Fprintf(stderr, "llmproxy: journal: %s is open in another process; asking the proxy at %s\n", cfg.State, base)
		return adminJournal{ctx: ctx, base: base, token: cfg.AdminToken}, func() {}, nil
	case err != nil:
		return nil, nil, err
	}
	j, err := st.Journal(cfg.JournalTTL, cfg.JournalMaxBytes)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return fileJournal{j}, func() { st.Close() }, nil
}

// journalDo does verb on run ("": every run) and writes what it found.
func journalDo(src journalSource, verb, run string, stdout io.Writer) error {
	switch verb {
	case "ls":
		o, err := src.overview()
		if err != nil {
			return err
		}
		printJournalRuns(stdout, o)
		return nil
	case "show":
		return showJournal(src, run, stdout)
	case "export":
		return src.lines("export", run, stdout)
	}
	n, err := src.remove(run)
	if err != nil {
		return err
	}
	what := "entries"
	if n == 1 {
		what = "entry"
	}
	if run == "" {
		fmt.Fprintf(stdout, "removed %d %s, every run's\n", n, what)
	} else {
		fmt.Fprintf(stdout, "removed %d %s of run %s\n", n, what, run)
	}
	return nil
}

// journalTime is a recording time as the listings show it.
func journalTime(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05") }

// printJournalRuns writes a line per run, then the totals.
func printJournalRuns(w io.Writer, o journalOverview) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tENTRIES\tBYTES\tFIRST\tLAST\t")
	var entries int
	for _, r := range o.Runs {
		entries += r.Entries
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t\n", r.Run, r.Entries, r.Bytes, journalTime(r.First), journalTime(r.Last))
	}
	tw.Flush()
	limit := "no bound"
	if o.Stats.MaxBytes > 0 {
		limit = "at most " + strconv.FormatInt(o.Stats.MaxBytes, 10)
	}
	fmt.Fprintf(w, "total: %d runs, %d entries, %d bytes (%s); the file is %d bytes\n",
		len(o.Runs), o.Stats.Entries, o.Stats.Bytes, limit, o.Stats.FileBytes)
}

// showJournal writes a line per entry of run ("": every run, and then
// a column of runs).
func showJournal(src journalSource, run string, w io.Writer) error {
	pr, pw := io.Pipe()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		pw.CloseWithError(src.lines("show", run, pw))
	}()
	defer func() { pr.Close(); <-wrote }()
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	head := "OCCURRENCE\tRECORDED\tPATH\tMODEL\tSTREAM\tSTATUS\tKEY\tREQUEST BYTES\tANSWER BYTES\t"
	if run == "" {
		head = "RUN\t" + head
	}
	fmt.Fprintln(tw, head)
	dec := json.NewDecoder(pr)
	for {
		var s state.Summary
		if err := dec.Decode(&s); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		if run == "" {
			fmt.Fprintf(tw, "%s\t", s.Run)
		}
		stream := "no"
		if s.Stream {
			stream = "yes"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t\n", s.Occurrence, journalTime(s.RecordedAt), s.Path,
			orDash(s.Model), stream, s.Status, s.Key, s.RequestBytes, s.AnswerBytes)
	}
	return tw.Flush()
}

// fileJournal is the journal in the state file, opened here.
type fileJournal struct{ j *state.Journal }

func (f fileJournal) overview() (journalOverview, error) {
	runs, err := f.j.Runs()
	return journalOverview{Stats: f.j.Stats(), Runs: runs}, err
}

func (f fileJournal) lines(what, run string, w io.Writer) error {
	if what == "export" {
		return f.j.Export(w, run)
	}
	return f.j.List(w, run)
}

func (f fileJournal) remove(run string) (int, error) { return f.j.Remove(run) }

// adminJournal is the journal of the proxy whose admin listener is at
// base, sending token when set.
type adminJournal struct {
	ctx         context.Context
	base, token string
}

func (a adminJournal) overview() (journalOverview, error) {
	var o journalOverview
	b, err := ask(a.ctx, http.MethodGet, a.base+"/journal", nil, a.token)
	if err == nil {
		err = json.Unmarshal(b, &o)
	}
	return o, err
}

func (a adminJournal) remove(run string) (int, error) {
	q := "?all=1"
	if run != "" {
		q = "?run=" + url.QueryEscape(run)
	}
	var r struct {
		Removed int `json:"removed"`
	}
	b, err := ask(a.ctx, http.MethodDelete, a.base+"/journal"+q, nil, a.token)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	return r.Removed, err
}

// lines copies /journal/show or /journal/export to w as it comes: an
// export can be larger than ask reads, and slower than its timeout.
func (a adminJournal) lines(what, run string, w io.Writer) error {
	u := a.base + "/journal/" + what
	if run != "" {
		u += "?run=" + url.QueryEscape(run)
	}
	req, err := http.NewRequestWithContext(a.ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refusal(u, resp, a.token)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("GET %s: %w (the answer is cut short)", u, err)
	}
	return nil
}

// refusal is the error of a GET of u that the proxy did not answer 200,
// in the proxy's words, as ask says it.
func refusal(u string, resp *http.Response, token string) error {
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	msg := resp.Status
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e) == nil && e.Error.Message != "" {
		msg = strings.TrimPrefix(e.Error.Message, "llmproxy: ")
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized && token == "":
		msg += " (LLMPROXY_ADMIN_TOKEN is not set)"
	case resp.StatusCode == http.StatusUnauthorized:
		msg += " (LLMPROXY_ADMIN_TOKEN is not the proxy's)"
	}
	return fmt.Errorf("GET %s: %d: %s", u, resp.StatusCode, msg)
}
