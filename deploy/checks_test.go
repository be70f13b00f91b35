package deploy

// Cross-object checks on one kustomize build: does the whole thing hang
// together the way kvgate, the gateway and vLLM need it to.

import (
	"cmp"
	"fmt"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/scheduler/replica"
	"github.com/kvgate/kvgate/tokenize"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// target says what one kustomize build must produce.
type target struct {
	Dir             string // relative to deploy/
	Namespace       string
	KvgateKind      string // Deployment or StatefulSet
	Replicas        int32
	LogLevel        string
	Gateway         bool // the build defines the Gateway its HTTPRoute attaches to
	LocalTokenizers bool // models.yaml names tokenizer directories
}

// extProcService is the gRPC health service name Envoy checks; kvgate
// reports it as its readiness.
const extProcService = "envoy.service.ext_proc.v3.ExternalProcessor"

// checker collects the problems of one build.
type checker struct {
	objs  []object
	flags map[string]bool // `kvgate serve` flags
	want  target
	errs  []error
}

func (c *checker) bad(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// checkBundle runs every cross-object check on a build's objects.
func checkBundle(objs []object, flags map[string]bool, want target) []error {
	c := &checker{objs: objs, flags: flags, want: want}
	c.checkNamespaces()
	c.checkServices()
	c.checkPDBs()
	c.checkRoutes()
	c.checkPools()
	var kv []workload
	for _, w := range c.workloads() {
		if _, ok := container(w.tmpl.Spec.Containers, "kvgate"); ok {
			kv = append(kv, w)
		}
	}
	if len(kv) != 1 {
		c.bad("want exactly one workload with a container named kvgate, found %d", len(kv))
		return c.errs
	}
	c.checkKvgate(kv[0])
	return c.errs
}

// ---- lookups ----

func (c *checker) find(kind, ns, name string) (object, bool) {
	for _, o := range c.objs {
		if o.Kind == kind && o.Namespace == ns && o.Name == name {
			return o, true
		}
	}
	return object{}, false
}

func (c *checker) all(kind string) []object {
	var out []object
	for _, o := range c.objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// workload is a Deployment or a StatefulSet.
type workload struct {
	object
	replicas    int32
	selector    *metav1.LabelSelector
	tmpl        corev1.PodTemplateSpec
	serviceName string // StatefulSet only
}

func (c *checker) workloads() []workload {
	var out []workload
	for _, o := range c.objs {
		switch obj := o.Obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{object: o, replicas: replicas(obj.Spec.Replicas), selector: obj.Spec.Selector, tmpl: obj.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{object: o, replicas: replicas(obj.Spec.Replicas), selector: obj.Spec.Selector,
				tmpl: obj.Spec.Template, serviceName: obj.Spec.ServiceName})
		}
	}
	return out
}

func replicas(p *int32) int32 {
	if p == nil {
		return 1 // the API default
	}
	return *p
}

// selected returns the workloads in ns whose pods carry every label of sel.
func (c *checker) selected(ns string, sel map[string]string) []workload {
	var out []workload
	for _, w := range c.workloads() {
		if w.Namespace == ns && len(sel) > 0 && subset(sel, w.tmpl.Labels) {
			out = append(out, w)
		}
	}
	return out
}

func container(cs []corev1.Container, name string) (corev1.Container, bool) {
	for _, ct := range cs {
		if ct.Name == name {
			return ct, true
		}
	}
	return corev1.Container{}, false
}

// containerPort resolves a port reference (name or number) against the
// ports a container declares.
func containerPort(ct corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range ct.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func declaresPort(ct corev1.Container, port int32) bool {
	_, ok := containerPort(ct, intstr.FromInt32(port))
	return ok
}

// servicePortTarget resolves a Service port to the container port it
// reaches in a pod template.
func servicePortTarget(tmpl corev1.PodTemplateSpec, sp corev1.ServicePort) (int32, bool) {
	tp := sp.TargetPort
	if tp.Type == intstr.Int && tp.IntVal == 0 {
		tp = intstr.FromInt32(sp.Port) // the API default
	}
	for _, ct := range tmpl.Spec.Containers {
		if n, ok := containerPort(ct, tp); ok {
			return n, true
		}
	}
	return 0, false
}

// ---- whole-build checks ----

// checkNamespaces: everything namespaced is in the target's namespace,
// which the build creates; no object is defined twice.
func (c *checker) checkNamespaces() {
	if _, ok := c.find("Namespace", "", c.want.Namespace); !ok {
		c.bad("no Namespace %s in the build", c.want.Namespace)
	}
	seen := map[string]bool{}
	for _, o := range c.objs {
		switch {
		case clusterScoped(o.Kind) && o.Namespace != "":
			c.bad("%s is cluster-scoped but has namespace %q", o, o.Namespace)
		case !clusterScoped(o.Kind) && o.Namespace != c.want.Namespace:
			c.bad("%s is not in namespace %s", o, c.want.Namespace)
		}
		if seen[o.String()] {
			c.bad("%s is defined twice", o)
		}
		seen[o.String()] = true
	}
}

// checkServices: every Service selects pods of the build, and every port
// reaches a port those pods declare.
func (c *checker) checkServices() {
	for _, o := range c.all("Service") {
		svc := o.Obj.(*corev1.Service)
		ws := c.selected(o.Namespace, svc.Spec.Selector)
		if len(ws) == 0 {
			c.bad("%s: selector %v matches no pod template in the build", o, svc.Spec.Selector)
			continue
		}
		for _, w := range ws {
			for _, sp := range svc.Spec.Ports {
				if _, ok := servicePortTarget(w.tmpl, sp); !ok {
					c.bad("%s port %s (%d): targetPort %s is not a port of %s's containers", o, sp.Name, sp.Port, sp.TargetPort.String(), w.object)
				}
			}
		}
	}
}

// checkPDBs: a PodDisruptionBudget selects pods and still lets one go.
func (c *checker) checkPDBs() {
	for _, o := range c.all("PodDisruptionBudget") {
		pdb := o.Obj.(*policyv1.PodDisruptionBudget)
		if pdb.Spec.Selector == nil {
			continue // validateObject reports it
		}
		ws := c.selected(o.Namespace, pdb.Spec.Selector.MatchLabels)
		if len(ws) == 0 {
			c.bad("%s selects no pod template in the build", o)
		}
		for _, w := range ws {
			if m := pdb.Spec.MinAvailable; m != nil && m.Type == intstr.Int && m.IntVal >= w.replicas {
				c.bad("%s: minAvailable %d with %d replicas of %s blocks every voluntary eviction (node drains)", o, m.IntVal, w.replicas, w.object)
			}
		}
	}
}

// checkRoutes: HTTPRoutes reach InferencePools of the build, and attach to
// a Gateway of the build when the target defines one.
func (c *checker) checkRoutes() {
	routes := c.all("HTTPRoute")
	if len(routes) == 0 {
		c.bad("no HTTPRoute in the build: no traffic reaches the pool")
	}
	attached := map[string]bool{}
	for _, o := range routes {
		r := o.Obj.(*httpRoute)
		for i, rule := range r.Spec.Rules {
			for _, br := range rule.BackendRefs {
				if str(br.Kind, "Service") != "InferencePool" {
					continue
				}
				ns := str(br.Namespace, o.Namespace)
				if _, ok := c.find("InferencePool", ns, br.Name); !ok {
					c.bad("%s rule %d: backendRef InferencePool %s/%s is not in the build", o, i, ns, br.Name)
				}
			}
		}
		for _, pr := range r.Spec.ParentRefs {
			if str(pr.Kind, "Gateway") != "Gateway" || str(pr.Group, "gateway.networking.k8s.io") != "gateway.networking.k8s.io" {
				c.bad("%s: parentRef %s is not a Gateway", o, pr.Name)
				continue
			}
			ns := str(pr.Namespace, o.Namespace)
			g, ok := c.find("Gateway", ns, pr.Name)
			if !ok {
				if c.want.Gateway {
					c.bad("%s: parentRef Gateway %s/%s is not in the build", o, ns, pr.Name)
				}
				continue // brought by the user's gateway installation
			}
			attached[g.String()] = true
			gw := g.Obj.(*gateway)
			admits := false
			for _, l := range gw.Spec.Listeners {
				if pr.SectionName != nil && *pr.SectionName != l.Name {
					continue
				}
				from := "Same"
				if l.AllowedRoutes != nil && l.AllowedRoutes.Namespaces != nil {
					from = str(l.AllowedRoutes.Namespaces.From, "Same")
				}
				if from != "Same" || g.Namespace == o.Namespace {
					admits = true
				}
			}
			if !admits {
				c.bad("%s: no listener of %s admits routes from namespace %s", o, g, o.Namespace)
			}
		}
	}
	for _, g := range c.all("Gateway") {
		if !attached[g.String()] {
			c.bad("%s: no HTTPRoute of the build attaches to it", g)
		}
	}
	if c.want.Gateway && len(c.all("Gateway")) == 0 {
		c.bad("the target should define a Gateway and does not")
	}
}

// checkPools: every pool's picker reference names a Service of the build
// and one of its ports, and the pool selects pods that serve its ports.
func (c *checker) checkPools() {
	for _, o := range c.all("InferencePool") {
		p := o.Obj.(*inferencePool)
		ref := p.Spec.EndpointPickerRef
		if ref.Port == nil {
			continue // validateObject reports it
		}
		so, ok := c.find("Service", o.Namespace, ref.Name)
		if !ok {
			c.bad("%s: endpointPickerRef names Service %s, which is not in the build", o, ref.Name)
			continue
		}
		svc := so.Obj.(*corev1.Service)
		var sp *corev1.ServicePort
		for i := range svc.Spec.Ports {
			if svc.Spec.Ports[i].Port == ref.Port.Number {
				sp = &svc.Spec.Ports[i]
			}
		}
		if sp == nil {
			c.bad("%s: endpointPickerRef port %d: %s has no such port", o, ref.Port.Number, so)
			continue
		}
		if sp.AppProtocol == nil || *sp.AppProtocol != "kubernetes.io/h2c" {
			c.bad("%s port %d (the picker's gRPC port): appProtocol should be kubernetes.io/h2c", so, sp.Port)
		}
		for _, w := range c.selected(o.Namespace, svc.Spec.Selector) {
			if ct, ok := container(w.tmpl.Spec.Containers, "kvgate"); !ok {
				c.bad("%s: picker Service %s selects %s, which runs no kvgate", o, so, w.object)
			} else if n, ok := servicePortTarget(w.tmpl, *sp); ok && !declaresPort(ct, n) {
				c.bad("%s: picker port %d reaches port %d, which is not kvgate's", o, sp.Port, n)
			}
		}
		pods := c.selected(o.Namespace, p.Spec.Selector.MatchLabels)
		if len(pods) == 0 {
			c.bad("%s: selector %v matches no pod template in the build", o, p.Spec.Selector.MatchLabels)
		}
		for _, w := range pods {
			if _, ok := container(w.tmpl.Spec.Containers, "kvgate"); ok {
				c.bad("%s: selector %v also selects kvgate's own pods (%s)", o, p.Spec.Selector.MatchLabels, w.object)
				continue
			}
			for _, tp := range p.Spec.TargetPorts {
				found := false
				for _, ct := range w.tmpl.Spec.Containers {
					found = found || declaresPort(ct, tp.Number)
				}
				if !found {
					c.bad("%s: target port %d is not a container port of %s", o, tp.Number, w.object)
				}
			}
		}
	}
}

// ---- kvgate ----

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

// kvEventsConfig mirrors vLLM's KVEventsConfig (vllm/config/kv_events.py),
// the JSON of --kv-events-config.
type kvEventsConfig struct {
	EnableKVCacheEvents bool    `json:"enable_kv_cache_events"`
	Publisher           string  `json:"publisher"`
	Endpoint            *string `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	BufferSteps         *int    `json:"buffer_steps"`
	HWM                 *int    `json:"hwm"`
	MaxQueueSize        *int    `json:"max_queue_size"`
	Topic               string  `json:"topic"`
}

// engineArgs reads vLLM's flags: --name=value, or --name alone for a
// boolean.
func engineArgs(args []string) (map[string]string, error) {
	out := map[string]string{}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			return nil, fmt.Errorf("arg %q: write flags as --flag=value (or --flag for booleans)", a)
		}
		name, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			v = "true"
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--%s given twice", name)
		}
		out[name] = v
	}
	return out, nil
}

// expandTemplate expands a kvgate endpoint template (the discovery
// package's syntax: literal text with {podIP}, {rank}, {port} and
// {N+rank}) for one rank of a pod, and returns the endpoint's port.
func expandTemplate(tmpl string, rank int, port int32) (int, error) {
	var b strings.Builder
	rest := tmpl
	sawIP := false
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(rest)
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return 0, fmt.Errorf("template %q: unclosed '{'", tmpl)
		}
		b.WriteString(rest[:i])
		switch name := rest[i+1 : i+j]; {
		case name == "podIP":
			b.WriteString("10.0.0.1")
			sawIP = true
		case name == "rank":
			b.WriteString(strconv.Itoa(rank))
		case name == "port":
			b.WriteString(strconv.Itoa(int(port)))
		case strings.HasSuffix(name, "+rank"):
			n, err := strconv.Atoi(strings.TrimSuffix(name, "+rank"))
			if err != nil || n < 0 {
				return 0, fmt.Errorf("template %q: placeholder {%s}", tmpl, name)
			}
			b.WriteString(strconv.Itoa(n + rank))
		default:
			return 0, fmt.Errorf("template %q: unknown placeholder {%s} (want {podIP}, {rank}, {port} or {N+rank})", tmpl, name)
		}
		rest = rest[i+j+1:]
	}
	if !sawIP {
		return 0, fmt.Errorf("template %q has no {podIP}: every pod would get the same endpoint", tmpl)
	}
	return endpointPort(b.String())
}

// endpointPort returns the port of a ZMQ tcp:// endpoint.
func endpointPort(ep string) (int, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	_, port, err := net.SplitHostPort(rest)
	n, err2 := strconv.Atoi(port)
	if !ok || err != nil || err2 != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("endpoint %q: want tcp://host:port", ep)
	}
	return n, nil
}

// checkVLLM: the pods of kvgate's pool run vLLM the way kvgate expects:
// same model names and block size as models.yaml, prefix caching, KV events
// on the ports and topic of kvgate's templates, readiness on /health.
func (c *checker) checkVLLM(kv workload, pool *inferencePool, s map[string]setting, models tokenize.Config) {
	if len(pool.Spec.TargetPorts) == 0 {
		return
	}
	// The KV event ports kvgate connects to for rank 0 of a pod; rank i
	// is the pool's target port i (data-parallel ranks), see below.
	evPort, evErr := expandTemplate(value(s, "kv-events-template", ""), 0, pool.Spec.TargetPorts[0].Number)
	rpPort, rpErr := expandTemplate(value(s, "kv-replay-template", ""), 0, pool.Spec.TargetPorts[0].Number)
	for _, err := range []error{evErr, rpErr} {
		if err != nil {
			c.bad("kvgate: %v", err)
		}
	}
	target := pool.Spec.TargetPorts[0].Number
	for _, w := range c.selected(kv.Namespace, pool.Spec.Selector.MatchLabels) {
		var vc corev1.Container
		found := false
		for _, ct := range w.tmpl.Spec.Containers {
			if declaresPort(ct, target) {
				vc, found = ct, true
			}
		}
		if !found {
			continue // checkPools reports it
		}
		where := fmt.Sprintf("%s container %s", w.object, vc.Name)
		args, err := engineArgs(vc.Args)
		if err != nil {
			c.bad("%s: %v", where, err)
			continue
		}
		if args["enable-prefix-caching"] != "true" || args["no-enable-prefix-caching"] != "" {
			c.bad("%s: --enable-prefix-caching is not on; KV routing needs cached prefixes", where)
		}
		if p := cmpOr(args["port"], "8000"); p != strconv.Itoa(int(target)) {
			c.bad("%s: vLLM listens on --port=%s but the pool's target port is %d", where, p, target)
		}
		served := cmpOr(args["served-model-name"], args["model"])
		var mc *tokenize.ModelConfig
		for i := range models.Models {
			if models.Models[i].Name == served {
				mc = &models.Models[i]
			}
		}
		if mc == nil {
			c.bad("%s: served model %q is not in kvgate's models.yaml", where, served)
		} else {
			want := cmp.Or(mc.BlockSize, 16) // both default to 16
			if got := cmpOr(args["block-size"], "16"); got != strconv.Itoa(want) {
				c.bad("%s: --block-size=%s but models.yaml says block_size %d for %s", where, got, want, served)
			}
		}
		if got := value(s, "block-size", "16"); got != cmpOr(args["block-size"], "16") {
			c.bad("%s: --block-size=%s but kvgate --block-size=%s", where, cmpOr(args["block-size"], "16"), got)
		}
		if label := value(s, "pod-model-label", ""); label != "" && w.tmpl.Labels[label] != served {
			c.bad("%s: pod label %s=%q, want the served model name %q (kvgate --pod-model-label)", where, label, w.tmpl.Labels[label], served)
		}
		c.checkKVEvents(where, vc, args, s, evPort, rpPort)
		for rank, tp := range pool.Spec.TargetPorts[1:] {
			for _, flag := range []string{"kv-events-template", "kv-replay-template"} {
				if p, err := expandTemplate(value(s, flag, ""), rank+1, tp.Number); err == nil && !declaresPort(vc, int32(p)) {
					c.bad("%s: rank %d's KV port %d (kvgate --%s) is not a container port", where, rank+1, p, flag)
				}
			}
		}
		rp := vc.ReadinessProbe
		if rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/health" {
			c.bad("%s: readinessProbe should be GET /health (kvgate routes to Ready pods only)", where)
		} else if n, ok := containerPort(vc, rp.HTTPGet.Port); !ok || n != target {
			c.bad("%s: readinessProbe port %s is not the target port %d", where, rp.HTTPGet.Port.String(), target)
		}
	}
}

// checkKVEvents compares vLLM's --kv-events-config with kvgate's templates.
func (c *checker) checkKVEvents(where string, vc corev1.Container, args map[string]string, s map[string]setting, evPort, rpPort int) {
	raw, ok := args["kv-events-config"]
	if !ok {
		c.bad("%s: no --kv-events-config: kvgate would not see the cache", where)
		return
	}
	var kc kvEventsConfig // pydantic: case-sensitive, unknown keys refused
	if err := strictUnmarshal([]byte(raw), &kc); err != nil {
		c.bad("%s: --kv-events-config: %v", where, err)
		return
	}
	if !kc.EnableKVCacheEvents {
		c.bad("%s: --kv-events-config: enable_kv_cache_events is not true", where)
	}
	if p := cmpOr(kc.Publisher, "zmq"); p != "zmq" {
		c.bad("%s: --kv-events-config: publisher %q, want zmq", where, p)
	}
	// kvgate subscribes to --kv-topic as a ZMQ prefix.
	if topic := value(s, "kv-topic", ""); !strings.HasPrefix(kc.Topic, topic) {
		c.bad("%s: KV events topic %q does not start with kvgate's --kv-topic %q: kvgate would receive nothing", where, kc.Topic, topic)
	}
	ep, err := endpointPort(str(kc.Endpoint, "tcp://*:5557"))
	epOK := err == nil
	switch {
	case !epOK:
		c.bad("%s: --kv-events-config: %v", where, err)
	case !declaresPort(vc, int32(ep)):
		c.bad("%s: KV events port %d is not a container port", where, ep)
	}
	if epOK && evPort != 0 && ep != evPort {
		c.bad("%s: KV events on port %d but kvgate --kv-events-template uses port %d", where, ep, evPort)
	}
	if kc.ReplayEndpoint == nil {
		c.bad("%s: --kv-events-config has no replay_endpoint: kvgate could not recover missed events", where)
		return
	}
	rp, err := endpointPort(*kc.ReplayEndpoint)
	if err != nil {
		c.bad("%s: --kv-events-config: %v", where, err)
		return
	}
	if rpPort != 0 && rp != rpPort {
		c.bad("%s: KV event replay on port %d but kvgate --kv-replay-template uses port %d", where, rp, rpPort)
	}
	if !declaresPort(vc, int32(rp)) {
		c.bad("%s: replay port %d is not a container port", where, rp)
	}
	// vLLM adds the data-parallel rank to both ports.
	dp, err := strconv.Atoi(cmpOr(args["data-parallel-size"], "1"))
	if err != nil || dp < 1 {
		c.bad("%s: --data-parallel-size=%q", where, args["data-parallel-size"])
	} else if epOK && rp >= ep && rp < ep+dp {
		c.bad("%s: with --data-parallel-size=%d the live ports %d..%d overlap the replay port %d", where, dp, ep, ep+dp-1, rp)
	}
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
