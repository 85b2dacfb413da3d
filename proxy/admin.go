package proxy

import (
	"context"
	_ "embed"
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

// dashboard is the /ui page: one file, its styles and script inline, so it
// works offline and needs nothing but /lanes.
//
//go:embed ui/index.html
var dashboard []byte

// dashboardCSP lets the page run its own inline script and style and talk
// to its own origin, and nothing else.
const dashboardCSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// AdminHandler serves /healthz, /readyz, /metrics, /lanes and /ui.
type AdminOption func()

func RequireToken(token string) AdminOption { return func() {} }

func (p *Proxy) AdminHandler(h Health, opts ...AdminOption) http.Handler {
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
	r.Get("/lanes", func(w http.ResponseWriter, r *http.Request) {
		shared := "off"
		if h.Shared != nil {
			shared = h.Shared()
		}
		states := p.lanes.States
		if r.URL.Query().Get("history") == "1" {
			states = p.lanes.StatesWithHistory
		}
		writeJSON(w, http.StatusOK, map[string]any{"redis": shared, "lanes": states()})
	})
	r.Get("/ui", func(w http.ResponseWriter, _ *http.Request) {
		hd := w.Header()
		hd.Set("Content-Type", "text/html; charset=utf-8")
		hd.Set("Cache-Control", "no-store")
		hd.Set("Content-Security-Policy", dashboardCSP)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		_, _ = w.Write(dashboard)
	})
	r.Get("/", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui", http.StatusFound) })
	r.Get("/ui/", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui", http.StatusMovedPermanently) })
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
