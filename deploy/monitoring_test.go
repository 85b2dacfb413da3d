package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// Monitoring: the Grafana dashboard and the Prometheus alert rules. Neither
// runs in CI, so these tests read every PromQL expression in them and hold
// it to the Metrics table of docs/operations.md, the contract of what
// llmproxy exports:
// metric names, their type (counters only under rate/irate/increase) and
// their labels.

const (
	dashboardFile = "grafana/llmproxy-dashboard.json"
	alertsFile    = "prometheus/llmproxy-alerts.yaml"
	// metricsDoc holds the Metrics table, under "## Metrics".
	metricsDoc = "../docs/operations.md"
)

// metricDoc is one row of the Metrics table.
type metricDoc struct {
	kind   string // counter, gauge or histogram
	labels map[string]bool
}

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// documentedMetrics parses the "## Metrics" table of docs/operations.md.
func documentedMetrics(t *testing.T) map[string]metricDoc {
	t.Helper()
	doc, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Metrics\n")
	if !ok {
		t.Fatal("docs/operations.md: no ## Metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	section, _, _ = strings.Cut(section, "\n### ")
	docs := map[string]metricDoc{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `llmproxy_") {
			continue
		}
		cells := strings.Split(line, "|") // "", name, type, labels, meaning, ""
		if len(cells) < 5 {
			t.Fatalf("docs/operations.md Metrics table: cannot read row %q", line)
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		kind := strings.TrimSpace(cells[2])
		if kind != "counter" && kind != "gauge" && kind != "histogram" {
			t.Fatalf("docs/operations.md Metrics table: %s has type %q, want counter, gauge or histogram", name, kind)
		}
		if _, dup := docs[name]; dup {
			t.Fatalf("docs/operations.md Metrics table: %s listed twice", name)
		}
		doc := metricDoc{kind: kind, labels: map[string]bool{}}
		for _, l := range strings.Split(cells[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l == "" {
				continue
			}
			if !labelName.MatchString(l) {
				t.Fatalf("docs/operations.md Metrics table: %s has label %q", name, l)
			}
			doc.labels[l] = true
		}
		docs[name] = doc
	}
	if len(docs) < 15 {
		t.Fatalf("found only %d metrics in the Metrics table of docs/operations.md; has it changed shape?", len(docs))
	}
	return docs
}

// series is an llmproxy series named in an expression, resolved to the
// documented metric it belongs to.
type series struct {
	metric string // as documented
	suffix string // _bucket, _sum or _count of a histogram; "" otherwise
	doc    metricDoc
}

// resolveSeries finds the documented metric of a series name: the name
// itself, or a histogram's name plus _bucket, _sum or _count.
func resolveSeries(docs map[string]metricDoc, name string) (series, error) {
	if doc, ok := docs[name]; ok {
		if doc.kind == "histogram" {
			return series{}, fmt.Errorf("histogram %s has no series of that name: use %s_bucket, _sum or _count", name, name)
		}
		return series{metric: name, doc: doc}, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if doc, found := docs[base]; ok && found && doc.kind == "histogram" {
			return series{metric: base, suffix: suffix, doc: doc}, nil
		}
	}
	return series{}, fmt.Errorf("%s is not a metric of the Metrics table of docs/operations.md", name)
}

// hasLabel tells whether the series carries a label: a documented one, or
// le on a histogram's buckets.
func (s series) hasLabel(l string) bool {
	return s.doc.labels[l] || (l == "le" && s.suffix == "_bucket")
}

// counterLike tells whether the series only ever goes up.
func (s series) counterLike() bool { return s.doc.kind == "counter" || s.suffix != "" }

// promToken is a PromQL token: 'i' identifier or keyword, 's' string, 'n'
// number or duration, 'v' a Grafana variable ($x, ${x}), 'p' punctuation or
// operator.
type promToken struct {
	kind byte
	text string
}

func isIdentStart(c byte) bool { return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }
func isIdentChar(c byte) bool  { return isIdentStart(c) || ('0' <= c && c <= '9') || c == ':' }

// lexPromQL splits a PromQL expression (with Grafana variables) into tokens.
func lexPromQL(expr string) ([]promToken, error) {
	var toks []promToken
	for i := 0; i < len(expr); {
		c := expr[i]
		start := i
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '#': // comment to the end of the line
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
			continue
		case c == '"' || c == '\'' || c == '`':
			i++
			for i < len(expr) && expr[i] != c {
				if expr[i] == '\\' && c != '`' {
					i++
				}
				i++
			}
			if i >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %q", expr[start:])
			}
			i++
			toks = append(toks, promToken{'s', expr[start:i]})
		case c == '$':
			i++
			if i < len(expr) && expr[i] == '{' {
				end := strings.IndexByte(expr[i:], '}')
				if end < 0 {
					return nil, fmt.Errorf("unterminated ${ at %q", expr[start:])
				}
				i += end + 1
			} else {
				for i < len(expr) && isIdentChar(expr[i]) && expr[i] != ':' {
					i++
				}
			}
			toks = append(toks, promToken{'v', expr[start:i]})
		case isIdentStart(c):
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
			toks = append(toks, promToken{'i', expr[start:i]})
		case '0' <= c && c <= '9' || c == '.':
			for i < len(expr) && (isIdentChar(expr[i]) && expr[i] != ':' || expr[i] == '.') {
				i++
			}
			toks = append(toks, promToken{'n', expr[start:i]})
		default:
			i++
			if i < len(expr) && slices.Contains([]string{"==", "!=", "=~", "!~", ">=", "<="}, expr[start:i+1]) {
				i++
			}
			toks = append(toks, promToken{'p', expr[start:i]})
		}
	}
	return toks, nil
}

