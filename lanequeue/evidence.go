package lanequeue

import (
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// shareEvidence is what a limit's answers show of other limits of its group
// drawing on the same upstream limit: a credential's models share one at
// a company gateway, behind a LiteLLM virtual key, or in a model family
// with a shared limit. The upstream's remaining count then falls by more
// than the limit itself sent between two answers, by about what the
// group's other lanes sent; a limit of its own falls by what it sent, less
// what refilled. Guarded by the group's mutex.
type shareEvidence struct {
	// bases are the answers read since the last that showed an excess
	// (the first read against the window full before anything went),
	// oldest first, at most shareBases: each is a reading a later answer
	// is compared with. One request of the limit's in flight at a base
	// may be counted after it; across several answers those late ones
	// are allowed for once, so an excess that each step hides shows
	// against an older base.
	bases [shareBases]reading
	n     int // 0 until an answer with a remaining count was read
	// excess sums what the remaining count fell by beyond the limit's own
	// dispatches, over the readings where it did; others what the
	// group's other limits sent over them.
	excess, others float64
	// held is an excess one answer showed, with others what the group's
	// other limits sent over it, until an answer to a request sent after
	// the limit's own heldThrough-th says whether it stays (see
	// observe); zero: none.
	held, heldOthers float64
	heldThrough      uint64
	// sentAt holds the limit's latest dispatch times, by its dispatch
	// count (this replica's) modulo overtakeRing: which of its requests
	// went just after an answer's (see after).
	sentAt [overtakeRing]time.Time
	// stated is the request limit the headers state: limits found
	// sharing state the same.
	stated int64
	// read: an answer was read (n may be 0 again since); firstLeft is
	// the remaining count the first one showed.
	read      bool
	firstLeft int64
}

// reading is one answer read: when its request went, what it said was
// left, the limit's and the group's dispatch counts right after it went,
// and the limit's requests then in flight (the upstream may count any of
// them after it).
type reading struct {
	dispatched         time.Time
	remaining          int64
	limSent, groupSent uint64
	inFlight           int
	fleet              bool // the counts are every replica's (Slot.fleet)
}

// shareBases is how many earlier answers a reading is compared with.
const shareBases = 8

// A request sent within overtake after another may reach the upstream
// before it: on another connection (one being opened, with its TLS
// handshake) or at the same instant. The latest overtakeRing dispatch
// times of a limit are kept to tell.
const (
	overtake     = 100 * time.Millisecond
	overtakeRing = 32
)

// dispatched records the limit's dispatch numbered n, sent at at.
func (sh *shareEvidence) dispatched(n uint64, at time.Time) { sh.sentAt[n%overtakeRing] = at }

// after counts the limit's dispatches after the one numbered n, sent at
// at, up to the one numbered sent, that went within overtake of it: the
// upstream may have counted those first. With more sent since than the
// ring holds, all of them.
func (sh *shareEvidence) after(n, sent uint64, at time.Time) uint64 {
	if sent-n >= overtakeRing {
		return sent - n
	}
	var c uint64
	for i := n + 1; i <= sent; i++ {
		if !sh.sentAt[i%overtakeRing].After(at.Add(overtake)) {
			c++
		}
	}
	return c
}

// Sharing is told by readings whose excess adds to minShareExcess
// requests, no more than maxShareExcess times what the group's other lanes
// sent (with another client on the same key, the excess is the other
// client's). A limit of its own shows none: its count falls by what it
// sent, less what refilled. (The excess shows while the window has room
// to fall: once it is empty for everyone, every limit's count stays near
// zero, shared or not.)
const (
	minShareExcess = 1
	maxShareExcess = 1.5
)

// observe reads one answer's request window w to the dispatch of s. The
// upstream's count falls between two answers by what reached it, less
// what refilled: by no more than the limit's own dispatches between them
// (and those in flight at the earlier), unless others drew on it. The
// first answer is read against the window full before anything went,
// with nothing else of the limit's in flight; it reports whether that one
// showed an excess, which the group's dispatches before it must have made
// (they may reach the upstream in another order than they went: which of
// them did is not told). out is what the group's other limits had out,
// on any replica, at a first answer among replicas (see shareLocked):
// those went in any order with it, and count as others' for it.
//
// after is how many of the limit's own requests went just after s's (see
// shareEvidence.after): the upstream may have counted any of them before
// s's. A later answer's excess they could explain is held until the next
// answer read, and counts if that one shows an excess too, against the
// same bases or later ones.
func (sh *shareEvidence) observe(w headerparse.Window, s *Slot, out int, after uint64) (first bool) {
	if !w.HasRemaining {
		return false
	}
	now := reading{dispatched: s.ticket.Dispatched, remaining: w.Remaining,
		limSent: s.limSent, groupSent: s.groupSent, inFlight: s.ticket.InFlight, fleet: s.fleet}
	if sh.n > 0 && sh.bases[sh.n-1].fleet != now.fleet {
		// Counts of another kind (Redis went away, or came back): not
		// comparable; read on from this answer.
		sh.n = 0
	}
	isFirst := sh.readFirst(w, now)
	if sh.n > 0 && !now.dispatched.After(sh.bases[sh.n-1].dispatched) {
		return false // an answer to an earlier request, come late
	}
	excess, others := sh.excessOver(now, out)
	// The limit's own requests that went just after this one (at the
	// same instant, or on another connection) may reach the upstream
	// first, and show here as others'. Others' stay in the count, theirs
	// do not: the next answer's reading against the same bases tells.
	if excess > maxShareExcess*others+2 || isFirst && excess > others {
		// More than the others sent could take: the window is not what
		// the count was read against (a first reading against a stated
		// per-minute figure that the upstream enforces as a bucket of a
		// second's worth). It shows nothing of sharing; read on from
		// this answer.
		excess, sh.n, sh.held, sh.heldOthers = 0, 0, 0, 0
	}
	if excess > 0 {
		if !isFirst && excess <= float64(after) && (sh.held == 0 || now.limSent <= sh.heldThrough) {
			// Among the requests that may have overtaken the held one's,
			// an answer tells nothing new: the same one may be counted.
			if sh.held == 0 && !now.fleet {
				sh.heldThrough = now.limSent + after
			}
			sh.held, sh.heldOthers = max(sh.held, excess), max(sh.heldOthers, others)
		} else {
			sh.excess += max(excess, sh.held)
			sh.others += max(others, sh.heldOthers)
			first = isFirst
			// What showed is counted: later answers are read from here.
			sh.n, sh.held, sh.heldOthers = 0, 0, 0
		}
	} else {
		sh.held, sh.heldOthers = 0, 0
	}
	if sh.n == len(sh.bases) {
		copy(sh.bases[:], sh.bases[1:])
		sh.n--
	}
	sh.bases[sh.n], sh.n = now, sh.n+1
	if w.Limit > 0 {
		sh.stated = w.Limit
	}
	return first
}

// readFirst reports whether now, reading w, is the first answer read,
// which is read against the window full before anything went.
func (sh *shareEvidence) readFirst(w headerparse.Window, now reading) (first bool) {
	if first = !sh.read; first {
		sh.read, sh.firstLeft = true, w.Remaining
	}
	if first && w.Limit > 0 {
		sh.bases[0], sh.n = reading{remaining: w.Limit}, 1 // nothing sent, nothing in flight
		if now.fleet {
			// Among replicas, the limit's requests that went from others
			// just after this one may be counted before it, and would
			// read as others': as many as it had out when it went.
			sh.bases[0].inFlight = now.inFlight
		}
	}
	return first
}

// excessOver is the most that a base shows the count fell by beyond the
// limit's own dispatches, reading now, with what the group's other limits
// sent over it (out besides): zero when no base shows one.
func (sh *shareEvidence) excessOver(now reading, out int) (excess, others float64) {
	for _, b := range sh.bases[:sh.n] {
		own := float64(now.limSent - b.limSent)
		o := float64(now.groupSent-b.groupSent) - own + float64(out)
		// Requests sent before the base may reach the upstream after
		// it: its count may lack them.
		if e := float64(b.remaining-now.remaining) - own - float64(b.inFlight); e >= 1 && o > 0 && e > excess {
			excess, others = e, o
		}
	}
	return excess, others
}

// shows reports whether the answers show the limit shared with others of
// the group.
func (sh *shareEvidence) shows() bool {
	return sh.excess >= minShareExcess &&
		sh.excess <= maxShareExcess*sh.others+2
}
