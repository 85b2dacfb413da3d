package lanequeue

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// shareLocked learns from lim's answer to s whether lim draws on one
// upstream limit with others of the group, and if so makes them one, the
// limit made first taking the others' lanes: every limit whose answers
// show it and that states the same window; and when lim's first answer
// showed all that the group sent before it, every limit that sent before
// it. It reports whether any joined. Requires g.mu held.
//
// Among replicas, each reads a part of the limits' first answers, and
// their first requests may have gone from others. At the answer to lim's
// first request of all (the state holds a limit to one request until its
// first answer), a limit whose state had permits out, on any replica,
// when this replica last asked it (hadOut) sent too, and what it had out
// may have been counted first, whichever went first (some of it may be in
// the counts already: the bound on the excess is then looser). Later,
// lim's own requests from other replicas may be counted first too, and
// only the counts tell.
func (g *group) shareLocked(lim *pool, s *Slot, w headerparse.Window, now time.Time) bool {
	if lim.mergedInto != nil || lim.sharedBy == "configured" {
		return false
	}
	var hadOut []*pool
	out := 0
	if s.fleet && s.limSent == 1 {
		g.limMu.Lock()
		for _, o := range g.limits {
			if o == lim || o.mergedInto != nil || o.sharedBy == "configured" {
				continue
			}
			if n := o.shared.View(now).InFlight; n > 0 {
				hadOut = append(hadOut, o)
				out += n
			}
		}
		g.limMu.Unlock()
	}
	// The limit's own requests sent just after s's; among replicas,
	// others' may have gone too, at times this one does not know: any
	// number.
	after := uint64(math.MaxUint64)
	if !s.fleet {
		after = lim.share.after(s.limSent, lim.sent, s.ticket.Dispatched)
	}
	wasRead := lim.share.read
	first := lim.share.observe(w, s, out, after)
	g.limMu.Lock()
	defer g.limMu.Unlock()
	if !wasRead && w.HasRemaining {
		if round := g.firstRoundLocked(lim, w.Limit); len(round) > 1 {
			g.mergeLocked(round, "headers move together")
			return true
		}
	}
	if !lim.share.shows() {
		return false
	}
	with := []*pool{lim}
	for _, o := range g.limits {
		if o.mergedInto != nil || slices.Contains(with, o) {
			continue
		}
		sameWindow := o.share.stated == lim.share.stated || o.share.stated == 0
		sentBefore := o.firstSeq > 0 && o.firstSeq < s.groupSent || slices.Contains(hadOut, o)
		if sameWindow && (o.share.shows() || first && sentBefore) {
			with = append(with, o)
		}
	}
	if len(with) < 2 {
		return false
	}
	g.mergeLocked(with, "headers move together")
	return true
}

// firstRoundLocked reads lim's first answer with the other first answers
// of the group's limits that state the same window (stated, requests)
// and whose first requests went within overtake of lim's, in any order
// the upstream counted them: one round. When none of them showed half
// the stated figure left, the figure is not the window (OpenAI's
// quantized headers state 1,200 a minute over a bucket of 20), and read
// against it each fell by far more than anyone sent: it shows nothing of
// sharing (see shareEvidence.observe). Each limit sent one: windows of their
// own, of one size as the figure says, show one count alike, and one
// window counts them down, each one fewer, so counts that differ by no
// more than the others sent show one window. It returns the round's
// limits (the ones they draw on) then, else nil. (Before, each of four
// models sharing a bucket of 20 believed the 16 left its own and sent up
// to its concurrency limit on it: 32 requests, a dozen refused at once.)
// Requires g.limMu held.
func (g *group) firstRoundLocked(lim *pool, stated int64) []*pool {
	round := []*pool{lim.root()}
	left := []int64{lim.share.firstLeft}
	for _, o := range g.limits {
		if o == lim || !o.share.read || o.share.stated != stated || o.firstAt.Sub(lim.firstAt).Abs() > overtake {
			continue
		}
		left = append(left, o.share.firstLeft)
		if r := o.root(); !slices.Contains(round, r) {
			round = append(round, r)
		}
	}
	slices.Sort(left)
	lo, hi, n := left[0], left[len(left)-1], int64(len(left))
	if stated == 0 {
		// No figure to read them against (Azure's remaining alone): only
		// counts one apart, all of them, show one window counting down.
		if hi-lo != n-1 || int64(len(slices.Compact(left))) != n {
			return nil
		}
		return round
	}
	if lo == hi || 2*(hi+1) > stated || float64(hi-lo) > maxShareExcess*float64(n-1)+2 {
		return nil
	}
	return round
}

// mergeLocked makes the limits in with one, for why: the one made first
// takes the others' lanes and models; among replicas that share the
// state, the one whose key sorts first, so that every replica that finds
// the same limits shared paces them on one shared state, whatever order
// its own lanes came in. Requires g.mu and g.limMu held.
func (g *group) mergeLocked(with []*pool, why string) {
	order := func(a, b *pool) int { return a.seq - b.seq }
	if g.fleet {
		order = func(a, b *pool) int { return strings.Compare(a.key, b.key) }
	}
	slices.SortFunc(with, order)
	g.takeLocked(with[0], with[1:], why)
}

// takeLocked has into take the others' lanes and models, for why.
func (g *group) takeLocked(into *pool, others []*pool, why string) {
	for _, o := range others {
		o.mergedInto = into
		into.addModel(o.models...)
		if s, ok := o.shared.(joinSharer); ok {
			s.PutJoined(into.key) // the other replicas, or the next process, pool them too
		}
	}
	into.sharedBy = why
}

// joinSharer is a limit's state, shared among replicas or kept for the
// next process, that says which limit it was found to share. Each
// replica reads its own part of the first answers and finds a part of
// the limits that move together; a limit one paces on its own state
// while another paces it with the others is paced twice, and each pace
// is refused for what the other sends.
type joinSharer interface {
	// PutJoined notes that this limit shares the limit named root.
	PutJoined(root string)
	// Joined reports whether some replica noted it sharing root.
	Joined(root string) bool
}

// joinedElsewhereLocked pools lim with the limit another replica found
// it shares, and reports whether it did. Requires g.mu held.
func (g *group) joinedElsewhereLocked(lim *pool) bool {
	s, ok := lim.shared.(joinSharer)
	if !ok || lim.mergedInto != nil || lim.sharedBy == "configured" {
		return false
	}
	g.limMu.Lock()
	defer g.limMu.Unlock()
	for _, o := range g.limits {
		if r := o.root(); o != lim && r != lim && r.trial == nil && r.sharedBy != "configured" && s.Joined(o.key) {
			g.takeLocked(r, []*pool{lim}, "headers move together") // the root of what the note names
			return true
		}
	}
	return false
}

// peersLocked reports whether limits of the group that lim has not been
// found to share, that sent and state lim's window, may draw on it unseen:
// once any count of the group fell by more than its limit sent (never
// forgotten; see docs/how-it-learns.md). Requires g.mu held.
func (g *group) peersLocked(lim *pool) bool {
	g.limMu.Lock()
	defer g.limMu.Unlock()
	peers, spent := false, false
	for _, o := range g.limits {
		spent = spent || o.share.excess > 0
		peers = peers || o.root() != lim.root() && o.sharedBy != "configured" && o.firstSeq > 0 && o.share.stated == lim.share.stated
	}
	return peers && spent
}
