package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/llmproxy/llmproxy/internal/bound"
	"github.com/llmproxy/llmproxy/state"
)

// keepOn readies req's journal and joins (see tape.go): it answers a
// hit, a strict miss or a join itself (and returns nil), or returns the
// writer the answer goes through.
func (p *Proxy) keepOn(w http.ResponseWriter, req *request) http.ResponseWriter {
	k := &req.keep
	mode := p.keeping.mode
	if k.said {
		mode = k.mode
	}
	if !k.post || mode == journalOff && !k.retries && k.idem == "" {
		return w
	}
	if mode != journalOff && p.keeping.journal == nil {
		p.failRequest(w, req, fail(failBadJournal, "x-llmproxy-journal needs a state file: start the proxy with LLMPROXY_STATE"))
		return nil
	}
	c := callOf(k, req.target, keyBody(req), mode != journalOff)
	if t, claimed := p.keeping.joinable(c, k); t != nil && p.joinCall(w, req, t, claimed) {
		return nil
	}
	var j *journaled
	if mode != journalOff {
		j = p.keeping.take(c, req.spend.run, k.retry, time.Now())
		if mode != journalRecord && p.replayed(w, req, c, j, mode) {
			return nil
		}
	}
	k.tape = p.keeping.newTape(w, k.client, c, j, k.idem != "")
	if k.timeout > 0 {
		k.tape.timesOut = req.arrived.Add(k.timeout)
	}
	// A call kept for a retry or the journal outlives its client's own
	// timeout (X-Stainless-Timeout): the retry wants its answer. What is
	// decided by the deadline (a Retry-After too long to wait, flex's
	// turn to standard) still keeps to the client's.
	wait := p.cfg.MaxWait
	if k.maxWait > 0 {
		wait = min(wait, k.maxWait)
	}
	k.tape.until = req.arrived.Add(wait)
	return k.tape
}

// keyBody is what of req's body names it: the body, or, past
// canonicalMax, the SHA-256 of all of it.
func keyBody(req *request) []byte {
	if req.body.file == nil && len(req.body.mem) <= canonicalMax {
		return req.body.mem // read, not kept: no copy
	}
	b := req.body.reader()
	defer b.Close()
	raw, _ := io.ReadAll(io.LimitReader(b, canonicalMax+1))
	if len(raw) <= canonicalMax {
		return raw
	}
	h := sha256.New()
	h.Write(raw)
	_, _ = io.Copy(h, b)
	return []byte("sha256:" + hex.EncodeToString(h.Sum(nil)))
}

// replayed answers req from the journal when its occurrence was
// recorded, or joins the call recording it now; in strict mode it
// answers a miss with 404 journal_miss. It reports whether it answered.
func (p *Proxy) replayed(w http.ResponseWriter, req *request, c callKey, j *journaled, mode journalMode) bool {
	e, ok, err := p.keeping.journal.Lookup(j.run, c.sum, j.occ, p.cfg.Clock.Now())
	if err != nil {
		p.log.Warn("journal read failed", "err", err)
	}
	if ok {
		p.keeping.answered(j, true)
		p.metrics.journal("hit").Inc()
		serveEntry(w, req, e)
		return true
	}
	if t := p.keeping.recording(c, j); t != nil && p.joinRecording(w, req, t, j) {
		return true
	}
	if mode == journalStrict {
		p.keeping.answered(j, false)
		p.metrics.journal("miss").Inc()
		p.failRequest(w, req, fail(failJournalMiss, "no recording of this request (occurrence "+
			strconv.Itoa(int(j.occ))+" in run "+strconv.Quote(j.run)+"); x-llmproxy-journal: strict answers from the journal only"))
		return true
	}
	return false
}

// joinRecording joins t, the call recording j's occurrence, and ends
// j in its pass whatever happens, a join cut off included.
func (p *Proxy) joinRecording(w http.ResponseWriter, req *request, t *tape, j *journaled) (served bool) {
	defer func() {
		if served {
			p.keeping.answered(j, true)
		} else if v := recover(); v != nil {
			p.keeping.answered(j, false)
			panic(v)
		}
	}()
	return p.joinCall(w, req, t, false)
}