var (
	promDuration = regexp.MustCompile(`^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$`)
	durationUnit = []time.Duration{365 * 24 * time.Hour, 7 * 24 * time.Hour, 24 * time.Hour, time.Hour, time.Minute, time.Second, time.Millisecond}
)

// parsePromDuration parses a duration as Prometheus writes them in rule
// files and range selectors: 10m, 1h30m, 2d, 500ms (units in descending
// order, integers only; "0" alone is zero).
func parsePromDuration(s string) (time.Duration, error) {
	if s == "0" {
		return 0, nil
	}
	m := promDuration.FindStringSubmatch(s)
	if s == "" || m == nil {
		return 0, fmt.Errorf("%q is not a Prometheus duration (like 30s, 10m, 1h30m)", s)
	}
	var d time.Duration
	for i, n := range m[1:] {
		if n == "" {
			continue
		}
		var v int64
		if _, err := fmt.Sscan(n, &v); err != nil {
			return 0, err
		}
		d += time.Duration(v) * durationUnit[i]
	}
	return d, nil
}

// grafanaBuiltins are the variables Grafana defines in every query.
var grafanaBuiltins = map[string]bool{"__rate_interval": true, "__interval": true, "__interval_ms": true, "__range": true, "__range_s": true, "__range_ms": true}

var (
	rangeFuncs   = map[string]bool{"rate": true, "irate": true, "increase": true}
	aggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "count": true, "group": true, "stddev": true, "stdvar": true, "topk": true, "bottomk": true, "quantile": true, "count_values": true, "limitk": true, "limit_ratio": true}
	grouping     = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	varInString  = regexp.MustCompile(`\$\{?(\w+)`)
)

// exprInfo is what checkExpr learned of an expression, to check the labels
// that legends and annotations name.
type exprInfo struct {
	labels      map[string]bool // every label of every llmproxy series in it
	grouped     map[string]bool // labels named in by, on, group_left, ...
	aggregates  bool            // an aggregation operator is used
	withoutUsed bool            // by `without`, so which labels remain is not tracked
}

// outputHas tells whether a series of the expression's result can carry the
// label: it belongs to a series in it (or Prometheus adds it to every
// scraped series), and if the expression aggregates, a grouping clause
// keeps it.
func (in exprInfo) outputHas(l string) bool {
	if !in.labels[l] && !targetLabels[l] {
		return false
	}
	return !in.aggregates || in.withoutUsed || in.grouped[l]
}

// targetLabels are the labels Prometheus adds to every scraped series. The
// Metrics table does not list them, so expressions may not select or group by
// them; legends and annotations may show them.
var targetLabels = map[string]bool{"instance": true, "job": true}

