package proxy

import (
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/internal/bound"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
)

// New builds a proxy from cfg.
func New(cfg Config) (*Proxy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	stopped, stop := context.WithCancel(context.Background())
	p := &Proxy{cfg: cfg, log: cfg.Logger, stopped: stopped, stop: stop,
		policy: retryPolicy{maxRetries: cfg.MaxRetries, maxRetryAfter: cfg.MaxRetryAfter, backoff: cfg.Backoff}}
	p.sessions = map[*session]struct{}{}
	p.keeping.init(cfg.Journal, cfg.JournalMode, cfg.JournalPassGap)
	if p.ledger = cfg.Ledger; p.ledger == nil {
		p.ledger = cost.NewLocal()
	}
	p.bodySeed = maphash.MakeSeed()
	p.buffered.init(cfg.MaxBufferedBytes, cfg.MemoryBodyBytes, "LLMPROXY_MAX_BUFFERED_BYTES", "held in memory")
	p.spooled.init(cfg.MaxSpoolBytes, cfg.MaxBodyBytes, "LLMPROXY_MAX_SPOOL_BYTES", "spooled to disk")
	if cfg.Tracer != nil {
		p.providers = routeProviders(cfg)
	}
	lanes := p.routeLimits(cfg.Lanes)
	p.lanes = lanequeue.NewTable(lanes)
	if n := removeSpools(cfg.SpoolDir); n > 0 {
		p.log.Info("removed request bodies spooled before a crash", "dir", cfg.SpoolDir, "files", n)
	}
	var routes prometheus.Collector
	if lanes.GlobalConcurrency > 0 || len(lanes.LocalRoutes) > 0 {
		routes = routesCollector{p}
	}
	m, err := newMetrics(cfg.Registry, p.lanes, slices.Collect(maps.Keys(p.settings)), func() float64 { return float64(p.buffered.Load()) },
		func() float64 { return float64(p.spooled.Load()) }, func() float64 { return float64(p.Sessions()) }, routes, spendCollector{&p.spends})
	if err != nil {
		return nil, err
	}
	p.metrics = m
	r := chi.NewRouter()
	for _, rt := range cfg.Routes {
		h := p.routeHandler(rt.Name, rt.URL, "/"+rt.Name)
		r.Handle("/"+rt.Name, h)
		r.Handle("/"+rt.Name+"/*", h)
	}
	r.NotFound(p.routeHandler("", cfg.Upstream, ""))
	r.MethodNotAllowed(p.routeHandler("", cfg.Upstream, ""))
	p.handler = p.guard(r)
	p.ops.routes = map[string]*routeOps{}
	if cfg.Fleet != nil {
		cfg.Fleet.WatchChanges(p.applyFleet)
	}
	return p, nil
}

// routeLimits sets each route's settings on p, and returns lanes with
// each route's limits, the local routes (each kept to one model at a time
// by a model gate) and the global cap.
func (p *Proxy) routeLimits(lanes lanequeue.TableConfig) lanequeue.TableConfig {
	cfg := p.cfg
	p.settings = map[string]RouteSettings{"": cfg.Default}
	for _, rt := range cfg.Routes {
		p.settings[rt.Name] = rt.Settings
	}
	for name, st := range p.settings {
		if st.Limits != (limit.Limits{}) {
			if lanes.RouteLimits == nil {
				lanes.RouteLimits = map[string]limit.Limits{}
			}
			lanes.RouteLimits[name] = st.Limits
		}
	}
	lanes.LocalRoutes = p.localRoutes()
	lanes.GlobalConcurrency = cfg.GlobalConcurrency
	return lanes
}

// trackingWriter remembers whether the status line went out. It keeps
// http.Flusher and the rest reachable through Unwrap for
// http.ResponseController.
type trackingWriter struct {
	http.ResponseWriter
	wroteHeader bool
}

func (t *trackingWriter) WriteHeader(code int) {
	if code >= 200 {
		t.wroteHeader = true
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.wroteHeader = true
	return t.ResponseWriter.Write(b)
}

func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// guard refuses requests that try to choose the upstream themselves and
// turns a panic into a JSON 500 instead of a dropped connection.
func (p *Proxy) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				p.log.Error("panic serving request", "panic", fmt.Sprint(v), "path", bound.Field(r.URL.Path))
				if tw.wroteHeader {
					// Part of an answer is out: only a broken connection
					// tells the client it is incomplete.
					panic(http.ErrAbortHandler)
				}
				p.writeFailure(w, "", fail(failInternal, "internal error"), false)
			}
		}()
		w = tw
		if r.ContentLength != 0 {
			// The body's deadline runs from here, not only from when
			// it is read (see paced): whatever answers a request
			// without reading its body, the server's read of what is
			// left ends by then.
			if rd := deadliner(w); rd != nil {
				_ = rd.SetReadDeadline(time.Now().Add(p.cfg.BodyTimeout))
			}
		}
		if r.Method == http.MethodConnect {
			unread(w, r)
			p.writeFailure(w, "", fail(failMethod, "CONNECT is not supported: llmproxy is a reverse proxy, set your client's base URL to it"), false)
			return
		}
		if !strings.HasPrefix(r.RequestURI, "/") {
			unread(w, r)
			p.writeFailure(w, "", fail(failAbsoluteURI, "absolute-form request targets are not supported: llmproxy sends every request to its configured upstream"), false)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// localRoutes are the routes to a local server, each with its model
// gate's fairness.
func (p *Proxy) localRoutes() map[string]time.Duration {
	var out map[string]time.Duration
	for name, st := range p.settings {
		if st.Local {
			if out == nil {
				out = map[string]time.Duration{}
			}
			out[name] = st.LocalFairness
		}
	}
	return out
}
