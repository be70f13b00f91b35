package envoy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyhmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	// Registered only so that configs adapted as the README suggests (file
	// access logs instead of stdout) still resolve.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
)

// The named imports above register every type envoy.yaml references in
// protoregistry.GlobalTypes, which is what protojson uses to resolve "@type".
// Referenced here so the intent survives goimports.
var (
	_ = (*streamv3.StdoutAccessLog)(nil)
	_ = (*routerv3.Router)(nil)
	_ = (*earlyhmv3.HeaderMutation)(nil)
	_ = (*tlsv3.UpstreamTlsContext)(nil)
)

const (
	configPath       = "envoy.yaml"
	readmePath       = "README.md"
	extProcCluster   = "kvgate-ext-proc"
	origDstCluster   = "original_destination_cluster"
	destHeader       = "x-gateway-destination-endpoint"
	extProcHealthSvc = "envoy.service.ext_proc.v3.ExternalProcessor"
	extProcFilter    = "envoy.filters.http.ext_proc"
	routerFilter     = "envoy.filters.http.router"
	hcmFilter        = "envoy.filters.network.http_connection_manager"
)

// validator is implemented by every protoc-gen-validate generated message.
type validator interface{ ValidateAll() error }

// config is envoy.yaml parsed, validated, and with the typed configs the
// tests care about unpacked.
type config struct {
	bootstrap *bootstrapv3.Bootstrap
	hcm       *hcmv3.HttpConnectionManager
	extProc   *extprocv3.ExternalProcessor
	filters   []string // HTTP filter names in order
	clusters  map[string]*clusterv3.Cluster
	// unpacked counts every Any resolved while walking the config, by type URL.
	unpacked map[string]int
}

// yamlToJSON converts YAML to JSON. YAML mappings decode into map[string]any
// (or map[any]any for non-string keys), which encoding/json cannot encode,
// so they are normalized first.
func yamlToJSON(data []byte) ([]byte, error) {
	var tree any
	if err := yaml.Unmarshal(data, &tree); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	return json.Marshal(normalize(tree))
}

func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = normalize(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[fmt.Sprint(k)] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = normalize(e)
		}
		return out
	default:
		return v
	}
}

// parseBootstrap decodes YAML into a Bootstrap, rejecting unknown fields,
// unknown enum values and unresolvable "@type"s, then runs the PGV rules.
func parseBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yamlToJSON(data)
	if err != nil {
		return nil, err
	}
	b := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("protojson: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap validation: %w", err)
	}
	return b, nil
}

// unpack resolves an Any, validates the result, and recursively resolves
// and validates every Any nested inside it.
func unpack(a *anypb.Any, seen map[string]int) (proto.Message, error) {
	m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
	if err != nil {
		return nil, fmt.Errorf("unpack %s: %w", a.GetTypeUrl(), err)
	}
	v, ok := m.(validator)
	if !ok {
		return nil, fmt.Errorf("%s has no ValidateAll", a.GetTypeUrl())
	}
	if err := v.ValidateAll(); err != nil {
		return nil, fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
	}
	seen[a.GetTypeUrl()]++
	if err := walkAnys(m.ProtoReflect(), seen); err != nil {
		return nil, err
	}
	return m, nil
}

// walkAnys finds every google.protobuf.Any set anywhere in m (singular,
// repeated and map fields) and unpacks it, so no typed config is left
// unvalidated, including ones the semantic checks below never look at.
func walkAnys(m protoreflect.Message, seen map[string]int) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		visit := func(v protoreflect.Value) {
			if err != nil {
				return
			}
			msg := v.Message()
			if a, ok := msg.Interface().(*anypb.Any); ok {
				_, err = unpack(a, seen)
				return
			}
			err = walkAnys(msg, seen)
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					visit(mv)
					return err == nil
				})
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				l := v.List()
				for i := 0; i < l.Len() && err == nil; i++ {
					visit(l.Get(i))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			visit(v)
		}
		return err == nil
	})
	return err
}

