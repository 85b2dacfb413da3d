package lanequeue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// sentAs is a slot whose latest dispatch went at d as its limit's
// limSent-th and its group's groupSent-th, with inFlight other permits
// of the limit out then: what sharing reads an answer against.
func sentAs(d time.Time, limSent, groupSent uint64, inFlight int) *Slot {
	return &Slot{ticket: limit.Ticket{Dispatched: d, InFlight: inFlight}, limSent: limSent, groupSent: groupSent}
}

// window20 is a requests window of 20 with remaining left.
func window20(remaining int64) headerparse.Window { return win(20, remaining, t0.Add(time.Second)) }

// TestAFirstAnswerOneRequestPastItsOwnDispatchShowsSharing: the first
// answer is read against the full window; one request more gone than the
// limit sent, while another lane of the group sent one, is the least
// excess that tells sharing (minShareExcess), and within what the others
// sent: the limit shows sharing, and the first answer says it showed it.
func TestAFirstAnswerOneRequestPastItsOwnDispatchShowsSharing(t *testing.T) {
	var sh shareEvidence
	// The group's second dispatch, the limit's first: 20 - 1 own - 1 more.
	if first := sh.observe(window20(20-1-minShareExcess), sentAs(at(0), 1, 2, 0), 0, anyAfter); !first {
		t.Fatal("the first answer does not report the excess it showed")
	}
	if !sh.shows() {
		t.Fatalf("an excess of %v request with another lane sending shows no sharing", float64(minShareExcess))
	}
}

// TestAnExcessUpToTheBoundOnWhatOthersSentShowsSharing: between two
// answers the excess may be up to maxShareExcess times what the group's
// other lanes sent, plus two, and still be theirs; one request past that
// bound is another client's.
func TestAnExcessUpToTheBoundOnWhatOthersSentShowsSharing(t *testing.T) {
	const others = 2
	bound := int64(maxShareExcess*others + 2)
	for _, c := range []struct {
		excess int64
		shows  bool
	}{{bound, true}, {bound + 1, false}} {
		var sh shareEvidence
		sh.observe(window20(19), sentAs(at(0), 1, 1, 0), 0, 0)
		// The limit's second dispatch after the others' two.
		sh.observe(window20(19-1-c.excess), sentAs(at(time.Second), 2, 2+others, 0), 0, 0)
		if sh.shows() != c.shows {
			t.Errorf("an excess of %d over %d sent by others: shows %v, want %v", c.excess, others, sh.shows(), c.shows)
		}
	}
}

// TestAFirstAnswerPastWhatOthersSentShowsNoSharing: a first answer is read
// against the window full before anything went; sharing it with the
// others, its count falls by no more than they and it sent. More says the
// stated figure is not the window: an IETF policy's q=22 over w=1 for a
// bucket of 18 read three models of their own, each one's first answer
// 17 left, as one limit (seed 7, 1.8× its ideal).
func TestAFirstAnswerPastWhatOthersSentShowsNoSharing(t *testing.T) {
	var sh shareEvidence
	sh.observe(win(22, 17, t0.Add(time.Second)), sentAs(at(0), 1, 3, 0), 0, 0)
	if sh.shows() {
		t.Fatalf("a first answer 4 past its own with 2 sent by others showed sharing: excess %v", sh.excess)
	}
}

// TestAnExcessWhileNoOtherLaneSentShowsNoSharing: when the count falls by
// more than the limit sent while none of the group's other lanes sent
// anything, the excess is another client's on the key, not the group's:
// between two answers with only the limit's own dispatch between them, a
// fall of two more shows nothing.
func TestAnExcessWhileNoOtherLaneSentShowsNoSharing(t *testing.T) {
	var sh shareEvidence
	sh.observe(window20(19), sentAs(at(0), 1, 1, 0), 0, anyAfter)
	// The limit's second dispatch and the group's second: nobody else sent.
	if first := sh.observe(window20(19-1-2), sentAs(at(time.Second), 2, 2, 0), 0, anyAfter); first {
		t.Fatal("a later answer reported as the first")
	}
	if sh.shows() {
		t.Fatal("an excess with no other lane sending shows sharing")
	}
}

