package lanequeue

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector reports the lanes' counters and gauges at scrape time, read
// from the table: a lane's series go with the lane, and nothing outside
// this package needs to know that lanes are evicted. Only
// defaultMetricLanes lanes have series of their own: those the upstream
// vouched for (see Lane.vouched) first, then the busiest, then the most
// recently used, so that random keys, models or paths cannot grow the
// metrics or push a real lane's series out. The others' queued and in
// flight requests are summed under lane="other"; their counters are left
// out (a sum over a changing set of lanes would not be a counter).
func (t *Table) Collector() prometheus.Collector { return collector{t} }

// otherLanes is the lane label of the lanes without series of their own.
const otherLanes = "other"

type collector struct{ t *Table }

func laneDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"lane"}, labels...), nil)
}

var (
	descRequests = laneDesc("llmproxy_requests_total",
		"Client requests answered, by lane, the status the client got (0: none was sent) and outcome (how the answer ended, as the proxy names it).", "status", "outcome")
	descAttempts = laneDesc("llmproxy_upstream_attempts_total",
		"Upstream attempts, by lane and upstream status (\"error\": no answer).", "status")
	descAbsorbed    = laneDesc("llmproxy_absorbed_429_total", "Upstream 429s the proxy retried instead of passing to the client.")
	descInfo        = laneDesc("llmproxy_lane_info", "Always 1: what the lane id stands for.", "route", "path", "model", "key_hash")
	descQueued      = laneDesc("llmproxy_lane_queue_depth", "Requests waiting in the lane.")
	descInFlight    = laneDesc("llmproxy_lane_in_flight", "Requests of the lane holding a concurrency permit.")
	descLimit       = laneDesc("llmproxy_lane_concurrency_limit", "The concurrency limit of the lane's pool.")
	descPaused      = laneDesc("llmproxy_lane_paused", "1 while the lane is paused by an upstream hint.")
	descPauses      = laneDesc("llmproxy_lane_pauses_total", "Pauses started by the lane's answers, by reason.", "reason")
	descPausedSecs  = laneDesc("llmproxy_lane_paused_seconds_total", "Pause time set by the lane's answers, by reason.", "reason")
	descReqLimit    = laneDesc("llmproxy_lane_requests_limit", "The request window the lane has learned, as corrected by refusals (0: unknown).")
	descReqLeft     = laneDesc("llmproxy_lane_requests_remaining", "Requests left in the learned window now.")
	descReqRate     = laneDesc("llmproxy_lane_requests_per_second", "The request rate the lane has learned (0: unknown).")
	descTokLimit    = laneDesc("llmproxy_lane_tokens_limit", "The token window the lane has learned, as corrected by refusals (0: unknown).")
	descTokLeft     = laneDesc("llmproxy_lane_tokens_remaining", "Tokens left in the learned window now.")
	descTokRate     = laneDesc("llmproxy_lane_tokens_per_second", "The token rate the lane has learned (0: unknown).")
	descAdmitted    = laneDesc("llmproxy_lane_admitted_rate", "The request rate the lane's pool measured from the upstream's behaviour, without rate-limit headers (0: not learned so).")
	descDrain       = laneDesc("llmproxy_lane_drain_seconds", "Estimated time until the lane's pool has sent what waits now (0: nothing waits, or nothing learned).")
	descConfigured  = laneDesc("llmproxy_lane_configured_limit", "A limit the lane's route configures (LLMPROXY_ROUTE_<NAME>_*), by kind: rpm, tpm, concurrency, min_gap_seconds; only those set.", "kind")
	descLanes       = prometheus.NewDesc("llmproxy_lanes", "Lanes in the table.", nil, nil)
	descListed      = prometheus.NewDesc("llmproxy_lanes_listed", "Lanes with series of their own (at most 200: vouched for by the upstream first, then the busiest); the others' queue depth and in flight are under lane=\"other\".", nil, nil)
	laneDescriptors = []*prometheus.Desc{descRequests, descAttempts, descAbsorbed, descInfo, descQueued, descInFlight,
		descLimit, descPaused, descPauses, descPausedSecs, descReqLimit, descReqLeft, descReqRate, descTokLimit,
		descTokLeft, descTokRate, descAdmitted, descDrain, descConfigured, descLanes, descListed}
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range laneDescriptors {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	loads := c.t.loads(true)
	listed := min(len(loads), c.t.cfg.metricLanes)
	ch <- prometheus.MustNewConstMetric(descLanes, prometheus.GaugeValue, float64(len(loads)))
	ch <- prometheus.MustNewConstMetric(descListed, prometheus.GaugeValue, float64(listed))
	if rest := loads[listed:]; len(rest) > 0 {
		queued, flights := 0, 0
		for _, ld := range rest {
			queued += ld.queued
			flights += ld.flights
		}
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(queued), otherLanes)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(flights), otherLanes)
	}
	for _, ld := range loads[:listed] {
		collectLane(ch, ld.l.State())
	}
}

// collectLane sends the series of the lane whose state is s.
func collectLane(ch chan<- prometheus.Metric, s State) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	id := s.ID
	gauge(descInfo, 1, id, s.Route, s.Path, s.Model, s.KeyHash)
	for k, n := range s.answerCounts {
		counter(descRequests, float64(n), id, strconv.Itoa(k.Status), k.Outcome)
	}
	for status, n := range s.Attempts {
		label := "error"
		if status != 0 {
			label = strconv.Itoa(status)
		}
		counter(descAttempts, float64(n), id, label)
	}
	counter(descAbsorbed, float64(s.Absorbed429), id)
	for reason, n := range s.Pauses {
		counter(descPauses, float64(n), id, reason)
	}
	for reason, secs := range s.PausedSeconds {
		counter(descPausedSecs, secs, id, reason)
	}
	gauge(descQueued, float64(s.Queued), id)
	gauge(descInFlight, float64(s.InFlight), id)
	gauge(descLimit, float64(s.Concurrency), id)
	paused := 0.0
	if !s.PausedUntil.IsZero() {
		paused = 1
	}
	gauge(descPaused, paused, id)
	gauge(descReqLimit, s.RequestsLimit, id)
	gauge(descReqLeft, s.RequestsAvailable, id)
	gauge(descReqRate, s.RequestsPerSecond, id)
	gauge(descTokLimit, s.TokensLimit, id)
	gauge(descTokLeft, s.TokensAvailable, id)
	gauge(descTokRate, s.TokensPerSecond, id)
	gauge(descAdmitted, s.AdmittedRate, id)
	gauge(descDrain, s.DrainSeconds, id)
	if c := s.Configured; c != nil {
		for _, k := range []struct {
			kind string
			v    float64
		}{{"rpm", c.RPM}, {"tpm", c.TPM}, {"concurrency", float64(c.Concurrency)}, {"min_gap_seconds", c.MinGapSecs}} {
			if k.v > 0 {
				gauge(descConfigured, k.v, id, k.kind)
			}
		}
	}
}