// unpackAs resolves a to the concrete type T (already validated by walkAnys).
func unpackAs[T proto.Message](a *anypb.Any) (T, error) {
	var zero T
	m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
	if err != nil {
		return zero, err
	}
	t, ok := m.(T)
	if !ok {
		return zero, fmt.Errorf("typed_config is %s, want %T", a.GetTypeUrl(), zero)
	}
	return t, nil
}

// loadConfig parses data, resolves every typed config and checks the
// rules Envoy itself enforces at startup that PGV cannot express.
func loadConfig(data []byte) (*config, error) {
	b, err := parseBootstrap(data)
	if err != nil {
		return nil, err
	}
	c := &config{bootstrap: b, clusters: map[string]*clusterv3.Cluster{}, unpacked: map[string]int{}}
	if err := walkAnys(b.ProtoReflect(), c.unpacked); err != nil {
		return nil, err
	}

	for _, cl := range b.GetStaticResources().GetClusters() {
		if _, dup := c.clusters[cl.GetName()]; dup {
			return nil, fmt.Errorf("duplicate cluster %q", cl.GetName())
		}
		c.clusters[cl.GetName()] = cl
		if err := checkCluster(cl); err != nil {
			return nil, err
		}
	}

	// Exactly one HTTP connection manager is expected (the gateway listener).
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if f.GetName() != hcmFilter {
					continue
				}
				if c.hcm != nil {
					return nil, errors.New("more than one http_connection_manager")
				}
				if c.hcm, err = unpackAs[*hcmv3.HttpConnectionManager](f.GetTypedConfig()); err != nil {
					return nil, fmt.Errorf("listener %s: %w", l.GetName(), err)
				}
			}
		}
	}
	if c.hcm == nil {
		return nil, errors.New("no http_connection_manager")
	}

	for _, hf := range c.hcm.GetHttpFilters() {
		c.filters = append(c.filters, hf.GetName())
		switch hf.GetName() {
		case extProcFilter:
			if c.extProc != nil {
				return nil, errors.New("more than one ext_proc filter")
			}
			if c.extProc, err = unpackAs[*extprocv3.ExternalProcessor](hf.GetTypedConfig()); err != nil {
				return nil, err
			}
		case routerFilter:
			if _, err = unpackAs[*routerv3.Router](hf.GetTypedConfig()); err != nil {
				return nil, err
			}
		}
	}
	if n := len(c.filters); n == 0 || c.filters[n-1] != routerFilter {
		return nil, fmt.Errorf("http filters %v: the router must be last", c.filters)
	}
	if c.extProc == nil {
		return nil, errors.New("no ext_proc filter")
	}
	if err := checkExtProc(c.extProc); err != nil {
		return nil, err
	}

	// Every cluster a route or the ext_proc filter names must exist.
	for _, vh := range c.hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			name := r.GetRoute().GetCluster()
			if name == "" {
				return nil, fmt.Errorf("route %v in %s does not name a cluster", r.GetMatch(), vh.GetName())
			}
			if _, ok := c.clusters[name]; !ok {
				return nil, fmt.Errorf("route in %s targets unknown cluster %q", vh.GetName(), name)
			}
		}
	}
	if name := c.extProc.GetGrpcService().GetEnvoyGrpc().GetClusterName(); name == "" {
		return nil, errors.New("ext_proc grpc_service is not envoy_grpc with a cluster_name")
	} else if _, ok := c.clusters[name]; !ok {
		return nil, fmt.Errorf("ext_proc grpc_service targets unknown cluster %q", name)
	}
	return c, nil
}

