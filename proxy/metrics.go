package proxy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/upstream"
)

// metrics are the proxy's Prometheus series, all named llmproxy_*. Series
// labelled by lane are deleted when the lane leaves the table; the per-lane
// gauges are read from the table at scrape time, so they never go stale.
type metrics struct {
	requests    *prometheus.CounterVec // lane, status
	attempts    *prometheus.CounterVec // lane, status ("error" for no answer)
	absorbed429 *prometheus.CounterVec // lane
	queueWait   prometheus.Histogram
	upstreamLat *prometheus.HistogramVec // route
}

func newMetrics(reg prometheus.Registerer, lanes *lanequeue.Table) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_requests_total", Help: "Client requests answered, by lane and the status the client got (0: the client went away).",
		}, []string{"lane", "status"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_upstream_attempts_total", Help: "Upstream attempts, by lane and upstream status (\"error\": no answer).",
		}, []string{"lane", "status"}),
		absorbed429: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_absorbed_429_total", Help: "Upstream 429s the proxy retried instead of passing to the client.",
		}, []string{"lane"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmproxy_queue_wait_seconds", Help: "Time from arrival to the first upstream attempt.",
			Buckets: []float64{.001, .005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		upstreamLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmproxy_upstream_latency_seconds", Help: "Time from sending an attempt to its response headers, by route.",
			Buckets: []float64{.005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"route"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.attempts, m.absorbed429, m.queueWait, m.upstreamLat, &laneCollector{lanes: lanes}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) attempt(lane, route string, res upstream.Result, counted bool) {
	status := "error"
	if res.Resp != nil {
		status = strconv.Itoa(res.Resp.StatusCode)
		m.upstreamLat.WithLabelValues(route).Observe(res.Latency.Seconds())
	}
	if counted {
		m.attempts.WithLabelValues(lane, status).Inc()
	}
}

func (m *metrics) forgetLane(id string) {
	l := prometheus.Labels{"lane": id}
	m.requests.DeletePartialMatch(l)
	m.attempts.DeletePartialMatch(l)
	m.absorbed429.DeletePartialMatch(l)
}

// laneCollector reports each lane's live gauges from the table.
type laneCollector struct{ lanes *lanequeue.Table }

var (
	descQueued   = prometheus.NewDesc("llmproxy_lane_queue_depth", "Requests waiting in the lane.", []string{"lane"}, nil)
	descInFlight = prometheus.NewDesc("llmproxy_lane_in_flight", "Requests holding a slot in the lane.", []string{"lane"}, nil)
	descLimit    = prometheus.NewDesc("llmproxy_lane_concurrency_limit", "The lane's current concurrency limit.", []string{"lane"}, nil)
	descPaused   = prometheus.NewDesc("llmproxy_lane_paused", "1 while the lane is paused by an upstream hint.", []string{"lane"}, nil)
	descLanes    = prometheus.NewDesc("llmproxy_lanes", "Lanes in the table.", nil, nil)
)

func (c *laneCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueued, descInFlight, descLimit, descPaused, descLanes} {
		ch <- d
	}
}

func (c *laneCollector) Collect(ch chan<- prometheus.Metric) {
	states := c.lanes.States()
	ch <- prometheus.MustNewConstMetric(descLanes, prometheus.GaugeValue, float64(len(states)))
	for _, s := range states {
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(s.Queued), s.ID)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(s.InFlight), s.ID)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(s.Concurrency), s.ID)
		paused := 0.0
		if !s.PausedUntil.IsZero() {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(descPaused, prometheus.GaugeValue, paused, s.ID)
	}
}
