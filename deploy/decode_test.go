package deploy

// Strict decoding of manifests into typed objects, and the per-object
// (structural) checks. Cross-object checks are in checks*_test.go.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one decoded manifest document.
type object struct {
	Source string // file or build target and document index, for messages
	Kind   string
	Name   string
	// Namespace is "" for cluster-scoped objects and for namespaced ones
	// that leave it to kustomize or kubectl.
	Namespace string
	Obj       metav1.Object // a pointer to the typed object
}

func (o object) String() string {
	if o.Namespace == "" {
		return fmt.Sprintf("%s %s", o.Kind, o.Name)
	}
	return fmt.Sprintf("%s %s/%s", o.Kind, o.Namespace, o.Name)
}

// newTyped returns an empty typed object for apiVersion and kind, or false
// when no schema is known: such a manifest is an error, never skipped.
func newTyped(apiVersion, kind string) (metav1.Object, bool) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, true
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, true
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, true
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, true
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "inference.networking.k8s.io/v1 InferencePool":
		return &inferencePool{}, true
	case "gateway.networking.k8s.io/v1 HTTPRoute":
		return &httpRoute{}, true
	case "gateway.networking.k8s.io/v1 Gateway":
		return &gateway{}, true
	}
	return nil, false
}

// clusterScoped lists the kinds above that have no namespace.
func clusterScoped(kind string) bool { return kind == "Namespace" }

// splitDocs splits a multi-document YAML stream, dropping empty documents
// (only comments or whitespace).
func splitDocs(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("split YAML documents: %w", err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("YAML document %d: %w", len(docs), err)
		}
		if s := string(bytes.TrimSpace(j)); s == "null" || s == "" {
			continue
		}
		docs = append(docs, doc)
	}
}

// decodeDoc decodes one document strictly: an unknown or duplicated field
// is an error, and so is a kind without a schema here.
func decodeDoc(source string, doc []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return object{}, fmt.Errorf("%s: apiVersion and kind are required", source)
	}
	typed, ok := newTyped(tm.APIVersion, tm.Kind)
	if !ok {
		return object{}, fmt.Errorf("%s: no schema for %s %s (add one to newTyped)", source, tm.APIVersion, tm.Kind)
	}
	if err := strictUnmarshal(doc, typed); err != nil {
		return object{}, fmt.Errorf("%s: %s %s: %w", source, tm.Kind, typed.GetName(), err)
	}
	return object{Source: source, Kind: tm.Kind, Name: typed.GetName(), Namespace: typed.GetNamespace(), Obj: typed}, nil
}

// strictUnmarshal decodes YAML into v the way the API server decodes JSON:
// field names are case-sensitive, and an unknown or duplicated field is an
// error naming its path (spec.ports[0].protocool).
func strictUnmarshal(doc []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// decodeAll decodes every document of a YAML stream.
func decodeAll(source string, data []byte) ([]object, error) {
	docs, err := splitDocs(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	var objs []object
	var errs []error
	for i, doc := range docs {
		o, err := decodeDoc(fmt.Sprintf("%s#%d", source, i), doc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	return objs, errors.Join(errs...)
}

// ---- Schemas of the objects that have no Go module here ----
//
// sigs.k8s.io/gateway-api-inference-extension is not in the module proxy
// this repository can use, and the Gateway API types would only be needed
// for these few fields. The structs below mirror the published v1 schemas
// (field names and nesting) for the fields kvgate's manifests may use; a
// field they do not know fails the strict decoding, so a typo cannot hide.

// inferencePool mirrors inference.networking.k8s.io/v1 InferencePool.
type inferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              poolSpec `json:"spec"`
}

type poolSpec struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	TargetPorts       []poolPort        `json:"targetPorts"`
	EndpointPickerRef endpointPickerRef `json:"endpointPickerRef"`
}

type poolPort struct {
	Number int32 `json:"number"`
}

type endpointPickerRef struct {
	Group       *string   `json:"group,omitempty"` // default "" (core)
	Kind        string    `json:"kind,omitempty"`  // default Service
	Name        string    `json:"name"`
	Port        *poolPort `json:"port,omitempty"`        // required for a Service
	FailureMode string    `json:"failureMode,omitempty"` // default FailClose
}

// httpRoute mirrors gateway.networking.k8s.io/v1 HTTPRoute.
type httpRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		ParentRefs []parentRef `json:"parentRefs"`
		Hostnames  []string    `json:"hostnames,omitempty"`
		Rules      []routeRule `json:"rules"`
	} `json:"spec"`
}