// checkExtProc mirrors the checks Envoy's ext_proc filter factory makes
// (verifyFilterConfig / verifyProcessingModeConfig in
// source/extensions/filters/http/ext_proc/config.cc).
func checkExtProc(ep *extprocv3.ExternalProcessor) error {
	if (ep.GetGrpcService() != nil) == (ep.GetHttpService() != nil) {
		return errors.New("ext_proc: exactly one of grpc_service or http_service must be set")
	}
	if ep.GetDisableClearRouteCache() && ep.GetRouteCacheAction() != extprocv3.ExternalProcessor_DEFAULT {
		return errors.New("ext_proc: disable_clear_route_cache and route_cache_action both set")
	}
	pm := ep.GetProcessingMode()
	fd := extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if pm.GetRequestBodyMode() == fd && pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
		return errors.New("ext_proc: request_body_mode FULL_DUPLEX_STREAMED requires request_trailer_mode SEND")
	}
	if pm.GetResponseBodyMode() == fd && pm.GetResponseTrailerMode() != extprocv3.ProcessingMode_SEND {
		return errors.New("ext_proc: response_body_mode FULL_DUPLEX_STREAMED requires response_trailer_mode SEND")
	}
	if (pm.GetRequestBodyMode() == fd || pm.GetResponseBodyMode() == fd) && ep.GetFailureModeAllow() {
		return errors.New("ext_proc: failure_mode_allow must be false with FULL_DUPLEX_STREAMED")
	}
	return nil
}

// checkCluster mirrors Envoy's ORIGINAL_DST cluster factory checks and
// requires an HTTP/2 protocol for clusters that carry gRPC health checks.
func checkCluster(cl *clusterv3.Cluster) error {
	if cl.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		if cl.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			return fmt.Errorf("cluster %s: ORIGINAL_DST needs lb_policy CLUSTER_PROVIDED", cl.GetName())
		}
		if cl.GetLoadAssignment() != nil {
			return fmt.Errorf("cluster %s: ORIGINAL_DST must have no load_assignment", cl.GetName())
		}
		if o := cl.GetOriginalDstLbConfig(); !o.GetUseHttpHeader() && o.GetHttpHeaderName() != "" {
			return fmt.Errorf("cluster %s: http_header_name set without use_http_header", cl.GetName())
		}
	}
	for _, hc := range cl.GetHealthChecks() {
		if hc.GetGrpcHealthCheck() != nil && !speaksHTTP2(cl) {
			return fmt.Errorf("cluster %s: gRPC health check on a cluster without HTTP/2", cl.GetName())
		}
	}
	return nil
}

func protocolOptions(cl *clusterv3.Cluster) *upstreamhttpv3.HttpProtocolOptions {
	a, ok := cl.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return nil
	}
	po, err := unpackAs[*upstreamhttpv3.HttpProtocolOptions](a)
	if err != nil {
		return nil
	}
	return po
}

