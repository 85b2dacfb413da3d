package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/llmproxy/llmproxy/limit"
)

// The admin endpoints that change lanes while the proxy runs (behind the
// admin token):
//
//	GET    /admin/routes                    every route's limits and hold
//	GET    /admin/routes/{route}/limits     one route's
//	PUT    /admin/routes/{route}/limits     change them (JSON: rpm, tpm, concurrency, min_gap, mode)
//	DELETE /admin/routes/{route}/limits     back to the route's own (LLMPROXY_ROUTE_<NAME>_*)
//	POST   /admin/routes/{route}/hold, /release, /clear
//	POST   /admin/lanes/{lane}/hold, /release, /clear
//
// {route} is a route's name, or "default" for LLMPROXY_UPSTREAM; {lane} a
// lane's ID as /lanes shows it. Each change is logged with who asked, and
// shared with the other replicas through the Fleet; it lasts until the
// proxy stops.

// defaultRoute is how the admin endpoints name the default upstream's
// route (no route may have its name: it would share DEFAULT in
// LLMPROXY_ROUTE_<NAME>_*).
const defaultRoute = "default"

// operateRoutes mounts the endpoints that change lanes on r. open: no
// admin token guards them; locked: nor may they change anything (see
// mayWrite), the listener at addr not being bound to loopback.
func (p *Proxy) operateRoutes(r chi.Router, open, locked bool, addr string) {
	r.Get("/admin/routes", p.listRoutes)
	r.Get("/admin/routes/{route}/limits", p.getLimits)
	r.Group(func(r chi.Router) {
		r.Use(func(next http.Handler) http.Handler { return mayWrite(next, locked, addr) })
		r.Put("/admin/routes/{route}/limits", p.putLimits(open))
		r.Delete("/admin/routes/{route}/limits", p.putLimits(open))
		for _, op := range []string{"hold", "release", "clear"} {
			r.Post("/admin/routes/{route}/"+op, p.operateOn("route", open))
			r.Post("/admin/lanes/{lane}/"+op, p.operateOn("lane", open))
		}
	})
}

// mayWrite serves next to the requests that may change lanes. Without an
// admin token only a listener bound to loopback takes changes (a local
// dev proxy; locked: not this one, bound to addr): who may connect to a
// listener on another address is not the proxy's to know, and a peer's
// loopback address proves nothing (a sidecar, a port-forward). A
// browser's request from another site may not in any case: a page must
// not hold a lane (the token's cookie stays home by SameSite=Strict, but
// a proxy without a token has no cookie to miss).
func mayWrite(next http.Handler, locked bool, addr string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if locked {
			replyFor(fail(failAdminWrite, "this admin endpoint changes lanes; without an admin token it takes changes only on an admin listener bound to loopback (LLMPROXY_ADMIN_ADDR=127.0.0.1:9090), and this one is bound to "+strconv.Quote(addr)+": set LLMPROXY_ADMIN_TOKEN to change lanes here"), time.Time{}).write(w)
			return
		}
		if crossSite(r) {
			replyFor(fail(failAdminWrite, "this admin endpoint changes lanes and answers no page of another site"), time.Time{}).write(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// crossSite reports whether a browser sent r from a page of another
// origin than the admin listener's.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return true
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err != nil || u.Host != r.Host
}

// asker names who asked, as the log and /lanes say it: the first 8 hex
// digits of the admin token's SHA-256 ("token:ab12cd34"; the login
// cookie holds that sum), or "local" when no token guards the endpoints
// (open). Never the token.
func asker(r *http.Request, open bool) string {
	if open {
		return "local"
	}
	if scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		sum := sha256.Sum256([]byte(strings.TrimSpace(cred)))
		return "token:" + hex.EncodeToString(sum[:4])
	}
	c, _ := r.Cookie(adminCookie) // the guard let the request in: it holds the sum
	return "token:" + c.Value[:8]
}

// routeOf is the route {route} names, and whether there is one.
func (p *Proxy) routeOf(r *http.Request) (string, bool) {
	name := chi.URLParam(r, "route")
	if strings.EqualFold(name, defaultRoute) {
		return "", true
	}
	_, ok := p.settings[name]
	return name, ok && name != ""
}

// routeName is how the endpoints name route.
func routeName(route string) string {
	if route == "" {
		return defaultRoute
	}
	return route
}

func (p *Proxy) unknownRoute(w http.ResponseWriter, r *http.Request) {
	names := []string{defaultRoute}
	for n := range p.settings {
		if n != "" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	replyFor(fail(failNotFound, fmt.Sprintf("no route %q (routes: %s)", chi.URLParam(r, "route"), strings.Join(names, ", "))), time.Time{}).write(w)
}

// routeView is a route's limits and hold as the endpoints show them.
type routeView struct {
	Route string `json:"route"`
	// Limits are those in force; Configured the route's own; Set, when
	// they were set at run time and by whom.
	Limits     *limitsJSON `json:"limits"`
	Configured *limitsJSON `json:"configured"`
	Set        *madeBy     `json:"set,omitempty"`
	Held       *madeBy     `json:"held,omitempty"`
}

// routeViewLocked is route's view. Requires p.ops.mu held.
func (p *Proxy) routeViewLocked(route string) routeView {
	own := p.settings[route].Limits
	v := routeView{Route: routeName(route), Limits: toJSON(own), Configured: toJSON(own)}
	if ops := p.ops.routes[route]; ops != nil {
		if ops.limits != nil {
			set := ops.set
			v.Limits, v.Set = toJSON(*ops.limits), &set
		}
		v.Held = ops.hold
	}
	return v
}

func (p *Proxy) listRoutes(w http.ResponseWriter, _ *http.Request) {
	routes := make([]string, 0, len(p.settings))
	for n := range p.settings {
		routes = append(routes, n)
	}
	slices.Sort(routes)
	p.ops.mu.Lock()
	out := make([]routeView, len(routes))
	for i, n := range routes {
		out[i] = p.routeViewLocked(n)
	}
	p.ops.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"routes": out})
}