type parentRef struct {
	Group       *string `json:"group,omitempty"` // default gateway.networking.k8s.io
	Kind        *string `json:"kind,omitempty"`  // default Gateway
	Namespace   *string `json:"namespace,omitempty"`
	Name        string  `json:"name"`
	SectionName *string `json:"sectionName,omitempty"`
	Port        *int32  `json:"port,omitempty"`
}

type routeRule struct {
	Name        *string      `json:"name,omitempty"`
	Matches     []routeMatch `json:"matches,omitempty"`
	BackendRefs []backendRef `json:"backendRefs,omitempty"`
	Timeouts    *struct {
		Request        *string `json:"request,omitempty"`
		BackendRequest *string `json:"backendRequest,omitempty"`
	} `json:"timeouts,omitempty"`
}

type routeMatch struct {
	Path *struct {
		Type  *string `json:"type,omitempty"` // default PathPrefix
		Value *string `json:"value,omitempty"`
	} `json:"path,omitempty"`
	Headers []struct {
		Type  *string `json:"type,omitempty"`
		Name  string  `json:"name"`
		Value string  `json:"value"`
	} `json:"headers,omitempty"`
	Method *string `json:"method,omitempty"`
}

type backendRef struct {
	Group     *string `json:"group,omitempty"` // default "" (core)
	Kind      *string `json:"kind,omitempty"`  // default Service
	Name      string  `json:"name"`
	Namespace *string `json:"namespace,omitempty"`
	Port      *int32  `json:"port,omitempty"`
	Weight    *int32  `json:"weight,omitempty"`
}

// gateway mirrors gateway.networking.k8s.io/v1 Gateway.
type gateway struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		GatewayClassName string     `json:"gatewayClassName"`
		Listeners        []listener `json:"listeners"`
	} `json:"spec"`
}

type listener struct {
	Name          string  `json:"name"`
	Hostname      *string `json:"hostname,omitempty"`
	Port          int32   `json:"port"`
	Protocol      string  `json:"protocol"`
	AllowedRoutes *struct {
		Namespaces *struct {
			From     *string               `json:"from,omitempty"` // default Same
			Selector *metav1.LabelSelector `json:"selector,omitempty"`
		} `json:"namespaces,omitempty"`
	} `json:"allowedRoutes,omitempty"`
}

