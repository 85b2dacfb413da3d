package lanequeue

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/headerparse"
)

// firstAnswers sends one request on each lane, in order, and answers each
// with the remaining count remaining(i) of a window of 20 full in a second;
// it returns the slots, released.
func firstAnswers(t *testing.T, lanes []*Lane, remaining func(i int) int64) {
	t.Helper()
	var slots []*Slot
	for _, l := range lanes {
		slots = append(slots, mustGet(t, acquireAsync(context.Background(), l)))
	}
	for i, s := range slots {
		accept(s, headerparse.Limits{Requests: win(20, remaining(i), t0.Add(time.Second))})
		s.release()
	}
}

// TestModelsWhoseCountsMoveTogetherShareALimit: four models of one key
// each see the one window fall by what all four sent: the first answers
// already show it, and the lanes draw on one limit from then on, saying so.
func TestModelsWhoseCountsMoveTogetherShareALimit(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
	cred := HashCredential("sk-gateway")
	var lanes []*Lane
	for _, m := range []string{"gpt-a", "gpt-b", "gpt-c", "gpt-d"} {
		lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
	}
	// One window of 20: the i-th request to reach it leaves 19-i.
	firstAnswers(t, lanes, func(i int) int64 { return int64(19 - i) })
	one := limitOf(lanes[0])
	for i, l := range lanes {
		if limitOf(l) != one {
			t.Fatalf("lane %d draws on a limit of its own", i)
		}
	}
	st := lanes[1].State()
	if !slices.Equal(st.SharesLimitWith, []string{"gpt-a", "gpt-c", "gpt-d"}) || st.SharedBecause != "headers move together" {
		t.Fatalf("state says it shares with %v (%q)", st.SharesLimitWith, st.SharedBecause)
	}
	// Paced as one: the window the last answer showed (16 left) is the
	// group's, not each model's. (Each model's own budget would let 16
	// of its own go: 40 in all.)
	ctx, cancel := context.WithCancel(context.Background())
	var chs []<-chan result
	for i := range 40 {
		chs = append(chs, acquireAsync(ctx, lanes[i%4]))
	}
	deadline := time.Now().Add(5 * time.Second)
	for queuedIn(lanes)+grantedIn(lanes) < 40 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := grantedIn(lanes); n > 16 {
		t.Fatalf("%d sent against one window with 16 left", n)
	}
	cancel()
	for _, ch := range chs {
		if r := <-ch; r.err == nil {
			r.s.release()
		}
	}
}

// queuedIn and grantedIn count the lanes' waiters and permits held.
func queuedIn(lanes []*Lane) int  { return countIn(lanes, func(l *Lane) int { return l.queued }) }
func grantedIn(lanes []*Lane) int { return countIn(lanes, func(l *Lane) int { return l.inFlight }) }

func countIn(lanes []*Lane, f func(*Lane) int) (n int) {
	for _, l := range lanes {
		l.g.mu.Lock()
		n += f(l)
		l.g.mu.Unlock()
	}
	return n
}

// TestALimitThatNeverSentJoinsNoFirstAnswersShare: gpt-a and gpt-b each
// send one and gpt-b's first answer shows the window fell by both; gpt-c,
// whose lane was made but has sent nothing, is not among those that sent
// before it, and keeps its own limit.
func TestALimitThatNeverSentJoinsNoFirstAnswersShare(t *testing.T) {
	tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}})
	cred := HashCredential("sk-gateway")
	var lanes []*Lane
	for _, m := range []string{"gpt-a", "gpt-b", "gpt-c"} {
		lanes = append(lanes, tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: m}))
	}
	firstAnswers(t, lanes[:2], func(i int) int64 { return int64(19 - i) })
	if limitOf(lanes[0]) != limitOf(lanes[1]) {
		t.Fatal("gpt-a and gpt-b, whose window fell by both, keep limits of their own")
	}
	if limitOf(lanes[2]) == limitOf(lanes[1]) {
		t.Error("gpt-c, which sent nothing, joined gpt-b's limit at gpt-b's first answer")
	}
}

// TestFirstAnswersOfOneRoundShowAQuantizedWindowShared: four models of one
// key send one request each at once into a bucket of 20 that the headers
// state as 1,200 a minute (OpenAI's quantized form); the upstream counts
// them in another order than they went, and their answers come in yet
// another. Read against 1,200, each count fell by far more than anyone
// sent; the four counts, 16 to 19, are one window counted down, and the
// lanes draw on one limit from the first answers on. Windows of their own
// would each show 19. With no figure stated, only counts one apart, each
// of them, show one window (seed 199: three models on one bucket behind
// Azure's remaining count, 74 % of the upstream's requests refused).
func TestFirstAnswersOfOneRoundShowAQuantizedWindowShared(t *testing.T) {
	for _, c := range []struct {
		stated int64
		left   []int64
		shared bool
		apart  time.Duration // between the lanes' first requests
	}{
		{1200, []int64{16, 19, 17, 18}, true, 0},
		{1200, []int64{19, 19, 19, 19}, false, 0},
		{40, []int64{17, 19}, true, 0},               // 2×(19+1) = 40: none showed over half the figure
		{39, []int64{17, 19}, false, 0},              // one showed over half: the figure may be the window
		{1200, []int64{10, 15, 12}, true, 0},         // 5 apart, what two others sent (1.5×2+2)
		{1200, []int64{12, 16}, false, 0},            // 4 apart, more than one other sent (1.5×1+2)
		{1200, []int64{16, 18}, true, overtake},      // first requests overtake apart: one round
		{1200, []int64{16, 18}, false, overtake + 1}, // further apart: not one round
		// No figure (Azure's remaining alone): only counts one apart, all of them.
		{0, []int64{5, 3, 4}, true, 0},
		{0, []int64{2, 2, 2}, false, 0},
		{0, []int64{2, 0}, false, 0},
	} {
		fc := clock.NewFake(t0)
		tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
		cred := HashCredential("sk-gateway")
		var lanes []*Lane
		var slots []*Slot
		for i := range c.left {
			l := tb.laneFor(Key{CredentialHash: cred, Path: "/v1/chat/completions", Model: fmt.Sprintf("gpt-%c", 'a'+i)})
			lanes = append(lanes, l)
			slots = append(slots, mustGet(t, acquireAsync(context.Background(), l)))
			fc.Advance(c.apart)
		}
		for i, s := range slots {
			accept(s, headerparse.Limits{Requests: win(c.stated, c.left[i], fc.Now().Add(150*time.Millisecond))})
			s.release()
		}
		for i, l := range lanes {
			if shared := limitOf(l) == limitOf(lanes[0]); i > 0 && shared != c.shared {
				t.Errorf("first answers %v: lane %d draws on gpt-a's limit %v, want %v", c.left, i, shared, c.shared)
			}
		}
	}
}

