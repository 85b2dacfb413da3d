package main

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/llmproxy/llmproxy/cost"
	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/limit"
	"github.com/llmproxy/llmproxy/proxy"
)

// routePrefix starts every per-route variable:
// LLMPROXY_ROUTE_<NAME>_<SETTING>.
const routePrefix = envPrefix + "ROUTE_"

// defaultRouteName is <NAME> for LLMPROXY_UPSTREAM.
const defaultRouteName = "DEFAULT"

// routeSetting is one per-route setting: its name, what -h says of it, and
// how its value goes into the route's settings.
type routeSetting struct {
	name, def, help string
	set             func(st *proxy.RouteSettings, v string) error
}

var routeSettings = []routeSetting{
	{"RPM", "unset", "requests a minute per pool (credential + model), as even spacing", func(st *proxy.RouteSettings, v string) error {
		f, err := positive(v)
		st.Limits.RPM = f
		return err
	}},
	{"TPM", "unset", "tokens a minute per pool (estimated before sending, settled from usage)", func(st *proxy.RouteSettings, v string) error {
		f, err := positive(v)
		st.Limits.TPM = f
		return err
	}},
	{"CONCURRENCY", "unset", "requests in flight per pool: where it starts, and (ceiling) its highest", func(st *proxy.RouteSettings, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a whole number of at least 1", v)
		}
		st.Limits.Concurrency = n
		return nil
	}},
	{"MIN_GAP", "unset", "least time between two request starts of a pool, retries included (pacing: holds no slot); always enforced", func(st *proxy.RouteSettings, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("%q is not a positive duration such as 200ms", v)
		}
		st.Limits.MinGap = d
		return nil
	}},
	{"LIMITS", "ceiling", "ceiling: learning may only lower RPM, TPM and CONCURRENCY, they are never exceeded; start: they are where learning starts (growing while nothing is refused), and what the upstream shows replaces them", func(st *proxy.RouteSettings, v string) error {
		switch strings.ToLower(v) {
		case "ceiling":
			st.Limits.Start = false
		case "start":
			st.Limits.Start = true
		default:
			return fmt.Errorf("%q is not ceiling or start", v)
		}
		return nil
	}},
	{"SHARED_LIMIT", "model", "model: each model of a credential has limits of its own, unless the upstream's answers show models drawing on one (their counts move together); credential: every model of a credential draws on one limit from the start (a gateway key, a LiteLLM virtual key), and their lanes take turns", func(st *proxy.RouteSettings, v string) error {
		switch strings.ToLower(v) {
		case "model":
			st.Limits.PerCredential = false
		case "credential":
			st.Limits.PerCredential = true
		default:
			return fmt.Errorf("%q is not model or credential", v)
		}
		return nil
	}},
	{"LOCAL", "false", "true: a local model server holding one model at a time; requests for the loaded model go first, another model waits until that queue drains or LOCAL_FAIRNESS passes", func(st *proxy.RouteSettings, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		st.Local = b
		return nil
	}},
	{"LOCAL_FAIRNESS", lanequeue.DefaultFairness.String(), "with LOCAL: how long the loaded model's requests may go ahead of a waiting request for another model; at least 1s", func(st *proxy.RouteSettings, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return fmt.Errorf("%q is not a duration of at least 1s", v)
		}
		st.LocalFairness = d
		return nil
	}},
	{"SERVICE_TIER", "", "flex: requests that send no x-llmproxy-tier ask the upstream for its flex tier (half price, slower, refused when short of capacity; a flex refusal is capacity, not rate); empty: the upstream's default", func(st *proxy.RouteSettings, v string) error {
		switch strings.ToLower(v) {
		case "", "standard", "default":
			st.ServiceTier = ""
		case "flex":
			st.ServiceTier = cost.Flex
		default:
			return fmt.Errorf("%q is not flex or standard", v)
		}
		return nil
	}},
	{"FLEX_FALLBACK", "standard", "standard: a flex request goes at standard once only the time a standard answer needs is left before its deadline; never: it stays on flex until its deadline", func(st *proxy.RouteSettings, v string) error {
		switch strings.ToLower(v) {
		case "standard":
			st.FlexNever = false
		case "never":
			st.FlexNever = true
		default:
			return fmt.Errorf("%q is not standard or never", v)
		}
		return nil
	}},
	{"BUDGET_USD", "", "a cap on the route's spend, in US dollars, every key's together (needs a price for each model, LLMPROXY_PRICES); at the cap requests get 429 budget_exhausted", func(st *proxy.RouteSettings, v string) error {
		if v == "" {
			st.Budget = 0
			return nil
		}
		a, err := cost.ParseDollars(v)
		if err != nil || a <= 0 {
			return fmt.Errorf("%q is not a number of dollars above 0", v)
		}
		st.Budget = a
		return nil
	}},
	{"PRIORITY", "high", "the priority of requests that send no x-llmproxy-priority: high or low (low keeps one dispatch in four)", func(st *proxy.RouteSettings, v string) error {
		if st.Priority.UnmarshalText([]byte(v)) != nil {
			return fmt.Errorf("%q is not high or low", v)
		}
		return nil
	}},
}

// positive reads an RPM or TPM: a number within limit.PerMinuteBounds.
func positive(v string) (float64, error) {
	lo, hi := limit.PerMinuteBounds()
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= lo && f <= hi) {
		return 0, fmt.Errorf("%q is not a number from %g to %g", v, lo, hi)
	}
	return f, nil
}

// routeVarName is a route's <NAME>: its name in capitals, with '.' and
// '-' as '_' (environment variable names hold neither).
func routeVarName(route string) string {
	if route == "" {
		return defaultRouteName
	}
	return strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(route))
}