// TestALimitsOwnDispatchesCountFromTheLastAnswerRead: what the limit sent
// is counted since the answer last read, not from its first dispatch:
// after a first answer of its own, one more dispatch of its own beside two
// of the others', and a count three lower than its own fall explains,
// kept by the next answer, shows sharing.
func TestALimitsOwnDispatchesCountFromTheLastAnswerRead(t *testing.T) {
	var sh shareEvidence
	sh.observe(window20(19), sentAs(at(0), 1, 1, 0), 0, anyAfter)
	// Its second dispatch, the group's fourth: two of the others' between.
	sh.observe(window20(19-1-3), sentAs(at(time.Second), 2, 4, 0), 0, anyAfter)
	// Its third, alone: the count falls by it.
	sh.observe(window20(19-1-3-1), sentAs(at(2*time.Second), 3, 5, 0), 0, anyAfter)
	if !sh.shows() {
		t.Fatal("a fall of three past one own dispatch, with two of the others', shows no sharing")
	}
}

// TestACountThatFallsByItsOwnDispatchesShowsNoSharing: a limit of its own
// falls by what it sent, whatever the group's other lanes sent meanwhile:
// it shows no excess, so no sharing.
func TestACountThatFallsByItsOwnDispatchesShowsNoSharing(t *testing.T) {
	var sh shareEvidence
	// Another lane sent first; the limit's count fell by its one alone.
	sh.observe(window20(19), sentAs(at(0), 1, 2, 0), 0, anyAfter)
	// Two more of its own and two of the others': fell by its two.
	sh.observe(window20(17), sentAs(at(time.Second), 3, 6, 0), 0, anyAfter)
	if sh.shows() {
		t.Fatal("a count that fell by the limit's own dispatches shows sharing")
	}
}

// TestRequestsInFlightAtTheLastAnswerMayReachTheUpstreamAfterIt: the
// limit's requests that were in flight when the last answer's request
// went may be counted after that answer: a later fall by them and its own
// new dispatch is no excess, though others sent meanwhile.
func TestRequestsInFlightAtTheLastAnswerMayReachTheUpstreamAfterIt(t *testing.T) {
	const late = 2
	var sh shareEvidence
	// Its third dispatch, with its first two still out, answered first:
	// the upstream counted only the third.
	sh.observe(window20(20-1), sentAs(at(0), 3, 3, late), 0, anyAfter)
	// One more of its own and two of the others': the two that were out
	// reached the upstream since, with it.
	sh.observe(window20(20-1-late-1), sentAs(at(time.Second), 4, 6, 0), 0, anyAfter)
	if sh.shows() {
		t.Fatal("requests in flight at the last answer, counted after it, show sharing")
	}
}

// TestAnExcessEachStepHidesShowsAgainstAnOlderAnswer: between two
// answers, the limit's requests in flight at the earlier may hide an
// excess (they may be counted after it); across three, those late ones
// are allowed for once, and what the others took shows. Two readings
// apart, the count fell by what the limit sent and had out; from the
// first to the third it fell by four more than the limit ever sent since.
func TestAnExcessEachStepHidesShowsAgainstAnOlderAnswer(t *testing.T) {
	var sh shareEvidence
	unstated := func(remaining int64) headerparse.Window { return win(0, remaining, t0.Add(time.Second)) }
	sh.observe(unstated(15), sentAs(at(0), 1, 1, 0), 0, anyAfter)
	// Four of its own since, four out when this one went.
	sh.observe(unstated(11), sentAs(at(time.Second), 5, 5, 4), 0, anyAfter)
	if sh.shows() {
		t.Fatal("a fall by the limit's own four shows sharing")
	}
	// Two more of its own, three of the others': a fall of six, which
	// its two and the four that were out could explain step by step.
	sh.observe(unstated(5), sentAs(at(2*time.Second), 7, 10, 0), 0, anyAfter)
	// One more of its own: the next answer keeps the excess.
	sh.observe(unstated(4), sentAs(at(3*time.Second), 8, 11, 0), 0, anyAfter)
	if !sh.shows() {
		t.Fatal("a fall of ten over the limit's six since its first answer shows no sharing")
	}
	if sh.excess != 4 || sh.others != 3 {
		t.Fatalf("counted an excess of %v over %v sent by others, want 4 over 3", sh.excess, sh.others)
	}
}