// TestALimitHasPeersUntilFoundToShareTheirWindow: a limit whose group has
// others that sent and state the same window, not found to share it,
// while some count of the group fell by more than its limit sent, may be
// counted down by them unseen, and its answers credit no refill
// (limit.Ticket.Peers). Limits of their own, whose counts fall by what
// each sent, have none; nor have limits found to share one window.
func TestALimitHasPeersUntilFoundToShareTheirWindow(t *testing.T) {
	peers := func(l *Lane) bool {
		l.g.mu.Lock()
		defer l.g.mu.Unlock()
		return l.g.peersLocked(l.drawsOn())
	}
	lanesOf := func(models ...string) []*Lane {
		tb := NewTable(TableConfig{Lane: Config{Clock: clock.NewFake(t0)}})
		var lanes []*Lane
		for _, m := range models {
			lanes = append(lanes, tb.laneFor(Key{CredentialHash: HashCredential("sk-gateway"), Path: "/v1/chat/completions", Model: m}))
		}
		return lanes
	}
	// Windows of their own, or one not yet shown: each showed 19 left.
	apart := lanesOf("gpt-a", "gpt-b", "gpt-c")
	firstAnswers(t, apart[:2], func(int) int64 { return 19 })
	if limitOf(apart[0]) == limitOf(apart[1]) {
		t.Fatal("counts of 19 and 19 were read as one window")
	}
	if peers(apart[0]) {
		t.Error("gpt-a has peers while every count fell by what its own limit sent")
	}
	// gpt-b's count fell by more than it sent, and no limit was found to
	// share it: gpt-a's window may be the one.
	limitOf(apart[1]).share.excess = 1
	if !peers(apart[0]) || !peers(apart[1]) {
		t.Error("gpt-a and gpt-b state one window of 20, unjoined, one count fell by others', and they have no peers")
	}
	limitOf(apart[1]).share.stated = 40
	if peers(apart[0]) {
		t.Error("gpt-b, stating a window of 40, is a peer of gpt-a's window of 20")
	}
	lone := lanesOf("gpt-a", "gpt-b")
	firstAnswers(t, lone[:1], func(int) int64 { return 19 })
	limitOf(lone[0]).share.excess = 1
	limitOf(lone[0]).share.stated = 0 // no figure stated (Azure's remaining alone), as none is for gpt-b, which read none
	if peers(lone[0]) {
		t.Error("gpt-a has a peer in gpt-b, which never sent")
	}
	// One window, found: the group's other limits are its own.
	together := lanesOf("gpt-a", "gpt-b", "gpt-c")
	firstAnswers(t, together, func(i int) int64 { return int64(19 - i) })
	if peers(together[0]) {
		t.Error("limits found to share one window still have peers")
	}
}

// TestAnAnswerOfALimitWithPeersCreditsNoRefill: the answer's ticket
// carries peersLocked's verdict to the limit's window. Two models state a
// window of 20 and each showed 19 left; gpt-a's window then shows it
// refills 20 a second. Its next request, answered 500 ms after it went,
// leaves 9 more to send when its limit has no peers (10 refilled since,
// one kept back) than when gpt-b's count fell by more than gpt-b sent.
func TestAnAnswerOfALimitWithPeersCreditsNoRefill(t *testing.T) {
	left := map[bool]float64{}
	for _, spent := range []bool{false, true} {
		fc := clock.NewFake(t0)
		tb := NewTable(TableConfig{Lane: Config{Clock: fc}})
		var lanes []*Lane
		for _, m := range []string{"gpt-a", "gpt-b"} {
			lanes = append(lanes, tb.laneFor(Key{CredentialHash: HashCredential("sk-gateway"), Path: "/v1/chat/completions", Model: m}))
		}
		firstAnswers(t, lanes, func(int) int64 { return 19 })
		if spent {
			limitOf(lanes[1]).share.excess = 1
		}
		s := mustGet(t, acquireAsync(context.Background(), lanes[0]))
		accept(s, headerparse.Limits{Requests: win(20, 0, fc.Now().Add(time.Second))}) // 20 a second
		s.release()
		fc.Advance(100 * time.Millisecond)
		s = mustGet(t, acquireAsync(context.Background(), lanes[0]))
		went := fc.Now()
		fc.Advance(500 * time.Millisecond)
		accept(s, headerparse.Limits{Requests: win(20, 0, went.Add(time.Second))})
		s.release()
		left[spent] = lanes[0].State().RequestsAvailable
	}
	if got := left[false] - left[true]; math.Abs(got-9) > 0.01 {
		t.Errorf("without peers %v left to send, with them %v: %v more, want 9", left[false], left[true], got)
	}
}
