package deploy

// Cross-object checks of kvgate's workload: its flags, probes, security,
// shutdown, resources, RBAC, Services, models, pool and replica sync.

import (
	"fmt"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/scheduler/replica"
	"github.com/kvgate/kvgate/tokenize"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// setting is one `kvgate serve` setting as the container sets it.
type setting struct {
	Value     string
	Source    string // `arg "--x=y"` or `env KVGATE_X`
	FieldPath string // for an env var from a fieldRef
	Secret    bool   // for an env var from a Secret
}

// settings reads kvgate's flags (args, written --flag=value) and KVGATE_*
// environment variables, and checks each names a real `kvgate serve` flag.
func (c *checker) settings(ct corev1.Container) map[string]setting {
	s := map[string]setting{}
	if len(ct.Command) > 0 {
		c.bad("kvgate container: command %v overrides the image's entrypoint; use args", ct.Command)
	}
	if len(ct.Args) == 0 || ct.Args[0] != "serve" {
		c.bad("kvgate container: args must start with the serve command, got %q", ct.Args)
		return s
	}
	for _, a := range ct.Args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			c.bad("kvgate arg %q: write flags as --flag=value", a)
			continue
		}
		if !c.flags[name] {
			c.bad("kvgate arg %q: --%s is not a `kvgate serve` flag", a, name)
		}
		if prev, dup := s[name]; dup {
			c.bad("kvgate arg %q: --%s already set by %s", a, name, prev.Source)
		}
		s[name] = setting{Value: value, Source: fmt.Sprintf("arg %q", a)}
	}
	for _, e := range ct.Env {
		rest, ok := strings.CutPrefix(e.Name, "KVGATE_")
		if !ok {
			continue
		}
		name := strings.ToLower(strings.ReplaceAll(rest, "_", "-"))
		if !c.flags[name] {
			c.bad("kvgate env %s: --%s is not a `kvgate serve` flag", e.Name, name)
		}
		if prev, dup := s[name]; dup {
			c.bad("kvgate env %s: --%s is also set by %s, which wins (flag > environment)", e.Name, name, prev.Source)
			continue
		}
		st := setting{Value: e.Value, Source: "env " + e.Name}
		if vf := e.ValueFrom; vf != nil {
			switch {
			case vf.FieldRef != nil:
				st.FieldPath = vf.FieldRef.FieldPath
			case vf.SecretKeyRef != nil:
				st.Secret = true
			default:
				c.bad("kvgate env %s: only literal values, fieldRefs and secretKeyRefs are checked here", e.Name)
			}
		}
		s[name] = st
	}
	return s
}

// value returns a setting's literal value, or def when it is not set.
func value(s map[string]setting, name, def string) string {
	if st, ok := s[name]; ok {
		return st.Value
	}
	return def
}

// addrPort returns the port of a listen address setting.
func (c *checker) addrPort(s map[string]setting, name string) int32 {
	st, ok := s[name]
	if !ok {
		c.bad("kvgate: --%s is not set; set it explicitly, the Service and probes depend on it", name)
		return 0
	}
	_, port, err := net.SplitHostPort(st.Value)
	n, err2 := strconv.Atoi(port)
	if err != nil || err2 != nil || n < 1 || n > 65535 {
		c.bad("kvgate %s: %q is not host:port with a fixed port", st.Source, st.Value)
		return 0
	}
	return int32(n)
}

func (c *checker) duration(s map[string]setting, name, def string) time.Duration {
	v := value(s, name, def)
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		c.bad("kvgate --%s=%q: want a positive duration with a unit", name, v)
		return 0
	}
	return d
}

