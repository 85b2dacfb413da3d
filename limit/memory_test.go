package limit

import (
	"slices"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
)

// admitted admits a request of cost at now, failing the test if m holds it.
func admitted(t *testing.T, m *Memory, now time.Time, cost int64) *Ticket {
	t.Helper()
	tk, at, ok := m.Admit(now, cost, false)
	if !ok {
		t.Fatalf("a request at %v held until %v", now.Sub(t0), at)
	}
	return &tk
}

// answered reports an answer to tk at now and gives its permit back.
func answered(m *Memory, tk *Ticket, r Report, now time.Time) {
	m.Learn(tk, r, now)
	m.Return(tk, now)
}

// TestDispatchesAtOneInstantAreEachMarkedAsSentFirst: a ticket carries the
// running totals right after its dispatch, each of a batch sent at one
// instant as if it went first (they reach the upstream in any order); the
// next instant's counts all of them.
func TestDispatchesAtOneInstantAreEachMarkedAsSentFirst(t *testing.T) {
	m := NewMemory(Config{})
	a := admitted(t, m, t0, 100)
	b := admitted(t, m, t0, 50)
	c := admitted(t, m, at(time.Millisecond), 10)
	for _, tc := range []struct {
		name             string
		tk               *Ticket
		requests, tokens float64
	}{{"first", a, 1, 100}, {"second at the same instant", b, 1, 50}, {"next instant", c, 3, 160}} {
		if tc.tk.Requests != tc.requests || tc.tk.Tokens != tc.tokens {
			t.Errorf("%s: marked at %v requests and %v tokens, want %v and %v", tc.name, tc.tk.Requests, tc.tk.Tokens, tc.requests, tc.tokens)
		}
	}
}

// TestTheMeanAnswerTimeWeighsTheNewestAFifth: the first accepted answer's
// time with its permit is the mean answer time; each later one moves it a
// fifth of the way (1 s, then 3 s: 1.4 s). A failed answer's time is not
// an answer time.
func TestTheMeanAnswerTimeWeighsTheNewestAFifth(t *testing.T) {
	m := NewMemory(Config{})
	a, b, c := admitted(t, m, t0, 1), admitted(t, m, t0, 1), admitted(t, m, t0, 1)
	answered(m, a, Report{Status: 200, Verdict: Accepted}, at(time.Second))
	if got := m.View(at(time.Second)).AnswerSeconds; !near(got, 1) {
		t.Fatalf("after one answer of 1s the mean is %v", got)
	}
	answered(m, b, Report{Status: 200, Verdict: Accepted}, at(3*time.Second))
	if got := m.View(at(3 * time.Second)).AnswerSeconds; !near(got, 1.4) {
		t.Fatalf("after answers of 1s and 3s the mean is %v, want 1.4", got)
	}
	answered(m, c, Report{Status: 500, Verdict: Failed}, at(10*time.Second))
	if got := m.View(at(10 * time.Second)).AnswerSeconds; !near(got, 1.4) {
		t.Fatalf("a failed answer moved the mean to %v", got)
	}
}

// TestAStatedConcurrencyRefusalTakesTheLimitToTheLevelItWentAt: the third
// of five requests in flight refused for concurrency, in words: the
// upstream held no more than went with it, so the limit falls to 3 at
// once, not a step, nor to the five out. Before, the limit was the
// start's.
func TestAStatedConcurrencyRefusalTakesTheLimitToTheLevelItWentAt(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	if v := m.View(t0); v.ConcurrencyFrom != concurrencyGrown || v.ConcurrencyLowered {
		t.Fatalf("a fresh state's limit comes from %q, lowered %v; want the start's", v.ConcurrencyFrom, v.ConcurrencyLowered)
	}
	var tks []*Ticket
	for range 5 {
		tks = append(tks, admitted(t, m, t0, 1))
	}
	m.Learn(tks[2], Report{Status: 429, Verdict: ConcurrencyRefused}, t0)
	v := m.View(t0)
	if v.Concurrency != 3 || v.ConcurrencyFrom != concurrencyNamed || v.Bound != BoundConcurrency || !v.ConcurrencyLowered {
		t.Fatalf("limit %d from %q, bound %v, lowered %v; want 3 from words, bound by concurrency, lowered",
			v.Concurrency, v.ConcurrencyFrom, v.Bound, v.ConcurrencyLowered)
	}
}