// TestAnExcessShownAgainstTwoAnswersIsReadAgainstTheOlder: when an older
// and a newer answer show the same excess, it is read against the older,
// whose span holds all the others' dispatches that could have made it:
// five gone past the limit's own, with three of the others' since the
// older answer (within maxShareExcess of them) but one since the newer.
func TestAnExcessShownAgainstTwoAnswersIsReadAgainstTheOlder(t *testing.T) {
	var sh shareEvidence
	unstated := func(remaining int64) headerparse.Window { return win(0, remaining, t0.Add(time.Second)) }
	sh.observe(unstated(19), sentAs(at(0), 1, 1, 0), 0, anyAfter)
	sh.observe(unstated(18), sentAs(at(time.Second), 2, 4, 0), 0, anyAfter) // its own one
	sh.observe(unstated(12), sentAs(at(2*time.Second), 3, 6, 0), 0, anyAfter)
	sh.observe(unstated(11), sentAs(at(3*time.Second), 4, 7, 0), 0, anyAfter) // kept
	if sh.excess != 5 || sh.others != 3 {
		t.Fatalf("counted an excess of %v over %v sent by others, want 5 over 3", sh.excess, sh.others)
	}
	if !sh.shows() {
		t.Fatal("an excess of 5 over three of the others' shows no sharing")
	}
}

// TestAnExcessCountedOnceIsNotCountedAgain: once an answer shows an
// excess, later answers are read from it, not from the answers before it:
// a count that then falls by the limit's own dispatches adds nothing.
func TestAnExcessCountedOnceIsNotCountedAgain(t *testing.T) {
	var sh shareEvidence
	sh.observe(window20(20-1-2), sentAs(at(0), 1, 3, 0), 0, anyAfter) // two of the others' first
	if sh.excess != 2 {
		t.Fatalf("the first answer counted %v, want 2", sh.excess)
	}
	sh.observe(window20(20-1-2-1), sentAs(at(time.Second), 2, 4, 0), 0, anyAfter)
	if sh.excess != 2 {
		t.Fatalf("a fall by the limit's own dispatch added to the excess: %v", sh.excess)
	}
}

// sendOn has lane l send a request a moment after the last (the fake
// clock moving past any pace that holds it) and returns its slot.
func sendOn(t *testing.T, l *Lane) *Slot {
	t.Helper()
	fc := l.g.clock.(*clock.Fake)
	fc.Advance(10 * time.Millisecond) // answers read in order of dispatch
	ch := acquireAsync(context.Background(), l)
	for range 500 {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("acquire: %v", r.err)
			}
			return r.s
		case <-time.After(time.Millisecond):
			fc.Advance(10 * time.Millisecond)
		}
	}
	t.Fatal("acquire did not return")
	return nil
}

// answerWith accepts s with the requests window w and releases it.
func answerWith(s *Slot, w headerparse.Window) {
	accept(s, headerparse.Limits{Requests: w})
	s.release()
}

// TestAFirstAnswerJoinsAModelThatSentBeforeItAndStatedNoWindowYet: gpt-b
// sends, then gpt-a, whose first answer shows one request gone past its
// own: gpt-b's. gpt-b has stated no window yet (its answer is still out),
// which counts as the same window, so the two draw on one limit.
func TestAFirstAnswerJoinsAModelThatSentBeforeItAndStatedNoWindowYet(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	b := sendOn(t, lanes[1])
	a := sendOn(t, lanes[0])
	answerWith(a, window20(18))
	if limitOf(lanes[0]) != limitOf(lanes[1]) {
		t.Fatal("gpt-b, which sent before gpt-a's first answer showed it, was not joined")
	}
	answerWith(b, window20(17))
}

// TestAFirstAnswerDoesNotJoinAModelThatHasSentNothing: a first answer
// showing the group's earlier dispatches joins the models that sent
// before it; one whose lane has sent nothing took no part in what it
// showed and keeps its own limit.
func TestAFirstAnswerDoesNotJoinAModelThatHasSentNothing(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b", "gpt-c")
	b := sendOn(t, lanes[1])
	a := sendOn(t, lanes[0])
	answerWith(a, window20(18))
	if limitOf(lanes[0]) != limitOf(lanes[1]) {
		t.Fatal("gpt-b, which sent before gpt-a's first answer showed it, was not joined")
	}
	if limitOf(lanes[2]) == limitOf(lanes[0]) {
		t.Fatal("gpt-c, which has sent nothing, was joined")
	}
	answerWith(b, window20(17))
}