// checkKvgate checks kvgate's workload and everything it refers to.
func (c *checker) checkKvgate(w workload) {
	ct, _ := container(w.tmpl.Spec.Containers, "kvgate")
	if w.Kind != c.want.KvgateKind {
		c.bad("kvgate runs as a %s, want %s", w.Kind, c.want.KvgateKind)
	}
	if w.replicas != c.want.Replicas {
		c.bad("%s has %d replicas, want %d", w.object, w.replicas, c.want.Replicas)
	}
	s := c.settings(ct)
	if v := value(s, "discovery", ""); v != "kubernetes" {
		c.bad("kvgate --discovery=%q: want kubernetes (the pool's pods are found through the API)", v)
	}
	if v := value(s, "log-level", "info"); v != c.want.LogLevel {
		c.bad("kvgate log level %q, want %q", v, c.want.LogLevel)
	}
	for _, name := range []string{"pool-name", "kv-events-template", "kv-replay-template", "models"} {
		if value(s, name, "") == "" {
			c.bad("kvgate: --%s is not set", name)
		}
	}
	if m := value(s, "model-name", ""); m == "" {
		c.bad("kvgate: set --model-name, the model of pods without the --pod-model-label label")
	}
	if st, ok := s["pool-namespace"]; !ok || (st.FieldPath != "metadata.namespace" && st.Value != w.Namespace) {
		c.bad("kvgate: --pool-namespace should come from env KVGATE_POOL_NAMESPACE with fieldRef metadata.namespace (got %+v)", st)
	}
	c.duration(s, "metrics-scrape-interval", "")
	extProc := c.addrPort(s, "ext-proc-addr")
	admin := c.addrPort(s, "admin-addr")
	for _, p := range []struct {
		flag string
		port int32
	}{{"ext-proc-addr", extProc}, {"admin-addr", admin}} {
		if p.port != 0 && !declaresPort(ct, p.port) {
			c.bad("kvgate --%s port %d is not a declared container port", p.flag, p.port)
		}
	}
	if value(s, "proxy-addr", "") != "" {
		if p := c.addrPort(s, "proxy-addr"); p != 0 && !declaresPort(ct, p) {
			c.bad("kvgate --proxy-addr port %d is not a declared container port", p)
		}
	}
	c.checkProbes(ct, extProc, admin)
	c.checkSecurity(w)
	c.checkShutdown(w, ct, s)
	c.checkResources(ct)
	c.checkRBAC(w)
	c.checkKvgateServices(w, extProc, admin)
	models := c.checkModels(w, ct, s)
	if m := value(s, "model-name", ""); m != "" && len(models.Models) > 0 &&
		!slices.ContainsFunc(models.Models, func(mc tokenize.ModelConfig) bool { return mc.Name == m }) {
		c.bad("kvgate --model-name=%s is not in models.yaml", m)
	}
	if pool, ok := c.checkPoolOf(w, s, extProc); ok {
		c.checkVLLM(w, pool, s, models)
	}
	c.checkReplicaSync(w, ct, s)
}

// checkProbes: startup, liveness and readiness all exist, reach kvgate's
// ports, and only readiness waits for vLLM workers.
func (c *checker) checkProbes(ct corev1.Container, extProc, admin int32) {
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
	}{{"startupProbe", ct.StartupProbe}, {"livenessProbe", ct.LivenessProbe}, {"readinessProbe", ct.ReadinessProbe}} {
		p := pr.probe
		if p == nil {
			c.bad("kvgate container has no %s", pr.name)
			continue
		}
		followsWorkers, ok := c.probeTarget(ct, pr.name, p, extProc, admin)
		if !ok {
			continue
		}
		switch {
		case pr.name == "readinessProbe" && !followsWorkers:
			c.bad("kvgate readinessProbe should follow routing readiness (gRPC service readiness or %s, or GET /ready)", extProcService)
		case pr.name != "readinessProbe" && followsWorkers:
			c.bad("kvgate %s waits for vLLM workers (readiness): kvgate would be restarted while models load", pr.name)
		}
		period, timeout := cmpInt(p.PeriodSeconds, 10), cmpInt(p.TimeoutSeconds, 1)
		if timeout >= period {
			c.bad("kvgate %s: timeoutSeconds %d >= periodSeconds %d", pr.name, timeout, period)
		}
	}
}

