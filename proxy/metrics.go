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
	// byRoute holds each route's series of the two histograms, resolved
	// once: a request observes them without hashing its labels.
	byRoute map[string]routeSeries
}

// routeSeries are one route's series of the per-request histograms.
type routeSeries struct {
	queueWait, upstreamLat prometheus.Observer
}

// route is the series of the route named name.
func (m *metrics) route(name string) routeSeries {
	if s, ok := m.byRoute[name]; ok {
		return s
	}
	return routeSeries{m.queueWait.WithLabelValues(name), m.upstreamLat.WithLabelValues(name)}
}

func newMetrics(reg prometheus.Registerer, lanes *lanequeue.Table, routeNames []string, buffered, spooled, sessions func() float64, routes prometheus.Collector) (*metrics, error) {
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
	m.byRoute = map[string]routeSeries{}
	for _, name := range routeNames {
		m.byRoute[name] = routeSeries{m.queueWait.WithLabelValues(name), m.upstreamLat.WithLabelValues(name)}
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmproxy_buffered_request_bytes", Help: "Request body bytes the proxy holds in memory now (bounded by LLMPROXY_MAX_BUFFERED_BYTES).",
	}, buffered)
	spool := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmproxy_spooled_request_bytes", Help: "Request body bytes the proxy holds in spool files now (bounded by LLMPROXY_MAX_SPOOL_BYTES).",
	}, spooled)
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmproxy_websocket_sessions", Help: "WebSocket sessions open now (joined after their handshake; they hold no lane permit).",
	}, sessions)
	cs := []prometheus.Collector{m.queueWait, m.upstreamLat, m.proxyErrors, held, spool, open, lanes.Collector()}
	if routes != nil {
		cs = append(cs, routes)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