// TestModelsThatStatedDifferentWindowsAreNotJoined: two models each show
// an excess that the other's dispatches explain, but their answers state
// windows of 20 and of 50: they are limits of their own. A later answer
// of gpt-a's that states a remaining count and no limit leaves its stated
// window as it was.
func TestModelsThatStatedDifferentWindowsAreNotJoined(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	// First answers, each falling by its own dispatch alone.
	answerWith(sendOn(t, lanes[0]), win(20, 19, t0.Add(time.Second)))
	answerWith(sendOn(t, lanes[1]), win(50, 49, t0.Add(time.Second)))
	// One more each; each count falls by one past its own.
	a, b := sendOn(t, lanes[0]), sendOn(t, lanes[1])
	answerWith(a, headerparse.Window{Remaining: 19 - 1 - 1, HasRemaining: true})
	answerWith(b, win(50, 49-1-1, t0.Add(time.Second)))
	// The next answers keep the excess.
	a, b = sendOn(t, lanes[0]), sendOn(t, lanes[1])
	answerWith(a, headerparse.Window{Remaining: 19 - 1 - 1 - 1, HasRemaining: true})
	answerWith(b, win(50, 49-1-1-1, t0.Add(time.Second)))
	if !showsSharing(lanes[0]) || !showsSharing(lanes[1]) {
		t.Fatal("the answers do not show the excess the test is built on")
	}
	if limitOf(lanes[0]) == limitOf(lanes[1]) {
		t.Fatal("models stating windows of 20 and of 50 were joined")
	}
}

// showsSharing reports whether the answers of the limit l draws on show
// it shared.
func showsSharing(l *Lane) bool {
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	return l.drawsOn().share.shows()
}

// TestALowPriorityWaiterHeldByAPauseGoesWhenItEnds: a pause holds a lone
// low-priority waiter; the group arms its timer for the pause's end,
// counting every priority's waiters, and the waiter goes then.
func TestALowPriorityWaiterHeldByAPauseGoesWhenItEnds(t *testing.T) {
	l, fc := testLane(4, 100)
	pause(l, t0.Add(time.Second))
	ch := make(chan result, 1)
	go func() {
		s, err := l.acquire(context.Background(), 1, Low)
		ch <- result{s, err}
	}()
	waitQueued(t, l, 1)
	mustBlock(t, ch)
	fc.Advance(time.Second)
	mustGet(t, ch).release()
}

// queueOn puts a waiter of priority p on each lane's queue, in order
// (their lanes join the turns in that order), as Acquire does before it
// dispatches; it returns them. Requires the lanes' group mutex held.
func queueOn(p Priority, lanes ...*Lane) []*Slot {
	var slots []*Slot
	for _, l := range lanes {
		g := l.g
		g.arrivals++
		s := &Slot{lane: l, seq: g.arrivals, prio: p, cost: 1}
		g.enqueueLocked(s)
		slots = append(slots, s)
	}
	return slots
}

// TestTheHeadHonoursPriorityAcrossLanes: the head is a high-priority
// waiter when there is one in any lane, though the lane whose turn it is
// has only low-priority waiters; and once low-priority waiters have waited
// through lowShare-1 high dispatches in a row, it is a low-priority one,
// though the lane whose turn it is has only high-priority waiters.
func TestTheHeadHonoursPriorityAcrossLanes(t *testing.T) {
	for _, c := range []struct {
		name          string
		first, second Priority
		highRun       int
	}{
		{"high in a later lane", Low, High, 0},
		{"low's share in a later lane", High, Low, lowShare - 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
			g := lanes[0].g
			g.mu.Lock()
			defer g.mu.Unlock()
			g.pass++ // a dispatch pass, as dispatchLocked starts one
			queueOn(c.first, lanes[0])
			want := queueOn(c.second, lanes[1])[0]
			if g.next != nil && g.next != lanes[0] || g.turns.first != lanes[0] {
				t.Fatal("gpt-a's turn does not come first")
			}
			g.highRun = c.highRun
			if h := g.headLocked(); h != want {
				t.Fatal("the head is not gpt-b's waiter")
			}
		})
	}
}

