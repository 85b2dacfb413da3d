package universe

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/tokens"
)

// Dialect is how an upstream speaks of its limits.
type Dialect string

// The dialects a draw speaks in.
const (
	OpenAIExact     Dialect = "openai-exact"     // x-ratelimit-* stating the enforced size; the hint in the body
	OpenAIQuantized Dialect = "openai-quantized" // x-ratelimit-* stating per-minute figures over the enforced bucket
	AnthropicDown   Dialect = "anthropic-down"   // anthropic-ratelimit-*, resets rounded down to the second
	AnthropicUp     Dialect = "anthropic-up"     // resets rounded up
	AnthropicSkew   Dialect = "anthropic-skew"   // resets on a clock ClockSkew off
	IETF            Dialect = "ietf"             // RateLimit-Policy and RateLimit (draft-08+), Retry-After
	AzureRemaining  Dialect = "azure-remaining"  // x-ratelimit-remaining-* only; Retry-After and retry-after-ms
	GeminiRetryInfo Dialect = "gemini"           // RetryInfo retryDelay in the body alone
	RetryAfterOnly  Dialect = "retry-after"      // Retry-After in whole seconds alone
	BodyHint        Dialect = "hint"             // "Please try again in …" in the body alone
	Silent          Dialect = "silent"           // a bare 429
	Silent503       Dialect = "silent-503"       // a bare 503 with an HTML page
)

// Dialects is every dialect, in the order draws pick from.
var Dialects = []Dialect{OpenAIExact, OpenAIQuantized, AnthropicDown, AnthropicUp, AnthropicSkew, IETF,
	AzureRemaining, GeminiRetryInfo, RetryAfterOnly, BodyHint, Silent, Silent503}

// SilentDialect is whether d says nothing of its limits.
func SilentDialect(d Dialect) bool { return d == Silent || d == Silent503 }

// Anthropic is whether d is spoken on /v1/messages in Anthropic's form.
func (d Dialect) Anthropic() bool { return strings.HasPrefix(string(d), "anthropic") }

// CountRule is how the upstream counts a request's prompt. Either way it
// charges the prompt plus max_tokens at admission (as OpenAI reserves
// max_tokens), and its usage reports the prompt so counted and half of
// max_tokens generated.
type CountRule string

const (
	// Scaled is tokens.Estimate's prompt times Factor, with Noise.
	Scaled CountRule = "scaled"
	// WholeBody is the JSON body's bytes ÷ 4.
	WholeBody CountRule = "whole-body"
)

// Draw is one upstream of the universe and the load sent to it.
type Draw struct {
	Seed uint64
	// Limits are counted per scope: the key (SharedModels) or the key and
	// model.
	Limits      []Limit
	MaxInFlight int // per scope; 0: none
	Rule        CountRule
	Factor      float64 // Scaled: the upstream's count ÷ tokens.Estimate
	Noise       float64 // Scaled: each request's count varies by up to this share
	Dialect     Dialect
	ClockSkew   time.Duration // AnthropicSkew: the upstream's clock minus ours
	// CountRefused: a refused request is charged as an admitted one.
	CountRefused bool
	// Change: the limits halve a third of the way into the expected run
	// and are half again their first size from two thirds on.
	Change       bool
	Models       int
	SharedModels bool
	Latency      time.Duration
	Jitter       time.Duration // each answer takes up to this much more
	// Arrival: each request reaches the limits up to this much after it
	// came, so they are counted in another order than they were sent (a
	// network, a new connection's handshake, a loaded machine).
	Arrival   time.Duration
	Stream    bool
	MaxTokens int
	N, C      int
	// expected is how long the run would take without Change, for when
	// the change comes.
	expected time.Duration
}

