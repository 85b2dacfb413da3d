package proxy

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/limit"
)

func toJSON(l limit.Limits) *limitsJSON {
	j := &limitsJSON{RPM: l.RPM, TPM: l.TPM, Concurrency: l.Concurrency, Mode: "ceiling"}
	if l.MinGap > 0 {
		j.MinGap = l.MinGap.String()
	}
	if l.Start {
		j.Mode = "start"
	}
	return j
}

// limitFields are the fields a route's limits are given by.
const limitFields = "rpm, tpm, concurrency, min_gap and mode"

// parseLimits reads a change to a route's limits, a JSON object of
// limitFields, over cur: a field left out stays, null or 0 (or "" for
// min_gap) clears one, and mode null is ceiling. Its error names the
// field.
func parseLimits(body []byte, cur limit.Limits) (limit.Limits, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return cur, badAdmin("", "the body is not a JSON object of "+limitFields)
	}
	for name, raw := range fields {
		null := string(raw) == "null"
		var err error
		switch name {
		case "rpm":
			cur.RPM, err = perMinute(raw, null)
		case "tpm":
			cur.TPM, err = perMinute(raw, null)
		case "concurrency":
			cur.Concurrency = 0
			if !null && (json.Unmarshal(raw, &cur.Concurrency) != nil || cur.Concurrency < 0 || cur.Concurrency > 1e6) {
				err = fmt.Errorf("%s is not a whole number from 0 to 1000000", raw)
			}
		case "min_gap":
			cur.MinGap, err = minGap(raw, null)
		case "mode":
			var mode string
			if !null && json.Unmarshal(raw, &mode) != nil {
				mode = "?"
			}
			switch strings.ToLower(mode) {
			case "", "ceiling":
				cur.Start = false
			case "start":
				cur.Start = true
			default:
				err = fmt.Errorf("%s is not \"ceiling\" or \"start\"", raw)
			}
		default:
			return cur, badAdmin(name, fmt.Sprintf("unknown field %q: the limits are %s", name, limitFields))
		}
		if err != nil {
			return cur, badAdmin(name, name+": "+err.Error())
		}
	}
	return cur, nil
}

// perMinute reads an rpm or tpm: 0 (none), or a number within
// limit.PerMinuteBounds.
func perMinute(raw json.RawMessage, null bool) (float64, error) {
	lo, hi := limit.PerMinuteBounds()
	var f float64
	if !null && (json.Unmarshal(raw, &f) != nil || f != 0 && !(f >= lo && f <= hi)) {
		return 0, fmt.Errorf("%s is not 0 (none) or a number from %g to %g", raw, lo, hi)
	}
	return f, nil
}

// minGap reads a min_gap: a Go duration ("200ms"), "" or "0" for none.
func minGap(raw json.RawMessage, null bool) (time.Duration, error) {
	var s string
	if null {
		return 0, nil
	}
	if json.Unmarshal(raw, &s) != nil {
		return 0, fmt.Errorf("%s is not a duration such as \"200ms\"", raw)
	}
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > 24*time.Hour {
		return 0, fmt.Errorf("%q is not a duration such as \"200ms\", at most 24h", s)
	}
	return d, nil
}

// describeLimits is a route's limits for the log: "600 rpm, concurrency
// 4, as ceiling"; "none" when it has none.
func describeLimits(l limit.Limits) string {
	var parts []string
	if l.RPM > 0 {
		parts = append(parts, fmt.Sprintf("%g rpm", l.RPM))
	}
	if l.TPM > 0 {
		parts = append(parts, fmt.Sprintf("%g tpm", l.TPM))
	}
	if l.Concurrency > 0 {
		parts = append(parts, fmt.Sprintf("concurrency %d", l.Concurrency))
	}
	if l.MinGap > 0 {
		parts = append(parts, "min gap "+l.MinGap.String())
	}
	if len(parts) == 0 {
		return "none"
	}
	mode := "ceiling"
	if l.Start {
		mode = "start"
	}
	return strings.Join(parts, ", ") + ", as " + mode
}