// TestALaneWhoseTurnWasNextPassesItOnWhenItEmpties: when the last waiter
// of the lane whose turn comes next leaves (its client went away), the
// turn passes to the lane after it, not back to the first.
func TestALaneWhoseTurnWasNextPassesItOnWhenItEmpties(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b", "gpt-c")
	g := lanes[0].g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pass++ // a dispatch pass, as dispatchLocked starts one
	waiters := queueOn(High, lanes...)
	g.next = lanes[1] // gpt-b's turn
	g.dequeueLocked(waiters[1])
	if h := g.headLocked(); h != waiters[2] {
		t.Fatalf("the head is not gpt-c's waiter (gpt-a's: %v)", h == waiters[0])
	}
}

// TestAReplicasAnswerIsAskedForWhenTheFirstAnswerWindowWouldHold: the
// first-answer window asks whether another replica has answered when it
// would hold a request, one of its own being out; a word from elsewhere
// that no longer holds by then (the store went away, or the answer is no
// longer recent) does not end the window, though it held before the
// first request went.
func TestAReplicasAnswerIsAskedForWhenTheFirstAnswerWindowWouldHold(t *testing.T) {
	fc := clock.NewFake(t0)
	cfg := Config{Concurrency: 4, MaxConcurrency: 4, Clock: fc}
	var answered atomic.Bool
	answered.Store(true)
	tb := NewTable(TableConfig{Lane: cfg, Shared: func(_ string, c limit.Config) limit.Shared { return elsewhere{limit.NewMemory(c), &answered} }})
	l := tb.laneFor(Key{Path: "/p"})
	first := mustGet(t, acquireAsync(context.Background(), l))
	defer first.release()
	answered.Store(false)
	ch := acquireAsync(context.Background(), l)
	mustBlock(t, ch)
	fc.Advance(firstAnswerWindow)
	mustGet(t, ch).release()
}

// TestAmongReplicasAFirstAnswerAllowsForTheLimitsRequestsOutWhenItWent: a
// limit's first answer read on this replica, to its second request of
// all, sent with one of its requests out: the window fell by three. In
// one process the third is another lane's; among replicas it may be the
// limit's own, sent from another replica just after this one and counted
// first, as many as it had out: no excess. One more gone shows one.
func TestAmongReplicasAFirstAnswerAllowsForTheLimitsRequestsOutWhenItWent(t *testing.T) {
	for _, c := range []struct {
		fleet     bool
		remaining int64
		shows     bool
	}{{false, 17, true}, {true, 17, false}, {true, 16, true}} {
		var sh shareEvidence
		s := sentAs(at(0), 2, 8, 1)
		s.fleet = c.fleet
		sh.observe(window20(c.remaining), s, 0, anyAfter)
		if sh.shows() != c.shows {
			t.Errorf("fleet %v, %d left: shows sharing %v, want %v", c.fleet, c.remaining, sh.shows(), c.shows)
		}
	}
}

// TestAnExcessTheNextAnswerDoesNotKeepShowsNoSharing: two of the limit's
// own requests go at once, and the upstream counts the later first: the
// earlier one's answer reads one more gone than the limit sent before it,
// while another lane sent one. The later one's answer reads what the
// limit sent and nothing more: the excess was its own, and nothing shows.
// (The limits of four models of their own, sent at once, were merged so
// in the simulator now and then.)
func TestAnExcessTheNextAnswerDoesNotKeepShowsNoSharing(t *testing.T) {
	var sh shareEvidence
	sh.observe(window20(19), sentAs(at(0), 1, 2, 0), 0, anyAfter)
	// Another lane's dispatch, then two of the limit's at one instant;
	// the second reached the upstream first.
	sh.observe(window20(19-2), sentAs(at(time.Second), 2, 4, 0), 0, anyAfter)
	sh.observe(window20(19-2), sentAs(at(time.Second).Add(time.Millisecond), 3, 5, 0), 0, anyAfter)
	if sh.shows() || sh.excess != 0 {
		t.Fatalf("the limit's own requests overtaking each other showed sharing: excess %v", sh.excess)
	}
	// Later answers that fall by its own alone add nothing either.
	sh.observe(window20(19-2-1), sentAs(at(2*time.Second), 4, 7, 0), 0, anyAfter)
	if sh.shows() {
		t.Fatal("a count falling by the limit's own dispatches after an excess not kept showed sharing")
	}
}