// TestAnUpstreamIsLiveForLessThanLiveForAfterAnAdmission: a quiet refusal
// just under liveFor after an admission is a live upstream's, whose pace
// is learned (and no pause taken for a refusal without a wait); at
// liveFor, the upstream admitted nothing lately: the refusal's pause holds
// the pool and no pace is learned.
func TestAnUpstreamIsLiveForLessThanLiveForAfterAnAdmission(t *testing.T) {
	for _, tc := range []struct {
		since time.Duration
		live  bool
	}{{liveFor - time.Millisecond, true}, {liveFor, false}} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
		answered(m, admitted(t, m, t0, 1), Report{Status: 200, Verdict: Accepted}, t0)
		now := t0.Add(tc.since)
		pause := now.Add(time.Second)
		m.Learn(admitted(t, m, now, 1), Report{Status: 429, Verdict: RateRefused, PauseUntil: pause}, now)
		v := m.View(now)
		if v.FromRefusals() != tc.live || v.PausedUntil.Equal(pause) == tc.live {
			t.Errorf("refused %v after an admission: pace from refusals %v, paused until %v; want a pace %v, the pause %v",
				tc.since, v.FromRefusals(), v.PausedUntil.Sub(t0), tc.live, !tc.live)
		}
	}
}

// TestARefusalWhileTheUpstreamIsDown: with nothing admitted lately, an
// overload steps the concurrency limit down and a rate refusal does not;
// a short hint sets the pace (one request per hint), none sets no pace;
// the refusal's pause holds the pool either way.
func TestARefusalWhileTheUpstreamIsDown(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		verdict Verdict
		hint    time.Duration
		limit   int
		rate    float64 // 0: no pace learned
	}{
		{"overloaded", 503, Overloaded, 0, 7, 0},
		{"rate refused", 429, RateRefused, 0, 8, 0},
		{"rate refused with a short hint", 429, RateRefused, 200 * time.Millisecond, 8, 5},
	} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
		pause := at(time.Second)
		m.Learn(admitted(t, m, t0, 1), Report{Status: tc.status, Verdict: tc.verdict, Hint: tc.hint, PauseUntil: pause}, t0)
		v := m.View(t0)
		if v.Concurrency != tc.limit {
			t.Errorf("%s: concurrency limit %d, want %d", tc.name, v.Concurrency, tc.limit)
		}
		if v.FromRefusals() != (tc.rate > 0) || tc.rate > 0 && (v.RateFrom != rateHint || !near(v.AdmittedRate, tc.rate)) {
			t.Errorf("%s: pace from refusals %v, %v/s from %v; want %v/s from the hint (0: none)", tc.name, v.FromRefusals(),
				v.AdmittedRate, v.RateFrom, tc.rate)
		}
		if !v.PausedUntil.Equal(pause) {
			t.Errorf("%s: paused until %v, want the refusal's 1s", tc.name, v.PausedUntil.Sub(t0))
		}
	}
}

// TestQuietOverloadsCloseASilentWindowFailuresDoNot: after admissions,
// overloads with no headers and no wait, 400 ms apart, read as a silent
// window's closure once they span a second, as rate refusals do; failed
// answers as many and as long say nothing of a window.
func TestQuietOverloadsCloseASilentWindowFailuresDoNot(t *testing.T) {
	for _, tc := range []struct {
		status  int
		verdict Verdict
		closes  bool
	}{{503, Overloaded, true}, {500, Failed, false}} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
		for range 5 {
			answered(m, admitted(t, m, t0, 1), Report{Status: 200, Verdict: Accepted}, t0)
		}
		closed := false
		for i := range 4 {
			now := at(time.Duration(i+1) * 400 * time.Millisecond)
			answered(m, admitted(t, m, now, 1), Report{Status: tc.status, Verdict: tc.verdict}, now)
			closed = m.View(now).Window != nil
		}
		if closed != tc.closes {
			t.Errorf("%v answers over 1.2s: a window closed %v, want %v", tc.verdict, closed, tc.closes)
		}
	}
}