// changedRoutes are the views of the routes an operator changed (their
// limits set, or held), by name.
func (p *Proxy) changedRoutes() []routeView {
	p.ops.mu.Lock()
	defer p.ops.mu.Unlock()
	var out []routeView
	for route, ops := range p.ops.routes {
		if ops.limits != nil || ops.hold != nil {
			out = append(out, p.routeViewLocked(route))
		}
	}
	slices.SortFunc(out, func(a, b routeView) int { return strings.Compare(a.Route, b.Route) })
	return out
}

func (p *Proxy) getLimits(w http.ResponseWriter, r *http.Request) {
	route, ok := p.routeOf(r)
	if !ok {
		p.unknownRoute(w, r)
		return
	}
	p.ops.mu.Lock()
	v := p.routeViewLocked(route)
	p.ops.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}

// maxAdminBody bounds a change's body.
const maxAdminBody = 64 << 10

// putLimits sets a route's limits (PUT: the body's fields over those in
// force) or sets them back to the route's own (DELETE); open: see
// asker.
func (p *Proxy) putLimits(open bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { p.setLimits(w, r, open) }
}

func (p *Proxy) setLimits(w http.ResponseWriter, r *http.Request, open bool) {
	route, ok := p.routeOf(r)
	if !ok {
		p.unknownRoute(w, r)
		return
	}
	c := adminChange{Op: "reset", By: asker(r, open), At: p.cfg.Clock.Now()}
	if r.Method == http.MethodPut {
		body, err := readAdminBody(w, r)
		if err != nil {
			replyFor(err, time.Time{}).write(w)
			return
		}
		p.ops.mu.Lock()
		cur := p.settings[route].Limits
		if ops := p.ops.routes[route]; ops != nil && ops.limits != nil {
			cur = *ops.limits
		}
		p.ops.mu.Unlock()
		lim, err := parseLimits(body, cur)
		if err != nil {
			replyFor(err, time.Time{}).write(w)
			return
		}
		c.Op, c.lim, c.Limits = "limits", &lim, toJSON(lim)
	}
	p.apply(r.Context(), "route", routeName(route), c, false)
	p.ops.mu.Lock()
	v := p.routeViewLocked(route)
	p.ops.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}

// readAdminBody reads a change's body, at most maxAdminBody: one JSON
// value and nothing after it but white space (a second object, or bytes
// a client glued on, would be taken for a change that was not meant).
func readAdminBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	var body json.RawMessage
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err := dec.Decode(&body); err != nil {
		return nil, badAdmin("", "the body is not one JSON object of "+limitFields+": "+err.Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badAdmin("", "the body has more after its JSON object: send one object of "+limitFields)
	}
	return body, nil
}

// operateOn serves POST /admin/{what}s/{name}/{hold,release,clear}, what
// being "route" or "lane"; open: see asker.
func (p *Proxy) operateOn(what string, open bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		op := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		c := adminChange{Op: op, By: asker(r, open), At: p.cfg.Clock.Now()}
		name := chi.URLParam(r, what)
		if what == "route" {
			route, ok := p.routeOf(r)
			if !ok {
				p.unknownRoute(w, r)
				return
			}
			name = routeName(route)
		} else if !validLaneID(name) {
			replyFor(badAdmin("lane", fmt.Sprintf("%q is not a lane ID (hex digits, as /lanes shows them)", name)), time.Time{}).write(w)
			return
		}
		body := map[string]any{what: name, "op": c.Op, "by": c.By, "at": c.At}
		if err := p.apply(r.Context(), what, name, c, false); err != nil {
			replyFor(fail(failNotFound, fmt.Sprintf("no lane %s (llmproxy status, or /lanes, lists them)", name)), time.Time{}).write(w)
			return
		}
		writeJSON(w, http.StatusOK, body)
	}
}