// str returns *p, or def when p is nil.
func str(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// ---- Structural checks, one object at a time ----

// validateObject checks what the API server (or the CRD's schema) would
// check on one object, as far as kvgate's manifests need.
func validateObject(o object) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s (%s): %s", o, o.Source, fmt.Sprintf(format, args...)))
	}
	nameOK := validation.IsDNS1123Subdomain
	if o.Kind == "Service" || o.Kind == "Namespace" {
		nameOK = validation.IsDNS1035Label
	}
	if msgs := nameOK(o.Name); len(msgs) > 0 {
		bad("invalid name %q: %s", o.Name, strings.Join(msgs, "; "))
	}
	errs = append(errs, labelErrs(o.String()+" metadata.labels", o.Obj.GetLabels())...)

	switch obj := o.Obj.(type) {
	case *appsv1.Deployment:
		for _, e := range validateWorkload(obj.Spec.Selector, obj.Spec.Template) {
			bad("%v", e)
		}
	case *appsv1.StatefulSet:
		for _, e := range validateWorkload(obj.Spec.Selector, obj.Spec.Template) {
			bad("%v", e)
		}
		if obj.Spec.ServiceName == "" {
			bad("spec.serviceName is required")
		}
	case *corev1.Service:
		if len(obj.Spec.Selector) == 0 {
			bad("spec.selector is empty: the Service would have no endpoints")
		}
		errs = append(errs, labelErrs(o.String()+" spec.selector", obj.Spec.Selector)...)
		if len(obj.Spec.Ports) == 0 {
			bad("spec.ports is empty")
		}
		seen := map[string]bool{}
		for _, p := range obj.Spec.Ports {
			if len(obj.Spec.Ports) > 1 && p.Name == "" {
				bad("port %d: a name is required when there are several ports", p.Port)
			}
			if p.Name != "" && len(validation.IsDNS1123Label(p.Name)) > 0 {
				bad("port name %q is not a DNS-1123 label", p.Name)
			}
			if seen[p.Name] {
				bad("duplicate port name %q", p.Name)
			}
			seen[p.Name] = true
			if len(validation.IsValidPortNum(int(p.Port))) > 0 {
				bad("port %d out of range", p.Port)
			}
			if p.TargetPort.Type == intstr.String && len(validation.IsValidPortName(p.TargetPort.StrVal)) > 0 {
				bad("port %q: targetPort %q is not a valid port name", p.Name, p.TargetPort.StrVal)
			}
		}
	case *corev1.ConfigMap:
		for k := range obj.Data {
			if msgs := validation.IsConfigMapKey(k); len(msgs) > 0 {
				bad("data key %q: %s", k, strings.Join(msgs, "; "))
			}
		}
	case *rbacv1.RoleBinding:
		if obj.RoleRef.Name == "" || obj.RoleRef.APIGroup != rbacv1.GroupName {
			bad("roleRef needs apiGroup %s and a name", rbacv1.GroupName)
		}
		if len(obj.Subjects) == 0 {
			bad("no subjects")
		}
	case *rbacv1.Role:
		if len(obj.Rules) == 0 {
			bad("no rules")
		}
	case *policyv1.PodDisruptionBudget:
		if obj.Spec.Selector == nil || len(obj.Spec.Selector.MatchLabels)+len(obj.Spec.Selector.MatchExpressions) == 0 {
			bad("spec.selector is empty")
		}
		if (obj.Spec.MinAvailable == nil) == (obj.Spec.MaxUnavailable == nil) {
			bad("set exactly one of minAvailable and maxUnavailable")
		}
	case *inferencePool:
		for _, e := range validatePool(obj) {
			bad("%v", e)
		}
	case *httpRoute:
		for _, e := range validateRoute(obj) {
			bad("%v", e)
		}
	case *gateway:
		for _, e := range validateGateway(obj) {
			bad("%v", e)
		}
	}
	return errs
}