// TestOnlyAWaitShortEnoughToBeAPacePausesTheGroup: a live upstream's quiet
// refusal with a wait under a second (a pace, one request per wait)
// pauses the whole pool for it; a wait of a second or more holds only
// the refused request, the learned pace holds the rest.
func TestOnlyAWaitShortEnoughToBeAPacePausesTheGroup(t *testing.T) {
	for _, tc := range []struct {
		hint   time.Duration
		pauses bool
	}{{500 * time.Millisecond, true}, {time.Second, false}} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
		answered(m, admitted(t, m, t0, 1), Report{Status: 200, Verdict: Accepted}, t0)
		now := at(100 * time.Millisecond)
		pause := now.Add(tc.hint)
		m.Learn(admitted(t, m, now, 1), Report{Status: 429, Verdict: RateRefused, Hint: tc.hint, PauseUntil: pause}, now)
		v := m.View(now)
		if !v.FromRefusals() {
			t.Errorf("a %v wait: no pace learned", tc.hint)
		}
		if paused := v.PausedUntil.Equal(pause) && v.PauseReason == pauseRateLimited; paused != tc.pauses {
			t.Errorf("a %v wait: paused until %v (%q), want a pause %v", tc.hint, v.PausedUntil.Sub(t0), v.PauseReason, tc.pauses)
		}
	}
}

// TestARateRefusalWithRoomCorrectsTheHeadersWindow: headers stating 1200
// a minute while never showing more than 19 left, then a refusal of a
// request they had room for: the refusal wins, and the window is taken
// as 20; the view says so. The same for tokens alone. A fresh state, or
// one whose headers were never contradicted, shows no correction.
func TestARateRefusalWithRoomCorrectsTheHeadersWindow(t *testing.T) {
	for _, tc := range []struct {
		name       string
		told, left headerparse.Limits
		cost       int64
		size       func(View) float64
		want       float64
	}{
		{"requests", headerparse.Limits{Requests: win(1200, 19, at(time.Minute))}, headerparse.Limits{Requests: win(1200, 0, at(time.Minute))},
			1, func(v View) float64 { return v.Requests.Limit }, 20},
		{"tokens", headerparse.Limits{Tokens: win(100000, 500, at(time.Minute))}, headerparse.Limits{Tokens: win(100000, 0, at(time.Minute))},
			10, func(v View) float64 { return v.Tokens.Limit }, 501},
	} {
		m := NewMemory(Config{})
		if v := m.View(t0); v.Corrected || v.RateFrom != rateUnknown {
			t.Fatalf("a fresh state: corrected %v, rate from %q", v.Corrected, v.RateFrom)
		}
		answered(m, admitted(t, m, t0, tc.cost), Report{Status: 200, Verdict: Accepted, Limits: tc.told}, t0)
		if v := m.View(t0); v.Corrected || !v.FromHeaders() || v.FromRefusals() {
			t.Fatalf("%s: after honest-looking headers: corrected %v, rate from %q", tc.name, v.Corrected, v.RateFrom)
		}
		now := at(10 * time.Millisecond)
		tk := admitted(t, m, now, tc.cost)
		if !tk.Room {
			t.Fatalf("%s: the headers had no room for the request", tc.name)
		}
		m.Learn(tk, Report{Status: 429, Verdict: RateRefused, Limits: tc.left}, now)
		if v := m.View(now); !v.Corrected || !near(tc.size(v), tc.want) {
			t.Errorf("%s: after the refusal: corrected %v, window %v; want corrected to %v", tc.name, v.Corrected, tc.size(v), tc.want)
		}
	}
}

