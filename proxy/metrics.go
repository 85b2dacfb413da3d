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

// routesCollector reports the global cap and the local routes' model gates
// at scrape time.
type routesCollector struct{ p *Proxy }

var (
	descGlobalLimit   = prometheus.NewDesc("llmproxy_global_concurrency_limit", "LLMPROXY_GLOBAL_CONCURRENCY.", nil, nil)
	descGlobalInUse   = prometheus.NewDesc("llmproxy_global_concurrency_in_use", "Places of the global cap held by requests sent upstream.", nil, nil)
	descGlobalWaiting = prometheus.NewDesc("llmproxy_global_concurrency_waiting_groups", "Limit groups with a request ready to go but for the global cap.", nil, nil)
	descSwaps         = prometheus.NewDesc("llmproxy_local_model_swaps_total", "Model swaps the local route's gate made.", []string{"route"}, nil)
	descSwapsAvoided  = prometheus.NewDesc("llmproxy_local_model_swaps_avoided_total", "Model changes between consecutive arrivals that the local route's gate did not turn into swaps.", []string{"route"}, nil)
	descLoaded        = prometheus.NewDesc("llmproxy_local_model_loaded", "1 for the model a local route's gate holds loaded.", []string{"route", "model"}, nil)
	descLocalWaiting  = prometheus.NewDesc("llmproxy_local_model_waiting", "Requests waiting at the local route's gate for their model.", []string{"route"}, nil)
)

func (c routesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGlobalLimit, descGlobalInUse, descGlobalWaiting, descSwaps, descSwapsAvoided, descLoaded, descLocalWaiting} {
		ch <- d
	}
}

func (c routesCollector) Collect(ch chan<- prometheus.Metric) {
	if st, ok := c.p.lanes.CapStats(); ok {
		ch <- prometheus.MustNewConstMetric(descGlobalLimit, prometheus.GaugeValue, float64(st.Limit))
		ch <- prometheus.MustNewConstMetric(descGlobalInUse, prometheus.GaugeValue, float64(st.InUse))
		ch <- prometheus.MustNewConstMetric(descGlobalWaiting, prometheus.GaugeValue, float64(st.Waiting))
	}
	for _, r := range c.p.lanes.GateStats() {
		ch <- prometheus.MustNewConstMetric(descSwaps, prometheus.CounterValue, float64(r.Swaps), r.Route)
		ch <- prometheus.MustNewConstMetric(descSwapsAvoided, prometheus.CounterValue, float64(r.SwapsAvoided), r.Route)
		ch <- prometheus.MustNewConstMetric(descLocalWaiting, prometheus.GaugeValue, float64(r.Waiting), r.Route)
		if r.Loaded != "" {
			ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, 1, r.Route, r.Loaded)
		}
	}
}