// checkExpr checks a PromQL expression against the Metrics table.
// vars are the dashboard's template variables; nil where none may be used
// (alert rules). It is no PromQL parser, but it checks what typos break:
//   - brackets, braces and parentheses balance (outside strings);
//   - every llmproxy_* name is a documented metric (a histogram only by its
//     _bucket, _sum or _count series);
//   - every label in a selector {label=...} is one the Metrics table lists for
//     that metric (or le on _bucket series);
//   - every label in by/without/on/ignoring/group_left/group_right (...) is
//     a label of an llmproxy series in that clause's scope: the aggregated
//     expression for by/without, the enclosing parentheses (or the whole
//     expression) for vector matching;
//   - counters (and histogram series) only appear with a range inside
//     rate(), irate() or increase(), gauges never there;
//   - range durations parse, and variables are defined.
func checkExpr(docs map[string]metricDoc, expr string, vars map[string]bool) (exprInfo, []string) {
	info := exprInfo{labels: map[string]bool{}, grouped: map[string]bool{}}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	toks, err := lexPromQL(expr)
	if err != nil {
		return info, []string{err.Error()}
	}
	// Balance, and for each token its innermost enclosing "(" (-1: none).
	pairs := map[string]string{")": "(", "]": "[", "}": "{"}
	match := make([]int, len(toks))
	parent := make([]int, len(toks))
	var stack []int
	for i, tk := range toks {
		parent[i] = -1
		for j := len(stack) - 1; j >= 0; j-- {
			if toks[stack[j]].text == "(" {
				parent[i] = stack[j]
				break
			}
		}
		if tk.kind != 'p' {
			continue
		}
		switch tk.text {
		case "(", "[", "{":
			stack = append(stack, i)
		case ")", "]", "}":
			if len(stack) == 0 || toks[stack[len(stack)-1]].text != pairs[tk.text] {
				return info, []string{fmt.Sprintf("unbalanced %q (token %d)", tk.text, i+1)}
			}
			match[stack[len(stack)-1]], match[i] = i, stack[len(stack)-1]
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) > 0 {
		return info, []string{fmt.Sprintf("unclosed %q", toks[stack[len(stack)-1]].text)}
	}
	is := func(i int, text string) bool {
		return i >= 0 && i < len(toks) && toks[i].kind == 'p' && toks[i].text == text
	}
	// The llmproxy series between tokens lo and hi (exclusive), by index.
	seriesAt := map[int]series{}
	labelsIn := func(lo, hi int) map[string]bool {
		ls := map[string]bool{}
		for i, s := range seriesAt {
			if lo <= i && i < hi {
				for l := range s.doc.labels {
					ls[l] = true
				}
				if s.suffix == "_bucket" {
					ls["le"] = true
				}
			}
		}
		return ls
	}
	checkVar := func(name string) {
		name = strings.TrimPrefix(strings.TrimPrefix(name, "$"), "{")
		name, _, _ = strings.Cut(strings.TrimSuffix(name, "}"), ":")
		switch {
		case vars == nil:
			bad("variable $%s in an expression that Prometheus evaluates itself", name)
		case !vars[name] && !grafanaBuiltins[name]:
			bad("variable $%s is not a template variable of the dashboard", name)
		}
	}

	for i, tk := range toks {
		switch {
		case tk.kind == 'v':
			checkVar(tk.text)
		case tk.kind == 's':
			for _, m := range varInString.FindAllStringSubmatch(tk.text, -1) {
				checkVar(m[1])
			}
		case tk.kind == 'i' && strings.HasPrefix(tk.text, "llmproxy_"):
			s, err := resolveSeries(docs, tk.text)
			if err != nil {
				bad("%v", err)
				continue
			}
			seriesAt[i] = s
		case tk.kind == 'i' && aggregations[tk.text] && (is(i+1, "(") || i+1 < len(toks) && grouping[toks[i+1].text]):
			info.aggregates = true
		}
	}

	for _, i := range slices.Sorted(maps.Keys(seriesAt)) {
		s := seriesAt[i]
		name := toks[i].text
		next := i + 1
		if is(next, "{") { // the selector's labels
			for k := next + 1; k < match[next]; k++ {
				if toks[k].kind != 'i' || k+1 >= match[next] || !slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[k+1].text) {
					continue
				}
				if !s.hasLabel(toks[k].text) {
					bad("%s{%s=...}: docs/operations.md lists no label %q for %s (labels: %v)", name, toks[k].text, toks[k].text, s.metric, slices.Sorted(maps.Keys(s.doc.labels)))
				}
				if k+2 >= len(toks) || toks[k+2].kind != 's' {
					bad("%s{%s...}: the value is not a quoted string", name, toks[k].text)
				}
			}
			next = match[next] + 1
		}
		ranged := is(next, "[")
		if ranged {
			d := toks[next+1]
			switch {
			case d.kind == 'v':
			case d.kind == 'n':
				if _, err := parsePromDuration(d.text); err != nil {
					bad("%s[%s]: %v", name, d.text, err)
				}
			default:
				bad("%s[...]: no range duration", name)
			}
		}
		fn := ""
		if p := parent[i]; p > 0 && toks[p-1].kind == 'i' {
			fn = toks[p-1].text
		}
		switch {
		case s.counterLike() && (!ranged || !rangeFuncs[fn]):
			bad("%s only goes up: use it with a range inside rate(), irate() or increase()", name)
		case !s.counterLike() && rangeFuncs[fn]:
			bad("%s is a gauge: %s() of it means nothing (deriv, delta or *_over_time instead)", name, fn)
		}
	}

	for i, tk := range toks {
		if tk.kind != 'i' || !grouping[tk.text] || !is(i+1, "(") {
			continue
		}
		var lo, hi int // the clause's scope, tokens lo to hi exclusive
		switch end := match[i+1]; {
		case (tk.text == "by" || tk.text == "without") && is(end+1, "("):
			lo, hi = end+2, match[end+1]
		case tk.text == "by" || tk.text == "without":
			if !is(i-1, ")") {
				bad("%s (...) neither before nor after the aggregated expression", tk.text)
				continue
			}
			lo, hi = match[i-1]+1, i-1
		case parent[i] >= 0:
			lo, hi = parent[i]+1, match[parent[i]]
		default:
			lo, hi = 0, len(toks)
		}
		if tk.text == "without" {
			info.withoutUsed = true
		}
		scope := labelsIn(lo, hi)
		for k := i + 2; k < match[i+1]; k++ {
			l := toks[k]
			if l.kind == 'p' && l.text == "," {
				continue
			}
			if l.kind != 'i' || !labelName.MatchString(l.text) {
				bad("%s (...): %q is not a label name", tk.text, l.text)
				continue
			}
			info.grouped[l.text] = true
			if !scope[l.text] {
				bad("%s (%s): no llmproxy series in its scope has the label %q (they have %v)", tk.text, l.text, l.text, slices.Sorted(maps.Keys(scope)))
			}
		}
	}
	info.labels = labelsIn(0, len(toks))
	return info, problems
}