// TestTheRefusedRequestsOwnPermitIsNotTakenOffTwice: 21 requests sent at
// once to a live upstream, the last refused while the other 20 are still
// out: what the upstream took is those 20 in the last second, so a wait
// of 160 ms is 3.2 requests' worth, a window's boundary rather than a
// pace, and the first guess is what was sent. Alone, the same refusal's
// wait is a pace.
func TestTheRefusedRequestsOwnPermitIsNotTakenOffTwice(t *testing.T) {
	hint := 160 * time.Millisecond
	for _, tc := range []struct {
		sent int
		from rateFrom
		rate float64
	}{{21, rateSending, 21}, {1, rateHint, 1 / hint.Seconds()}} {
		m := NewMemory(Config{Concurrency: 32, MaxConcurrency: 64})
		m.Fleet().Said(t0, 0, 0, 0, t0) // live: another replica's request was admitted
		var last *Ticket
		for range tc.sent {
			last = admitted(t, m, t0, 1)
		}
		now := at(time.Millisecond)
		m.Learn(last, Report{Status: 429, Verdict: RateRefused, Hint: hint, PauseUntil: now.Add(hint)}, now)
		if v := m.View(now); v.RateFrom != tc.from || !near(v.AdmittedRate, tc.rate) {
			t.Errorf("%d sent: the first guess is %v/s from %v, want %v/s from %v", tc.sent, v.AdmittedRate, v.RateFrom, tc.rate, tc.from)
		}
	}
}

// TestWhatTheUpstreamTookIsPerSecondOverItsAdmissions: nine admissions
// over four seconds and a refusal a tenth of a second after the last: the
// upstream took about 2.2 requests a second, so a wait of 900 ms is under
// two requests' worth, a bucket's refill, not a window's boundary: the
// pace is one request per wait, and no window is suspected.
func TestWhatTheUpstreamTookIsPerSecondOverItsAdmissions(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	for i := range 9 {
		now := t0.Add(time.Duration(i) * 500 * time.Millisecond)
		answered(m, admitted(t, m, now, 1), Report{Status: 200, Verdict: Accepted}, now)
	}
	now := at(4100 * time.Millisecond)
	hint := 900 * time.Millisecond
	m.Learn(admitted(t, m, now, 1), Report{Status: 429, Verdict: RateRefused, Hint: hint, PauseUntil: now.Add(hint)}, now)
	v := m.View(now)
	if v.Window != nil || v.RateFrom != rateHint || !near(v.AdmittedRate, 1/hint.Seconds()) {
		t.Fatalf("window %q, %v/s from %v; want no window, %v/s from the hint", v.Window, v.AdmittedRate, v.RateFrom, 1/hint.Seconds())
	}
}

// TestARefusedProbeMeasuringExactlyTheEstimateLeavesIt: a refused probe's
// measurement only raises a measured estimate: one equal to it leaves the
// estimate, and its source, as the clean probe raised it; one above it
// replaces it.
func TestARefusedProbeMeasuringExactlyTheEstimateLeavesIt(t *testing.T) {
	for _, tc := range []struct {
		seq  uint64 // the probe's number: seq-2 admitted since the refusal numbered 1, (seq-3)/s measured
		want float64
		from rateFrom
	}{{25, 22, rateProbe}, {26, 23, rateAdmitted}} {
		m := quietLocal()
		l := &m.learn
		l.estimate, l.from, l.measured, l.sample, l.raisedFrom = 22, rateProbe, true, 23, 20
		l.refused(1, t0, 0) // the refusal before, a second earlier
		probe := Ticket{Seq: tc.seq, Dispatched: at(time.Second), Level: 1, Probe: true}
		l.estimateOnRefusal(&probe, refusalEvidence{}, at(time.Second))
		if l.estimate != tc.want || l.from != tc.from {
			t.Errorf("a refused probe numbered %d: estimate %v from %v, want %v from %v", tc.seq, l.estimate, l.from, tc.want, tc.from)
		}
	}
}

