package deploy

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/url"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The checks of an llmproxy container's settings against the program:
// every LLMPROXY_* variable set is one the binary reads, the Redis
// settings agree with each other, every file a setting names is mounted
// from a Secret (or, for certificates, a ConfigMap) the proxy's user can
// read, and a stop gives the proxy its whole drain before it is killed.

const cmdDir = "../cmd/llmproxy/"

// binary is what the tests need of cmd/llmproxy, read from its source
// (package main cannot be imported).
type binary struct {
	// names are the LLMPROXY_* variables config reads, as
	// unknownVariables in cmd/llmproxy counts them: its fields' env tags.
	names map[string]bool
	// shutdownTimeout is LLMPROXY_SHUTDOWN_TIMEOUT's default.
	shutdownTimeout time.Duration
	// tail is the most a stop takes after LLMPROXY_SHUTDOWN_TIMEOUT:
	// stopGrace for the 503s to what is left, again for the WebSocket
	// sessions' close frames, again for the admin listener.
	tail time.Duration
}

func readBinary(t *testing.T) binary {
	t.Helper()
	fset := token.NewFileSet()
	b := binary{names: map[string]bool{}}
	cfg, err := parser.ParseFile(fset, cmdDir+"config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(cfg, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "config" {
			return true
		}
		for _, f := range ts.Type.(*ast.StructType).Fields.List {
			if f.Tag == nil {
				continue
			}
			tag := reflect.StructTag(strings.Trim(f.Tag.Value, "`"))
			name := tag.Get("env")
			if name == "" {
				continue
			}
			b.names["LLMPROXY_"+name] = true
			if name == "SHUTDOWN_TIMEOUT" {
				if b.shutdownTimeout, err = time.ParseDuration(tag.Get("envDefault")); err != nil {
					t.Fatalf("config.go: SHUTDOWN_TIMEOUT's default: %v", err)
				}
			}
		}
		return false
	})
	if len(b.names) < 10 || b.shutdownTimeout <= 0 {
		t.Fatalf("%sconfig.go: found %d variables and SHUTDOWN_TIMEOUT default %v; has config changed shape?", cmdDir, len(b.names), b.shutdownTimeout)
	}
	serve, err := parser.ParseFile(fset, cmdDir+"serve.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	grace := constDuration(serve, "stopGrace")
	if grace <= 0 {
		t.Fatalf("%sserve.go: no const stopGrace = <n> * time.<unit>; has the stop changed shape?", cmdDir)
	}
	b.tail = 3 * grace
	return b
}

// constDuration is the value of a constant declared as n * time.Unit, or 0.
func constDuration(f *ast.File, name string) time.Duration {
	units := map[string]time.Duration{"Millisecond": time.Millisecond, "Second": time.Second, "Minute": time.Minute}
	var d time.Duration
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != name || len(vs.Values) != 1 {
			return true
		}
		be, ok := vs.Values[0].(*ast.BinaryExpr)
		if !ok || be.Op != token.MUL {
			return false
		}
		lit, ok1 := be.X.(*ast.BasicLit)
		sel, ok2 := be.Y.(*ast.SelectorExpr)
		if !ok1 || !ok2 {
			return false
		}
		if n, err := strconv.Atoi(lit.Value); err == nil {
			d = time.Duration(n) * units[sel.Sel.Name]
		}
		return false
	})
	return d
}

