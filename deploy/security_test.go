package deploy

import (
	"cmp"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"
	"testing"
)

// The Kubernetes manifests' security: the admin token from a Secret
// wherever the admin listener is not on loopback, probes that need no
// token, a Redis run in a file with a password from a Secret that
// llmproxy reads from the same Secret, and NetworkPolicies that let only
// llmproxy reach that Redis and only chosen clients the admin port.

// podOf is a workload document's pod: its labels, spec and containers.
type podOf struct {
	where      string
	labels     map[string]any
	spec       map[string]any
	containers []map[string]any
}

// pods are the pod templates of a file's workloads.
func pods(file string, docs []map[string]any) []podOf {
	var out []podOf
	for _, doc := range docs {
		spec := podSpec(doc)
		if spec == nil {
			continue
		}
		labels, _ := get(doc, "spec", "template", "metadata", "labels").(map[string]any)
		p := podOf{where: fmt.Sprintf("%s: %s %s", file, str(doc["kind"]), str(get(doc, "metadata", "name"))), labels: labels, spec: spec}
		for _, field := range []string{"initContainers", "containers"} {
			for _, c := range list(spec[field]) {
				m, _ := c.(map[string]any)
				p.containers = append(p.containers, m)
			}
		}
		out = append(out, p)
	}
	return out
}

// envEntry is container c's env entry name, or nil.
func envEntry(c map[string]any, name string) map[string]any {
	for _, e := range list(c["env"]) {
		if m, _ := e.(map[string]any); str(m["name"]) == name {
			return m
		}
	}
	return nil
}

// secretRef is the Secret and key an env entry takes its value from
// ("" when it does not).
func secretRef(e map[string]any) (name, key string) {
	return str(get(e, "valueFrom", "secretKeyRef", "name")), str(get(e, "valueFrom", "secretKeyRef", "key"))
}

// onLoopback says whether a listen address binds loopback only.
func onLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// isRedis says whether c is a Redis server run in the file.
func isRedis(c map[string]any) bool {
	image := str(c["image"])
	return strings.HasPrefix(image, "redis:") || strings.Contains(image, "/redis:")
}