// TestABoundByConcurrencyPacesAsFastAsItsLimitAllows: a pool paced from
// refusals, whose replicas' counts by level together show refusals only
// at 3 in flight and above, judges its bound at once: concurrency, its
// limit the level below (2), and a pace no slower than 1.5 times what 2
// in flight give at its answer time of 0.5 s (6 a second), above the 1.5
// times its guess of 2 a second that a pace alone would give.
func TestABoundByConcurrencyPacesAsFastAsItsLimitAllows(t *testing.T) {
	m := NewMemory(Config{Concurrency: 4, MaxConcurrency: 64})
	answered(m, admitted(t, m, t0, 1), Report{Status: 200, Verdict: Accepted}, at(500*time.Millisecond))
	now := at(500 * time.Millisecond)
	answered(m, admitted(t, m, now, 1), Report{Status: 429, Verdict: RateRefused}, now)
	if v := m.View(now); !v.FromRefusals() || v.Bound != BoundRate || !near(v.AdmittedRate, 2) || !near(v.AnswerSeconds, 0.5) {
		t.Fatalf("after a quiet refusal: from refusals %v, bound %v, %v/s, answers %vs; want a rate of 2/s, answers of 0.5s",
			v.FromRefusals(), v.Bound, v.AdmittedRate, v.AnswerSeconds)
	}
	now = at(600 * time.Millisecond)
	m.Fleet().Levels([]float64{0, 20, 20, 0}, []float64{0, 0, 0, 10}, now)
	v := m.View(now)
	if v.Bound != BoundConcurrency || v.ConcurrencyFrom != 3 || v.Concurrency != 2 {
		t.Fatalf("bound %v from %q, limit %d; want concurrency from refusals at 3, limit 2", v.Bound, v.ConcurrencyFrom, v.Concurrency)
	}
	if !near(v.Requests.PerSecond, 6) {
		t.Fatalf("paced at %v/s, want 6 (1.5 × 2 in flight / 0.5 s)", v.Requests.PerSecond)
	}
}

// TestSharedLevelsReplaceEveryLocalCount: the counts by level shared by
// every replica replace this replica's own at every level, those the
// shared counts do not reach included (cleared), whichever of the two
// lists is the shorter; levels above maxLevel are not kept.
func TestSharedLevelsReplaceEveryLocalCount(t *testing.T) {
	m := NewMemory(Config{})
	l := &m.learn
	for level := 1; level <= 5; level++ {
		l.answered(level, false)
		l.answered(level, true)
	}
	m.Fleet().Levels([]float64{0, 7}, []float64{0, 0, 0, 4}, t0)
	if want := []float64{0, 7, 0, 0, 0, 0}; !slices.Equal(l.admitted, want) {
		t.Errorf("admitted %v, want %v", l.admitted, want)
	}
	if want := []float64{0, 0, 0, 4, 0, 0}; !slices.Equal(l.refusedAt, want) {
		t.Errorf("refused %v, want %v", l.refusedAt, want)
	}
	m.Fleet().Levels([]float64{0, 0, 0, 6}, []float64{0, 3}, t0)
	if want := []float64{0, 0, 0, 6, 0, 0}; !slices.Equal(l.admitted, want) {
		t.Errorf("admitted %v, want %v", l.admitted, want)
	}
	if want := []float64{0, 3, 0, 0, 0, 0}; !slices.Equal(l.refusedAt, want) {
		t.Errorf("refused %v, want %v", l.refusedAt, want)
	}
	long := make([]float64, maxLevel+2)
	long[maxLevel], long[maxLevel+1] = 9, 5
	m.Fleet().Levels(long, long, t0)
	if len(l.admitted) != maxLevel+1 || len(l.refusedAt) != maxLevel+1 {
		t.Fatalf("%d and %d levels kept, want up to maxLevel, %d", len(l.admitted)-1, len(l.refusedAt)-1, maxLevel)
	}
	if l.admitted[maxLevel] != 9 || l.refusedAt[maxLevel] != 9 {
		t.Errorf("at maxLevel %v admitted and %v refused, want the shared 9", l.admitted[maxLevel], l.refusedAt[maxLevel])
	}
}

