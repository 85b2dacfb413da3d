// Package deploy holds example deployments of llmproxy (Docker Compose,
// Kubernetes) and its monitoring (a Grafana dashboard, Prometheus alert
// rules). Nothing here is compiled into the binary; this test only checks
// that the files parse and agree with each other and with the program's
// configuration and metrics, since no container engine, Prometheus or
// Grafana runs them in CI.
package deploy

import (
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	composeFile = "docker-compose.yml"
	// The listeners every llmproxy container in deploy/ uses.
	proxyPort = "8080"
	adminPort = "9090"
)

// yamlFiles returns every YAML file under deploy/ with its documents.
func yamlFiles(t *testing.T) map[string][]map[string]any {
	t.Helper()
	files := map[string][]map[string]any{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(path); ext != ".yml" && ext != ".yaml" {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		dec := yaml.NewDecoder(f)
		for i := 0; ; i++ {
			var doc map[string]any
			err := dec.Decode(&doc)
			if err == io.EOF {
				break
			}
			if err != nil {
				return fmt.Errorf("%s: document %d: %w", path, i+1, err)
			}
			if doc == nil {
				return fmt.Errorf("%s: document %d is empty", path, i+1)
			}
			files[filepath.ToSlash(path)] = append(files[filepath.ToSlash(path)], doc)
		}
		if len(files[filepath.ToSlash(path)]) == 0 {
			return fmt.Errorf("%s: no YAML documents", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no YAML files under deploy/")
	}
	return files
}

func TestYAMLParses(t *testing.T) {
	for path, docs := range yamlFiles(t) {
		t.Logf("%s: %d document(s)", path, len(docs))
	}
}

// Small accessors for decoded YAML; a missing or mistyped field gives the
// zero value, and the checks below report it.

func get(v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func list(v any) []any { l, _ := v.([]any); return l }

// composeEnv reads a compose service's environment, map or list form.
func composeEnv(svc any) map[string]string {
	env := map[string]string{}
	switch e := get(svc, "environment").(type) {
	case map[string]any:
		for k, v := range e {
			env[k] = str(v)
		}
	case []any:
		for _, kv := range e {
			k, v, _ := strings.Cut(str(kv), "=")
			env[k] = v
		}
	}
	return env
}

// composeDependsOn reads depends_on, list or map form.
func composeDependsOn(svc any) []string {
	var names []string
	switch d := get(svc, "depends_on").(type) {
	case []any:
		for _, n := range d {
			names = append(names, str(n))
		}
	case map[string]any:
		for n := range d {
			names = append(names, n)
		}
	}
	return names
}

// composePort is one published port: host address and container port.
type composePort struct{ host, target string }

// composePorts reads ports, short ("[ip:]host:container[/proto]") or long
// (target, published, host_ip) syntax.
func composePorts(svc any) []composePort {
	var ports []composePort
	for _, p := range list(get(svc, "ports")) {
		if m, ok := p.(map[string]any); ok {
			host := net.JoinHostPort(str(m["host_ip"]), str(m["published"]))
			ports = append(ports, composePort{host, str(m["target"])})
			continue
		}
		spec, _, _ := strings.Cut(str(p), "/")
		parts := strings.Split(spec, ":")
		cp := composePort{target: parts[len(parts)-1]}
		switch len(parts) {
		case 2:
			cp.host = net.JoinHostPort("", parts[0])
		case 3:
			cp.host = net.JoinHostPort(parts[0], parts[1])
		}
		ports = append(ports, cp)
	}
	return ports
}

// redisHost checks a LLMPROXY_REDIS_URL value and returns its host name.
func redisHost(t *testing.T, where, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Hostname() == "" {
		t.Errorf("%s: LLMPROXY_REDIS_URL %q is not a redis:// URL with a host", where, raw)
		return ""
	}
	return u.Hostname()
}

// redisHosts checks a LLMPROXY_REDIS_URL value and returns its host names:
// the URL's and those of its addr=host:port parameters (more cluster seeds
// or Sentinels).
func redisHosts(t *testing.T, where, raw string) []string {
	t.Helper()
	host := redisHost(t, where, raw)
	if host == "" {
		return nil
	}
	hosts := []string{host}
	u, _ := url.Parse(raw)
	for _, a := range u.Query()["addr"] {
		h, _, err := net.SplitHostPort(a)
		if err != nil || h == "" {
			t.Errorf("%s: LLMPROXY_REDIS_URL addr=%q is not host:port", where, a)
			continue
		}
		hosts = append(hosts, h)
	}
	return hosts
}

func TestCompose(t *testing.T) {
	docs := yamlFiles(t)[composeFile]
	if len(docs) != 1 {
		t.Fatalf("%s: want one document, got %d", composeFile, len(docs))
	}
	services, _ := get(docs[0], "services").(map[string]any)
	if _, ok := services["redis"]; !ok {
		t.Fatalf("%s: no redis service", composeFile)
	}
	if img := str(get(services["redis"], "image")); !strings.HasPrefix(img, "redis:7") {
		t.Errorf("redis image %q, want redis:7-*", img)
	}

	// Replicas are the services built from the repository's Dockerfile.
	var replicas []string
	for name, svc := range services {
		if get(svc, "build") != nil {
			replicas = append(replicas, name)
		}
	}
	slices.Sort(replicas)
	if len(replicas) != 3 {
		t.Fatalf("want 3 llmproxy replicas (services with build:), got %v", replicas)
	}

	published := map[string]string{} // host address -> service
	for name, svc := range services {
		for _, p := range composePorts(svc) {
			if p.host == "" {
				continue
			}
			if other, dup := published[p.host]; dup {
				t.Errorf("host port %s published by both %s and %s", p.host, other, name)
			}
			published[p.host] = name
		}
	}

	for _, name := range replicas {
		svc := services[name]
		if b := str(get(svc, "build")); b != ".." {
			t.Errorf("%s: build %q, want .. (the repository's Dockerfile)", name, b)
		}
		env := composeEnv(svc)
		want := map[string]string{
			"LLMPROXY_ADDR":       ":" + proxyPort,
			"LLMPROXY_ADMIN_ADDR": ":" + adminPort,
			"LLMPROXY_UPSTREAM":   "https://api.openai.com",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("%s: %s=%q, want %q", name, k, env[k], v)
			}
		}
		// The admin token comes from where compose runs, never from the
		// file: empty by default (the listener then answers localhost only).
		if tok := env["LLMPROXY_ADMIN_TOKEN"]; tok != "${LLMPROXY_ADMIN_TOKEN:-}" {
			t.Errorf("%s: LLMPROXY_ADMIN_TOKEN=%q, want it from the environment: ${LLMPROXY_ADMIN_TOKEN:-}", name, tok)
		}
		if host := redisHost(t, name, env["LLMPROXY_REDIS_URL"]); host != "" {
			if _, ok := services[host]; !ok || host != "redis" {
				t.Errorf("%s: LLMPROXY_REDIS_URL host %q is not the redis service", name, host)
			}
		}
		if !slices.Contains(composeDependsOn(svc), "redis") {
			t.Errorf("%s: does not depend on redis", name)
		}
		// No healthcheck here means the image's HEALTHCHECK; one given here
		// must be the binary's own subcommand (no shell or curl in the image).
		if hc := get(svc, "healthcheck", "test"); hc != nil && !strings.Contains(fmt.Sprint(hc), "healthcheck") {
			t.Errorf("%s: healthcheck %v does not run `llmproxy healthcheck`", name, hc)
		}
		// Both listeners published, on loopback only.
		targets := map[string]bool{}
		for _, p := range composePorts(svc) {
			targets[p.target] = true
			if h, _, _ := net.SplitHostPort(p.host); h != "127.0.0.1" {
				t.Errorf("%s: port %s published on %q, want 127.0.0.1", name, p.target, h)
			}
		}
		if !targets[proxyPort] || !targets[adminPort] {
			t.Errorf("%s: want ports %s and %s published, got %v", name, proxyPort, adminPort, composePorts(svc))
		}
	}

	// The optional load balancer: off by default, and its config names
	// every replica.
	if lb, ok := services["lb"]; ok {
		if !slices.Contains(list(get(lb, "profiles")), any("lb")) {
			t.Errorf("lb: not under profiles: [lb]")
		}
		conf, err := os.ReadFile("nginx.conf")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range replicas {
			if !strings.Contains(string(conf), "server "+name+":"+proxyPort+";") {
				t.Errorf("nginx.conf: no upstream server %s:%s", name, proxyPort)
			}
		}
	}
}

// k8sContainer is a container of a pod template, with where it was found.
type k8sContainer struct {
	where string
	c     map[string]any
	vols  map[string]bool // the names of its pod's volumes
}

func (c k8sContainer) env() map[string]any {
	env := map[string]any{}
	for _, e := range list(c.c["env"]) {
		env[str(get(e, "name"))] = e
	}
	return env
}

func (c k8sContainer) isLLMProxy() bool {
	return c.c["name"] == "llmproxy" || strings.Contains(str(c.c["image"]), "llmproxy")
}

// podSpec returns the pod spec of a workload (or a bare Pod).
func podSpec(doc map[string]any) map[string]any {
	var spec any
	switch str(doc["kind"]) {
	case "Pod":
		spec = doc["spec"]
	case "CronJob":
		spec = get(doc, "spec", "jobTemplate", "spec", "template", "spec")
	default:
		spec = get(doc, "spec", "template", "spec")
	}
	m, _ := spec.(map[string]any)
	return m
}

func TestKubernetes(t *testing.T) {
	found := 0
	for path, docs := range yamlFiles(t) {
		if !strings.HasPrefix(path, "kubernetes/") {
			continue
		}
		found++
		services := map[string]bool{}
		var podLabels []map[string]any
		var containers []k8sContainer
		llmproxies := 0
		for i, doc := range docs {
			kind, name := str(doc["kind"]), str(get(doc, "metadata", "name"))
			if kind == "" || str(doc["apiVersion"]) == "" || name == "" {
				t.Errorf("%s: document %d lacks apiVersion, kind or metadata.name", path, i+1)
			}
			if kind == "Service" {
				services[name] = true
			}
			spec := podSpec(doc)
			if spec == nil {
				continue
			}
			if l, ok := get(doc, "spec", "template", "metadata", "labels").(map[string]any); ok {
				podLabels = append(podLabels, l)
			}
			vols := map[string]bool{}
			for _, v := range list(spec["volumes"]) {
				vols[str(get(v, "name"))] = true
			}
			for _, field := range []string{"initContainers", "containers"} {
				for _, c := range list(spec[field]) {
					m, _ := c.(map[string]any)
					containers = append(containers, k8sContainer{fmt.Sprintf("%s: %s %s: %s", path, kind, name, str(m["name"])), m, vols})
				}
			}
		}

		for _, c := range containers {
			env := c.env()
			// API keys come from Secrets, never as literal values.
			for k, e := range env {
				if strings.HasSuffix(k, "_API_KEY") && get(e, "valueFrom", "secretKeyRef") == nil {
					t.Errorf("%s: %s is not taken from a Secret (secretKeyRef)", c.where, k)
				}
			}
			if !c.isLLMProxy() {
				continue
			}
			llmproxies++
			if _, ok := env["LLMPROXY_ADDR"]; !ok {
				t.Errorf("%s: LLMPROXY_ADDR not set", c.where)
			}
			probe := get(c.c, "readinessProbe", "httpGet")
			if p := str(get(probe, "path")); p != "/readyz" {
				t.Errorf("%s: readinessProbe path %q, want /readyz", c.where, p)
			}
			port := str(get(probe, "port"))
			for _, p := range list(c.c["ports"]) { // a named port
				if str(get(p, "name")) == port && port != "" {
					port = str(get(p, "containerPort"))
				}
			}
			if port != adminPort {
				t.Errorf("%s: readinessProbe port %q, want %s", c.where, port, adminPort)
			}
			// Large request bodies are spooled to files: a read-only root
			// file system needs a volume where they go.
			if get(c.c, "securityContext", "readOnlyRootFilesystem") == true {
				dir := "/tmp"
				if e, ok := env["LLMPROXY_SPOOL_DIR"]; ok {
					dir = str(get(e, "value"))
				}
				if !slices.ContainsFunc(list(c.c["volumeMounts"]), func(m any) bool {
					return str(get(m, "mountPath")) == dir && c.vols[str(get(m, "name"))]
				}) {
					t.Errorf("%s: read-only root file system and no pod volume mounted at the spool directory %s", c.where, dir)
				}
			}
			if raw, ok := env["LLMPROXY_REDIS_URL"]; ok {
				for _, host := range redisHosts(t, c.where, str(get(raw, "value"))) {
					// A Service of the file, or one of another namespace
					// by its cluster DNS name (a Redis installed apart).
					if !services[host] && !strings.Contains(host, ".svc") {
						t.Errorf("%s: LLMPROXY_REDIS_URL host %q is neither a Service in %s nor <service>.<namespace>.svc", c.where, host, path)
					}
				}
			}
		}
		if llmproxies == 0 {
			t.Errorf("%s: no llmproxy container", path)
		}

		// In a pod with llmproxy beside a client, the client's base URLs
		// point at the proxy's listener.
		for _, c := range containers {
			for _, k := range []string{"OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"} {
				e, ok := c.env()[k]
				if !ok {
					continue
				}
				u, err := url.Parse(str(get(e, "value")))
				if err != nil || u.Port() != proxyPort {
					t.Errorf("%s: %s=%q does not point at llmproxy's port %s", c.where, k, str(get(e, "value")), proxyPort)
				}
			}
		}

		// Every Service and PodDisruptionBudget selects the pods of some
		// workload in the file.
		for _, doc := range docs {
			var sel map[string]any
			switch str(doc["kind"]) {
			case "Service":
				sel, _ = get(doc, "spec", "selector").(map[string]any)
			case "PodDisruptionBudget":
				sel, _ = get(doc, "spec", "selector", "matchLabels").(map[string]any)
			default:
				continue
			}
			if !slices.ContainsFunc(podLabels, func(l map[string]any) bool {
				for k, v := range sel {
					if l[k] != v {
						return false
					}
				}
				return len(sel) > 0
			}) {
				t.Errorf("%s: %s %s selects no pod template (selector %v)", path, str(doc["kind"]), str(get(doc, "metadata", "name")), sel)
			}
		}
	}
	if found == 0 {
		t.Fatal("no Kubernetes files under deploy/kubernetes/")
	}
}

var envName = regexp.MustCompile(`\bLLMPROXY_[A-Z0-9_]*[A-Z0-9]`)

// documentedNames returns the LLMPROXY_* variables of config.example.env
// and of the tables of docs/configuration.md.
func documentedNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	example, err := os.ReadFile("../config.example.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(example), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if k, _, ok := strings.Cut(line, "="); ok && envName.MatchString(k) {
			names[strings.TrimSpace(k)] = true
		}
	}
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| `LLMPROXY_") {
			names[envName.FindString(line)] = true
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %d documented variables; has docs/configuration.md or config.example.env changed shape?", len(names))
	}
	return names
}

func TestEnvNamesDocumented(t *testing.T) {
	documented := documentedNames(t)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, k := range envName.FindAllString(string(b), -1) {
			if !documented[k] {
				t.Errorf("%s: %s is in neither config.example.env nor docs/configuration.md's tables", path, k)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