// Generate draws the upstream of seed.
func Generate(seed uint64) Draw {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	logUniform := func(lo, hi float64) float64 { return lo * math.Pow(hi/lo, r.Float64()) }
	d := Draw{Seed: seed}
	d.Dialect = Dialects[r.IntN(len(Dialects))]
	if d.Dialect == AnthropicSkew {
		d.ClockSkew = []time.Duration{-time.Second, time.Second}[r.IntN(2)]
	}
	d.Models = 1 + r.IntN(4)
	d.SharedModels = d.Models > 1 && r.IntN(2) == 0
	d.Latency = time.Duration(logUniform(0.05, 2) * float64(time.Second)).Round(time.Millisecond)
	d.Jitter = time.Duration(r.Float64() * 0.5 * float64(d.Latency)).Round(time.Millisecond)
	d.Stream = r.IntN(10) < 3
	d.MaxTokens = 16 << r.IntN(6)
	d.C = int(logUniform(5, 500))
	d.CountRefused = r.IntN(10) < 3
	d.Change = r.IntN(10) < 2
	d.Rule, d.Factor, d.Noise = Scaled, 0.5+2.5*r.Float64(), 0.1*r.Float64()
	if r.IntN(5) == 0 {
		d.Rule, d.Factor, d.Noise = WholeBody, 0, 0
	}

	rate := logUniform(1, 100)
	// The first limit: its shape, and a window short enough that the run
	// spans a few of them within a few hundred requests.
	var first Limit
	switch k := r.IntN(20); {
	case k < 8:
		first = Limit{Shape: Bucket, Rate: rate, Burst: math.Max(1, math.Round(rate*(0.05+1.95*r.Float64())))}
	case k < 12:
		first = Limit{Shape: Window, Rate: rate, Window: windowFor(r, rate)}
	case k < 15:
		w := windowFor(r, rate)
		first = Limit{Shape: Aligned, Rate: rate, Window: w, Phase: time.Duration(r.Int64N(int64(w)))}
	case k < 18:
		first = Limit{Shape: Log, Rate: rate, Window: windowFor(r, rate)}
	default: // a concurrency cap alone, worth at most 100 a second
		d.MaxInFlight = max(1, min(2+r.IntN(31), int(100*d.Latency.Seconds())))
	}
	if first.Shape != "" {
		d.Limits = append(d.Limits, first)
		if r.IntN(5) == 0 && d.MaxInFlight == 0 {
			d.MaxInFlight = 4 + r.IntN(61)
		}
		if r.IntN(6) == 0 { // several at once: a longer, looser window too
			d.Limits = append(d.Limits, Limit{Shape: Window, Rate: rate * (1.05 + 0.3*r.Float64()), Window: time.Minute})
		}
	}
	// A token limit, binding or not, in the first limit's shape.
	if first.Shape != "" && r.IntN(2) == 0 {
		mean, most := d.chargeSpread()
		share := 0.3 + 0.5*r.Float64() // binds
		if r.IntN(3) == 0 {
			share = 1.5 + 1.5*r.Float64() // does not
		}
		t := first
		t.Tokens, t.Rate = true, rate*share*mean
		if t.Shape == Bucket {
			t.Burst = math.Max(math.Ceil(1.5*most), first.Burst*share*mean)
		}
		if t.Shape != Bucket && t.Rate*t.Window.Seconds() < 2*most {
			t.Rate = 2 * most / t.Window.Seconds()
		}
		d.Limits = append(d.Limits, t)
	}
	d.N = d.size(r)
	if r.IntN(4) > 0 { // drawn last: the draws before it stay as they were
		d.Arrival = time.Duration(logUniform(1, 50) * float64(time.Millisecond)).Round(time.Millisecond)
	}
	return d
}

// windowFor picks 1, 10 or 60 s, the longer ones only where a run of a
// few hundred requests spans at least two of them.
func windowFor(r *rand.Rand, rate float64) time.Duration {
	choices := []time.Duration{time.Second}
	if rate <= 30 {
		choices = append(choices, 10*time.Second)
	}
	if rate <= 4 {
		choices = append(choices, time.Minute)
	}
	return choices[r.IntN(len(choices))]
}

// size picks the request count: about 10-30 s of what the limits allow,
// within 40-1,500 requests, and two windows or more.
func (d *Draw) size(r *rand.Rand) int {
	rate := d.nominalRate()
	n := int(rate * (10 + 20*r.Float64()))
	for _, l := range d.Limits {
		if l.Window > 0 && !l.Tokens && l.Window < time.Minute {
			n = max(n, int(2.2*l.allowance(1)))
		}
		if l.Window == time.Minute && len(d.Limits) == 1 {
			n = max(n, int(2.2*l.allowance(1)))
		}
	}
	n = min(max(n, 40), 1500)
	d.expected = time.Duration(float64(n) / rate * float64(time.Second))
	return n
}