// TestARefusalHoldsItsPermitUntilItGoesBack: a refused request that still
// holds its permit is not in flight upstream, so the next dispatch's level
// leaves it out until the permit goes back (Return, or Fleet.Returned for a
// permit another store gave); a refusal learned only after its permit
// went back holds nothing.
func TestARefusalHoldsItsPermitUntilItGoesBack(t *testing.T) {
	overload := Report{Status: 503, Verdict: Overloaded, Limits: headerparse.Limits{Requests: win(100, 50, at(time.Minute))}}
	// Each way of dispatching: the first dispatch's ticket, and the level
	// of the next with out permits out.
	inProcess := func(m *Memory) (*Ticket, func(out int) int, func(*Ticket)) {
		first := admitted(t, m, t0, 1)
		admitted(t, m, t0, 1) // another, still out
		return first, func(int) int { return admitted(t, m, t0, 1).Level }, func(tk *Ticket) { m.Return(tk, t0) }
	}
	elsewhere := func(m *Memory) (*Ticket, func(out int) int, func(*Ticket)) {
		first := m.Fleet().Dispatched(t0, 0, 0, 0)
		m.Fleet().Dispatched(t0, 1, 0, 0)
		next := func(out int) int { return m.Fleet().Dispatched(t0, out, 0, 0).Level }
		return &first, next, func(tk *Ticket) { m.Fleet().Returned(tk, t0) }
	}
	for _, c := range []struct {
		name     string
		dispatch func(*Memory) (*Ticket, func(out int) int, func(*Ticket))
	}{{"in process", inProcess}, {"elsewhere", elsewhere}} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
		refused, next, giveBack := c.dispatch(m)
		m.Learn(refused, overload, t0)
		if level := next(2); level != 2 {
			t.Errorf("%s: the next dispatch went at %d with the refused one holding its permit, want 2 (it and the other)", c.name, level)
		}
		giveBack(refused)
		if level := next(2); level != 3 {
			t.Errorf("%s: the next dispatch went at %d once the refused permit went back, want 3", c.name, level)
		}

		m = NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
		refused, next, giveBack = c.dispatch(m)
		giveBack(refused)
		m.Learn(refused, overload, t0)
		if level := next(1); level != 2 {
			t.Errorf("%s: the next dispatch went at %d after a refusal learned once its permit went back, want 2", c.name, level)
		}
	}
}

// TestAHintSlowerThanTheMeasuredRateIsNoRefill: a refusal whose hint
// paces 8 a second, while the refusals around it measured 20 a second
// admitted, is not a bucket's refill (at most one request's worth of it):
// the upstream admitted more than one per hint, so the hint named a
// window's end a moment away, and the measurement caps the rate, also
// when a refused probe did not take it. Without a measurement at that
// refusal, the same hint caps the rate.
func TestAHintSlowerThanTheMeasuredRateIsNoRefill(t *testing.T) {
	for _, c := range []struct {
		name     string
		from     rateFrom
		probe    bool
		measured bool // a refusal a second before: 21 admitted less one, over 1 s
		want     float64
		wantFrom rateFrom
	}{
		{"a refusal", rateAdmitted, false, true, 20, rateAdmitted},
		{"a refused probe", rateProbe, true, true, 20, rateAdmitted},
		{"nothing measured", rateAdmitted, false, false, 8, rateHint},
		// A refused probe (which leaves a measured estimate above the
		// measurement) measuring exactly one per hint (17 admitted less
		// one, over 2 s): a refill's pace, the hint's.
		{"a measurement equal to the hint", rateProbe, true, true, 8, rateHint},
		// A refused probe measuring exactly the estimate changes nothing.
		{"a refused probe measuring the estimate", rateProbe, true, true, 20, rateProbe},
	} {
		m := quietLocal()
		l := &m.learn
		l.estimate, l.from, l.measured = 30, c.from, true
		if c.measured {
			l.refused(1, t0, 0)
		}
		tk := Ticket{Seq: 23, Dispatched: at(time.Second), Level: 1, Probe: c.probe}
		switch c.name {
		case "a measurement equal to the hint":
			tk = Ticket{Seq: 19, Dispatched: at(2 * time.Second), Level: 1, Probe: true}
		case "a refused probe measuring the estimate":
			l.estimate = 20
		}
		l.estimateOnRefusal(&tk, refusalEvidence{hintPace: 8}, at(time.Second))
		if l.estimate != c.want || l.from != c.wantFrom {
			t.Errorf("%s: estimate %v from %v, want %v from %v", c.name, l.estimate, l.from, c.want, c.wantFrom)
		}
	}
}

