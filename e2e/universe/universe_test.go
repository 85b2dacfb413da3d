package universe

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/tokens"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 370e6, time.UTC)

func TestIdealOfATokenBucketIsItsRefill(t *testing.T) {
	// 100 requests at once into a bucket of 5 refilled at 10 a second:
	// the last is admitted (100-5)/10 s in, and answered 100 ms later.
	d := Draw{Limits: []Limit{{Shape: Bucket, Rate: 10, Burst: 5}}, Models: 1, Latency: 100 * time.Millisecond,
		N: 100, C: 1000, Rule: Scaled, Factor: 1, MaxTokens: 16, Dialect: Silent}
	if got, want := Ideal(d, epoch), 9500*time.Millisecond+100*time.Millisecond; absDiff(got, want) > time.Millisecond {
		t.Errorf("ideal %v, want %v", got, want)
	}
}

func TestIdealOfFixedWindowsSendsEachAllowanceAtItsStart(t *testing.T) {
	// 600 in windows of 200 per 10 s, from the first request: three
	// windows, the last one's answers 200 ms after it opens.
	d := Draw{Limits: []Limit{{Shape: Window, Rate: 20, Window: 10 * time.Second}}, Models: 1,
		Latency: 200 * time.Millisecond, N: 600, C: 200, Rule: Scaled, Factor: 1, MaxTokens: 16, Dialect: Silent}
	if got, want := Ideal(d, epoch), 20*time.Second+200*time.Millisecond; absDiff(got, want) > time.Millisecond {
		t.Errorf("ideal %v, want %v", got, want)
	}
	// Aligned to the clock, a boundary 9.7 s into the run.
	d.Limits[0].Shape, d.Limits[0].Phase = Aligned, 70*time.Millisecond
	if got, want := Ideal(d, epoch), 19900*time.Millisecond; absDiff(got, want) > time.Millisecond {
		t.Errorf("aligned: ideal %v, want %v", got, want)
	}
}

func TestIdealOfAConcurrencyCapIsWaves(t *testing.T) {
	d := Draw{MaxInFlight: 8, Models: 1, Latency: 500 * time.Millisecond, N: 80, C: 50, Rule: Scaled, Factor: 1,
		MaxTokens: 16, Dialect: Silent}
	if got, want := Ideal(d, epoch), 5*time.Second; absDiff(got, want) > time.Millisecond {
		t.Errorf("ideal %v, want %v", got, want)
	}
}

func TestIdealOfASlidingLogReturnsABurstOneWindowLater(t *testing.T) {
	// 30 a second over 1 s windows, 90 at once: three bursts, a second
	// apart.
	d := Draw{Limits: []Limit{{Shape: Log, Rate: 30, Window: time.Second}}, Models: 1, Latency: 100 * time.Millisecond,
		N: 90, C: 90, Rule: Scaled, Factor: 1, MaxTokens: 16, Dialect: Silent}
	if got, want := Ideal(d, epoch), 2100*time.Millisecond; absDiff(got, want) > time.Millisecond {
		t.Errorf("ideal %v, want %v", got, want)
	}
}

// The omniscient sender's schedule is one the upstream admits whole: sent
// at the instants Ideal chose, no request is refused, on every shape.
func TestTheUpstreamAdmitsWhatTheOmniscientSenderSends(t *testing.T) {
	for seed := uint64(1); seed <= 60; seed++ {
		d := Generate(seed)
		d.N = min(d.N, 200)
		s := newState(d)
		sends, _ := schedule(d, epoch)
		released := make([]bool, len(sends))
		for k, x := range sends {
			for j := range sends[:k] {
				if !released[j] && !sends[j].end.After(x.t) {
					released[j] = true
					s.release(d.Model(sends[j].i))
				}
			}
			if v := s.admit(x.t, d.Model(x.i), d.Charge(d.Body(x.i)), true); !v.ok {
				t.Fatalf("%v: request %d refused at %v", d, x.i, x.t.Sub(epoch))
			}
		}
		if len(sends) != d.N {
			t.Errorf("%v: %d of %d sent", d, len(sends), d.N)
		}
	}
}

