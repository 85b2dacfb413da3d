package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/lanequeue"
)

// metrics are the proxy's own Prometheus series, all named llmproxy_*. The
// per-lane counters and gauges come from the lane table's collector, which
// owns them and drops them with their lane.
type metrics struct {
	queueWait   *prometheus.HistogramVec // route
	upstreamLat *prometheus.HistogramVec // route
	proxyErrors *prometheus.CounterVec   // route, code, status
}

func newMetrics(reg prometheus.Registerer, lanes *lanequeue.Table, buffered func() float64) (*metrics, error) {
	m := &metrics{
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmproxy_queue_wait_seconds", Help: "Time from arrival to the first upstream attempt, by route.",
			Buckets: []float64{.001, .005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"route"}),
		upstreamLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmproxy_upstream_latency_seconds", Help: "Time from sending an attempt to its response headers, by route.",
			Buckets: []float64{.005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"route"}),
		proxyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_proxy_errors_total", Help: "Errors the proxy answered itself, by route, error code and HTTP status.",
		}, []string{"route", "code", "status"}),
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmproxy_buffered_request_bytes", Help: "Request body bytes the proxy holds now (bounded by LLMPROXY_MAX_BUFFERED_BYTES).",
	}, buffered)
	for _, c := range []prometheus.Collector{m.queueWait, m.upstreamLat, m.proxyErrors, held, lanes.Collector()} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
