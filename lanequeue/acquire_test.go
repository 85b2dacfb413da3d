package lanequeue

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmproxy/llmproxy/clock"
	"github.com/llmproxy/llmproxy/limit"
)

// TestAcquireToDoneIsOneRequest: Table.Acquire puts a request in the lane
// of its key (the credential hashed, never kept), Done gives the permit
// back and counts the answer once, however often it is called, and a
// refused Acquire gives no slot but an error that names the lane, where
// Answered counts the refusal.
func TestAcquireToDoneIsOneRequest(t *testing.T) {
	tb := NewTable(TableConfig{Lane: Config{Concurrency: 1, MaxConcurrency: 1, MaxQueue: 1}})
	r := Request{Route: "r", Credential: "sk-secret", Path: "/v1/chat/completions", Model: "gpt", Cost: 10}
	key := NewKey("r", "sk-secret", "/v1/chat/completions", "gpt")
	if key.CredentialHash != HashCredential("sk-secret") || key.CredentialHash == "sk-secret" {
		t.Fatalf("key %+v does not hold the credential's hash", key)
	}
	s, err := tb.Acquire(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() != key.ID() {
		t.Fatalf("slot's lane %s, want the key's %s", s.ID(), key.ID())
	}
	queued := make(chan error, 1)
	go func() {
		s2, err := tb.Acquire(context.Background(), r) // waits for s's permit
		if err == nil {
			s2.Done(200, "ok", -1)
		}
		queued <- err
	}()
	waitFor(t, func() bool { return tb.laneFor(key).State().Queued == 1 })
	full, err := tb.Acquire(context.Background(), r) // the queue of one is full
	var refused interface{ LaneID() string }
	if !errors.Is(err, ErrQueueFull) || full != nil || !errors.As(err, &refused) || refused.LaneID() != key.ID() {
		t.Fatalf("a full queue gave slot %v, err %v; want no slot and ErrQueueFull naming the lane", full, err)
	}
	tb.Answered(refused.LaneID(), 429, "proxy_error")
	tb.Answered("f00d", 429, "proxy_error") // no lane has that ID: nothing to count
	s.Done(200, "ok", 12)
	s.Done(200, "ok", 12) // twice is once
	if err := within(t, queued, "the waiter still waits after Done: the permit did not come back"); err != nil {
		t.Fatalf("the waiter did not get the permit Done gave back: %v", err)
	}
	st := tb.laneFor(key).State()
	if st.Answers[200] != 2 || st.Answers[429] != 1 || st.InFlight != 0 {
		t.Fatalf("answers %v, %d in flight; want two 200s, one 429 and none in flight", st.Answers, st.InFlight)
	}
}

// TestAcquireWaitsAtTheRoutesModelGate: on a route with a model gate, a
// request for another model than the loaded one waits until Done of the
// loaded model's last request lets it in.
func TestAcquireWaitsAtTheRoutesModelGate(t *testing.T) {
	fc := clock.NewFake(t0)
	tb := NewTable(TableConfig{Lane: Config{Clock: fc}, LocalRoutes: map[string]time.Duration{"local": time.Hour}})
	gate := tb.gates["local"]
	a, err := tb.Acquire(context.Background(), Request{Route: "local", Path: "/v1/chat/completions", Model: "a"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		b, err := tb.Acquire(context.Background(), Request{Route: "local", Path: "/v1/chat/completions", Model: "b"})
		if err == nil {
			b.Done(200, "ok", -1)
		}
		got <- err
	}()
	waitFor(t, func() bool { return gate.Stats().Waiting == 1 })
	select {
	case err := <-got:
		t.Fatalf("model b went while a was loaded and busy (err %v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	a.Done(200, "ok", -1)
	if err := within(t, got, "model b still waits after a's Done: a never left the gate"); err != nil {
		t.Fatalf("model b after a's Done: %v", err)
	}
	if st := gate.Stats(); st.Loaded != "b" || st.InFlight != 0 {
		t.Fatalf("gate %+v, want b loaded and nothing in flight after both Done", st)
	}
}

// waitFor polls cond for up to five seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// within is what ch gives within five seconds; it fails the test with
// stuck when nothing comes.
func within(t *testing.T, ch <-chan error, stuck string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal(stuck)
		return nil
	}
}

// TestDoneSettlesWithTheUsageKnown: Done swaps the request's estimate for
// the tokens its answer used, when known (0 included); unknown (-1) keeps
// the estimate charged. 6,000 tokens a minute refill 100 a second, so the
// next request of 100 waits for what the first still holds.
func TestDoneSettlesWithTheUsageKnown(t *testing.T) {
	for _, c := range []struct {
		used int64
		wait time.Duration
	}{
		{-1, time.Second},
		{0, 0},
		{10, 100 * time.Millisecond},
	} {
		synctest.Test(t, func(t *testing.T) {
			tb := configuredTable(limit.Limits{TPM: 6000})
			r := Request{Credential: "sk-c", Path: "/v1/chat/completions", Model: "m", Cost: 100}
			first, err := tb.Acquire(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			first.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
			first.Done(200, "ok", c.used)
			begin := time.Now()
			next, err := tb.Acquire(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			next.Done(200, "ok", -1)
			if waited := time.Since(begin); waited != c.wait {
				t.Errorf("used %d: the next request waited %v, want %v", c.used, waited, c.wait)
			}
		})
	}
}

// TestDoneSettlingAReleasedSlotLetsTheNextGo: a slot released before its
// Done (its permit given back for a session) still settles at Done, and
// the tokens the settling frees go to the request waiting for them at
// once, not when the refill would have let it.
func TestDoneSettlingAReleasedSlotLetsTheNextGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := configuredTable(limit.Limits{TPM: 6000})
		r := Request{Credential: "sk-c", Path: "/v1/chat/completions", Model: "m", Cost: 100}
		first, err := tb.Acquire(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		first.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
		closed := first.OpenSession()
		defer closed()
		granted := make(chan time.Time, 1)
		go func() {
			next, err := tb.Acquire(context.Background(), r)
			if err == nil {
				granted <- time.Now()
				next.Done(200, "ok", -1)
			}
		}()
		synctest.Wait() // the next request waits for the tokens the first holds
		begin := time.Now()
		first.Done(200, "ok", 0)
		if waited := (<-granted).Sub(begin); waited != 0 {
			t.Errorf("the next request went %v after the first settled, want at once", waited)
		}
	})
}

// countingShared counts the calls a group makes to its Shared.
type countingShared struct {
	*limit.Memory
	refunds, settles, returns int
}

func (c *countingShared) Refund(t *limit.Ticket) { c.refunds++; c.Memory.Refund(t) }
func (c *countingShared) Settle(t *limit.Ticket, used int64) {
	c.settles++
	c.Memory.Settle(t, used)
}
func (c *countingShared) Return(t *limit.Ticket, now time.Time) { c.returns++; c.Memory.Return(t, now) }

// TestTheGroupTellsItsSharedOfEachEventOnce: the group keeps the ticket's
// bookkeeping, so a Shared hears of a refund, a settle and a return once
// each, however often the slot's owner ends it, and of no settle after a
// refund (an attempt that never reached the upstream).
func TestTheGroupTellsItsSharedOfEachEventOnce(t *testing.T) {
	var c *countingShared
	tb := NewTable(TableConfig{Shared: func(_ string, cfg limit.Config) limit.Shared {
		c = &countingShared{Memory: limit.NewMemory(cfg)}
		return c
	}})
	r := Request{Path: "/v1/chat/completions", Model: "m", Cost: 10}
	s, err := tb.Acquire(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
	s.Done(200, "ok", 5)
	s.Done(200, "ok", 5)
	if c.refunds != 0 || c.settles != 1 || c.returns != 1 {
		t.Fatalf("an answered request: %d refunds, %d settles, %d returns; want 0, 1, 1", c.refunds, c.settles, c.returns)
	}
	s, err = tb.Acquire(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	s.Report(limit.Report{Verdict: limit.NotSent}) // the connection failed: refunded
	s.Done(0, "proxy_error", 5)
	if c.refunds != 1 || c.settles != 1 || c.returns != 2 {
		t.Fatalf("then one never sent: %d refunds, %d settles, %d returns in all; want 1, 1, 2", c.refunds, c.settles, c.returns)
	}
}

// TestARetrysTicketIsToldOfAsNew: the once-only marks belong to the
// ticket the slot holds; a retry's dispatch takes a new one, whose
// settle and return the Shared hears of though the first attempt's
// charge and permit went back already.
func TestARetrysTicketIsToldOfAsNew(t *testing.T) {
	var c *countingShared
	tb := NewTable(TableConfig{Shared: func(_ string, cfg limit.Config) limit.Shared {
		c = &countingShared{Memory: limit.NewMemory(cfg)}
		return c
	}})
	s, err := tb.Acquire(context.Background(), Request{Path: "/v1/chat/completions", Model: "m", Cost: 10})
	if err != nil {
		t.Fatal(err)
	}
	s.Report(limit.Report{Verdict: limit.NotSent}) // refunded
	if err := s.WaitRetry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if c.refunds != 1 || c.returns != 1 {
		t.Fatalf("the first attempt: %d refunds, %d returns; want 1, 1", c.refunds, c.returns)
	}
	s.Report(limit.Report{Status: 200, Verdict: limit.Accepted})
	s.Done(200, "ok", 5)
	if c.refunds != 1 || c.settles != 1 || c.returns != 2 {
		t.Fatalf("after the retry's answer: %d refunds, %d settles, %d returns in all; want 1, 1, 2", c.refunds, c.settles, c.returns)
	}
}
