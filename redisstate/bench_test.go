package redisstate

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/headerparse"
	"github.com/llmproxy/llmproxy/limit"
)

// BenchmarkRequest is what the Redis path adds to one request: admission,
// learning from its answer, and giving its permit back, against a real
// redis-server on loopback. It reports the p50 and p99 of that added time
// and the Redis round trips per request; the in-process state is the
// baseline (BenchmarkRequestLocal).
func BenchmarkRequest(b *testing.B) {
	srv := startServer(b)
	st, err := New(Config{URL: srv.url(), LeaseTTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	benchRequests(b, st.Shared("bench", limit.Config{Concurrency: 64, MaxConcurrency: 64}), st)
}

// BenchmarkRequestLocal is the same with the in-process state.
func BenchmarkRequestLocal(b *testing.B) {
	benchRequests(b, limit.NewMemory(limit.Config{Concurrency: 64, MaxConcurrency: 64}), nil)
}

func benchRequests(b *testing.B, sh limit.Shared, st *Store) {
	times := make([]time.Duration, 0, b.N)
	before := commandCount(st)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		t, _, ok := sh.Admit(start, 100, false)
		if !ok {
			b.Fatal("admit refused")
		}
		now := time.Now()
		sh.Learn(&t, limit.Report{Status: 200, Verdict: limit.Accepted, Limits: headerparse.Limits{
			Requests: headerparse.Window{Limit: 1 << 30, Remaining: 1<<30 - 1, HasRemaining: true, Reset: now.Add(time.Millisecond)}}}, now)
		sh.Return(&t, time.Now())
		times = append(times, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
	if st != nil {
		b.ReportMetric(float64(commandCount(st)-before)/float64(b.N), "roundtrips/req")
	}
}

func counterValue(st *Store, op string) float64 {
	return testutil.ToFloat64(st.commands.WithLabelValues(op))
}

// commandCount is the store's Redis round trips so far.
func commandCount(st *Store) float64 {
	if st == nil {
		return 0
	}
	n := 0.0
	for _, op := range []string{"admit", "learn", "return", "refund", "settle", "renew"} {
		n += counterValue(st, op)
	}
	return n
}