func TestCheckExprCatchesMistakes(t *testing.T) {
	docs := documentedMetrics(t)
	vars := map[string]bool{"lane": true}
	good := []string{
		`sum by (outcome) (rate(llmproxy_requests_total{lane=~"$lane", status="429"}[$__rate_interval]))`,
		`sum by (lane) (llmproxy_lane_queue_depth) * on(lane) group_left(model, route) max by (lane, model, route) (llmproxy_lane_info)`,
		`histogram_quantile(0.99, sum by (le, route) (rate(llmproxy_queue_wait_seconds_bucket[5m])))`,
		`sum(rate(llmproxy_upstream_latency_seconds_sum[5m])) by (route) / sum(rate(llmproxy_upstream_latency_seconds_count[5m])) by (route)`,
		`deriv(llmproxy_lane_queue_depth{lane="a(b"}[10m]) > 0`,
	}
	for _, e := range good {
		if _, problems := checkExpr(docs, e, vars); len(problems) > 0 {
			t.Errorf("%s: %v", e, problems)
		}
	}
	bad := []string{
		`llmproxy_lane_queue_dept`,                                                     // no such metric
		`sum(rate(llmproxy_requests_total{statuss="429"}[5m]))`,                        // no such label
		`sum by (model) (rate(llmproxy_requests_total[5m]))`,                           // not a label of requests_total
		`sum(rate(llmproxy_requests_total[5m])) by (lanes)`,                            // postfix by, no such label
		`llmproxy_lane_queue_depth * on(lane) group_left(modle) llmproxy_lane_info`,    // no such label
		`histogram_quantile(0.5, sum by (le) (rate(llmproxy_queue_wait_seconds[5m])))`, // histogram without _bucket
		`sum by (le) (rate(llmproxy_requests_total[5m]))`,                              // le on a counter
		`sum(llmproxy_requests_total)`,                                                 // counter without rate
		`rate(llmproxy_lane_queue_depth[5m])`,                                          // gauge in rate
		`sum(rate(llmproxy_requests_total[5m])`,                                        // unbalanced
		`sum(rate(llmproxy_requests_total[5m]})`,                                       // mismatched
		`rate(llmproxy_requests_total[5 m])`,                                           // bad duration
		`rate(llmproxy_requests_total{lane=~"$lanes"}[5m])`,                            // unknown variable
	}
	for _, e := range bad {
		if _, problems := checkExpr(docs, e, vars); len(problems) == 0 {
			t.Errorf("%s: no problem found", e)
		}
	}
	if _, problems := checkExpr(docs, `rate(llmproxy_requests_total[$__rate_interval])`, nil); len(problems) == 0 {
		t.Error("a Grafana variable passed in an alert expression")
	}
	for _, d := range []string{"10m", "1h30m", "2d", "500ms", "0"} {
		if _, err := parsePromDuration(d); err != nil {
			t.Error(err)
		}
	}
	for _, d := range []string{"", "10", "1.5h", "30m1h", "10min", "-5m"} {
		if _, err := parsePromDuration(d); err == nil {
			t.Errorf("duration %q parsed", d)
		}
	}
}