// probeTarget checks where a probe goes; followsWorkers tells whether its
// answer depends on kvgate's routing readiness.
func (c *checker) probeTarget(ct corev1.Container, name string, p *corev1.Probe, extProc, admin int32) (followsWorkers, ok bool) {
	h := p.ProbeHandler
	switch {
	case h.GRPC != nil:
		if h.GRPC.Port != extProc || !declaresPort(ct, h.GRPC.Port) {
			c.bad("kvgate %s: gRPC port %d is not the ext_proc port %d", name, h.GRPC.Port, extProc)
			return false, false
		}
		switch svc := str(h.GRPC.Service, ""); svc {
		case "", "liveness":
			return false, true
		case "readiness", extProcService:
			return true, true
		default:
			c.bad("kvgate %s: kvgate serves no gRPC health service %q", name, svc)
		}
	case h.HTTPGet != nil:
		port, found := containerPort(ct, h.HTTPGet.Port)
		if !found || port != admin {
			c.bad("kvgate %s: HTTP port %s is not the admin port %d", name, h.HTTPGet.Port.String(), admin)
			return false, false
		}
		switch h.HTTPGet.Path {
		case "/health":
			return false, true
		case "/ready":
			return true, true
		default:
			c.bad("kvgate %s: path %q is neither /health nor /ready", name, h.HTTPGet.Path)
		}
	case h.TCPSocket != nil:
		if _, found := containerPort(ct, h.TCPSocket.Port); !found {
			c.bad("kvgate %s: TCP port %s is not a container port", name, h.TCPSocket.Port.String())
			return false, false
		}
		return false, true
	default:
		c.bad("kvgate %s: use gRPC or HTTP (the image has no shell for exec probes)", name)
	}
	return false, false
}

func cmpInt(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
}

// checkSecurity: every container of kvgate's pod runs as a non-root user,
// read-only, without capabilities or privilege escalation, under the
// runtime's default seccomp profile.
func (c *checker) checkSecurity(w workload) {
	spec := w.tmpl.Spec
	ps := spec.SecurityContext
	if ps == nil {
		ps = &corev1.PodSecurityContext{}
	}
	for _, ct := range slices.Concat(spec.InitContainers, spec.Containers) {
		sc := ct.SecurityContext
		if sc == nil {
			c.bad("%s container %s: no securityContext", w.object, ct.Name)
			continue
		}
		nonRoot := ps.RunAsNonRoot != nil && *ps.RunAsNonRoot
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
		user := ps.RunAsUser
		if sc.RunAsUser != nil {
			user = sc.RunAsUser
		}
		seccomp := ps.SeccompProfile
		if sc.SeccompProfile != nil {
			seccomp = sc.SeccompProfile
		}
		switch {
		case !nonRoot:
			c.bad("%s container %s: runAsNonRoot is not true", w.object, ct.Name)
		case user == nil || *user == 0:
			c.bad("%s container %s: set a numeric non-zero runAsUser", w.object, ct.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			c.bad("%s container %s: readOnlyRootFilesystem is not true", w.object, ct.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			c.bad("%s container %s: allowPrivilegeEscalation is not false", w.object, ct.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			c.bad("%s container %s: privileged", w.object, ct.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			c.bad("%s container %s: capabilities must drop ALL and add none", w.object, ct.Name)
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			c.bad("%s container %s: seccompProfile is not RuntimeDefault", w.object, ct.Name)
		}
	}
}

// checkShutdown: the grace period covers kvgate's drain. On SIGTERM kvgate
// shuts its admin server down, then its ext_proc server, each waiting up to
// --shutdown-timeout, after the preStop hook.
func (c *checker) checkShutdown(w workload, ct corev1.Container, s map[string]setting) {
	timeout := c.duration(s, "shutdown-timeout", "10s")
	var preStop time.Duration
	if l := ct.Lifecycle; l != nil && l.PreStop != nil {
		switch {
		case l.PreStop.Sleep != nil:
			preStop = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
		default:
			c.bad("kvgate preStop: only the sleep action works (the image has no shell)")
		}
	}
	grace := 30 * time.Second // the API default
	if g := w.tmpl.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	// The admin server and the ext_proc streams drain together (runServe).
	if need := preStop + timeout; grace < need {
		c.bad("kvgate terminationGracePeriodSeconds %v < preStop %v + --shutdown-timeout %v = %v: the drain would be killed",
			grace, preStop, timeout, need)
	}
}

// checkResources: requests for scheduling, a memory limit, and GOMEMLIMIT
// below it so the GC works before the kernel kills.
func (c *checker) checkResources(ct corev1.Container) {
	r := ct.Resources
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := r.Requests[name]; !ok {
			c.bad("kvgate container: no %s request", name)
		}
	}
	limit, ok := r.Limits[corev1.ResourceMemory]
	if !ok {
		c.bad("kvgate container: no memory limit")
		return
	}
	for _, e := range ct.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		q, err := quantity(e.Value)
		if err != nil {
			c.bad("kvgate GOMEMLIMIT=%q: %v", e.Value, err)
		} else if q.Cmp(limit) >= 0 {
			c.bad("kvgate GOMEMLIMIT=%s is not below the memory limit %s", e.Value, limit.String())
		}
		return
	}
	c.bad("kvgate container: set GOMEMLIMIT below the memory limit %s", limit.String())
}

// checkRBAC: kvgate's ServiceAccount exists, gets its token, and is bound
// to read pods and InferencePools (both API groups), and nothing more.
func (c *checker) checkRBAC(w workload) {
	spec := w.tmpl.Spec
	sa := spec.ServiceAccountName
	if sa == "" || sa == "default" {
		c.bad("%s: set serviceAccountName to kvgate's own ServiceAccount", w.object)
		return
	}
	so, ok := c.find("ServiceAccount", w.Namespace, sa)
	if !ok {
		c.bad("%s: ServiceAccount %s is not in the build", w.object, sa)
		return
	}
	automount := true
	if a := so.Obj.(*corev1.ServiceAccount).AutomountServiceAccountToken; a != nil {
		automount = *a
	}
	if a := spec.AutomountServiceAccountToken; a != nil {
		automount = *a
	}
	if !automount {
		c.bad("%s: the ServiceAccount token is not mounted; discovery cannot reach the API", w.object)
	}
	var rules []rbacv1.PolicyRule
	for _, o := range c.all("RoleBinding") {
		rb := o.Obj.(*rbacv1.RoleBinding)
		bound := false
		for _, sub := range rb.Subjects {
			bound = bound || (sub.Kind == rbacv1.ServiceAccountKind && sub.Name == sa && cmpOr(sub.Namespace, o.Namespace) == w.Namespace)
		}
		if !bound {
			continue
		}
		if rb.RoleRef.Kind != "Role" {
			c.bad("%s binds %s %s: kvgate needs a Role in its own namespace", o, rb.RoleRef.Kind, rb.RoleRef.Name)
			continue
		}
		ro, ok := c.find("Role", o.Namespace, rb.RoleRef.Name)
		if !ok {
			c.bad("%s: Role %s is not in the build", o, rb.RoleRef.Name)
			continue
		}
		rules = append(rules, ro.Obj.(*rbacv1.Role).Rules...)
	}
	for _, need := range []struct{ group, resource string }{
		{"", "pods"},
		{"inference.networking.k8s.io", "inferencepools"},
		{"inference.networking.x-k8s.io", "inferencepools"},
	} {
		for _, verb := range []string{"get", "list", "watch"} {
			if !slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool { return covers(r, need.group, need.resource, verb) }) {
				c.bad("RBAC: ServiceAccount %s cannot %s %s in API group %q", sa, verb, need.resource, need.group)
			}
		}
	}
	for _, r := range rules {
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"get", "list", "watch"}, v) {
				c.bad("RBAC: ServiceAccount %s may %s %v: kvgate only reads", sa, v, r.Resources)
			}
		}
	}
}

