package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmproxy/llmproxy/internal/buildinfo"
	"github.com/llmproxy/llmproxy/lanequeue"
)

// Health is what the admin endpoints report beyond the lanes. Nil fields
// mean: always ready, never degraded, no shared state; a zero Build, no
// build named.
type Health struct {
	// Build is the running build, which /healthz names beside its status.
	Build buildinfo.Info
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

// healthz is the /healthz answer: {"status":"ok"} and the build's fields
// (version, revision, time, modified, goversion) that are known.
type healthz struct {
	Status string `json:"status"`
	buildinfo.Info
}

// dashboard is the /ui page: one file, its styles and script inline, so it
// works offline and needs nothing but /lanes.
//
//go:embed ui/index.html
var dashboard []byte

// dashboardCSP lets the page run its own inline script and style and talk
// to its own origin, and nothing else.
const dashboardCSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// AdminOption changes what AdminHandler serves.
type AdminOption func(*adminOptions)

type adminOptions struct {
	token    *adminToken // nil: the endpoints answer loopback Hosts only
	profile  bool        // serve /debug/pprof/
	loopback bool        // the admin listener is bound to a loopback address
	addr     string      // the admin listener's address, as ListenerAddr gave it
}

// WithProfiling serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/, behind the admin token when there is one: CPU, heap,
// allocations, goroutines, and the mutex and block profiles when their
// rates are set (the caller's choice; they cost time when on). Without a
// token they are served only on a listener bound to loopback (see
// ListenerAddr).
func WithProfiling() AdminOption {
	return func(o *adminOptions) { o.profile = true }
}

// ListenerAddr tells the handler the address its listener is bound to
// (net.Listener's Addr). Without an admin token, only a listener bound to
// a loopback address takes changes and serves profiles: the peer's
// address proves nothing, since a sidecar or a port-forward makes every
// caller local. Without this option the listener counts as not loopback.
func ListenerAddr(addr string) AdminOption {
	return func(o *adminOptions) { o.addr, o.loopback = addr, LoopbackHost(addr) }
}

// LoopbackHost reports whether host, a host name or an IP address with or
// without a port (a Host header, a listener's address), is this host's
// loopback: "localhost" or an address of 127.0.0.0/8 or ::1. An empty host
// (":9090", every interface) is not.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1] // a Host of an IPv6 address on port 80
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// profilesServed reports whether WithProfiling's profiles are served by a
// handler with an admin token (hasToken) on a listener bound to addr.
func profilesServed(hasToken bool, addr string) bool { return hasToken || LoopbackHost(addr) }

// RequireToken makes /metrics, /lanes, /ui and / answer 401 unless the
// request carries token, as Authorization: Bearer <token> or as the cookie
// that /ui?token=<token> sets: a browser cannot add a header to a page it
// navigates to. /healthz and /readyz stay open for load balancers and the
// container's HEALTHCHECK. An empty token is no token: then every
// endpoint but those two answers only requests addressed to localhost or
// a loopback address (a page rebinding its name to 127.0.0.1 still sends
// its name), and changes need a loopback listener (see ListenerAddr).
func RequireToken(token string) AdminOption {
	return func(o *adminOptions) {
		if token != "" {
			o.token = &adminToken{sum: sha256.Sum256([]byte(token))}
		}
	}
}

// /lanes pages: by default the 200 busiest lanes; ?limit= up to 2,000.
const (
	defaultLanesPage = 200
	maxLanesPage     = 2000
)

// AdminHandler serves /healthz, /readyz, /metrics, /lanes, /ui, the
// journal's /journal endpoints and the /admin/ changes; all but the
// first two are guarded, by a token (RequireToken) or, without one, by
// the Host they are addressed to.
func (p *Proxy) AdminHandler(h Health, opts ...AdminOption) http.Handler {
	var o adminOptions
	for _, opt := range opts {
		opt(&o)
	}
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		replyFor(fail(failNotFound, "the admin listener serves /healthz, /readyz, /metrics, /lanes, /ui, /journal and /admin/; not "+r.URL.Path), time.Time{}).write(w)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		allow := allowedAt(r.URL.Path)
		w.Header().Set("Allow", allow)
		replyFor(fail(failMethod, r.Method+" "+r.URL.Path+": this admin endpoint answers "+allow), time.Time{}).write(w)
	})
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, healthz{Status: "ok", Info: h.Build})
	})
	r.Get("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if h.Ready != nil {
			if err := h.Ready(r.Context()); err != nil {
				replyFor(fail(failNotReady, "not ready: "+err.Error()), time.Time{}).write(w)
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
	r.Group(func(r chi.Router) {
		if o.token != nil {
			r.Use(o.token.guard)
		} else {
			r.Use(loopbackHostOnly)
		}
		p.laneViews(r, h)
		p.operateRoutes(r, o.token == nil, o.token == nil && !o.loopback, o.addr)
		p.journalRoutes(r, o.token == nil, o.token == nil && !o.loopback, o.addr)
		if o.profile && profilesServed(o.token != nil, o.addr) {
			r.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			r.HandleFunc("/debug/pprof/profile", pprof.Profile)
			r.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			r.HandleFunc("/debug/pprof/trace", pprof.Trace)
			r.HandleFunc("/debug/pprof/*", pprof.Index)
		}
	})
	return r
}

// allowedAt is the methods the admin endpoint at path answers.
func allowedAt(path string) string {
	if path == "/journal" {
		return "GET, DELETE"
	}
	if !strings.HasPrefix(path, "/admin/") || path == "/admin/routes" {
		return "GET"
	}
	if strings.HasSuffix(path, "/limits") {
		return "GET, PUT, DELETE"
	}
	return "POST"
}

// laneViews serves what the admin token guards: the metrics, the lanes and
// the dashboard.
func (p *Proxy) laneViews(r chi.Router, h Health) {
	r.Handle("/metrics", promhttp.HandlerFor(p.cfg.Gatherer, promhttp.HandlerOpts{}))
	r.Get("/lanes", func(w http.ResponseWriter, r *http.Request) {
		shared := "off"
		if h.Shared != nil {
			shared = h.Shared()
		}
		// A page of the busiest lanes, never the whole table at once.
		limit := defaultLanesPage
		if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v > 0 {
			limit = min(v, maxLanesPage)
		}
		states, total := p.lanes.Busiest(limit, r.URL.Query().Get("history") == "1")
		if states == nil {
			states = []lanequeue.State{}
		}
		body := map[string]any{"redis": shared, "total": total, "lanes": states}
		if st, ok := p.lanes.CapStats(); ok {
			body["global"] = st
		}
		if gates := p.lanes.GateStats(); len(gates) > 0 {
			body["local_routes"] = gates
		}
		if changed := p.changedRoutes(); len(changed) > 0 {
			body["routes"] = changed
		}
		if runs := p.spends.Runs(); len(runs) > 0 {
			body["runs"] = runs
		}
		if spend := p.spends.Lanes(limit); len(spend) > 0 {
			body["lane_spend"] = spend
		}
		if j := p.keeping.journal; j != nil {
			body["journal"] = j.Stats()
		}
		writeJSON(w, http.StatusOK, body)
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
}

// loopbackHostOnly serves next to the requests whose Host is this host's
// loopback (see LoopbackHost) and answers 403 to the rest. It guards the
// endpoints when there is no admin token: a web page can make its own
// name resolve to 127.0.0.1 (DNS rebinding) and then read and change what
// the listener serves, but its requests still carry its own name as Host.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !LoopbackHost(r.Host) {
			w.Header().Set("Cache-Control", "no-store")
			replyFor(fail(failAdminHost, "without an admin token this endpoint answers only requests addressed to localhost or a loopback address (Host: 127.0.0.1:PORT), not Host "+strconv.Quote(r.Host)+": set LLMPROXY_ADMIN_TOKEN to reach it by another name"), time.Time{}).write(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// adminToken checks the admin token. Only its SHA-256 is kept, and every
// comparison is of two SHA-256 sums in constant time, so neither the
// token's bytes nor its length show in the timing.
type adminToken struct {
	sum [sha256.Size]byte
}

// guard serves next to requests that carry the token and answers 401 to
// the rest; /ui?token= is the browser's way in.
func (t *adminToken) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ui" && r.URL.Query().Has("token") {
			t.login(w, r)
			return
		}
		if !t.allows(r) {
			refuseAdmin(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (t *adminToken) matches(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1
}

// allows reports whether r carries the token in its Authorization header
// or, without a Bearer credential there, the login cookie. A wrong Bearer
// token is refused even beside a good cookie: who asked is told by the
// Bearer token when there is one (see asker), and it must be the one that
// let the request in.
func (t *adminToken) allows(r *http.Request) bool {
	if scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		return t.matches(strings.TrimSpace(cred))
	}
	c, err := r.Cookie(adminCookie)
	if err != nil {
		return false
	}
	sum, err := hex.DecodeString(c.Value)
	return err == nil && subtle.ConstantTimeCompare(sum, t.sum[:]) == 1
}

// login answers /ui?token=: the right token gets the cookie and a page
// that moves on to /ui, so the token leaves the address bar (and the
// history). The cookie holds the token's SHA-256, not the token: the
// browser never stores the secret, and its characters need no cookie
// encoding. HttpOnly keeps it from scripts, SameSite=Strict from other
// sites' requests.
func (t *adminToken) login(w http.ResponseWriter, r *http.Request) {
	if !t.matches(r.URL.Query().Get("token")) {
		refuseAdmin(w)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: adminCookie, Value: hex.EncodeToString(t.sum[:]), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	hd.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write([]byte(loginPage))
}

// loginPage sends the browser on to /ui. It is a page, not a 303: when
// another site started the navigation (a link in a wiki or a chat), a
// redirect stays cross-site, the SameSite=Strict cookie does not go with
// it and the link lands on a 401 (seen in Chromium); the page's own
// refresh is a same-site navigation.
const loginPage = `<!doctype html>
<meta http-equiv="refresh" content="0;url=/ui">
<title>llmproxy</title>
<a href="/ui">Continue to the dashboard</a>
`

// refuseAdmin is the 401 for a missing or wrong admin token, in the
// OpenAI error format of every other answer the proxy makes itself.
func refuseAdmin(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="llmproxy admin"`)
	w.Header().Set("Cache-Control", "no-store")
	replyFor(fail(failAdminToken, "this admin endpoint needs the admin token (LLMPROXY_ADMIN_TOKEN): send Authorization: Bearer <token>, or open /ui?token=<token> once in a browser"), time.Time{}).write(w)
}