// nominalRate is requests a second the limits allow in the long run.
func (d Draw) nominalRate() float64 {
	rate := math.Inf(1)
	mean, _ := d.chargeSpread()
	for _, l := range d.Limits {
		if l.Tokens {
			rate = math.Min(rate, l.Rate/mean)
		} else {
			rate = math.Min(rate, l.Rate)
		}
	}
	if d.MaxInFlight > 0 {
		rate = math.Min(rate, float64(d.MaxInFlight)/(d.Latency+d.Jitter/2).Seconds())
	}
	scopes := 1.0
	if !d.SharedModels {
		scopes = float64(d.Models)
	}
	rate *= scopes
	return math.Min(rate, float64(d.C)/(d.Latency+d.Jitter/2).Seconds())
}

// chargeSpread is the mean and the largest count of a request, over the
// first 800.
func (d Draw) chargeSpread() (mean, most float64) {
	sum := 0.0
	for i := range 800 {
		c := float64(d.Charge(d.Body(i)))
		sum += c
		most = math.Max(most, c)
	}
	return sum / 800, most
}

// Path is where the draw's requests go.
func (d Draw) Path() string {
	if d.Dialect.Anthropic() {
		return "/v1/messages"
	}
	return "/v1/chat/completions"
}

// Model is request i's model.
func (d Draw) Model(i int) string { return fmt.Sprintf("model-%c", 'a'+i%max(d.Models, 1)) }

// Body is request i's JSON body: a prompt of 0-2,000 characters more or
// less, the draw's max_tokens, and a stream when the draw streams.
func (d Draw) Body(i int) []byte {
	pad := strings.Repeat("lorem ipsum ", int(unit(d.Seed, uint64(i), 1)*170))
	stream := ""
	if d.Stream {
		stream = `,"stream":true`
		if !d.Dialect.Anthropic() {
			stream += `,"stream_options":{"include_usage":true}`
		}
	}
	return fmt.Appendf(nil, `{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"question %06d %s"}]%s}`,
		d.Model(i), d.MaxTokens, i, pad, stream)
}

// Charge is what the upstream counts body as at admission, in tokens: its
// prompt and its max_tokens.
func (d Draw) Charge(body []byte) int64 { return d.Prompt(body) + int64(d.MaxTokens) }

// Prompt is what the upstream counts body's prompt as.
func (d Draw) Prompt(body []byte) int64 {
	if d.Rule == WholeBody {
		return int64(len(body)) / 4
	}
	r := tokens.ReadRequest(d.Path(), body)
	noise := 1 + d.Noise*(2*unitOf(body, 2)-1)
	return max(1, int64(math.Round(float64(r.Cost-r.Output)*d.Factor*noise)))
}

// answerTime is how long the upstream takes to answer body.
func (d Draw) answerTime(body []byte) time.Duration {
	return d.Latency + time.Duration(unitOf(body, 3)*float64(d.Jitter))
}

// arrival is how long body takes to reach the limits.
func (d Draw) arrival(body []byte) time.Duration {
	return time.Duration(unitOf(body, 4) * float64(d.Arrival))
}

// scale is the limits' size at elapsed into the run.
func (d Draw) scale(elapsed time.Duration) float64 {
	if !d.Change {
		return 1
	}
	switch {
	case elapsed < d.expected/3:
		return 1
	case elapsed < 2*d.expected/3:
		return 0.5
	}
	return 1.5
}

// changes are when the limits change, past the run's start.
func (d Draw) changes() []time.Duration {
	if !d.Change {
		return nil
	}
	return []time.Duration{d.expected / 3, 2 * d.expected / 3}
}

// String says what the draw is, in one line.
func (d Draw) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %s", d.Seed, d.Dialect)
	if d.ClockSkew != 0 {
		fmt.Fprintf(&b, "(clock %+v)", d.ClockSkew)
	}
	for _, l := range d.Limits {
		unit := "req"
		if l.Tokens {
			unit = "tok"
		}
		fmt.Fprintf(&b, "; %s %.4g %s/s", l.Shape, l.Rate, unit)
		if l.Shape == Bucket {
			fmt.Fprintf(&b, " burst %.4g", l.Burst)
		} else {
			fmt.Fprintf(&b, " per %v", l.Window)
		}
		if l.Phase > 0 {
			fmt.Fprintf(&b, " phase %v", l.Phase.Round(time.Millisecond))
		}
	}
	if d.MaxInFlight > 0 {
		fmt.Fprintf(&b, "; at most %d in flight", d.MaxInFlight)
	}
	if d.Rule == WholeBody {
		b.WriteString("; tokens body/4+max_tokens")
	} else {
		fmt.Fprintf(&b, "; tokens %.2f×Estimate±%.0f%%", d.Factor, 100*d.Noise)
	}
	if d.CountRefused {
		b.WriteString("; refusals count")
	}
	if d.Change {
		b.WriteString("; halves then ×3")
	}
	share := "own"
	if d.SharedModels {
		share = "shared"
	}
	fmt.Fprintf(&b, "; %d model(s) %s; answers %v+%v", d.Models, share, d.Latency, d.Jitter)
	if d.Arrival > 0 {
		fmt.Fprintf(&b, "; arriving up to %v late", d.Arrival)
	}
	if d.Stream {
		b.WriteString(" streamed")
	}
	fmt.Fprintf(&b, "; max_tokens %d; %d requests at -c %d", d.MaxTokens, d.N, d.C)
	return b.String()
}

