package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// metrics are the proxy's own Prometheus series, all named llmproxy_*. The
// per-lane counters and gauges come from the lane table's collector, which
// owns them and drops them with their lane.
type metrics struct {
	queueWait   prometheus.Histogram
	upstreamLat *prometheus.HistogramVec // route
}

func newMetrics(reg prometheus.Registerer, lanes *lanequeue.Table) (*metrics, error) {
	m := &metrics{
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmproxy_queue_wait_seconds", Help: "Time from arrival to the first upstream attempt.",
			Buckets: []float64{.001, .005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		upstreamLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmproxy_upstream_latency_seconds", Help: "Time from sending an attempt to its response headers, by route.",
			Buckets: []float64{.005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"route"}),
	}
	for _, c := range []prometheus.Collector{m.queueWait, m.upstreamLat, lanes.Collector()} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
