package proxy

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Health is what the admin endpoints report beyond the lanes. Nil fields
// mean: always ready, never degraded, no shared state.
type Health struct {
	// Ready reports why the proxy cannot serve; /readyz then answers 503.
	Ready func(context.Context) error
	// Degraded reports why the proxy serves with less than it should (a
	// shared store it cannot reach); /readyz still answers 200, and says
	// "degraded" and why.
	Degraded func() error
	// Shared is what /lanes says of the state shared with other replicas:
	// "ok" or "degraded"; nil: "off".
	Shared func() string
}

// AdminHandler serves /healthz, /readyz, /metrics and /lanes.
func (p *Proxy) AdminHandler(h Health) http.Handler {
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if h.Ready != nil {
			if err := h.Ready(r.Context()); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": err.Error()})
				return
			}
		}
		if h.Degraded != nil {
			if err := h.Degraded(); err != nil {
				writeJSON(w, http.StatusOK, map[string]string{"status": "degraded", "reason": err.Error()})
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	r.Handle("/metrics", promhttp.HandlerFor(p.cfg.Gatherer, promhttp.HandlerOpts{}))
	r.Get("/lanes", func(w http.ResponseWriter, _ *http.Request) {
		shared := "off"
		if h.Shared != nil {
			shared = h.Shared()
		}
		writeJSON(w, http.StatusOK, map[string]any{"redis": shared, "lanes": p.lanes.States()})
	})
	return r
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