// parseRouteSettings reads the LLMPROXY_ROUTE_* variables of environ into
// the routes' settings. The error is one line naming the variable.
func (c *config) parseRouteSettings(environ map[string]string) error {
	byName, err := c.routeVarNames()
	if err != nil {
		return err
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	// Longest first: route MY_ROUTE's variables are not route MY's.
	sort.Slice(names, func(i, j int) bool {
		if len(names[i]) != len(names[j]) {
			return len(names[i]) > len(names[j])
		}
		return names[i] < names[j]
	})
	var vars []string
	for k := range environ {
		if strings.HasPrefix(k, routePrefix) {
			vars = append(vars, k)
		}
	}
	sort.Strings(vars)
	settings := map[string]proxy.RouteSettings{}
	fairnessSet := map[string]bool{}
	for _, k := range vars {
		route, setting, err := routeVar(k, names, byName)
		if err != nil {
			return err
		}
		st := settings[route]
		if err := setting.set(&st, strings.TrimSpace(environ[k])); err != nil {
			return fmt.Errorf("%s: %v", k, err)
		}
		settings[route] = st
		if setting.name == "LOCAL_FAIRNESS" {
			fairnessSet[route] = true
		}
	}
	for route := range fairnessSet {
		if !settings[route].Local {
			return fmt.Errorf("%s%s_LOCAL_FAIRNESS: set only for a local route (%s%s_LOCAL=true)", routePrefix, routeVarName(route), routePrefix, routeVarName(route))
		}
	}
	c.defaultRoute = settings[""]
	for i := range c.routes {
		c.routes[i].Settings = settings[c.routes[i].Name]
	}
	return nil
}

// routeVarNames maps each route's <NAME> to the route ("" for the default
// upstream); two routes with one <NAME> are an error.
func (c *config) routeVarNames() (map[string]string, error) {
	byName := map[string]string{defaultRouteName: ""}
	for _, r := range c.routes {
		n := routeVarName(r.Name)
		if other, ok := byName[n]; ok {
			shown := other
			if shown == "" {
				shown = "the default upstream"
			} else {
				shown = "route " + strconv.Quote(shown)
			}
			return nil, fmt.Errorf("%sROUTES: route %q and %s are both %s in LLMPROXY_ROUTE_%s_* variables; rename one", envPrefix, r.Name, shown, n, n)
		}
		byName[n] = r.Name
	}
	return byName, nil
}

// routeVar reads variable k, LLMPROXY_ROUTE_<NAME>_<SETTING>: its route
// and setting. names are the <NAME>s, longest first; byName maps each to
// its route.
func routeVar(k string, names []string, byName map[string]string) (string, *routeSetting, error) {
	rest := strings.TrimPrefix(k, routePrefix)
	route, setting, found := "", "", false
	for _, n := range names {
		if s, ok := strings.CutPrefix(rest, n+"_"); ok {
			route, setting, found = byName[n], s, true
			break
		}
	}
	if !found {
		shown := slices.Clone(names)
		sort.Strings(shown)
		return "", nil, fmt.Errorf("%s: no route of that name (LLMPROXY_ROUTE_<NAME>_<SETTING>; names: %s)", k, strings.Join(shown, ", "))
	}
	for i := range routeSettings {
		if routeSettings[i].name == setting {
			return route, &routeSettings[i], nil
		}
	}
	known := make([]string, len(routeSettings))
	for i, s := range routeSettings {
		known[i] = s.name
	}
	return "", nil, fmt.Errorf("%s: unknown setting %s (one of %s)", k, setting, strings.Join(known, ", "))
}

// describeRoute is a route's settings for the start-up log; "" when it
// has none.
func describeRoute(st proxy.RouteSettings) string {
	var parts []string
	l := st.Limits
	if l.RPM > 0 {
		parts = append(parts, strconv.FormatFloat(l.RPM, 'g', -1, 64)+" rpm")
	}
	if l.TPM > 0 {
		parts = append(parts, strconv.FormatFloat(l.TPM, 'g', -1, 64)+" tpm")
	}
	if l.Concurrency > 0 {
		parts = append(parts, "concurrency "+strconv.Itoa(l.Concurrency))
	}
	if l.MinGap > 0 {
		parts = append(parts, "min gap "+l.MinGap.String())
	}
	if l.RPM > 0 || l.TPM > 0 || l.Concurrency > 0 {
		mode := "ceiling"
		if l.Start {
			mode = "start"
		}
		parts = append(parts, "as "+mode)
	}
	if l.PerCredential {
		parts = append(parts, "one limit per credential")
	}
	if st.Local {
		f := st.LocalFairness
		if f == 0 {
			f = lanequeue.DefaultFairness
		}
		parts = append(parts, "local (fairness "+f.String()+")")
	}
	if st.Priority == lanequeue.Low {
		parts = append(parts, "priority low")
	}
	return strings.Join(parts, ", ")
}

// logRoutes logs each route's settings once, at start.
func (c config) logRoutes(log *slog.Logger) {
	if d := describeRoute(c.defaultRoute); d != "" {
		log.Info("route settings", "route", defaultRouteName, "settings", d)
	}
	for _, r := range c.routes {
		if d := describeRoute(r.Settings); d != "" {
			log.Info("route settings", "route", r.Name, "settings", d)
		}
	}
}

// printRouteUsage writes -h's part on the per-route settings.
func printRouteUsage(w io.Writer) {
	fmt.Fprintf(w, `
Per route (<NAME>: the route's name in capitals, '.' and '-' as '_';
DEFAULT for LLMPROXY_UPSTREAM; a setting for a route that does not exist
stops the program):
`)
	for _, s := range routeSettings {
		fmt.Fprintf(w, "  %s<NAME>_%s [%s]\n      %s\n", routePrefix, s.name, s.def, s.help)
	}
}