// TestARefusalBeforeAnyAdmissionKeepsTheSlowStart: a state whose first
// requests met a spent limit (a trial's, joined while the others' requests
// emptied the bucket) learns nothing of the number in flight from them:
// its slow start goes on. A refusal while the upstream admits others ends
// it.
func TestARefusalBeforeAnyAdmissionKeepsTheSlowStart(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	m.Learn(admitted(t, m, t0, 1), Report{Status: 429, Verdict: RateRefused, PauseUntil: at(time.Second)}, t0)
	if !m.conc.slowStart {
		t.Fatal("a refusal before any admission ended the slow start")
	}
	now := at(2 * time.Second)
	answered(m, admitted(t, m, now, 1), Report{Status: 200, Verdict: Accepted}, now)
	m.Learn(admitted(t, m, now, 1), Report{Status: 429, Verdict: RateRefused}, now)
	if m.conc.slowStart {
		t.Fatal("a refusal while the upstream admits others left the slow start on")
	}
}

// TestATrialStartsFromTheInFlightAndAnswerTimeItIsGiven: StartFrom raises
// the concurrency limit to what the joined limits had out (within the
// bounds) and takes their answer time while it knows none of its own.
func TestATrialStartsFromTheInFlightAndAnswerTimeItIsGiven(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	m.StartFrom(t0, 14, 0.6, 0)
	if v := m.View(t0); v.Concurrency != 14 || v.AnswerSeconds != 0.6 {
		t.Errorf("concurrency %d, answer time %v; want 14 and 0.6 s", v.Concurrency, v.AnswerSeconds)
	}
	m.StartFrom(t0, 100, 2, 0)
	if v := m.View(t0); v.Concurrency != 64 || v.AnswerSeconds != 0.6 {
		t.Errorf("concurrency %d, answer time %v; want the bound, 64, and the answer time it had, 0.6 s", v.Concurrency, v.AnswerSeconds)
	}
}

// TestATrialLearnsFromWhatItsLimitsSentTogether: two limits sending 58 a
// second each are refused together and joined; the trial's first refusal
// guesses the rate they sent together, not the few dispatches of its own
// so far (27 a second for two windows of 58, universe seed 121: 1.65×).
func TestATrialLearnsFromWhatItsLimitsSentTogether(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	m.StartFrom(t0, 4, 0.07, 116)
	if v := m.View(at(100 * time.Millisecond)); !near(v.Sending, 116) {
		t.Fatalf("sending %v a second after StartFrom, want the 116 the limits sent", v.Sending)
	}
	first := admitN(t, m, 1, at(100*time.Millisecond)) // alone, as a new state's first
	m.Learn(&first[0], Report{Status: 200, Verdict: Accepted}, at(170*time.Millisecond))
	var tks []Ticket
	for now := at(170 * time.Millisecond); len(tks) < 3; now = now.Add(5 * time.Millisecond) {
		if tk, _, ok := m.Admit(now, 1, false); ok { // the slow start spreads them
			tks = append(tks, tk)
		}
	}
	for i := range tks[:2] {
		m.Learn(&tks[i], Report{Status: 200, Verdict: Accepted}, at(240*time.Millisecond))
	}
	m.Learn(&tks[2], Report{Status: 429, Verdict: RateRefused}, at(240*time.Millisecond))
	if m.learn.from != rateSending || m.learn.estimate < 100 {
		t.Fatalf("first guess %v from %q, want about the 120 sent together", m.learn.estimate, m.learn.from)
	}
}

// TestRoomTheUpstreamStatesKeepsASpentWindowOpen: a window of 1 learned
// from refusals has sent its 1. While the upstream's latest answer says 1
// is left, the next request goes and the window stays open (a refusal
// would close it); with none left, the spent allowance closes it at once.
func TestRoomTheUpstreamStatesKeepsASpentWindowOpen(t *testing.T) {
	for _, left := range []float64{1, 0} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 8})
		m.win = windows{cur: windowCount{used: 1, start: t0, opened: t0}, shape: shape{known: true, allowance: 1, lengthLo: 9 * time.Second, lengthHi: 10 * time.Second}}
		m.pace.requests = budget{known: true, limit: 10, lastLeft: left}
		m.pace.requests.resize(10, 0)
		m.pace.requests.bucket.Set(t0, 10)
		_, _, ok := m.Admit(t0.Add(time.Second), 0, false)
		if ok != (left == 1) || m.win.closed != (left == 0) {
			t.Errorf("%v left: admitted %v, window closed %v; want admitted and open only with one left", left, ok, m.win.closed)
		}
	}
}