// covers reports whether a rule allows verb on every object of resource.
func covers(r rbacv1.PolicyRule, group, resource, verb string) bool {
	has := func(list []string, x string) bool { return slices.Contains(list, x) || slices.Contains(list, "*") }
	return len(r.ResourceNames) == 0 && has(r.APIGroups, group) && has(r.Resources, resource) && has(r.Verbs, verb)
}

// checkKvgateServices: a ClusterIP Service exposes kvgate's ext_proc and
// admin ports (checkServices already resolved every port).
func (c *checker) checkKvgateServices(w workload, extProc, admin int32) {
	exposed := map[int32]bool{}
	for _, o := range c.all("Service") {
		svc := o.Obj.(*corev1.Service)
		if o.Namespace != w.Namespace || svc.Spec.ClusterIP == corev1.ClusterIPNone || !subset(svc.Spec.Selector, w.tmpl.Labels) || len(svc.Spec.Selector) == 0 {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			if n, ok := servicePortTarget(w.tmpl, sp); ok {
				exposed[n] = true
			}
		}
	}
	if !exposed[extProc] {
		c.bad("no ClusterIP Service exposes kvgate's ext_proc port %d", extProc)
	}
	if !exposed[admin] {
		c.bad("no ClusterIP Service exposes kvgate's admin port %d", admin)
	}
}