// envProblems checks the LLMPROXY_* variables of one llmproxy container
// or service: names the binary reads, and Redis settings that agree.
func (b binary) envProblems(env map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if strings.HasPrefix(k, "LLMPROXY_") && !b.names[k] && !strings.HasPrefix(k, "LLMPROXY_ROUTE_") {
			out = append(out, k+" is not a variable llmproxy reads")
		}
	}
	raw, ok := env["LLMPROXY_REDIS_URL"]
	if !ok {
		for k := range env {
			if strings.HasPrefix(k, "LLMPROXY_REDIS_") {
				out = append(out, k+" set without LLMPROXY_REDIS_URL")
			}
		}
		return out
	}
	u, err := url.Parse(raw)
	if err != nil {
		return append(out, "LLMPROXY_REDIS_URL does not parse")
	}
	if _, set := u.User.Password(); set {
		out = append(out, "LLMPROXY_REDIS_URL holds a password: put it in a Secret (LLMPROXY_REDIS_PASSWORD_FILE)")
	}
	mode, master := env["LLMPROXY_REDIS_MODE"], env["LLMPROXY_REDIS_SENTINEL_MASTER"]
	switch {
	case !slices.Contains([]string{"", "auto", "standalone", "cluster", "sentinel"}, mode):
		out = append(out, fmt.Sprintf("LLMPROXY_REDIS_MODE %q is not auto, standalone, cluster or sentinel", mode))
	case mode == "sentinel" && master == "":
		out = append(out, "LLMPROXY_REDIS_MODE is sentinel without LLMPROXY_REDIS_SENTINEL_MASTER")
	case master != "" && (mode == "standalone" || mode == "cluster"):
		out = append(out, "LLMPROXY_REDIS_SENTINEL_MASTER set in mode "+mode)
	}
	for _, k := range []string{"LLMPROXY_REDIS_CA", "LLMPROXY_REDIS_CERT", "LLMPROXY_REDIS_KEY"} {
		if _, set := env[k]; set && u.Scheme != "rediss" {
			out = append(out, k+" set, but LLMPROXY_REDIS_URL is not rediss://")
		}
	}
	_, cert := env["LLMPROXY_REDIS_CERT"]
	if _, key := env["LLMPROXY_REDIS_KEY"]; cert != key {
		out = append(out, "a client certificate needs both LLMPROXY_REDIS_CERT and LLMPROXY_REDIS_KEY")
	}
	return out
}

// fileSetting says whether a variable's value is a file llmproxy reads,
// and whether that file is a secret (then it must come from a Secret).
func fileSetting(name string) (isFile, secret bool) {
	switch {
	case name == "LLMPROXY_REDIS_KEY" || strings.HasSuffix(name, "_FILE"):
		return true, true
	case name == "LLMPROXY_REDIS_CA" || name == "LLMPROXY_REDIS_CERT":
		return true, false
	}
	return false, false
}

// fileProblems checks each file a setting of container c names: a pod
// volume mounted over it, a Secret for a secret (a ConfigMap will do for a
// certificate), the file one of the volume's items when it lists them, and
// readable by the container's user.
func fileProblems(pod map[string]any, c map[string]any, env map[string]string) []string {
	vols := map[string]map[string]any{}
	for _, v := range list(pod["volumes"]) {
		m, _ := v.(map[string]any)
		vols[str(m["name"])] = m
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		isFile, secret := fileSetting(k)
		if !isFile {
			continue
		}
		file := env[k]
		if !path.IsAbs(file) {
			out = append(out, fmt.Sprintf("%s=%q is not an absolute path", k, file))
			continue
		}
		var mount map[string]any
		for _, m := range list(c["volumeMounts"]) {
			mm, _ := m.(map[string]any)
			dir := str(mm["mountPath"])
			if dir == file && mm["subPath"] != nil || strings.HasPrefix(file, strings.TrimSuffix(dir, "/")+"/") && mm["subPath"] == nil {
				mount = mm
			}
		}
		if mount == nil {
			out = append(out, fmt.Sprintf("%s=%s: no volume mounted there", k, file))
			continue
		}
		vol := vols[str(mount["name"])]
		src, kind := vol["secret"], "secret"
		if src == nil && !secret {
			src, kind = vol["configMap"], "configMap"
		}
		if src == nil {
			want := "a Secret"
			if !secret {
				want = "a Secret or ConfigMap"
			}
			out = append(out, fmt.Sprintf("%s=%s: volume %q is not %s", k, file, str(mount["name"]), want))
			continue
		}
		item := str(mount["subPath"])
		if item == "" {
			item = strings.TrimPrefix(file, strings.TrimSuffix(str(mount["mountPath"]), "/")+"/")
		}
		mode := 0o644 // Kubernetes' defaultMode
		if m, ok := get(src, "defaultMode").(int); ok {
			mode = m
		}
		if items := list(get(src, "items")); items != nil {
			i := slices.IndexFunc(items, func(it any) bool { return str(get(it, "path")) == item })
			if i < 0 {
				out = append(out, fmt.Sprintf("%s=%s: %s %q has no item %q", k, file, kind, str(mount["name"]), item))
				continue
			}
			if m, ok := get(items[i], "mode").(int); ok {
				mode = m
			}
		}
		if !readable(mode, pod, c) {
			out = append(out, fmt.Sprintf("%s=%s: mode %#o, not readable by the container's user", k, file, mode))
		}
	}
	return out
}