// labelErrs checks label keys and values.
func labelErrs(what string, labels map[string]string) []error {
	var errs []error
	for k, v := range labels {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: key %q: %s", what, k, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: %s=%q: %s", what, k, v, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// validateWorkload checks a Deployment's or StatefulSet's selector and pod
// template.
func validateWorkload(sel *metav1.LabelSelector, tmpl corev1.PodTemplateSpec) []error {
	var errs []error
	if sel == nil || len(sel.MatchLabels) == 0 {
		errs = append(errs, errors.New("spec.selector.matchLabels is empty"))
	} else if !subset(sel.MatchLabels, tmpl.Labels) {
		errs = append(errs, fmt.Errorf("spec.selector %v does not match the pod template labels %v", sel.MatchLabels, tmpl.Labels))
	}
	errs = append(errs, labelErrs("pod template labels", tmpl.Labels)...)
	spec := tmpl.Spec
	if len(spec.Containers) == 0 {
		errs = append(errs, errors.New("no containers"))
	}
	names := map[string]bool{}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if volumes[v.Name] {
			errs = append(errs, fmt.Errorf("duplicate volume %q", v.Name))
		}
		volumes[v.Name] = true
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if names[c.Name] {
			errs = append(errs, fmt.Errorf("duplicate container name %q", c.Name))
		}
		names[c.Name] = true
		if c.Image == "" {
			errs = append(errs, fmt.Errorf("container %s: no image", c.Name))
		}
		portNames := map[string]bool{}
		for _, p := range c.Ports {
			if len(validation.IsValidPortNum(int(p.ContainerPort))) > 0 {
				errs = append(errs, fmt.Errorf("container %s: port %d out of range", c.Name, p.ContainerPort))
			}
			if p.Name != "" {
				if msgs := validation.IsValidPortName(p.Name); len(msgs) > 0 {
					errs = append(errs, fmt.Errorf("container %s: port name %q: %s", c.Name, p.Name, strings.Join(msgs, "; ")))
				}
				if portNames[p.Name] {
					errs = append(errs, fmt.Errorf("container %s: duplicate port name %q", c.Name, p.Name))
				}
				portNames[p.Name] = true
			}
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				errs = append(errs, fmt.Errorf("container %s: volumeMount %q names no volume", c.Name, m.Name))
			}
		}
		envs := map[string]bool{}
		for _, e := range c.Env {
			if envs[e.Name] {
				errs = append(errs, fmt.Errorf("container %s: env %s set twice", c.Name, e.Name))
			}
			envs[e.Name] = true
		}
		// Extended resources (nvidia.com/gpu, ...) cannot be overcommitted.
		for name, limit := range c.Resources.Limits {
			if !strings.Contains(string(name), "/") {
				continue
			}
			if req, ok := c.Resources.Requests[name]; ok && req.Cmp(limit) != 0 {
				errs = append(errs, fmt.Errorf("container %s: %s request %s != limit %s", c.Name, name, req.String(), limit.String()))
			}
		}
		for name, req := range c.Resources.Requests {
			if limit, ok := c.Resources.Limits[name]; ok && req.Cmp(limit) > 0 {
				errs = append(errs, fmt.Errorf("container %s: %s request %s above limit %s", c.Name, name, req.String(), limit.String()))
			}
		}
	}
	return errs
}

// validatePool checks an InferencePool against the v1 CRD's rules.
func validatePool(p *inferencePool) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	ml := p.Spec.Selector.MatchLabels
	if len(ml) == 0 {
		bad("spec.selector.matchLabels is required and must not be empty")
	}
	if len(ml) > 64 {
		bad("spec.selector.matchLabels has %d entries (at most 64)", len(ml))
	}
	errs = append(errs, labelErrs("spec.selector.matchLabels", ml)...)
	if n := len(p.Spec.TargetPorts); n < 1 || n > 8 {
		bad("spec.targetPorts has %d entries (want 1 to 8)", n)
	}
	seen := map[int32]bool{}
	for _, tp := range p.Spec.TargetPorts {
		if tp.Number < 1 || tp.Number > 65535 {
			bad("spec.targetPorts: port %d out of 1..65535", tp.Number)
		}
		if seen[tp.Number] {
			bad("spec.targetPorts: port %d listed twice", tp.Number)
		}
		seen[tp.Number] = true
	}
	ref := p.Spec.EndpointPickerRef
	if g := str(ref.Group, ""); g != "" {
		bad("spec.endpointPickerRef.group %q: kvgate is reached through a core Service (group \"\")", g)
	}
	if kind := cmpOr(ref.Kind, "Service"); kind != "Service" {
		bad("spec.endpointPickerRef.kind %q: want Service", kind)
	}
	if msgs := validation.IsDNS1035Label(ref.Name); len(msgs) > 0 {
		bad("spec.endpointPickerRef.name %q: %s", ref.Name, strings.Join(msgs, "; "))
	}
	if ref.Port == nil {
		bad("spec.endpointPickerRef.port is required when kind is Service")
	} else if ref.Port.Number < 1 || ref.Port.Number > 65535 {
		bad("spec.endpointPickerRef.port.number %d out of 1..65535", ref.Port.Number)
	}
	switch ref.FailureMode {
	case "", "FailOpen", "FailClose":
	default:
		bad("spec.endpointPickerRef.failureMode %q: want FailOpen or FailClose", ref.FailureMode)
	}
	return errs
}

// gatewayDuration is the Gateway API's Duration format (GEP-2257).
var gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

