package proxy

import "github.com/prometheus/client_golang/prometheus"

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
