package lanequeue

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector reports every lane's counters and gauges at scrape time, read
// from the table: a lane's series go with the lane, so their number stays
// bounded by MaxLanes, and nothing outside this package needs to know that
// lanes are evicted.
func (t *Table) Collector() prometheus.Collector { return collector{t} }

type collector struct{ t *Table }

var (
	descRequests = prometheus.NewDesc("llmproxy_requests_total",
		"Client requests answered, by lane and the status the client got (0: the client went away).", []string{"lane", "status"}, nil)
	descAttempts = prometheus.NewDesc("llmproxy_upstream_attempts_total",
		"Upstream attempts, by lane and upstream status (\"error\": no answer).", []string{"lane", "status"}, nil)
	descAbsorbed = prometheus.NewDesc("llmproxy_absorbed_429_total",
		"Upstream 429s the proxy retried instead of passing to the client.", []string{"lane"}, nil)
	descQueued   = prometheus.NewDesc("llmproxy_lane_queue_depth", "Requests waiting in the lane.", []string{"lane"}, nil)
	descInFlight = prometheus.NewDesc("llmproxy_lane_in_flight", "Requests of the lane holding a concurrency permit.", []string{"lane"}, nil)
	descLimit    = prometheus.NewDesc("llmproxy_lane_concurrency_limit", "The concurrency limit of the lane's limit group.", []string{"lane"}, nil)
	descPaused   = prometheus.NewDesc("llmproxy_lane_paused", "1 while the lane is paused by an upstream hint.", []string{"lane"}, nil)
	descReqRate  = prometheus.NewDesc("llmproxy_lane_requests_per_second", "The request rate the lane has learned (0: unknown).", []string{"lane"}, nil)
	descTokRate  = prometheus.NewDesc("llmproxy_lane_tokens_per_second", "The token rate the lane has learned (0: unknown).", []string{"lane"}, nil)
	descLanes    = prometheus.NewDesc("llmproxy_lanes", "Lanes in the table.", nil, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRequests, descAttempts, descAbsorbed, descQueued, descInFlight, descLimit, descPaused, descReqRate, descTokRate, descLanes} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	states := c.t.States()
	ch <- prometheus.MustNewConstMetric(descLanes, prometheus.GaugeValue, float64(len(states)))
	for _, s := range states {
		for status, n := range s.Answers {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(n), s.ID, strconv.Itoa(status))
		}
		for status, n := range s.Attempts {
			label := "error"
			if status != 0 {
				label = strconv.Itoa(status)
			}
			ch <- prometheus.MustNewConstMetric(descAttempts, prometheus.CounterValue, float64(n), s.ID, label)
		}
		ch <- prometheus.MustNewConstMetric(descAbsorbed, prometheus.CounterValue, float64(s.Absorbed429), s.ID)
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(s.Queued), s.ID)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(s.InFlight), s.ID)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(s.Concurrency), s.ID)
		paused := 0.0
		if !s.PausedUntil.IsZero() {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(descPaused, prometheus.GaugeValue, paused, s.ID)
		ch <- prometheus.MustNewConstMetric(descReqRate, prometheus.GaugeValue, s.RequestsPerSecond, s.ID)
		ch <- prometheus.MustNewConstMetric(descTokRate, prometheus.GaugeValue, s.TokensPerSecond, s.ID)
	}
}