// readable says whether a projected file of mode (owned by root, group
// fsGroup when the pod sets one) can be read by the container's user.
func readable(mode int, pod, c map[string]any) bool {
	user := get(c, "securityContext", "runAsUser")
	if user == nil {
		user = get(pod, "securityContext", "runAsUser")
	}
	switch {
	case mode&0o004 != 0:
		return true
	case mode&0o040 != 0 && get(pod, "securityContext", "fsGroup") != nil:
		return true
	default:
		return mode&0o400 != 0 && user == 0
	}
}

// stopProblems checks that a pod's stop gives an llmproxy container its
// whole drain: the preStop sleep, the shutdown timeout and the tail fit in
// terminationGracePeriodSeconds (Kubernetes' default 30 when unset).
// A Deployment's pods sit behind a Service: they need the preStop sleep,
// as llmproxy refuses new connections from the SIGTERM on, and a rolling
// update, not Recreate.
func (b binary) stopProblems(doc, pod, c map[string]any, env map[string]string) []string {
	var out []string
	timeout := b.shutdownTimeout
	if v, ok := env["LLMPROXY_SHUTDOWN_TIMEOUT"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return []string{fmt.Sprintf("LLMPROXY_SHUTDOWN_TIMEOUT %q is not a duration", v)}
		}
		timeout = d
	}
	sleep := time.Duration(0)
	if s, ok := get(c, "lifecycle", "preStop", "sleep", "seconds").(int); ok {
		sleep = time.Duration(s) * time.Second
	}
	grace := 30 * time.Second
	if g, ok := pod["terminationGracePeriodSeconds"].(int); ok {
		grace = time.Duration(g) * time.Second
	}
	if need := sleep + timeout + b.tail; grace <= need {
		out = append(out, fmt.Sprintf("terminationGracePeriodSeconds %v, not more than the preStop sleep %v + LLMPROXY_SHUTDOWN_TIMEOUT %v + %v to stop", grace, sleep, timeout, b.tail))
	}
	if str(doc["kind"]) == "Deployment" {
		if sleep == 0 {
			out = append(out, "no preStop sleep: connections sent before the Service drops the pod would be refused")
		}
		if t := str(get(doc, "spec", "strategy", "type")); t == "Recreate" {
			out = append(out, "strategy Recreate stops every replica at once")
		}
	}
	return out
}

// envValues is a container's literal env values (valueFrom entries give
// "").
func envValues(c map[string]any) map[string]string {
	env := map[string]string{}
	for _, e := range list(c["env"]) {
		env[str(get(e, "name"))] = str(get(e, "value"))
	}
	return env
}