func speaksHTTP2(cl *clusterv3.Cluster) bool {
	return protocolOptions(cl).GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustLoad(t *testing.T) *config {
	t.Helper()
	c, err := loadConfig(readFile(t, configPath))
	if err != nil {
		t.Fatalf("%s: %v", configPath, err)
	}
	return c
}

func TestConfigParsesAndValidates(t *testing.T) {
	c := mustLoad(t)
	// Every typed config envoy.yaml uses was resolved and validated.
	for _, typeURL := range []string{
		"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
		"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
		"type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
		"type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
		"type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
	} {
		if c.unpacked[typeURL] == 0 {
			t.Errorf("%s not found among unpacked typed configs %v", typeURL, c.unpacked)
		}
	}
}

func TestExtProcFilter(t *testing.T) {
	c := mustLoad(t)
	ep := c.extProc
	pm := ep.GetProcessingMode()

	if got := c.filters; len(got) != 2 || got[0] != extProcFilter || got[1] != routerFilter {
		t.Errorf("http filters = %v, want [%s %s]", got, extProcFilter, routerFilter)
	}

	modes := []struct {
		field string
		got   fmt.Stringer
		want  fmt.Stringer
	}{
		{"request_header_mode", pm.GetRequestHeaderMode(), extprocv3.ProcessingMode_SEND},
		{"response_header_mode", pm.GetResponseHeaderMode(), extprocv3.ProcessingMode_SEND},
		{"request_body_mode", pm.GetRequestBodyMode(), extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		{"response_body_mode", pm.GetResponseBodyMode(), extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		{"request_trailer_mode", pm.GetRequestTrailerMode(), extprocv3.ProcessingMode_SEND},
		{"response_trailer_mode", pm.GetResponseTrailerMode(), extprocv3.ProcessingMode_SEND},
	}
	for _, m := range modes {
		if m.got != m.want {
			t.Errorf("processing_mode.%s = %v, want %v", m.field, m.got, m.want)
		}
	}

	flags := []struct {
		field string
		got   bool
		want  bool
	}{
		{"failure_mode_allow", ep.GetFailureModeAllow(), false},
		{"allow_mode_override", ep.GetAllowModeOverride(), false},
		{"observability_mode", ep.GetObservabilityMode(), false},
		// kvgate sets clear_route_cache; Envoy must honour it.
		{"disable_clear_route_cache", ep.GetDisableClearRouteCache(), false},
		{"route_cache_action is RETAIN", ep.GetRouteCacheAction() == extprocv3.ExternalProcessor_RETAIN, false},
		// kvgate's ImmediateResponse (400/404/429/503) must reach the client.
		{"disable_immediate_response", ep.GetDisableImmediateResponse(), false},
		// Mutation rules must let x-gateway-destination-endpoint through.
		{"mutation_rules.disallow_all", ep.GetMutationRules().GetDisallowAll().GetValue(), false},
	}
	for _, f := range flags {
		if f.got != f.want {
			t.Errorf("%s = %v, want %v", f.field, f.got, f.want)
		}
	}
	if re := ep.GetMutationRules().GetDisallowExpression().GetRegex(); re != "" {
		if ok, err := regexp.MatchString(re, destHeader); err != nil || ok {
			t.Errorf("mutation_rules.disallow_expression %q blocks %s (err %v)", re, destHeader, err)
		}
	}

	if !contains(ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), "envoy.lb") {
		t.Errorf("metadata_options.receiving_namespaces.untyped = %v, want it to contain envoy.lb",
			ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped())
	}

	// x-request-id is generated by the HCM and must be forwarded to kvgate.
	if !c.hcm.GetGenerateRequestId().GetValue() && c.hcm.GetGenerateRequestId() != nil {
		t.Error("http_connection_manager.generate_request_id is false")
	}
	if fr := ep.GetForwardRules(); fr != nil {
		if al := fr.GetAllowedHeaders(); al != nil && !matchesAny(al.GetPatterns(), "x-request-id") {
			t.Error("ext_proc forward_rules.allowed_headers drop x-request-id")
		}
		if matchesAny(fr.GetDisallowedHeaders().GetPatterns(), "x-request-id") {
			t.Error("ext_proc forward_rules.disallowed_headers drop x-request-id")
		}
	}

	// A gRPC stream timeout would cut long streaming responses.
	if to := ep.GetGrpcService().GetTimeout(); to != nil && to.AsDuration() > 0 {
		t.Errorf("ext_proc grpc_service.timeout = %v; leave it unset for streaming", to.AsDuration())
	}
	if name := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); name != extProcCluster {
		t.Errorf("ext_proc grpc_service cluster = %q, want %q", name, extProcCluster)
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// matchesAny reports whether header name h matches one of the patterns
// (exact, prefix and safe_regex; other matchers are treated as no match).
func matchesAny(patterns []*matcherv3.StringMatcher, h string) bool {
	for _, p := range patterns {
		if p.GetExact() == h || (p.GetPrefix() != "" && strings.HasPrefix(h, p.GetPrefix())) {
			return true
		}
		if re := p.GetSafeRegex().GetRegex(); re != "" {
			if ok, _ := regexp.MatchString("^(?:"+re+")$", h); ok {
				return true
			}
		}
	}
	return false
}

func TestRouteAndOriginalDstCluster(t *testing.T) {
	c := mustLoad(t)
	vhs := c.hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhs) == 0 {
		t.Fatal("no virtual hosts")
	}
	for _, vh := range vhs {
		if !contains(vh.GetDomains(), "*") {
			t.Errorf("virtual host %s domains = %v, want *", vh.GetName(), vh.GetDomains())
		}
		for _, r := range vh.GetRoutes() {
			ra := r.GetRoute()
			if ra.GetCluster() != origDstCluster {
				t.Errorf("route %v -> %q, want %q", r.GetMatch(), ra.GetCluster(), origDstCluster)
			}
			if ra.GetTimeout() == nil || ra.GetTimeout().AsDuration() != 0 {
				t.Errorf("route timeout = %v, want 0s (disabled) for streaming", ra.GetTimeout())
			}
		}
	}
	if d := c.hcm.GetStreamIdleTimeout(); d == nil || d.AsDuration().Minutes() < 10 {
		t.Errorf("stream_idle_timeout = %v, want at least 10m for slow generations", d)
	}

	// Client-supplied destination headers are dropped before ext_proc runs.
	var stripped bool
	for _, ext := range c.hcm.GetEarlyHeaderMutationExtensions() {
		hm, err := unpackAs[*earlyhmv3.HeaderMutation](ext.GetTypedConfig())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range hm.GetMutations() {
			stripped = stripped || strings.EqualFold(m.GetRemove(), destHeader)
		}
	}
	if !stripped {
		t.Errorf("client-supplied %s is not removed by an early header mutation", destHeader)
	}

	cl := c.clusters[origDstCluster]
	if cl == nil {
		t.Fatalf("cluster %q missing", origDstCluster)
	}
	checks := []struct {
		field     string
		got, want any
	}{
		{"type", cl.GetType(), clusterv3.Cluster_ORIGINAL_DST},
		{"lb_policy", cl.GetLbPolicy(), clusterv3.Cluster_CLUSTER_PROVIDED},
		{"original_dst_lb_config.use_http_header", cl.GetOriginalDstLbConfig().GetUseHttpHeader(), true},
		{"original_dst_lb_config.http_header_name", cl.GetOriginalDstLbConfig().GetHttpHeaderName(), destHeader},
		{"connect_timeout set", cl.GetConnectTimeout() != nil, true},
		{"cleanup_interval set", cl.GetCleanupInterval() != nil, true},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s.%s = %v, want %v", origDstCluster, ch.field, ch.got, ch.want)
		}
	}
}

func TestExtProcCluster(t *testing.T) {
	c := mustLoad(t)
	checkExtProcCluster(t, c, "127.0.0.1:9002") // kvgate's default --ext-proc-addr
}

// checkExtProcCluster checks the cluster the ext_proc filter talks to:
// HTTP/2, a gRPC health check on the ExternalProcessor service, circuit
// breakers sized for one stream per in-flight request, and its endpoint.
func checkExtProcCluster(t *testing.T, c *config, wantAddr string) {
	t.Helper()
	cl := c.clusters[extProcCluster]
	if cl == nil {
		t.Fatalf("cluster %q missing", extProcCluster)
	}
	if !speaksHTTP2(cl) {
		t.Error("ext_proc cluster does not use explicit HTTP/2 (gRPC needs it)")
	}

	var addrs []string
	for _, le := range cl.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			addrs = append(addrs, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
		}
	}
	if len(addrs) != 1 || addrs[0] != wantAddr {
		t.Errorf("ext_proc endpoints = %v, want [%s]", addrs, wantAddr)
	}

	var grpcHC *corev3.HealthCheck_GrpcHealthCheck
	for _, hc := range cl.GetHealthChecks() {
		if g := hc.GetGrpcHealthCheck(); g != nil {
			grpcHC = g
		}
	}
	if grpcHC == nil {
		t.Fatal("ext_proc cluster has no gRPC health check")
	}
	if grpcHC.GetServiceName() != extProcHealthSvc {
		t.Errorf("grpc_health_check.service_name = %q, want %q", grpcHC.GetServiceName(), extProcHealthSvc)
	}

	// Envoy's defaults (1024) would reject ext_proc streams long before
	// the model servers are saturated.
	var th *clusterv3.CircuitBreakers_Thresholds
	for _, x := range cl.GetCircuitBreakers().GetThresholds() {
		if x.GetPriority() == corev3.RoutingPriority_DEFAULT {
			th = x
		}
	}
	if th == nil {
		t.Fatal("ext_proc cluster has no DEFAULT circuit breaker thresholds")
	}
	for name, v := range map[string]uint32{
		"max_requests":         th.GetMaxRequests().GetValue(),
		"max_pending_requests": th.GetMaxPendingRequests().GetValue(),
	} {
		if v < 10000 {
			t.Errorf("ext_proc circuit breaker %s = %d, want >= 10000", name, v)
		}
	}
}

