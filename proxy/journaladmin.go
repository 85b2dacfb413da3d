package proxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/llmproxy/llmproxy/state"
)

// The journal's admin endpoints (behind the admin token, as /lanes), the
// way `llmproxy journal` reaches a state file that a running proxy holds:
//
//	GET    /journal                   its size and its runs
//	GET    /journal/show[?run=RUN]    a JSON line per entry: what names it, its sizes
//	GET    /journal/export[?run=RUN]  a JSON line per entry, with its request and answer
//	DELETE /journal?run=RUN           removes a run's entries; ?all=1 every entry
//
// Without a run, show and export go through every run. An entry holds
// no credential, and a line shows 12 hex digits of its key's hash.

// journalRoutes mounts the journal's endpoints on r. open: no admin
// token guards them (see asker); locked: nor is the listener, at addr,
// bound to loopback. Then they neither give out what clients asked and
// got nor remove anything, as no profile is served: anyone who reaches
// such a listener can send a loopback Host.
func (p *Proxy) journalRoutes(r chi.Router, open, locked bool, addr string) {
	r.Get("/journal", p.journalOverview)
	r.Get("/journal/show", p.journalLines(false, locked, addr))
	r.Get("/journal/export", p.journalLines(true, locked, addr))
	r.Delete("/journal", p.journalRemove(open, locked, addr))
}

// journalOrNone is the proxy's journal, or nil, having answered 404: the
// proxy has no state file.
func (p *Proxy) journalOrNone(w http.ResponseWriter) *state.Journal {
	j := p.keeping.journal
	if j == nil {
		replyFor(fail(failNotFound, "this proxy keeps no journal: start it with LLMPROXY_STATE, the file that keeps it"), time.Time{}).write(w)
	}
	return j
}

// journalOverview answers GET /journal: {"stats": ..., "runs": [...]}.
func (p *Proxy) journalOverview(w http.ResponseWriter, _ *http.Request) {
	j := p.journalOrNone(w)
	if j == nil {
		return
	}
	runs, err := j.Runs()
	if err != nil {
		replyFor(fail(failInternal, "the journal could not be read: "+err.Error()), time.Time{}).write(w)
		return
	}
	if runs == nil {
		runs = []state.RunStats{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"stats": j.Stats(), "runs": runs})
}

// journalLines serves /journal/export (bodies) or /journal/show: JSON
// lines, written as they are read. A read that fails past the first
// bytes cuts the answer, so that the client cannot take it for whole.
func (p *Proxy) journalLines(bodies, locked bool, addr string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if bodies && locked {
			replyFor(fail(failNotFound, "without an admin token the journal's requests and answers are served only on an admin listener bound to loopback, and this one is bound to "+strconv.Quote(addr)+": set LLMPROXY_ADMIN_TOKEN"), time.Time{}).write(w)
			return
		}
		j := p.journalOrNone(w)
		if j == nil {
			return
		}
		run := r.URL.Query().Get("run")
		hd := w.Header()
		hd.Set("Content-Type", "application/x-ndjson")
		hd.Set("Cache-Control", "no-store")
		hd.Set("X-Content-Type-Options", "nosniff")
		emit := j.List
		if bodies {
			emit = j.Export
		}
		if err := emit(w, run); err != nil {
			p.log.Warn("journal: the admin listener's read failed", "path", r.URL.Path, "run", run, "err", err)
			panic(http.ErrAbortHandler)
		}
	}
}

// journalRemove answers DELETE /journal?run=RUN or ?all=1:
// {"removed": n}.
func (p *Proxy) journalRemove(open, locked bool, addr string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case locked:
			replyFor(fail(failAdminWrite, "this admin endpoint removes recorded answers; without an admin token it does so only on an admin listener bound to loopback, and this one is bound to "+strconv.Quote(addr)+": set LLMPROXY_ADMIN_TOKEN"), time.Time{}).write(w)
			return
		case crossSite(r):
			replyFor(fail(failAdminWrite, "this admin endpoint removes recorded answers and answers no page of another site"), time.Time{}).write(w)
			return
		}
		q := r.URL.Query()
		run, all := q.Get("run"), q.Get("all") == "1"
		if run == "" && !all || run != "" && q.Has("all") {
			replyFor(badAdmin("run", "say which entries go: ?run=RUN for a run's, or ?all=1 for every one"), time.Time{}).write(w)
			return
		}
		j := p.journalOrNone(w)
		if j == nil {
			return
		}
		n, err := j.Remove(run)
		if err != nil {
			replyFor(fail(failInternal, "the journal could not be changed: "+err.Error()), time.Time{}).write(w)
			return
		}
		p.log.Info("journal: entries removed", "run", run, "all", all, "entries", n, "by", asker(r, open))
		writeJSON(w, http.StatusOK, map[string]int{"removed": n})
	}
}