// selects says whether a selector's matchLabels pick pods of labels (an
// empty selector picks every pod).
func selects(sel any, labels map[string]any) bool {
	ml, _ := get(sel, "matchLabels").(map[string]any)
	if get(sel, "matchExpressions") != nil {
		return false // not read here: no manifest uses them
	}
	for k, v := range ml {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// tokenProblems: an llmproxy container whose admin listener is not on
// loopback takes LLMPROXY_ADMIN_TOKEN from a Secret; no manifest writes a
// token out; the probes ask /healthz and /readyz, which need no token,
// and send no header of one.
func tokenProblems(p podOf) []string {
	var out []string
	for _, c := range p.containers {
		name := str(c["name"])
		if !(k8sContainer{c: c}).isLLMProxy() {
			continue
		}
		tok := envEntry(c, "LLMPROXY_ADMIN_TOKEN")
		if tok != nil && tok["value"] != nil {
			out = append(out, name+": LLMPROXY_ADMIN_TOKEN is written in the manifest: take it from a Secret (secretKeyRef)")
		}
		admin := str(get(envEntry(c, "LLMPROXY_ADMIN_ADDR"), "value"))
		if admin != "" && !onLoopback(admin) {
			if s, k := secretRef(tok); s == "" || k == "" {
				out = append(out, fmt.Sprintf("%s: the admin listener %s is not on loopback and LLMPROXY_ADMIN_TOKEN is not from a Secret", name, admin))
			}
		}
		for probe, want := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": ""} {
			g := get(c, probe, "httpGet")
			if g == nil {
				if probe != "startupProbe" {
					out = append(out, fmt.Sprintf("%s: no %s httpGet", name, probe))
				}
				continue
			}
			p := str(get(g, "path"))
			if want == "" && (p == "/healthz" || p == "/readyz") {
				want = p
			}
			if p != want {
				out = append(out, fmt.Sprintf("%s: %s asks %q, want %s (open without the token)", name, probe, p, cmp.Or(want, "/healthz or /readyz")))
			}
			if get(g, "httpHeaders") != nil {
				out = append(out, fmt.Sprintf("%s: %s sends headers: the probes need no token", name, probe))
			}
		}
	}
	return out
}

// redisPasswordProblems: a Redis run in the file requires a password
// ($(VAR) in its args, VAR from a Secret), and every llmproxy container
// that reaches it reads that Secret's key from LLMPROXY_REDIS_PASSWORD_FILE.
func redisPasswordProblems(pp []podOf) []string {
	var out []string
	var secret, key string
	for _, p := range pp {
		for _, c := range p.containers {
			if !isRedis(c) {
				continue
			}
			args := list(c["args"])
			i := slices.IndexFunc(args, func(a any) bool { return str(a) == "--requirepass" })
			if i < 0 || i+1 >= len(args) {
				out = append(out, p.where+": Redis runs without --requirepass")
				continue
			}
			v, ok := strings.CutPrefix(str(args[i+1]), "$(")
			v, ok2 := strings.CutSuffix(v, ")")
			if !ok || !ok2 {
				out = append(out, p.where+": Redis' password is written in its args: take it from a Secret")
				continue
			}
			if secret, key = secretRef(envEntry(c, v)); secret == "" || key == "" {
				out = append(out, fmt.Sprintf("%s: Redis' password %s is not from a Secret", p.where, v))
			}
		}
	}
	if secret == "" {
		return out
	}
	for _, p := range pp {
		vols := map[string]map[string]any{}
		for _, v := range list(p.spec["volumes"]) {
			m, _ := v.(map[string]any)
			vols[str(m["name"])] = m
		}
		for _, c := range p.containers {
			if !(k8sContainer{c: c}).isLLMProxy() || envEntry(c, "LLMPROXY_REDIS_URL") == nil {
				continue
			}
			file := str(get(envEntry(c, "LLMPROXY_REDIS_PASSWORD_FILE"), "value"))
			if file == "" {
				out = append(out, p.where+": llmproxy reaches the Redis without LLMPROXY_REDIS_PASSWORD_FILE")
				continue
			}
			found := false
			for _, m := range list(c["volumeMounts"]) {
				dir := str(get(m, "mountPath"))
				if path.Dir(file) != path.Clean(dir) {
					continue
				}
				src := get(vols[str(get(m, "name"))], "secret")
				found = str(get(src, "secretName")) == secret && slices.ContainsFunc(list(get(src, "items")), func(it any) bool {
					return str(get(it, "key")) == key && str(get(it, "path")) == path.Base(file)
				})
			}
			if !found {
				out = append(out, fmt.Sprintf("%s: LLMPROXY_REDIS_PASSWORD_FILE=%s is not key %q of Secret %q, Redis' password", p.where, file, key, secret))
			}
		}
	}
	return out
}

// ingressRules are the ingress rules of the NetworkPolicies of docs
// that select pods of labels, and whether any does.
func ingressRules(docs []map[string]any, labels map[string]any) ([]any, bool) {
	var rules []any
	isolated := false
	for _, doc := range docs {
		if str(doc["kind"]) != "NetworkPolicy" || !selects(get(doc, "spec", "podSelector"), labels) {
			continue
		}
		if !slices.ContainsFunc(list(get(doc, "spec", "policyTypes")), func(t any) bool { return str(t) == "Ingress" }) {
			continue
		}
		isolated = true
		rules = append(rules, list(get(doc, "spec", "ingress"))...)
	}
	return rules, isolated
}

// admits says whether rule lets in port (a number, or a container port's
// name), and from whom: every peer's selector, nil for anyone.
func admits(rule any, port string, named map[string]string) (bool, []any) {
	ports := list(get(rule, "ports"))
	in := len(ports) == 0 || slices.ContainsFunc(ports, func(p any) bool {
		v := str(get(p, "port"))
		return v == port || named[v] == port
	})
	return in, list(get(rule, "from"))
}

// onlyProxies says whether a NetworkPolicy peer picks llmproxy pods of
// the file and no other: a pod selector of this namespace alone.
func onlyProxies(peer any, pp, proxies []podOf) bool {
	sel := get(peer, "podSelector")
	if sel == nil || get(peer, "namespaceSelector") != nil || get(peer, "ipBlock") != nil {
		return false
	}
	picked := 0
	for _, q := range pp {
		if !selects(sel, q.labels) {
			continue
		}
		if !slices.ContainsFunc(proxies, func(x podOf) bool { return x.where == q.where }) {
			return false
		}
		picked++
	}
	return picked > 0
}

// policyProblems: a Redis run in the file is reachable by the llmproxy
// pods only (on its port), and the admin port of an llmproxy pod whose
// admin listener is not on loopback by chosen peers only (never every
// pod of the namespace, every namespace or an address block), while its
// proxy port, when not on loopback, stays open.
func policyProblems(docs []map[string]any, pp []podOf) []string {
	var out []string
	var proxies []podOf
	for _, p := range pp {
		if slices.ContainsFunc(p.containers, func(c map[string]any) bool { return (k8sContainer{c: c}).isLLMProxy() }) {
			proxies = append(proxies, p)
		}
	}
	for _, p := range pp {
		named := map[string]string{}
		for _, c := range p.containers {
			for _, port := range list(c["ports"]) {
				named[str(get(port, "name"))] = str(get(port, "containerPort"))
			}
		}
		rules, isolated := ingressRules(docs, p.labels)
		for _, c := range p.containers {
			switch {
			case isRedis(c):
				if !isolated {
					out = append(out, p.where+": no NetworkPolicy holds who reaches Redis")
					continue
				}
				for _, r := range rules {
					for _, port := range list(get(r, "ports")) {
						if v := str(get(port, "port")); v != "6379" && named[v] != "6379" {
							out = append(out, fmt.Sprintf("%s: a NetworkPolicy lets in port %s of Redis", p.where, v))
						}
					}
					from := list(get(r, "from"))
					if len(from) == 0 {
						out = append(out, p.where+": a NetworkPolicy lets anyone reach Redis")
					}
					for _, peer := range from {
						if !onlyProxies(peer, pp, proxies) {
							out = append(out, fmt.Sprintf("%s: a NetworkPolicy lets others than the llmproxy pods reach Redis (%v)", p.where, peer))
						}
					}
				}
			case (k8sContainer{c: c}).isLLMProxy():
				admin := str(get(envEntry(c, "LLMPROXY_ADMIN_ADDR"), "value"))
				if admin == "" || onLoopback(admin) {
					continue
				}
				if !isolated {
					out = append(out, p.where+": no NetworkPolicy holds who reaches the admin port")
					continue
				}
				for _, r := range rules {
					in, from := admits(r, adminPort, named)
					if !in {
						continue
					}
					if len(from) == 0 {
						out = append(out, p.where+": a NetworkPolicy lets anyone reach the admin port")
					}
					for _, peer := range from {
						ml, _ := get(peer, "podSelector", "matchLabels").(map[string]any)
						if get(peer, "ipBlock") != nil || len(ml) == 0 {
							out = append(out, fmt.Sprintf("%s: a NetworkPolicy lets every pod of a namespace, or an address block, reach the admin port (%v)", p.where, peer))
						}
					}
				}
				if proxy := str(get(envEntry(c, "LLMPROXY_ADDR"), "value")); !onLoopback(proxy) &&
					!slices.ContainsFunc(rules, func(r any) bool { in, _ := admits(r, proxyPort, named); return in }) {
					out = append(out, p.where+": no NetworkPolicy rule lets the clients reach the proxy port")
				}
			}
		}
	}
	return out
}

// securityProblems are the problems above of one file's documents.
func securityProblems(file string, docs []map[string]any) []string {
	pp := pods(file, docs)
	var out []string
	for _, p := range pp {
		out = append(out, tokenProblems(p)...)
	}
	out = append(out, redisPasswordProblems(pp)...)
	return append(out, policyProblems(docs, pp)...)
}

func TestKubernetesGuardsTheAdminPortAndRedis(t *testing.T) {
	found := 0
	for file, docs := range yamlFiles(t) {
		if !strings.HasPrefix(file, "kubernetes/") {
			continue
		}
		found++
		for _, p := range securityProblems(file, docs) {
			t.Errorf("%s: %s", file, p)
		}
	}
	if found == 0 {
		t.Fatal("no Kubernetes files")
	}
}

// TestSecurityChecksCatchMistakes: each check above fails on the mistake
// it is there for, made in a copy of the shared service's manifest.
func TestSecurityChecksCatchMistakes(t *testing.T) {
	const file = "kubernetes/llmproxy-redis-replicas.yaml"
	fresh := func() []map[string]any { return yamlFiles(t)[file] }
	if p := securityProblems(file, fresh()); len(p) > 0 {
		t.Fatalf("%s as shipped: %v", file, p)
	}
	doc := func(docs []map[string]any, kind, name string) map[string]any {
		for _, d := range docs {
			if str(d["kind"]) == kind && str(get(d, "metadata", "name")) == name {
				return d
			}
		}
		t.Fatalf("%s: no %s %s", file, kind, name)
		return nil
	}
	container := func(docs []map[string]any, name string) map[string]any {
		return list(podSpec(doc(docs, "Deployment", name))["containers"])[0].(map[string]any)
	}
	setEnv := func(c map[string]any, name string, entry map[string]any) {
		env := slices.DeleteFunc(list(c["env"]), func(e any) bool { return get(e, "name") == name })
		if entry != nil {
			env = append(env, entry)
		}
		c["env"] = env
	}
	ingress := func(docs []map[string]any, name string) []any {
		return list(get(doc(docs, "NetworkPolicy", name), "spec", "ingress"))
	}
	setIngress := func(docs []map[string]any, name string, rules ...any) {
		doc(docs, "NetworkPolicy", name)["spec"].(map[string]any)["ingress"] = rules
	}
	adminRule := func(from ...any) any {
		return map[string]any{"from": from, "ports": []any{map[string]any{"port": 9090}}}
	}
	proxyRule := map[string]any{"ports": []any{map[string]any{"port": 8080}}}
	labelled := map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"llmproxy-admin": "true"}}}
	without := func(docs []map[string]any, kind, name string) []map[string]any {
		return slices.DeleteFunc(docs, func(d map[string]any) bool {
			return str(d["kind"]) == kind && str(get(d, "metadata", "name")) == name
		})
	}
	for _, tc := range []struct {
		mistake string
		change  func([]map[string]any) []map[string]any
		want    string
	}{
		{"the token written out", func(d []map[string]any) []map[string]any {
			setEnv(container(d, "llmproxy"), "LLMPROXY_ADMIN_TOKEN", map[string]any{"name": "LLMPROXY_ADMIN_TOKEN", "value": "s3cret"})
			return d
		}, "LLMPROXY_ADMIN_TOKEN is written in the manifest"},
		{"no token", func(d []map[string]any) []map[string]any {
			setEnv(container(d, "llmproxy"), "LLMPROXY_ADMIN_TOKEN", nil)
			return d
		}, "the admin listener :9090 is not on loopback and LLMPROXY_ADMIN_TOKEN is not from a Secret"},
		{"a liveness probe of /lanes", func(d []map[string]any) []map[string]any {
			get(container(d, "llmproxy"), "livenessProbe", "httpGet").(map[string]any)["path"] = "/lanes"
			return d
		}, `livenessProbe asks "/lanes", want /healthz`},
		{"a startup probe of /metrics", func(d []map[string]any) []map[string]any {
			container(d, "llmproxy")["startupProbe"] = map[string]any{"httpGet": map[string]any{"path": "/metrics", "port": 9090}}
			return d
		}, `startupProbe asks "/metrics", want /healthz or /readyz`},
		{"no readiness probe", func(d []map[string]any) []map[string]any {
			delete(container(d, "llmproxy"), "readinessProbe")
			return d
		}, "no readinessProbe httpGet"},
		{"a probe with a header", func(d []map[string]any) []map[string]any {
			get(container(d, "llmproxy"), "readinessProbe", "httpGet").(map[string]any)["httpHeaders"] = []any{map[string]any{"name": "Authorization", "value": "Bearer x"}}
			return d
		}, "readinessProbe sends headers"},
		{"Redis without a password", func(d []map[string]any) []map[string]any {
			container(d, "redis")["args"] = []any{"--save", ""}
			return d
		}, "Redis runs without --requirepass"},
		{"Redis' password in its args", func(d []map[string]any) []map[string]any {
			container(d, "redis")["args"] = []any{"--requirepass", "hunter2"}
			return d
		}, "Redis' password is written in its args"},
		{"Redis' password not from a Secret", func(d []map[string]any) []map[string]any {
			setEnv(container(d, "redis"), "REDIS_PASSWORD", map[string]any{"name": "REDIS_PASSWORD", "value": "hunter2"})
			return d
		}, "Redis' password REDIS_PASSWORD is not from a Secret"},
		{"Redis' password from another Secret", func(d []map[string]any) []map[string]any {
			get(envEntry(container(d, "redis"), "REDIS_PASSWORD"), "valueFrom", "secretKeyRef").(map[string]any)["name"] = "other"
			return d
		}, `is not key "password" of Secret "other"`},
		{"llmproxy without the password", func(d []map[string]any) []map[string]any {
			setEnv(container(d, "llmproxy"), "LLMPROXY_REDIS_PASSWORD_FILE", nil)
			return d
		}, "without LLMPROXY_REDIS_PASSWORD_FILE"},
		{"no NetworkPolicy for Redis", func(d []map[string]any) []map[string]any {
			return without(d, "NetworkPolicy", "redis")
		}, "no NetworkPolicy holds who reaches Redis"},
		{"Redis open to anyone", func(d []map[string]any) []map[string]any {
			setIngress(d, "redis", map[string]any{"ports": []any{map[string]any{"port": 6379}}})
			return d
		}, "lets anyone reach Redis"},
		{"Redis open to every pod", func(d []map[string]any) []map[string]any {
			setIngress(d, "redis", map[string]any{"from": []any{map[string]any{"podSelector": map[string]any{}}}})
			return d
		}, "lets others than the llmproxy pods reach Redis"},
		{"Redis open to another namespace", func(d []map[string]any) []map[string]any {
			get(ingress(d, "redis")[0], "from").([]any)[0].(map[string]any)["namespaceSelector"] = map[string]any{}
			return d
		}, "lets others than the llmproxy pods reach Redis"},
		{"Redis open to pods of no workload here", func(d []map[string]any) []map[string]any {
			setIngress(d, "redis", map[string]any{"from": []any{map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": "x"}}}}})
			return d
		}, "lets others than the llmproxy pods reach Redis"},
		{"another port of Redis", func(d []map[string]any) []map[string]any {
			get(ingress(d, "redis")[0], "ports").([]any)[0].(map[string]any)["port"] = 16379
			return d
		}, "lets in port 16379 of Redis"},
		{"no NetworkPolicy for llmproxy", func(d []map[string]any) []map[string]any {
			return without(d, "NetworkPolicy", "llmproxy")
		}, "no NetworkPolicy holds who reaches the admin port"},
		{"the admin port open to anyone", func(d []map[string]any) []map[string]any {
			setIngress(d, "llmproxy", proxyRule, adminRule())
			return d
		}, "lets anyone reach the admin port"},
		{"every port open to anyone", func(d []map[string]any) []map[string]any {
			setIngress(d, "llmproxy", map[string]any{})
			return d
		}, "lets anyone reach the admin port"},
		{"the admin port by name, open to anyone", func(d []map[string]any) []map[string]any {
			setIngress(d, "llmproxy", proxyRule, map[string]any{"ports": []any{map[string]any{"port": "admin"}}})
			return d
		}, "lets anyone reach the admin port"},
		{"the admin port open to every pod", func(d []map[string]any) []map[string]any {
			setIngress(d, "llmproxy", proxyRule, adminRule(map[string]any{"podSelector": map[string]any{}}))
			return d
		}, "lets every pod of a namespace"},
		{"the admin port open to a namespace", func(d []map[string]any) []map[string]any {
			setIngress(d, "llmproxy", proxyRule, adminRule(labelled, map[string]any{"namespaceSelector": map[string]any{}}))
			return d
		}, "lets every pod of a namespace"},
		{"the admin port open to an address block", func(d []map[string]any) []map[string]any {
			setIngress(d, "llmproxy", proxyRule, adminRule(map[string]any{"ipBlock": map[string]any{"cidr": "0.0.0.0/0"}}))
			return d
		}, "an address block"},
		{"the proxy port shut", func(d []map[string]any) []map[string]any {
			setIngress(d, "llmproxy", adminRule(labelled))
			return d
		}, "no NetworkPolicy rule lets the clients reach the proxy port"},
	} {
		t.Run(tc.mistake, func(t *testing.T) {
			p := securityProblems(file, tc.change(fresh()))
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem saying %q, got %q", tc.want, p)
			}
		})
	}
}