// validLaneID reports whether id can be a lane's ID: hex digits, at most a
// SHA-256's.
func validLaneID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	_, err := hex.DecodeString(id + strings.Repeat("0", len(id)%2))
	return err == nil && strings.ToLower(id) == id
}

// apply makes change c of the route or lane name (what: "route" or
// "lane") here, logs it with who asked, and, made here (not elsewhere),
// tells the other replicas. Its error is the lane table's: no lane has
// that ID.
func (p *Proxy) apply(ctx context.Context, what, name string, c adminChange, elsewhere bool) error {
	p.ops.mu.Lock()
	err := p.operate(what, name, c, elsewhere)
	p.ops.mu.Unlock()
	if err != nil {
		return err
	}
	attrs := []any{what, name, "op", c.Op, "by", c.By}
	if c.lim != nil {
		attrs = append(attrs, "limits", describeLimits(*c.lim))
	}
	msg := "admin change"
	if elsewhere {
		msg = "admin change from another replica"
	}
	p.log.Info(msg, attrs...)
	if !elsewhere && p.cfg.Fleet != nil {
		v, _ := json.Marshal(c)
		// Made here already: a client gone does not keep it from the others.
		if err := p.cfg.Fleet.PutChange(context.WithoutCancel(ctx), what+":"+name+":"+fleetField(c.Op), string(v)); err != nil {
			p.log.Warn("admin change not shared with the other replicas", append(attrs, "err", err.Error())...)
		}
	}
	return nil
}

// operate makes c on the route or the lane (what) name in the lane
// table, a route's recorded as in force. Requires p.ops.mu held.
func (p *Proxy) operate(what, name string, c adminChange, elsewhere bool) error {
	t := p.lanes
	if what == "lane" {
		switch c.Op {
		case "hold", "release":
			return t.HoldLane(name, c.Op == "hold", c.By, c.At, elsewhere)
		case "clear":
			return t.ClearLane(name, c.By, c.At, elsewhere)
		}
		return fmt.Errorf("lane %s: limits are set on a route", name)
	}
	route := name
	if name == defaultRoute {
		route = ""
	}
	p.ops.recordLocked(route, c)
	switch c.Op {
	case "hold", "release":
		t.HoldRoute(route, c.Op == "hold", c.By, c.At)
	case "clear":
		t.ClearRoute(route, c.By, c.At)
	default:
		t.SetRouteLimits(route, c.lim, c.By, c.At)
	}
	return nil
}

// fleetField is the part of a change's field that names its kind: a
// hold and its release are one field, as a route's limits and their
// reset are.
func fleetField(op string) string {
	switch op {
	case "release":
		return "hold"
	case "reset":
		return "limits"
	}
	return op
}

// applyFleet makes a change another replica made (see Fleet), unless it
// is a clear made before this replica started (first: nothing of it is
// here to clear).
func (p *Proxy) applyFleet(field, value string, first bool) {
	what, rest, _ := strings.Cut(field, ":")
	name, _, _ := strings.Cut(rest, ":")
	c, err := decodeChange(value)
	if err == nil && what == "route" && name != defaultRoute {
		if _, ok := p.settings[name]; !ok {
			err = fmt.Errorf("no route %q here", name)
		}
	}
	if err == nil && what != "route" && (what != "lane" || !validLaneID(name)) {
		err = fmt.Errorf("%q is not a route's or a lane's", field)
	}
	if err != nil {
		p.log.Warn("another replica's admin change ignored", "field", field, "err", err.Error())
		return
	}
	if c.Op == "clear" && first {
		return
	}
	_ = p.apply(context.Background(), what, name, c, true)
}

// decodeChange reads a change as the replicas share it.
func decodeChange(value string) (adminChange, error) {
	var c adminChange
	if err := json.Unmarshal([]byte(value), &c); err != nil {
		return c, err
	}
	switch c.Op {
	case "limits":
		if c.Limits == nil {
			return c, errors.New("limits without their figures")
		}
		raw, _ := json.Marshal(c.Limits)
		lim, err := parseLimits(raw, limit.Limits{})
		if err != nil {
			return c, err
		}
		c.lim = &lim
	case "reset", "hold", "release", "clear":
	default:
		return c, fmt.Errorf("unknown op %q", c.Op)
	}
	return c, nil
}

// adminCookie holds a browser's proof of the admin token.
const adminCookie = "llmproxy_admin"

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