// TestAnExcessTheNextAnswerKeepsShowsSharing: the same excess, and the
// next answer still reads it against the answer before it: others drew
// on the count, and sharing shows, counted once.
func TestAnExcessTheNextAnswerKeepsShowsSharing(t *testing.T) {
	var sh shareEvidence
	sh.observe(window20(19), sentAs(at(0), 1, 2, 0), 0, anyAfter)
	sh.observe(window20(19-2), sentAs(at(time.Second), 2, 4, 0), 0, anyAfter)
	if sh.shows() {
		t.Fatal("one answer's excess showed sharing before the next kept it")
	}
	sh.observe(window20(19-3), sentAs(at(2*time.Second), 3, 5, 0), 0, anyAfter)
	// Read against the window full before anything went: the other
	// lane's dispatch before the first answer counts too.
	if !sh.shows() || sh.excess != 1 || sh.others != 2 {
		t.Fatalf("an excess the next answer kept: shows %v, excess %v over %v, want 1 over 2", sh.shows(), sh.excess, sh.others)
	}
}

// TestAnExcessAnotherOvertakenAnswerShowsIsNotKept: three of the limit's
// requests go a millisecond apart and the upstream counts the last first: the
// first two answers each read one more gone than the limit sent before
// them. The second is an answer among the requests that may have been
// counted early, and keeps nothing: no sharing shows. (Three models of
// their own on aligned windows were merged so in the simulator, seed 23,
// and took two windows for one.) An answer to a request sent after them
// all that still reads the excess keeps it.
func TestAnExcessAnotherOvertakenAnswerShowsIsNotKept(t *testing.T) {
	var sh shareEvidence
	sh.observe(window20(19), sentAs(at(0), 1, 1, 0), 0, 0)
	d := at(time.Second) // another lane sent one (the group's 2nd), then the limit three, then more
	sh.observe(window20(19-2), sentAs(d, 2, 3, 0), 0, 2)
	sh.observe(window20(19-3), sentAs(d.Add(time.Millisecond), 3, 4, 0), 0, 1)
	// The last that may have overtaken the first, its own overtaken
	// by a later one and another lane's between.
	sh.observe(window20(19-4), sentAs(d.Add(2*time.Millisecond), 4, 6, 0), 0, 1)
	if sh.shows() {
		t.Fatalf("answers among requests sent together showed sharing: excess %v", sh.excess)
	}
	sh.observe(window20(19-6), sentAs(at(2*time.Second), 6, 8, 0), 0, 0)
	if !sh.shows() {
		t.Fatal("an answer past the requests that went together kept no excess")
	}
}

// TestAnExcessNoOwnRequestSentAfterCouldMakeCountsAtOnce: when fewer of
// the limit's own requests went after the answer's than the excess it
// shows, they cannot have made it: it counts at once, without waiting for
// the next answer. With one of its own sent after, an excess of one is
// held and an excess of two counted.
func TestAnExcessNoOwnRequestSentAfterCouldMakeCountsAtOnce(t *testing.T) {
	var held, counted shareEvidence
	for _, sh := range []*shareEvidence{&held, &counted} {
		sh.observe(window20(19), sentAs(at(0), 1, 3, 0), 0, 0)
	}
	held.observe(window20(19-1-1), sentAs(at(time.Second), 2, 5, 0), 0, 1)
	counted.observe(window20(19-1-2), sentAs(at(time.Second), 2, 5, 0), 0, 1)
	if held.shows() {
		t.Fatal("an excess of one, with one of the limit's own sent after, counted at once")
	}
	if !counted.shows() || counted.excess != 2 {
		t.Fatalf("an excess of two, with one of the limit's own sent after: shows %v, excess %v, want counted at once", counted.shows(), counted.excess)
	}
}

// TestAnExcessNoOwnRequestAfterExplainsJoinsAtOnce: through one proxy, a
// limit knows how many of its own requests went after an answer's. Two
// models' second answers each read one gone past their own, with none of
// their own sent after: the excess is the other's, and they are joined on
// those answers, without waiting for the next.
func TestAnExcessNoOwnRequestAfterExplainsJoinsAtOnce(t *testing.T) {
	lanes := silentLanes(t, Config{}, "gpt-a", "gpt-b")
	answerWith(sendOn(t, lanes[0]), window20(19))
	answerWith(sendOn(t, lanes[1]), window20(19))
	a, b := sendOn(t, lanes[0]), sendOn(t, lanes[1])
	answerWith(a, window20(19-1-1))
	answerWith(b, window20(19-1-1))
	if limitOf(lanes[0]) != limitOf(lanes[1]) {
		t.Fatal("two limits whose answers each show the other's request, with none of their own sent after, were not joined")
	}
}