var seriesName = regexp.MustCompile(`\bllmproxy_\w+`)

// TestMonitoringNamesDocumented checks every llmproxy_* name anywhere in the
// dashboard and the rules, descriptions included.
func TestMonitoringNamesDocumented(t *testing.T) {
	docs := documentedMetrics(t)
	for _, path := range []string{dashboardFile, alertsFile} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range seriesName.FindAllString(string(b), -1) {
			if _, ok := docs[name]; ok {
				continue // a histogram's own name may be named in prose
			}
			if _, err := resolveSeries(docs, name); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		}
	}
}

// walkPanels calls f on every panel, those inside collapsed rows included.
func walkPanels(panels []any, f func(p map[string]any)) {
	for _, p := range panels {
		m, _ := p.(map[string]any)
		f(m)
		walkPanels(list(m["panels"]), f)
	}
}

// checkDatasources reports every datasource in v (a decoded JSON tree) that
// is not the ${datasource} variable: a hard-coded uid or name breaks the
// dashboard on any other Grafana.
func checkDatasources(t *testing.T, where string, v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			if k != "datasource" {
				checkDatasources(t, where+"."+k, c)
				continue
			}
			switch ds := c.(type) {
			case string:
				if ds != "${datasource}" && ds != "$datasource" {
					t.Errorf("%s.datasource is %q, want ${datasource}", where, ds)
				}
			case map[string]any:
				if str(ds["type"]) == "grafana" && str(ds["uid"]) == "-- Grafana --" {
					continue // the built-in annotations
				}
				if uid := str(ds["uid"]); uid != "${datasource}" && uid != "$datasource" {
					t.Errorf("%s.datasource.uid is %q, want ${datasource}", where, uid)
				}
				if typ := str(ds["type"]); typ != "prometheus" {
					t.Errorf("%s.datasource.type is %q, want prometheus", where, typ)
				}
			case nil:
			default:
				t.Errorf("%s.datasource is %v", where, ds)
			}
		}
	case []any:
		for i, c := range v {
			checkDatasources(t, fmt.Sprintf("%s[%d]", where, i), c)
		}
	}
}