// checkModels: --models is a file of a ConfigMap volume of the build, it
// parses with kvgate's own parser, and tokenizer directories are on volumes
// that something fills.
func (c *checker) checkModels(w workload, ct corev1.Container, s map[string]setting) tokenize.Config {
	file := value(s, "models", "")
	if !path.IsAbs(file) {
		c.bad("kvgate --models=%q: want an absolute path in the container", file)
		return tokenize.Config{}
	}
	vol, key := "", ""
	for _, m := range ct.VolumeMounts {
		switch {
		case m.SubPath == "" && path.Dir(file) == path.Clean(m.MountPath):
			vol, key = m.Name, path.Base(file)
		case m.SubPath != "" && path.Clean(m.MountPath) == file:
			vol, key = m.Name, m.SubPath
		}
	}
	if vol == "" {
		c.bad("kvgate --models=%s: no volume is mounted at %s", file, path.Dir(file))
		return tokenize.Config{}
	}
	var src *corev1.ConfigMapVolumeSource
	for _, v := range w.tmpl.Spec.Volumes {
		if v.Name == vol {
			src = v.ConfigMap
		}
	}
	if src == nil {
		c.bad("kvgate --models=%s: volume %s is not a ConfigMap", file, vol)
		return tokenize.Config{}
	}
	for _, it := range src.Items {
		if it.Path == key {
			key = it.Key
		}
	}
	co, ok := c.find("ConfigMap", w.Namespace, src.Name)
	if !ok {
		c.bad("kvgate --models: ConfigMap %s is not in the build", src.Name)
		return tokenize.Config{}
	}
	data, ok := co.Obj.(*corev1.ConfigMap).Data[key]
	if !ok {
		c.bad("kvgate --models: %s has no key %s", co, key)
		return tokenize.Config{}
	}
	cfg, err := tokenize.ParseConfig([]byte(data))
	if err != nil {
		c.bad("kvgate --models (%s key %s): %v", co, key, err)
		return tokenize.Config{}
	}
	if len(cfg.Models) == 0 {
		c.bad("kvgate --models: no models")
	}
	local := false
	for _, m := range cfg.Models {
		if m.BlockSize < 0 {
			c.bad("models.yaml %s: block_size %d", m.Name, m.BlockSize)
		}
		if i := slices.Index(m.Fallbacks, tokenize.PathLocal); i > 0 || (i == 0 && m.Tokenizer == "") {
			c.bad("models.yaml %s: fallback local needs a tokenizer and must come first", m.Name)
		}
		if m.Tokenizer == "" {
			continue
		}
		local = true
		c.checkTokenizerDir(w, ct, m.Name, m.Tokenizer)
	}
	if local != c.want.LocalTokenizers {
		c.bad("models.yaml names tokenizer directories: %v, want %v", local, c.want.LocalTokenizers)
	}
	return cfg
}

// checkTokenizerDir: dir is on a volume of kvgate's container; an emptyDir
// must be filled by an init container.
func (c *checker) checkTokenizerDir(w workload, ct corev1.Container, model, dir string) {
	var mount *corev1.VolumeMount
	for i, m := range ct.VolumeMounts {
		if rel, ok := strings.CutPrefix(path.Clean(dir), path.Clean(m.MountPath)+"/"); ok && rel != "" {
			mount = &ct.VolumeMounts[i]
		}
	}
	if mount == nil {
		c.bad("models.yaml %s: tokenizer %s is on no volume of the kvgate container (the root filesystem has no tokenizers)", model, dir)
		return
	}
	for _, v := range w.tmpl.Spec.Volumes {
		if v.Name != mount.Name || v.EmptyDir == nil {
			continue
		}
		filled := slices.ContainsFunc(w.tmpl.Spec.InitContainers, func(ic corev1.Container) bool {
			return slices.ContainsFunc(ic.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name && !m.ReadOnly })
		})
		if !filled {
			c.bad("models.yaml %s: tokenizer %s is on emptyDir %s, which no init container fills", model, dir, v.Name)
		}
	}
}