// TestADebtPaidAtTheKnocksPaceSlowsTheGuess: one request admitted, then
// quiet refusals that close a silent window, knocks refused and one
// admitted: the closure teaches no window (one admission is no
// allowance), and a guessed pace goes no faster than one request per the
// gap the admitted knock came after; the pool is paced so at once. A
// guess slower already stays, and a measured pace is the upstream's own:
// the knocks leave both.
func TestADebtPaidAtTheKnocksPaceSlowsTheGuess(t *testing.T) {
	for _, tc := range []struct{ measured, slow bool }{{false, false}, {true, false}, {false, true}} {
		m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
		now := t0
		send := func(r Report) {
			for {
				tk, at, ok := m.Admit(now, 1, false)
				if ok {
					answered(m, &tk, r, now)
					return
				}
				if !at.After(now) {
					t.Fatalf("held at %v with no time to go", now.Sub(t0))
				}
				now = at
			}
		}
		refused, accepted := Report{Status: 429, Verdict: RateRefused}, Report{Status: 200, Verdict: Accepted}
		send(accepted)
		for m.View(now).Window == nil {
			now = now.Add(400 * time.Millisecond)
			send(refused)
		}
		m.learn.measured = tc.measured
		if tc.slow {
			m.learn.estimate = 0.1
		}
		guess := m.learn.estimate
		last := now
		for gap := time.Duration(0); gap < time.Second; gap = now.Sub(last) { // knocks refused until they go a second apart
			last = now
			send(refused)
		}
		last = now
		send(accepted)
		v := m.View(now)
		want := guess
		if !tc.measured && !tc.slow {
			want = 1 / now.Sub(last).Seconds()
		}
		if v.Window != nil || !tc.measured && !tc.slow && want >= guess || v.AdmittedRate != want {
			t.Errorf("%+v: window %+v, pace %v from %v; want no window and %v", tc, v.Window, v.AdmittedRate, guess, want)
		}
		if paced := m.pace.requests.view().PerSecond; !tc.measured && (paced <= 0 || paced != m.pacing()) {
			t.Errorf("%+v: paced at %v, want the learned %v", tc, paced, m.pacing())
		}
	}
}

// TestATicketSaysWhetherItKnocked: requests admitted into an open pool
// are no knocks; once quiet refusals close a silent window, each request
// let through to see whether it opened is marked a knock (a refused one's
// retry waits for the window's knocks, not its own backoff: see
// lanequeue.Slot.Report), until one is admitted and the window is open.
func TestATicketSaysWhetherItKnocked(t *testing.T) {
	m := NewMemory(Config{Concurrency: 8, MaxConcurrency: 64})
	now := t0
	send := func(r Report) Ticket {
		for {
			tk, at, ok := m.Admit(now, 1, false)
			if ok {
				answered(m, &tk, r, now)
				return tk
			}
			if !at.After(now) {
				t.Fatalf("held at %v with no time to go", now.Sub(t0))
			}
			now = at
		}
	}
	refused, accepted := Report{Status: 429, Verdict: RateRefused}, Report{Status: 200, Verdict: Accepted}
	for range 3 {
		if tk := send(accepted); tk.Knock {
			t.Fatal("a request into an open pool is marked a knock")
		}
	}
	for m.View(now).Window == nil {
		now = now.Add(400 * time.Millisecond)
		if tk := send(refused); tk.Knock && m.View(now).Window == nil {
			t.Fatal("a knock before any closure")
		}
	}
	for i := range 3 {
		if tk := send(refused); !tk.Knock {
			t.Fatalf("request %d into the closed window is not marked a knock", i+1)
		}
	}
	if tk := send(accepted); !tk.Knock {
		t.Fatal("the knock that opened the window is not marked one")
	}
	if tk := send(accepted); tk.Knock {
		t.Fatal("a request into the opened window is marked a knock")
	}
}
