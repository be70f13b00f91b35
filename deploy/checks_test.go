package deploy

// Cross-object checks on one kustomize build: does the whole thing hang
// together the way kvgate, the gateway and vLLM need it to. This file holds
// the checker and the whole-build checks; kvgate's workload is checked in
// checks_kvgate_test.go, the vLLM fleet in checks_vllm_test.go.

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
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