func TestAdminListener(t *testing.T) {
	c := mustLoad(t)
	sa := c.bootstrap.GetAdmin().GetAddress().GetSocketAddress()
	if sa.GetAddress() != "127.0.0.1" || sa.GetPortValue() != 9901 {
		t.Errorf("admin address = %s:%d, want 127.0.0.1:9901", sa.GetAddress(), sa.GetPortValue())
	}
	ls := c.bootstrap.GetStaticResources().GetListeners()
	if len(ls) != 1 {
		t.Fatalf("%d listeners, want 1", len(ls))
	}
	la := ls[0].GetAddress().GetSocketAddress()
	if la.GetAddress() != "0.0.0.0" || la.GetPortValue() != 8081 {
		t.Errorf("listener address = %s:%d, want 0.0.0.0:8081", la.GetAddress(), la.GetPortValue())
	}
}

// TestBrokenConfigsFail makes sure the checks above can fail: each case
// breaks one thing in a copy of envoy.yaml.
func TestBrokenConfigsFail(t *testing.T) {
	orig := string(readFile(t, configPath))
	cases := []struct {
		name    string
		old     string
		new     string
		wantErr string
	}{
		{
			name:    "unknown field",
			old:     "allow_mode_override: false",
			new:     "allow_mode_override: false\n                      no_such_field: true",
			wantErr: "no_such_field",
		},
		{
			name:    "invalid processing mode enum",
			old:     "request_body_mode: FULL_DUPLEX_STREAMED",
			new:     "request_body_mode: FULL_DUPLEX_STREAMING",
			wantErr: "FULL_DUPLEX_STREAMING",
		},
		{
			name:    "unresolvable @type",
			old:     "envoy.extensions.filters.http.router.v3.Router",
			new:     "envoy.extensions.filters.http.router.v3.NoSuchRouter",
			wantErr: "NoSuchRouter",
		},
		{
			name:    "PGV rule in bootstrap",
			old:     "port_value: 9901",
			new:     "port_value: 99010",
			wantErr: "PortValue",
		},
		{
			name:    "PGV rule inside a typed config",
			old:     "stat_prefix: inference_gateway",
			new:     `stat_prefix: ""`,
			wantErr: "StatPrefix",
		},
		{
			name:    "ext_proc names a missing cluster",
			old:     "envoy_grpc:\n                          cluster_name: kvgate-ext-proc\n",
			new:     "envoy_grpc:\n                          cluster_name: kvgate-ext-proc-typo\n",
			wantErr: `unknown cluster "kvgate-ext-proc-typo"`,
		},
		{
			name:    "route names a missing cluster",
			old:     "cluster: original_destination_cluster",
			new:     "cluster: no_such_cluster",
			wantErr: `unknown cluster "no_such_cluster"`,
		},
		{
			name:    "full duplex without trailers",
			old:     "request_trailer_mode: SEND",
			new:     "request_trailer_mode: SKIP",
			wantErr: "request_trailer_mode SEND",
		},
		{
			name:    "full duplex with fail open",
			old:     "failure_mode_allow: false",
			new:     "failure_mode_allow: true",
			wantErr: "failure_mode_allow",
		},
		{
			name:    "original dst with a load balancer",
			old:     "lb_policy: CLUSTER_PROVIDED",
			new:     "lb_policy: ROUND_ROBIN",
			wantErr: "CLUSTER_PROVIDED",
		},
		{
			name:    "gRPC health check without HTTP/2",
			old:     "explicit_http_config:",
			new:     "use_downstream_protocol_config:",
			wantErr: "without HTTP/2",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if n := strings.Count(orig, tc.old); n != 1 {
				t.Fatalf("%q occurs %d times in %s, want exactly once", tc.old, n, configPath)
			}
			broken := strings.Replace(orig, tc.old, tc.new, 1)
			_, err := loadConfig([]byte(broken))
			if err == nil {
				t.Fatal("broken config accepted")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
			t.Logf("rejected as expected: %v", err)
		})
	}
}

