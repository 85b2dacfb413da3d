package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/lanequeue"
)

// metrics are the proxy's own Prometheus series, all named llmproxy_*. The
// per-lane counters and gauges come from the lane table's collector, which
// owns them and drops them with their lane.
type metrics struct {
	queueWait   *prometheus.HistogramVec // route
	upstreamLat *prometheus.HistogramVec // route
	proxyErrors *prometheus.CounterVec   // route, code, status
	spend       *prometheus.CounterVec   // route, tier
	flexRefused *prometheus.CounterVec   // route
	journaled   *prometheus.CounterVec   // result
	// byRoute holds each route's series of the two histograms, resolved
	// once: a request observes them without hashing its labels.
	byRoute map[string]routeSeries
}

// routeSeries are one route's series of the per-request histograms.
type routeSeries struct {
	queueWait, upstreamLat prometheus.Observer
	flexRefused            prometheus.Counter
}

// route is the series of the route named name.
func (m *metrics) route(name string) routeSeries {
	if s, ok := m.byRoute[name]; ok {
		return s
	}
	return routeSeries{m.queueWait.WithLabelValues(name), m.upstreamLat.WithLabelValues(name), m.flexRefused.WithLabelValues(name)}
}

// journal is the counter of the journal's answers with result: hit,
// miss (strict), recorded or joined.
func (m *metrics) journal(result string) prometheus.Counter {
	return m.journaled.WithLabelValues(result)
}

// spent counts a priced answer's cost to its route and tier.
func (m *metrics) spent(route string, tier cost.Tier, a cost.Amount) {
	m.spend.WithLabelValues(route, string(tier)).Add(a.Dollars())
}

func newMetrics(reg prometheus.Registerer, lanes *lanequeue.Table, routeNames []string, buffered, spooled, sessions func() float64, routes, spends prometheus.Collector) (*metrics, error) {
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
		spend: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_spend_usd_total", Help: "What the priced answers cost, in US dollars, by route and the tier that served them.",
		}, []string{"route", "tier"}),
		flexRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_flex_refusals_total", Help: "Flex refusals (no flex capacity) the proxy absorbed, by route; they teach the lanes nothing.",
		}, []string{"route"}),
		journaled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmproxy_journal_answers_total", Help: "Answers the journal served (hit), refused in strict mode (miss) or recorded, and answers given by joining a call in flight (joined).",
		}, []string{"result"}),
	}
	m.byRoute = map[string]routeSeries{}
	for _, name := range routeNames {
		m.byRoute[name] = routeSeries{m.queueWait.WithLabelValues(name), m.upstreamLat.WithLabelValues(name), m.flexRefused.WithLabelValues(name)}
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
	cs := []prometheus.Collector{m.queueWait, m.upstreamLat, m.proxyErrors, m.spend, m.flexRefused, m.journaled, held, spool, open, lanes.Collector(), spends}
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

// spendCollector serves the spend of the latest runs and of the lanes
// that spent most, bounded so that clients' run names cannot grow the
// series without end.
type spendCollector struct{ t *spendTable }

// maxSpendSeries bounds the run and lane series spendCollector serves,
// each.
const maxSpendSeries = 100

var (
	runSpendDesc = prometheus.NewDesc("llmproxy_run_spend_usd", "What a run's priced answers cost, in US dollars (the 100 latest runs).",
		[]string{"run", "key", "tier"}, nil)
	laneSpendDesc = prometheus.NewDesc("llmproxy_lane_spend_usd", "What a lane's priced answers cost, in US dollars (the 100 lanes that spent most).",
		[]string{"lane"}, nil)
)

func (c spendCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runSpendDesc
	ch <- laneSpendDesc
}

func (c spendCollector) Collect(ch chan<- prometheus.Metric) {
	runs := c.t.Runs()
	for _, r := range runs[:min(len(runs), maxSpendSeries)] {
		for tier, a := range r.byTier {
			ch <- prometheus.MustNewConstMetric(runSpendDesc, prometheus.GaugeValue, a.Dollars(), r.Name, r.Key, string(tier))
		}
	}
	for _, l := range c.t.Lanes(maxSpendSeries) {
		ch <- prometheus.MustNewConstMetric(laneSpendDesc, prometheus.GaugeValue, l.cost.Dollars(), l.Lane)
	}
}
