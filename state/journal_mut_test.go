package state

import (
	"errors"
	"testing"
	"time"
)

func sizeOf(t *testing.T, e *Entry) int64 {
	v, err := encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(v))
}

func TestTheJournalsBytesFollowEveryChange(t *testing.T) {
	_, j := openJournal(t, time.Minute, 0)
	now := time.Now()
	old, first, again := entry("r", 1, 1, now.Add(-2*time.Minute), "old"), entry("r", 2, 1, now, "new"), entry("r", 2, 1, now, "newer!")
	for _, e := range []*Entry{old, first, again} {
		if err := j.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	if b := j.Stats().Bytes; b != sizeOf(t, old)+sizeOf(t, again) {
		t.Fatalf("after a replace: %d bytes, want %d", b, sizeOf(t, old)+sizeOf(t, again))
	}
	j.Sweep(now)
	if b := j.Stats().Bytes; b != sizeOf(t, again) {
		t.Fatalf("after a sweep: %d bytes, want %d", b, sizeOf(t, again))
	}
	j.Remove("r")
	if st := j.Stats(); st.Bytes != 0 || st.Entries != 0 {
		t.Fatalf("after removing all: %+v", st)
	}
}

func TestTheJournalDropsOnlyWhatItsBoundNeeds(t *testing.T) {
	now := time.Now()
	es := []*Entry{entry("r", 1, 1, now, "x"), entry("r", 2, 1, now.Add(time.Second), "x"), entry("r", 3, 1, now.Add(2*time.Second), "x")}
	_, j := openJournal(t, 0, 2*sizeOf(t, es[0]))
	for _, e := range es {
		j.Put(e)
	}
	if n := j.Stats().Entries; n != 2 {
		t.Fatalf("%d entries kept, want the 2 that fill the bound exactly", n)
	}
}

func TestWithoutATTLNothingExpires(t *testing.T) {
	_, j := openJournal(t, 0, 0)
	now := time.Now()
	e := entry("r", 1, 1, now.Add(-time.Hour), "x")
	j.Put(e)
	if _, ok, _ := j.Lookup("r", e.Key, 1, now); !ok {
		t.Fatal("an entry expired with no TTL")
	}
	if n, _ := j.Sweep(now); n != 0 {
		t.Fatalf("a sweep with no TTL removed %d", n)
	}
}

func TestAnEntryExactlyItsTTLOldIsStillServed(t *testing.T) {
	_, j := openJournal(t, time.Minute, 0)
	now := time.Now()
	e := entry("r", 1, 3, now.Add(-time.Minute), "x")
	j.Put(e)
	got, ok, _ := j.Lookup("r", e.Key, 3, now)
	if !ok || got.Run != "r" || got.Key != e.Key || got.Occurrence != 3 {
		t.Fatalf("lookup: %v %+v", ok, got)
	}
	if n, _ := j.Sweep(now); n != 0 {
		t.Fatalf("swept %d", n)
	}
}

func TestPutLaterAnswersEachPutOnce(t *testing.T) {
	s, j := openJournal(t, 0, 0)
	got := make(chan error, 4)
	then := func(err error) { got <- err }
	answer := func() error {
		select {
		case err := <-got:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("then was never called")
			return nil
		}
	}
	e := entry("r", 1, 1, time.Now(), "x")
	j.PutLater(e, then)
	if err := answer(); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := j.Lookup("r", e.Key, 1, time.Now()); !ok {
		t.Fatal("not put")
	}
	j.PutLater(entry("", 1, 1, time.Now(), ""), then)
	if err := answer(); err == nil {
		t.Fatal("an entry without a run was put")
	}
	s.Close()
	j.PutLater(e, then)
	if err := answer(); !errors.Is(err, errClosed) || len(got) != 0 {
		t.Fatalf("a put after Close: %v, %d more answers", err, len(got))
	}
}

func TestAnEntryRemovedAndPutAgainIsNotSweptByItsOldAge(t *testing.T) {
	_, j := openJournal(t, time.Minute, 0)
	now := time.Now()
	j.Put(entry("r", 1, 1, now.Add(-2*time.Minute), "old"))
	j.Remove("r")
	e := entry("r", 1, 1, now, "new")
	j.Put(e)
	if n, _ := j.Sweep(now); n != 0 {
		t.Fatalf("the sweep removed %d: the removed entry's age outlived it", n)
	}
	if _, ok, _ := j.Lookup("r", e.Key, 1, now); !ok {
		t.Fatal("the entry put again is gone")
	}
}