var (
	legendLabel     = regexp.MustCompile(`\{\{\s*([^{}\s]*)\s*\}\}`)
	labelValuesCall = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\s*\)$`)
)

func TestDashboard(t *testing.T) {
	docs := documentedMetrics(t)
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if v, _ := dash["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v, want a Grafana 10/11 one (36 or more)", dash["schemaVersion"])
	}
	if str(dash["uid"]) == "" || str(dash["title"]) == "" {
		t.Error("dashboard has no uid or title")
	}
	if dash["id"] != nil {
		t.Errorf("id %v: leave it null so that importing creates the dashboard", dash["id"])
	}
	checkDatasources(t, "dashboard", dash)

	// Template variables.
	vars := map[string]bool{}
	templates := map[string]map[string]any{}
	for _, v := range list(get(dash, "templating", "list")) {
		m, _ := v.(map[string]any)
		name := str(m["name"])
		if vars[name] {
			t.Errorf("template variable %q defined twice", name)
		}
		vars[name], templates[name] = true, m
	}
	if ds := templates["datasource"]; str(ds["type"]) != "datasource" || str(ds["query"]) != "prometheus" {
		t.Errorf("no template variable datasource of type datasource, query prometheus: %v", ds)
	}
	lane := templates["lane"]
	if lane == nil || lane["multi"] != true || lane["includeAll"] != true {
		t.Errorf("no template variable lane that is multi and includes All: %v", lane)
	}
	for name, m := range templates {
		if str(m["type"]) != "query" {
			continue
		}
		q := str(m["query"])
		if obj, ok := m["query"].(map[string]any); ok {
			q = str(obj["query"])
		}
		call := labelValuesCall.FindStringSubmatch(q)
		if call == nil {
			t.Errorf("template variable %s: query %q is not label_values(selector, label)", name, q)
			continue
		}
		info, problems := checkExpr(docs, call[1], vars)
		for _, p := range problems {
			t.Errorf("template variable %s: %s", name, p)
		}
		if !info.labels[call[2]] {
			t.Errorf("template variable %s: %s has no label %q", name, call[1], call[2])
		}
		if name == "lane" && (!strings.HasPrefix(call[1], "llmproxy_lane_info") || call[2] != "lane") {
			t.Errorf("template variable lane: query %q, want label_values(llmproxy_lane_info..., lane)", q)
		}
	}

	// Panels.
	ids := map[float64]bool{}
	panels, exprs := 0, 0
	walkPanels(list(dash["panels"]), func(p map[string]any) {
		title := str(p["title"])
		id, _ := p["id"].(float64)
		if ids[id] {
			t.Errorf("panel %q: id %v used twice", title, p["id"])
		}
		ids[id] = true
		if get(p, "gridPos", "w") == nil || get(p, "gridPos", "h") == nil {
			t.Errorf("panel %q: no gridPos", title)
		}
		if str(p["type"]) == "row" {
			return
		}
		panels++
		if title == "" {
			t.Errorf("panel %v has no title", p["id"])
		}
		if !slices.Contains([]string{"timeseries", "stat", "table", "gauge", "bargauge"}, str(p["type"])) {
			t.Errorf("panel %q: type %q", title, p["type"])
		}
		if str(get(p, "fieldConfig", "defaults", "unit")) == "" {
			t.Errorf("panel %q: no unit (fieldConfig.defaults.unit)", title)
		}
		targets := list(p["targets"])
		if len(targets) == 0 {
			t.Errorf("panel %q: no targets", title)
		}
		refIDs := map[string]bool{}
		for _, tg := range targets {
			expr, ref := str(get(tg, "expr")), str(get(tg, "refId"))
			where := fmt.Sprintf("panel %q target %s", title, ref)
			if refIDs[ref] {
				t.Errorf("%s: refId used twice", where)
			}
			refIDs[ref] = true
			if strings.TrimSpace(expr) == "" {
				t.Errorf("%s: no expr", where)
				continue
			}
			exprs++
			info, problems := checkExpr(docs, expr, vars)
			for _, pr := range problems {
				t.Errorf("%s: %s\n\t%s", where, pr, expr)
			}
			for _, m := range legendLabel.FindAllStringSubmatch(str(get(tg, "legendFormat")), -1) {
				if !info.outputHas(m[1]) {
					t.Errorf("%s: legend names {{%s}}, which its result does not carry", where, m[1])
				}
			}
		}
	})
	if panels < 10 {
		t.Errorf("only %d panels", panels)
	}
	t.Logf("%s: %d panels, %d queries", dashboardFile, panels, exprs)

	// Which documented metrics the dashboard does not show (a new metric
	// need not break this test, but should be charted).
	for name := range docs {
		if !strings.Contains(string(b), name) {
			t.Logf("%s: %s is not on the dashboard", dashboardFile, name)
		}
	}
}

// ruleFile is a Prometheus rule file; decoding it with KnownFields rejects
// any key Prometheus would not know.
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Limit    int    `yaml:"limit"`
		Rules    []struct {
			Alert         string            `yaml:"alert"`
			Record        string            `yaml:"record"`
			Expr          string            `yaml:"expr"`
			For           string            `yaml:"for"`
			KeepFiringFor string            `yaml:"keep_firing_for"`
			Labels        map[string]string `yaml:"labels"`
			Annotations   map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var (
	alertName      = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	annotationVars = regexp.MustCompile(`\$labels\.(\w+)`)
)

func TestAlertRules(t *testing.T) {
	docs := documentedMetrics(t)
	f, err := os.Open(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var rf ruleFile
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	if len(rf.Groups) == 0 {
		t.Fatalf("%s: no groups", alertsFile)
	}
	groups, alerts := map[string]bool{}, map[string]bool{}
	var allExprs []string
	for _, g := range rf.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group name %q empty or used twice", g.Name)
		}
		groups[g.Name] = true
		if g.Interval != "" {
			if _, err := parsePromDuration(g.Interval); err != nil {
				t.Errorf("group %s: interval: %v", g.Name, err)
			}
		}
		if len(g.Rules) == 0 {
			t.Errorf("group %s: no rules", g.Name)
		}
		for i, r := range g.Rules {
			where := fmt.Sprintf("group %s rule %d (%s)", g.Name, i+1, r.Alert)
			if r.Record != "" || !alertName.MatchString(r.Alert) {
				t.Errorf("%s: want an alerting rule with a valid alert name", where)
			}
			if alerts[r.Alert] {
				t.Errorf("%s: alert name used twice", where)
			}
			alerts[r.Alert] = true
			if _, err := parsePromDuration(r.For); err != nil {
				t.Errorf("%s: for: %v", where, err)
			}
			if r.KeepFiringFor != "" {
				if _, err := parsePromDuration(r.KeepFiringFor); err != nil {
					t.Errorf("%s: keep_firing_for: %v", where, err)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: labels.severity %q, want critical, warning or info", where, s)
			}
			for _, k := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[k]) == "" {
					t.Errorf("%s: no %s annotation", where, k)
				}
			}
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: no expr", where)
				continue
			}
			allExprs = append(allExprs, r.Expr)
			info, problems := checkExpr(docs, r.Expr, nil)
			for _, p := range problems {
				t.Errorf("%s: %s\n\t%s", where, p, r.Expr)
			}
			for k, text := range r.Annotations {
				if strings.Count(text, "{{") != strings.Count(text, "}}") {
					t.Errorf("%s: annotation %s: unbalanced {{ }}", where, k)
				}
				for _, m := range annotationVars.FindAllStringSubmatch(text, -1) {
					if !info.outputHas(m[1]) {
						t.Errorf("%s: annotation %s names $labels.%s, which the alert does not carry", where, k, m[1])
					}
				}
			}
		}
	}
	// The situations the rules are there for.
	joined := strings.Join(allExprs, "\n")
	for what, needle := range map[string]string{
		"a lane paused too long":         "llmproxy_lane_paused",
		"429s passed on to clients":      `status="429", outcome="upstream_error"`,
		"a queue growing":                "deriv(llmproxy_lane_queue_depth",
		"answers cut":                    `outcome="upstream_cut"`,
		"proxy-made errors":              "llmproxy_proxy_errors_total",
		"Redis down":                     "llmproxy_redis_up == 0",
		"a long estimated drain time":    "llmproxy_lane_drain_seconds",
		"upstream_unreachable":           "upstream_unreachable",
		"budget_exceeded and queue_full": "budget_exceeded|queue_full",
	} {
		if !strings.Contains(joined, needle) {
			t.Errorf("%s: no alert for %s (no expr contains %q)", alertsFile, what, needle)
		}
	}
	t.Logf("%s: %d alerts", alertsFile, len(alerts))
}