// TestOnlyOwnRequestsSentJustAfterCanHaveOvertaken: of the limit's
// dispatches after an answer's, those within overtake of it may have
// reached the upstream first; one sent later cannot. Past what the ring
// of dispatch times holds, all of them count.
func TestOnlyOwnRequestsSentJustAfterCanHaveOvertaken(t *testing.T) {
	var sh shareEvidence
	sh.dispatched(1, at(0))
	sh.dispatched(2, at(0))                        // the same instant
	sh.dispatched(3, at(overtake))                 // at the edge
	sh.dispatched(4, at(overtake+time.Nanosecond)) // too late
	if n := sh.after(1, 4, at(0)); n != 2 {
		t.Fatalf("%d of the limit's own requests could have overtaken the first, want 2", n)
	}
	if n := sh.after(4, 4, at(overtake)); n != 0 {
		t.Fatalf("%d could have overtaken the latest, want 0", n)
	}
	if n := sh.after(1, 3, at(0)); n != 2 {
		t.Fatalf("%d could have overtaken the first of three, the last at the edge, want 2", n)
	}
	// Further on in the ring.
	for i, d := range []time.Duration{0, 0, overtake, 2 * overtake} {
		sh.dispatched(uint64(21+i), at(d))
	}
	if n := sh.after(21, 24, at(0)); n != 2 {
		t.Fatalf("%d of the 22nd to 24th could have overtaken the 21st, want 2", n)
	}
	if n := sh.after(1, 1+overtakeRing, at(0)); n != overtakeRing {
		t.Fatalf("with more sent since than the ring holds, %d counted, want all %d", n, overtakeRing)
	}
}

// TestAmongReplicasALaterExcessWaitsForTheNextAnswer: a replica does not
// know when the others sent, so it cannot tell that none of a limit's own
// requests went just after an answer's. The second answers of
// TestAnExcessNoOwnRequestAfterExplainsJoinsAtOnce join nothing among
// replicas; the third, showing an excess again, join the two.
func TestAmongReplicasALaterExcessWaitsForTheNextAnswer(t *testing.T) {
	var group atomic.Uint64
	tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}, Shared: func(_ string, c limit.Config) limit.Shared {
		return fleetCounted{limit.NewMemory(c), new(atomic.Uint64), &group}
	}})
	cred := HashCredential("sk-shared")
	lanes := []*Lane{
		tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-a"}),
		tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: "gpt-b"}),
	}
	answerWith(sendOn(t, lanes[0]), window20(19))
	answerWith(sendOn(t, lanes[1]), window20(19))
	for i, left := range []int64{19 - 1 - 1, 19 - 2 - 2} {
		a, b := sendOn(t, lanes[0]), sendOn(t, lanes[1])
		answerWith(a, window20(left))
		answerWith(b, window20(left))
		if joined := limitOf(lanes[0]) == limitOf(lanes[1]); joined != (i == 1) {
			t.Fatalf("answers %d among replicas: joined %v, want %v", i+2, joined, i == 1)
		}
	}
}

// TestAFirstReadingAgainstAStatedPerMinuteFigureDoesNotHideSharing: OpenAI's
// quantized headers state 1,200 a minute over a bucket of 20; the first
// answer, read against the full 1,200, falls by far more than anyone sent.
// That reading shows nothing of sharing, and must not outweigh the later
// readings whose excess is what the other lanes sent.
func TestAFirstReadingAgainstAStatedPerMinuteFigureDoesNotHideSharing(t *testing.T) {
	var sh shareEvidence
	perMinute := func(remaining int64) headerparse.Window { return win(1200, remaining, t0.Add(time.Second)) }
	sh.observe(perMinute(16), sentAs(at(0), 1, 4, 0), 0, 0)
	if sh.shows() {
		t.Fatal("a first reading of 1,184 gone with 3 sent by others shows sharing")
	}
	// Next: the limit sent 1 more, the others 3; the count fell by 4.
	sh.observe(perMinute(12), sentAs(at(100), 2, 8, 0), 0, 0)
	if !sh.shows() {
		t.Errorf("a count that fell by what the others sent shows no sharing after a first reading against 1,200 (excess %.0f, others %.0f)",
			sh.excess, sh.others)
	}
}