// unit is a number in [0, 1) fixed by seed, i and salt.
func unit(seed, i, salt uint64) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d", seed, i, salt)
	return float64(h.Sum64()>>11) / (1 << 53)
}

// unitOf is a number in [0, 1) fixed by body and salt.
func unitOf(body []byte, salt byte) float64 {
	h := fnv.New64a()
	h.Write(body)
	h.Write([]byte{salt})
	return float64(h.Sum64()>>11) / (1 << 53)
}

// Row is a draw written by hand with its targets: the rows of issue 48's
// table, each a combination a real provider sends.
type Row struct {
	Name string
	Draw Draw
	// Ratio and Refused are the targets: makespan ÷ the omniscient
	// sender's, and refusals as a share (%) of the upstream's requests.
	Ratio, Refused float64
	// Floor, where set, is what the engine holds today for a row that
	// misses its target (ratio, refused): TestUniverseRows fails below it
	// and reports the target as missed.
	Floor *[2]float64
}

// Rows are the hand-written rows. Each has a seed of its own (1e9 and up)
// so that its bodies are its own.
func Rows() []Row {
	chats := func(seed uint64, dialect Dialect) Draw {
		d := Draw{Seed: seed, Dialect: dialect, Models: 1, Latency: 200 * time.Millisecond, MaxTokens: 100,
			Rule: Scaled, Factor: 1, N: 400, C: 50}
		d.expected = 20 * time.Second
		return d
	}
	// One bucket of 20 refilled at 20 a second for the key, four models
	// asked in turn, headers stating 1,200 a minute.
	shared := chats(1e9+1, OpenAIQuantized)
	shared.Limits = []Limit{{Shape: Bucket, Rate: 20, Burst: 20}}
	shared.Models, shared.SharedModels = 4, true
	// Tokens worth 20 chats a second, each counted 3× what
	// tokens.Estimate says (±5 %); requests ten times less limited.
	tpm := chats(1e9+2, OpenAIQuantized)
	tpm.Factor, tpm.Noise = 3, 0.05
	perChat := float64(tpm.Charge(tpm.Body(0)))
	tpm.Limits = []Limit{{Shape: Bucket, Rate: 200, Burst: 200},
		{Shape: Bucket, Rate: 20 * perChat, Burst: 20 * perChat, Tokens: true}}
	// 120 silent streams of about 1.8 s, 4 a second, answers 0-50 ms
	// apart.
	streams := chats(1e9+3, Silent)
	streams.Limits = []Limit{{Shape: Bucket, Rate: 4, Burst: 4}}
	streams.Latency, streams.Jitter, streams.Stream, streams.N, streams.C = 1800*time.Millisecond, 50*time.Millisecond, true, 120, 30
	streams.expected = 30 * time.Second
	// A silent bucket of 20 a second that charges refusals too, into debt
	// without a floor.
	counted := chats(1e9+4, Silent)
	counted.Limits = []Limit{{Shape: Bucket, Rate: 20, Burst: 20}}
	counted.CountRefused = true
	return []Row{
		{"shared-models-quantized", shared, 1.05, 2, nil},
		{"tpm-upstream-count", tpm, 1.05, 1, nil},
		{"streams-jitter-silent", streams, 1.15, 5, &[2]float64{1.15, 7}},
		{"counted-silent", counted, 1.10, 5, &[2]float64{1.12, 5}},
	}
}

// ParseSeeds reads a comma-separated list of seeds (a command's
// -universe flag); blanks between commas are skipped.
func ParseSeeds(list string) ([]uint64, error) {
	var seeds []uint64
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("-universe: %q is not a seed", s)
		}
		seeds = append(seeds, seed)
	}
	return seeds, nil
}