// validateRoute checks an HTTPRoute against the v1 schema's rules.
func validateRoute(r *httpRoute) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(r.Spec.ParentRefs) == 0 {
		bad("spec.parentRefs is empty: the route attaches to no Gateway")
	}
	for i, pr := range r.Spec.ParentRefs {
		if pr.Name == "" {
			bad("spec.parentRefs[%d].name is required", i)
		}
	}
	if n := len(r.Spec.Rules); n < 1 || n > 16 {
		bad("spec.rules has %d entries (want 1 to 16)", n)
	}
	for i, rule := range r.Spec.Rules {
		for j, m := range rule.Matches {
			if m.Path == nil {
				continue
			}
			switch t := str(m.Path.Type, "PathPrefix"); t {
			case "Exact", "PathPrefix", "RegularExpression":
			default:
				bad("spec.rules[%d].matches[%d].path.type %q", i, j, t)
			}
			if v := str(m.Path.Value, "/"); !strings.HasPrefix(v, "/") {
				bad("spec.rules[%d].matches[%d].path.value %q must start with /", i, j, v)
			}
		}
		if len(rule.BackendRefs) == 0 {
			bad("spec.rules[%d] has no backendRefs", i)
		}
		for j, br := range rule.BackendRefs {
			if br.Name == "" {
				bad("spec.rules[%d].backendRefs[%d].name is required", i, j)
			}
			kind, group := str(br.Kind, "Service"), str(br.Group, "")
			switch {
			case kind == "InferencePool":
				if group != "inference.networking.k8s.io" && group != "inference.networking.x-k8s.io" {
					bad("spec.rules[%d].backendRefs[%d]: an InferencePool needs group inference.networking.k8s.io, not %q", i, j, group)
				}
				if br.Port != nil {
					bad("spec.rules[%d].backendRefs[%d]: no port on an InferencePool backend (it has targetPorts)", i, j)
				}
			case kind == "Service" && group == "":
				if br.Port == nil {
					bad("spec.rules[%d].backendRefs[%d]: a Service backend needs a port", i, j)
				}
			}
		}
		if t := rule.Timeouts; t != nil {
			for what, v := range map[string]*string{"request": t.Request, "backendRequest": t.BackendRequest} {
				if v != nil && !gatewayDuration.MatchString(*v) {
					bad("spec.rules[%d].timeouts.%s %q is not a Gateway API duration", i, what, *v)
				}
			}
		}
	}
	return errs
}

// validateGateway checks a Gateway against the v1 schema's rules.
func validateGateway(g *gateway) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if g.Spec.GatewayClassName == "" {
		bad("spec.gatewayClassName is required")
	}
	if n := len(g.Spec.Listeners); n < 1 || n > 64 {
		bad("spec.listeners has %d entries (want 1 to 64)", n)
	}
	names := map[string]bool{}
	for i, l := range g.Spec.Listeners {
		if len(validation.IsDNS1123Subdomain(l.Name)) > 0 || names[l.Name] {
			bad("spec.listeners[%d].name %q is invalid or repeated", i, l.Name)
		}
		names[l.Name] = true
		if l.Port < 1 || l.Port > 65535 {
			bad("spec.listeners[%d].port %d out of range", i, l.Port)
		}
		switch l.Protocol {
		case "HTTP", "HTTPS":
		default:
			bad("spec.listeners[%d].protocol %q: HTTPRoutes need HTTP or HTTPS", i, l.Protocol)
		}
		if l.AllowedRoutes != nil && l.AllowedRoutes.Namespaces != nil {
			switch from := str(l.AllowedRoutes.Namespaces.From, "Same"); from {
			case "Same", "All", "Selector":
			default:
				bad("spec.listeners[%d].allowedRoutes.namespaces.from %q", i, from)
			}
		}
	}
	return errs
}

// subset reports whether every key=value of want is in have.
func subset(want, have map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// cmpOr returns s, or def when s is empty.
func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// quantity parses a resource quantity, or GOMEMLIMIT's byte form
// (1800MiB, 2GiB, 123456).
func quantity(s string) (resource.Quantity, error) {
	for _, suf := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if n, ok := strings.CutSuffix(s, suf); ok {
			s = n + suf[:2]
			break
		}
	}
	s = strings.TrimSuffix(s, "B")
	return resource.ParseQuantity(s)
}