// checkPoolOf: kvgate's --pool-name is an InferencePool of the build,
// whose picker is kvgate's ext_proc port, and an HTTPRoute reaches it.
func (c *checker) checkPoolOf(w workload, s map[string]setting, extProc int32) (*inferencePool, bool) {
	name := value(s, "pool-name", "")
	o, ok := c.find("InferencePool", w.Namespace, name)
	if !ok {
		c.bad("kvgate --pool-name=%s: no InferencePool %s in namespace %s", name, name, w.Namespace)
		return nil, false
	}
	p := o.Obj.(*inferencePool)
	ref := p.Spec.EndpointPickerRef
	if so, ok := c.find("Service", o.Namespace, ref.Name); ok && ref.Port != nil {
		svc := so.Obj.(*corev1.Service)
		if !subset(svc.Spec.Selector, w.tmpl.Labels) {
			c.bad("%s: picker Service %s does not select kvgate's pods", o, so)
		}
		for _, sp := range svc.Spec.Ports {
			if sp.Port != ref.Port.Number {
				continue
			}
			if n, ok := servicePortTarget(w.tmpl, sp); !ok || n != extProc {
				c.bad("%s: picker port %d reaches kvgate port %d, not the ext_proc port %d", o, sp.Port, n, extProc)
			}
		}
	} else if ref.Name != "" {
		c.bad("%s: its picker is not kvgate's Service", o)
	}
	routed := false
	for _, ro := range c.all("HTTPRoute") {
		for _, rule := range ro.Obj.(*httpRoute).Spec.Rules {
			for _, br := range rule.BackendRefs {
				routed = routed || (str(br.Kind, "") == "InferencePool" && br.Name == name && str(br.Namespace, ro.Namespace) == o.Namespace)
			}
		}
	}
	if !routed {
		c.bad("no HTTPRoute sends traffic to %s", o)
	}
	return p, true
}

// checkReplicaSync: several replicas share their load, each replica lists
// every replica by its stable StatefulSet DNS name.
func (c *checker) checkReplicaSync(w workload, ct corev1.Container, s map[string]setting) {
	port, _ := strconv.Atoi(value(s, "replica-sync-port", "0"))
	peers := value(s, "replica-sync-peers", "")
	if port == 0 {
		if w.replicas > 1 {
			c.bad("%s: %d replicas without --replica-sync-port: each replica would see only its own active load", w.object, w.replicas)
		}
		if peers != "" {
			c.bad("kvgate --replica-sync-peers needs --replica-sync-port")
		}
		return
	}
	if !declaresPort(ct, int32(port)) {
		c.bad("kvgate --replica-sync-port %d is not a declared container port", port)
	}
	if w.Kind != "StatefulSet" {
		c.bad("%s: replica sync peers need stable pod names: run kvgate as a StatefulSet", w.object)
		return
	}
	so, ok := c.find("Service", w.Namespace, w.serviceName)
	if !ok {
		c.bad("%s: serviceName %s is not a Service of the build", w.object, w.serviceName)
		return
	}
	svc := so.Obj.(*corev1.Service)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		c.bad("%s: must be headless (clusterIP: None) to give each replica a DNS name", so)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		c.bad("%s: set publishNotReadyAddresses, replicas must find each other before they are Ready", so)
	}
	if !subset(svc.Spec.Selector, w.tmpl.Labels) {
		c.bad("%s does not select kvgate's pods", so)
	}
	list := strings.Split(peers, ",")
	if peers == "" || int32(len(list)) != w.replicas {
		c.bad("kvgate --replica-sync-peers lists %d peers for %d replicas: list every replica", len(list), w.replicas)
	}
	seen := map[string]bool{}
	for _, p := range list {
		ep, err := replica.NormalizeEndpoint(strings.TrimSpace(p))
		if err != nil {
			c.bad("kvgate --replica-sync-peers: %v", err)
			continue
		}
		host, pport, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		labels := strings.Split(host, ".")
		okHost := len(labels) >= 2 && labels[1] == w.serviceName && (len(labels) == 2 || labels[2] == w.Namespace)
		idx := -1
		if pod, ok := strings.CutPrefix(labels[0], w.Name+"-"); ok {
			if i, err := strconv.Atoi(pod); err == nil && i >= 0 && int32(i) < w.replicas {
				idx = i
			}
		}
		if !okHost || idx < 0 || seen[labels[0]] {
			c.bad("kvgate --replica-sync-peers entry %s: want tcp://%s-<0..%d>.%s:%d, each replica once", p, w.Name, w.replicas-1, w.serviceName, port)
		}
		seen[labels[0]] = true
		if pport != strconv.Itoa(port) {
			c.bad("kvgate --replica-sync-peers entry %s: port %s, want --replica-sync-port %d", p, pport, port)
		}
	}
}