// serveEntry writes a recorded answer: its headers as recorded, its body
// byte for byte.
func serveEntry(w http.ResponseWriter, req *request, e *state.Entry) {
	h := w.Header()
	for name, v := range e.Header {
		h[name] = v
	}
	h.Set(journalHeader, "hit")
	if !e.Stream {
		h.Set("Content-Length", strconv.Itoa(len(e.Body)))
	}
	req.status, req.outcome = e.Status, OutcomeOK
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.Body)
}

// keepDone ends req's tape: a complete answer is recorded (its write
// ends after the answer), and calls waiting on it are answered.
func (p *Proxy) keepDone(req *request) {
	t := req.keep.tape
	if t == nil {
		return
	}
	ok, status, header, body := t.wrapUp(req.outcome == OutcomeOK)
	keep := ok && t.orphaned()
	if !ok || t.j == nil {
		p.keeping.forget(t, keep)
		return
	}
	canon, _ := canonicalBody(keyBody(req))
	e := &state.Entry{Run: t.j.run, Key: t.c.sum, Occurrence: t.j.occ, RecordedAt: p.cfg.Clock.Now(),
		Path: bound.Field(req.target.Path), Model: bound.Field(t.c.model), // a client's words, shown by ls and show
		Stream: eventStreamHeader(header), Status: status, Header: header, Request: canon, Body: body}
	p.keeping.journal.PutLater(e, func(err error) {
		if err != nil {
			p.log.Warn("journal write failed", "err", err)
		} else {
			p.metrics.journal("recorded").Inc()
		}
		p.keeping.forget(t, keep)
	})
}

// joinCall answers req with t's answer, as far as it has come and
// then as it comes; claimed says joinable claimed t for req, a retry.
// It reports false, having written nothing, when t ended without an
// answer to give (req then goes on by itself).
func (p *Proxy) joinCall(w http.ResponseWriter, req *request, t *tape, claimed bool) (served bool) {
	client := req.keep.client
	stop := context.AfterFunc(client, func() {
		t.mu.Lock()
		t.changed.Broadcast()
		t.mu.Unlock()
	})
	defer stop()
	complete := false
	defer func() { p.keeping.unclaim(t, complete, claimed) }()
	t.mu.Lock()
	if !claimed {
		t.joiners++
	}
	// An error's status waits for the end: a joiner takes only a success.
	for (t.status < 200 || t.status > 299) && !t.done && client.Err() == nil {
		t.changed.Wait()
	}
	if client.Err() != nil {
		t.mu.Unlock()
		req.outcome = OutcomeClientGone
		return true // nobody to answer: not sent again either
	}
	if t.status < 200 || t.status > 299 || t.over || t.done && !t.ok {
		t.mu.Unlock()
		return false
	}
	h := w.Header()
	for name, v := range t.header {
		h[name] = v
	}
	h.Set("X-Llmproxy-Joined", "true")
	if t.j != nil || req.keep.mode != journalOff {
		h.Set(journalHeader, "hit")
	}
	req.status, req.outcome = t.status, OutcomeOK
	status := t.status
	t.mu.Unlock()
	p.metrics.journal("joined").Inc()
	w.WriteHeader(status)
	complete = p.copyJoined(w, req, t)
	return true
}

// copyJoined writes t's answer to w as it comes, and reports whether
// all of it went.
func (p *Proxy) copyJoined(w http.ResponseWriter, req *request, t *tape) bool {
	client := req.keep.client
	rc := http.NewResponseController(w)
	for pos := 0; ; {
		t.mu.Lock()
		for pos == len(t.buf) && !t.done && !t.over && client.Err() == nil {
			t.changed.Wait()
		}
		var chunk []byte
		if !t.over { // an answer that outgrew its tape is gone from it
			chunk = t.buf[pos:]
		}
		done, ok := t.done, t.ok && !t.over
		t.mu.Unlock()
		switch {
		case len(chunk) > 0:
			if _, err := w.Write(chunk); err != nil {
				return false
			}
			_ = rc.Flush()
			pos += len(chunk)
		case client.Err() != nil:
			return false
		case done && ok:
			return true
		default: // the call broke off, or outgrew the tape
			req.outcome = OutcomeUpstreamCut
			panic(http.ErrAbortHandler)
		}
	}
}