// TestReadmeTLSSnippet replaces the kvgate-ext-proc cluster with the TLS
// variant shown in README.md and validates the result, so the documented
// snippet stays a valid Envoy config.
func TestReadmeTLSSnippet(t *testing.T) {
	readme := readFile(t, readmePath)
	const begin, end = "<!-- tls-snippet:begin -->", "<!-- tls-snippet:end -->"
	i, j := bytes.Index(readme, []byte(begin)), bytes.Index(readme, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("%s has no %s ... %s block", readmePath, begin, end)
	}
	block := strings.TrimSpace(string(readme[i+len(begin) : j]))
	block = strings.TrimPrefix(block, "```yaml")
	block = strings.TrimSuffix(block, "```")

	var snippet map[string]any
	if err := yaml.Unmarshal([]byte(block), &snippet); err != nil {
		t.Fatalf("TLS snippet: %v", err)
	}
	var tree map[string]any
	if err := yaml.Unmarshal(readFile(t, configPath), &tree); err != nil {
		t.Fatal(err)
	}
	sr, _ := tree["static_resources"].(map[string]any)
	clusters, _ := sr["clusters"].([]any)
	replaced := false
	for i, cl := range clusters {
		if m, _ := cl.(map[string]any); m["name"] == extProcCluster {
			clusters[i] = snippet
			replaced = true
		}
	}
	if !replaced {
		t.Fatalf("cluster %s not found in %s", extProcCluster, configPath)
	}
	data, err := yaml.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(data)
	if err != nil {
		t.Fatalf("%s with the README TLS cluster: %v", configPath, err)
	}
	checkExtProcCluster(t, c, "kvgate.example.internal:9002")

	cl := c.clusters[extProcCluster]
	ts := cl.GetTransportSocket()
	if ts == nil {
		t.Fatal("TLS snippet sets no transport_socket")
	}
	tc, err := unpackAs[*tlsv3.UpstreamTlsContext](ts.GetTypedConfig())
	if err != nil {
		t.Fatal(err)
	}
	// grpc-go servers reject TLS clients that do not negotiate h2 by ALPN.
	if !contains(tc.GetCommonTlsContext().GetAlpnProtocols(), "h2") {
		t.Errorf("alpn_protocols = %v, want h2", tc.GetCommonTlsContext().GetAlpnProtocols())
	}
	for _, hc := range cl.GetHealthChecks() {
		if !contains(hc.GetTlsOptions().GetAlpnProtocols(), "h2") {
			t.Errorf("health check tls_options.alpn_protocols = %v, want h2", hc.GetTlsOptions().GetAlpnProtocols())
		}
	}
}