func TestTheUpstreamSpeaksItsDialect(t *testing.T) {
	for _, dialect := range Dialects {
		d := Draw{Limits: []Limit{{Shape: Bucket, Rate: 1, Burst: 1}}, Models: 1, Latency: time.Millisecond, N: 2, C: 2,
			Rule: Scaled, Factor: 1, MaxTokens: 16, Dialect: dialect}
		u := NewUpstream(d)
		var codes []int
		var last *httptest.ResponseRecorder
		for i := range 2 {
			w := httptest.NewRecorder()
			u.ServeHTTP(w, httptest.NewRequest(http.MethodPost, d.Path(), bytes.NewReader(d.Body(i))))
			codes = append(codes, w.Code)
			last = w
		}
		want := http.StatusTooManyRequests
		if dialect == Silent503 {
			want = http.StatusServiceUnavailable
		}
		if codes[0] != http.StatusOK || codes[1] != want {
			t.Errorf("%s: statuses %v, want 200 then %d", dialect, codes, want)
		}
		h := last.Header()
		has := map[Dialect]string{OpenAIExact: "x-ratelimit-reset-requests", OpenAIQuantized: "x-ratelimit-limit-requests",
			AnthropicDown: "anthropic-ratelimit-requests-reset", IETF: "RateLimit", AzureRemaining: "retry-after-ms",
			RetryAfterOnly: "Retry-After"}[dialect]
		if has != "" && h.Get(has) == "" {
			t.Errorf("%s: no %s in %v", dialect, has, h)
		}
		if SilentDialect(dialect) && (h.Get("Retry-After") != "" || bytes.Contains(last.Body.Bytes(), []byte("again"))) {
			t.Errorf("%s: says something: %v %q", dialect, h, last.Body.String())
		}
		if q, _ := u.Stats(); q != 2 {
			t.Errorf("%s: %d requests counted", dialect, q)
		}
	}
	// Quantized headers state the per-minute figure, exact ones the size.
	for dialect, want := range map[Dialect]string{OpenAIQuantized: "60", OpenAIExact: "1"} {
		d := Draw{Limits: []Limit{{Shape: Bucket, Rate: 1, Burst: 1}}, Models: 1, N: 1, C: 1, Rule: Scaled, Factor: 1,
			MaxTokens: 16, Dialect: dialect}
		w := httptest.NewRecorder()
		NewUpstream(d).ServeHTTP(w, httptest.NewRequest(http.MethodPost, d.Path(), bytes.NewReader(d.Body(0))))
		if got := w.Header().Get("x-ratelimit-limit-requests"); got != want {
			t.Errorf("%s: limit %q, want %q", dialect, got, want)
		}
	}
	// An IETF policy states a bucket's rate over the whole seconds it
	// fills in: a burst of 2 at 6.25 a second fills in 0.32 s, so 6 a
	// second, not 2; a burst of 20 at 6.25, 25 over 4 s.
	for _, c := range []struct {
		burst float64
		want  string
	}{{2, `"default";q=6;w=1`}, {20, `"default";q=25;w=4`}, {6.25, `"default";q=6;w=1`}} {
		d := Draw{Limits: []Limit{{Shape: Bucket, Rate: 6.25, Burst: c.burst}}, Models: 1, N: 1, C: 1, Rule: Scaled, Factor: 1,
			MaxTokens: 16, Dialect: IETF}
		w := httptest.NewRecorder()
		NewUpstream(d).ServeHTTP(w, httptest.NewRequest(http.MethodPost, d.Path(), bytes.NewReader(d.Body(0))))
		if got := w.Header().Get("RateLimit-Policy"); got != c.want {
			t.Errorf("IETF bucket of %g at 6.25/s: policy %q, want %q", c.burst, got, c.want)
		}
	}
}

func TestTheUpstreamCountsTokensItsOwnWay(t *testing.T) {
	d := Draw{Rule: WholeBody, MaxTokens: 100, Dialect: Silent, Models: 1}
	body := d.Body(0)
	if got, want := d.Charge(body), int64(len(body)/4+100); got != want {
		t.Errorf("whole-body charge %d, want %d", got, want)
	}
	d = Draw{Rule: Scaled, Factor: 3, MaxTokens: 100, Dialect: Silent, Models: 1}
	one := Draw{Rule: Scaled, Factor: 1, MaxTokens: 100, Dialect: Silent, Models: 1}
	if a, b := d.Prompt(body), one.Prompt(body); a < 3*b-1 || a > 3*b+1 {
		t.Errorf("3× prompt %d against %d", a, b)
	}
	if got, want := one.Charge(body), tokens.Estimate(d.Path(), body); got != want {
		t.Errorf("a factor of 1 charges %d, tokens.Estimate says %d", got, want)
	}
}

func TestDrawsAreRepeatableAndVaried(t *testing.T) {
	if a, b := Generate(7).String(), Generate(7).String(); a != b {
		t.Errorf("seed 7 drew %q then %q", a, b)
	}
	dialects, shapes := map[Dialect]bool{}, map[Shape]bool{}
	for seed := uint64(1); seed <= 300; seed++ {
		d := Generate(seed)
		dialects[d.Dialect] = true
		for _, l := range d.Limits {
			shapes[l.Shape] = true
		}
		if d.N < 40 || d.N > 1500 || d.C < 5 || d.C > 500 {
			t.Errorf("%v: load out of range", d)
		}
	}
	if len(dialects) != len(Dialects) || len(shapes) != 4 {
		t.Errorf("300 draws spoke %d dialects and kept %d shapes", len(dialects), len(shapes))
	}
}

func absDiff(a, b time.Duration) time.Duration {
	if a > b {
		return a - b
	}
	return b - a
}