// podProblems runs the checks above on every llmproxy container of a
// workload document.
func (b binary) podProblems(doc map[string]any) []string {
	pod := podSpec(doc)
	var out []string
	for _, field := range []string{"initContainers", "containers"} {
		for _, c := range list(pod[field]) {
			m, _ := c.(map[string]any)
			if !(k8sContainer{c: m}).isLLMProxy() {
				continue
			}
			env := envValues(m)
			for _, p := range slices.Concat(b.envProblems(env), fileProblems(pod, m, env), b.stopProblems(doc, pod, m, env)) {
				out = append(out, str(m["name"])+": "+p)
			}
		}
	}
	return out
}

func TestKubernetesPodsMatchTheBinary(t *testing.T) {
	b := readBinary(t)
	checked := 0
	for file, docs := range yamlFiles(t) {
		if !strings.HasPrefix(file, "kubernetes/") {
			continue
		}
		for _, doc := range docs {
			if podSpec(doc) == nil {
				continue
			}
			checked++
			for _, p := range b.podProblems(doc) {
				t.Errorf("%s: %s %s: %s", file, str(doc["kind"]), str(get(doc, "metadata", "name")), p)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no workloads under kubernetes/")
	}
}

func TestComposeMatchesTheBinary(t *testing.T) {
	b := readBinary(t)
	services, _ := get(yamlFiles(t)[composeFile][0], "services").(map[string]any)
	for name, svc := range services {
		if get(svc, "build") == nil {
			continue
		}
		env := composeEnv(svc)
		for _, p := range b.envProblems(env) {
			t.Errorf("%s: %s", name, p)
		}
		timeout := b.shutdownTimeout
		if v, ok := env["LLMPROXY_SHUTDOWN_TIMEOUT"]; ok {
			timeout, _ = time.ParseDuration(v)
		}
		grace := 10 * time.Second // Compose's default
		if v := get(svc, "stop_grace_period"); v != nil {
			var err error
			if grace, err = time.ParseDuration(str(v)); err != nil {
				t.Errorf("%s: stop_grace_period %q: %v", name, str(v), err)
			}
		}
		if grace <= timeout+b.tail {
			t.Errorf("%s: stop_grace_period %v, not more than LLMPROXY_SHUTDOWN_TIMEOUT %v + %v to stop", name, grace, timeout, b.tail)
		}
	}
}

// The checks above catch what they are for: the Sentinel/TLS example,
// clean as shipped, with one mistake made at a time.
func TestPodChecksCatchMistakes(t *testing.T) {
	const file = "kubernetes/llmproxy-redis-sentinel-tls.yaml"
	b := readBinary(t)
	deployment := func() map[string]any {
		for _, doc := range yamlFiles(t)[file] {
			if doc["kind"] == "Deployment" {
				return doc // decoded afresh: each case changes its own
			}
		}
		t.Fatalf("%s: no Deployment", file)
		return nil
	}
	container := func(doc map[string]any) map[string]any {
		for _, c := range list(podSpec(doc)["containers"]) {
			if m, _ := c.(map[string]any); m["name"] == "llmproxy" {
				return m
			}
		}
		t.Fatalf("%s: no llmproxy container", file)
		return nil
	}
	// setEnv sets (value) or removes (nil) a variable.
	setEnv := func(doc map[string]any, name string, value any) {
		c := container(doc)
		env := slices.DeleteFunc(list(c["env"]), func(e any) bool { return get(e, "name") == name })
		if value != nil {
			env = append(env, map[string]any{"name": name, "value": value})
		}
		c["env"] = env
	}
	withEnv := func(name string, value any) func(map[string]any) {
		return func(d map[string]any) { setEnv(d, name, value) }
	}
	volume := func(doc map[string]any, name string) map[string]any {
		for _, v := range list(podSpec(doc)["volumes"]) {
			if m, _ := v.(map[string]any); m["name"] == name {
				return m
			}
		}
		t.Fatalf("%s: no volume %s", file, name)
		return nil
	}
	if p := b.podProblems(deployment()); len(p) > 0 {
		t.Fatalf("%s as shipped: %v", file, p)
	}
	for _, tc := range []struct {
		mistake string
		change  func(map[string]any)
		want    string
	}{
		{"a misspelt variable", func(d map[string]any) {
			setEnv(d, "LLMPROXY_REDIS_PASSWORD_FILE", nil)
			setEnv(d, "LLMPROXY_REDIS_PASSWORDFILE", "/etc/llmproxy/redis-auth/password")
		}, "LLMPROXY_REDIS_PASSWORDFILE is not a variable llmproxy reads"},
		{"the password file's Secret not mounted", func(d map[string]any) {
			c := container(d)
			c["volumeMounts"] = slices.DeleteFunc(list(c["volumeMounts"]), func(m any) bool { return get(m, "name") == "redis-auth" })
		}, "LLMPROXY_REDIS_PASSWORD_FILE=/etc/llmproxy/redis-auth/password: no volume mounted there"},
		{"the password file elsewhere than the mount", withEnv("LLMPROXY_REDIS_PASSWORD_FILE", "/etc/redis/password"), "LLMPROXY_REDIS_PASSWORD_FILE=/etc/redis/password: no volume mounted there"},
		{"the password from an emptyDir", func(d map[string]any) {
			v := volume(d, "redis-auth")
			delete(v, "secret")
			v["emptyDir"] = map[string]any{}
		}, `volume "redis-auth" is not a Secret`},
		{"the client key from a ConfigMap", func(d map[string]any) {
			v := volume(d, "redis-tls")
			v["configMap"], v["secret"] = v["secret"], nil
		}, `LLMPROXY_REDIS_KEY=/etc/llmproxy/redis-tls/tls.key: volume "redis-tls" is not a Secret`},
		{"the Secret's items without the password", func(d map[string]any) {
			s := get(volume(d, "redis-auth"), "secret").(map[string]any)
			s["items"] = slices.DeleteFunc(list(s["items"]), func(i any) bool { return get(i, "path") == "password" })
		}, `has no item "password"`},
		{"the files the user cannot read", func(d map[string]any) {
			delete(podSpec(d)["securityContext"].(map[string]any), "fsGroup")
		}, "not readable by the container's user"},
		{"a grace shorter than the shutdown timeout", func(d map[string]any) {
			podSpec(d)["terminationGracePeriodSeconds"] = 25
		}, "terminationGracePeriodSeconds 25s"},
		{"a grace without room for the preStop sleep", withEnv("LLMPROXY_SHUTDOWN_TIMEOUT", "40s"), "terminationGracePeriodSeconds 45s, not more than the preStop sleep 5s + LLMPROXY_SHUTDOWN_TIMEOUT 40s"},
		{"no preStop sleep", func(d map[string]any) { delete(container(d), "lifecycle") }, "no preStop sleep"},
		{"Recreate", func(d map[string]any) {
			d["spec"].(map[string]any)["strategy"] = map[string]any{"type": "Recreate"}
		}, "strategy Recreate"},
		{"the password in the URL", withEnv("LLMPROXY_REDIS_URL", "rediss://llmproxy:hunter2@redis.redis.svc.cluster.local:26379"), "LLMPROXY_REDIS_URL holds a password"},
		{"sentinel mode without a master", withEnv("LLMPROXY_REDIS_SENTINEL_MASTER", nil), "sentinel without LLMPROXY_REDIS_SENTINEL_MASTER"},
		{"a CA without TLS", withEnv("LLMPROXY_REDIS_URL", "redis://llmproxy@redis.redis.svc.cluster.local:26379"), "LLMPROXY_REDIS_CA set, but LLMPROXY_REDIS_URL is not rediss://"},
		{"a client certificate without its key", withEnv("LLMPROXY_REDIS_KEY", nil), "needs both LLMPROXY_REDIS_CERT and LLMPROXY_REDIS_KEY"},
	} {
		t.Run(tc.mistake, func(t *testing.T) {
			d := deployment()
			tc.change(d)
			p := b.podProblems(d)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem saying %q, got %q", tc.want, p)
			}
		})
	}
}
