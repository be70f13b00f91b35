package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The endpoint-picker protocol's names (docs/epp-protocol.md).
const (
	DestinationHeader   = "x-gateway-destination-endpoint"
	LBNamespace         = "envoy.lb"
	SubsetNamespace     = "envoy.lb.subset_hint"
	SubsetKey           = "x-gateway-destination-endpoint-subset"
	RankHeader          = "x-data-parallel-rank"
	RequestIDHeader     = "x-request-id"
	ExtProcServiceName  = "envoy.service.ext_proc.v3.ExternalProcessor"
	defaultMaxBody      = 32 << 20
	readinessPollPeriod = time.Second
	// streamedChunkSize is the largest body chunk streamed back in
	// FULL_DUPLEX_STREAMED mode: with the message's framing it stays in
	// gRPC's 16 KiB send buffer tier (the next tier is 32 KiB and then
	// 1 MiB, and pooled buffers are cleared whole on every send).
	streamedChunkSize = 16<<10 - 256
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// TLSCert and TLSKey, both set, serve gRPC over TLS.
	TLSCert, TLSKey string
	// MaxBody is the largest request body accepted (413 beyond); default
	// 32 MiB.
	MaxBody int
	// Ready reports whether the picker can route (gRPC health
	// "readiness"); nil means always.
	Ready  func() bool
	Logger *slog.Logger
}

// Server is the Envoy ExternalProcessor: one gRPC stream per HTTP request,
// answered with the endpoint-picker protocol; when Envoy sends the
// response headers, they gain the served worker's id and rank
// (WorkerIDHeader, DPRankHeader). It also serves grpc.health.v1
// for "", "liveness", "readiness" and the ExternalProcessor service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	g      *Gateway
	opts   ServerOptions
	log    *slog.Logger
	grpc   *grpc.Server
	health *health.Server

	stop chan struct{} // closed by Shutdown: ends the readiness poller
	wg   sync.WaitGroup
	once sync.Once
}

// NewServer returns an ext_proc server over g.
func NewServer(g *Gateway, opts ServerOptions) (*Server, error) {
	if opts.MaxBody <= 0 {
		opts.MaxBody = defaultMaxBody
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var gopts []grpc.ServerOption
	if opts.TLSCert != "" || opts.TLSKey != "" {
		if opts.TLSCert == "" || opts.TLSKey == "" {
			return nil, errors.New("ext_proc TLS needs both a certificate and a key")
		}
		creds, err := credentials.NewServerTLSFromFile(opts.TLSCert, opts.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("ext_proc TLS: %w", err)
		}
		gopts = append(gopts, grpc.Creds(creds))
	}
	s := &Server{g: g, opts: opts, log: opts.Logger, grpc: grpc.NewServer(gopts...), health: health.NewServer(), stop: make(chan struct{})}
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	for _, name := range []string{"", "liveness"} {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	s.setReadiness()
	return s, nil
}

func (s *Server) setReadiness() {
	st := healthpb.HealthCheckResponse_SERVING
	if s.opts.Ready != nil && !s.opts.Ready() {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	// Envoy health-checks the service itself: it follows readiness, as
	// the GIE protocol asks.
	s.health.SetServingStatus("readiness", st)
	s.health.SetServingStatus(ExtProcServiceName, st)
}

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.wg.Go(func() {
		t := time.NewTicker(readinessPollPeriod)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.setReadiness()
			}
		}
	})
	if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("ext_proc server: %w", err)
	}
	return nil
}

// Shutdown drains: health turns NOT_SERVING (so Envoy stops sending new
// streams), streams in flight may finish until ctx ends, then the rest
// are cancelled (their bookings are freed).
func (s *Server) Shutdown(ctx context.Context) {
	s.once.Do(func() {
		close(s.stop)
		s.health.Shutdown()
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpc.Stop()
			<-done
		}
		s.wg.Wait()
	})
}

// stream is the state of one HTTP request's ext_proc stream.
type stream struct {
	s       *Server
	srv     extprocv3.ExternalProcessor_ProcessServer
	duplex  bool // request body FULL_DUPLEX_STREAMED
	rduplex bool // response body FULL_DUPLEX_STREAMED

	path, id  string
	subset    []string
	subsetErr *Error
	body      []byte
	decided   bool
	route     *Route
	usage     usageScanner
	status    int
	end       string // how the stream ended, for the metric
}

// Process implements the ExternalProcessor service.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, srv: srv, end: "cancelled"}
	defer func() {
		st.route.Finish() // nil-safe; a no-op after a completed response
		s.g.m.streams.WithLabelValues("ext_proc", st.end).Inc()
	}()
	for first := true; ; first = false {
		req, err := srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			st.end = "error"
			return err
		}
		if first {
			if pc := req.GetProtocolConfig(); pc != nil {
				st.duplex = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
				st.rduplex = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			}
		}
		if req.GetObservabilityMode() {
			continue // answers would be ignored
		}
		if err := st.handle(req); err != nil {
			st.end = "error"
			return err
		}
		if st.end == "refused" {
			return nil // an immediate response ends the HTTP request
		}
	}
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		return fmt.Errorf("ext_proc send: %w", err)
	}
	return nil
}

func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		h := headerMap(v.RequestHeaders.GetHeaders())
		st.path, st.id = h[":path"], h[RequestIDHeader]
		st.subset, st.subsetErr = subsetHint(req.GetMetadataContext())
		if n, err := strconv.Atoi(h["content-length"]); err == nil && n > 0 && n <= st.s.opts.MaxBody {
			st.body = make([]byte, 0, n) // the body's chunks land in one buffer
		}
		if v.RequestHeaders.GetEndOfStream() {
			return st.decide(nil, &extprocv3.ProcessingResponse{})
		}
		if st.duplex {
			return nil // answered with the decision once the body is in
		}
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	case *extprocv3.ProcessingRequest_RequestBody:
		if st.decided {
			return st.passRequestBody(v.RequestBody)
		}
		st.body = append(st.body, v.RequestBody.GetBody()...)
		if len(st.body) > st.s.opts.MaxBody {
			return st.refuse(errorf(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", st.s.opts.MaxBody))
		}
		if !v.RequestBody.GetEndOfStream() {
			if st.duplex {
				return nil
			}
			// STREAMED mode: each chunk is answered; the decision rides on
			// the last one.
			return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}})
		}
		return st.decideBody()
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !st.decided {
			if err := st.decideBody(); err != nil || st.end == "refused" {
				return err
			}
		}
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		h := headerMap(v.ResponseHeaders.GetHeaders())
		st.status, _ = strconv.Atoi(h[":status"])
		st.usage.sse = strings.HasPrefix(h["content-type"], "text/event-stream")
		if v.ResponseHeaders.GetEndOfStream() {
			st.complete()
		}
		// The client learns which worker served it (served.go).
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: servedMutation(st.route, req.GetMetadataContext())}}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		b := v.ResponseBody
		if len(b.GetBody()) > 0 || b.GetEndOfStream() {
			st.route.PrefillDone()
		}
		st.usage.write(b.GetBody())
		if b.GetEndOfStream() {
			st.complete()
		}
		if st.rduplex {
			return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: streamed(b.GetBody(), b.GetEndOfStream())}})
		}
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.complete()
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil // messages this server does not act on (flow control) need no answer
}

// complete ends the request: usage into metrics, load freed.
func (st *stream) complete() {
	if st.route == nil {
		return
	}
	if u := st.usage.result(); u != nil && st.status < 400 {
		st.route.Usage(*u)
	}
	st.route.Finish()
	st.end = "completed"
}

// passRequestBody echoes request body chunks that arrive after the
// decision (FULL_DUPLEX_STREAMED after trailers cannot happen; kept for
// robustness).
func (st *stream) passRequestBody(b *extprocv3.HttpBody) error {
	if st.duplex {
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: streamed(b.GetBody(), b.GetEndOfStream())}})
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}})
}

// decideBody parses the complete body and answers with the decision.
func (st *stream) decideBody() error {
	p, e := ParsePrompt(st.path, st.body)
	if e != nil {
		return st.refuse(e)
	}
	return st.decide(&p, nil)
}

// decide routes the request and sends the decision: for a request
// without body as the headers response (bodyless != nil); in
// FULL_DUPLEX_STREAMED mode as the headers response followed by the body
// in chunks; otherwise on the body response.
func (st *stream) decide(p *Prompt, bodyless *extprocv3.ProcessingResponse) error {
	st.decided = true
	if st.subsetErr != nil {
		return st.refuse(st.subsetErr)
	}
	r, e := st.s.g.Decide(st.srv.Context(), p, st.subset, st.id)
	if e != nil {
		return st.refuse(e)
	}
	st.route = r
	common := &extprocv3.CommonResponse{HeaderMutation: st.mutation(r, bodyless == nil), ClearRouteCache: true}
	md := lbMetadata(r)
	switch {
	case bodyless != nil:
		return st.send(&extprocv3.ProcessingResponse{DynamicMetadata: md,
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}})
	case st.duplex:
		if err := st.send(&extprocv3.ProcessingResponse{DynamicMetadata: md,
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
			return err
		}
		for off := 0; ; off += streamedChunkSize {
			end := min(off+streamedChunkSize, len(st.body))
			last := end == len(st.body)
			if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: streamed(st.body[off:end], last)}}); err != nil {
				return err
			}
			if last {
				break
			}
		}
		st.body = nil
		return nil
	default:
		st.body = nil
		return st.send(&extprocv3.ProcessingResponse{DynamicMetadata: md,
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}})
	}
}

// mutation sets the destination (with fallbacks), the DP rank when the
// worker has several, the request id when the client sent none, and the
// body's length.
func (st *stream) mutation(r *Route, withBody bool) *extprocv3.HeaderMutation {
	set := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	m := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set(DestinationHeader, destination(r))}}
	if r.SetRank {
		m.SetHeaders = append(m.SetHeaders, set(RankHeader, strconv.FormatUint(uint64(r.Rank), 10)))
	}
	if st.id == "" {
		m.SetHeaders = append(m.SetHeaders, set(RequestIDHeader, r.ID))
	}
	if withBody {
		m.SetHeaders = append(m.SetHeaders, set("content-length", strconv.Itoa(len(st.body))))
	}
	return m
}

func destination(r *Route) string {
	return strings.Join(append([]string{r.Endpoint}, r.Fallbacks...), ",")
}

// lbMetadata is {"envoy.lb": {"x-gateway-destination-endpoint": ...}}.
func lbMetadata(r *Route) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationHeader: structpb.NewStringValue(destination(r)),
		}}),
	}}
}

// refuse answers with an ImmediateResponse carrying the OpenAI error.
func (st *stream) refuse(e *Error) error {
	st.end = "refused"
	st.decided = true
	st.s.log.Debug("request refused", "id", st.id, "path", st.path, "status", e.Status, "err", e.Message)
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}},
		Body:    e.Body(),
		Details: "kvgate: " + e.Message,
	}}})
}

func streamed(body []byte, end bool) *extprocv3.BodyResponse {
	return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: end}}}}}
}

// headerMap reads headers, lower-cased, from raw_value (Envoy) or value
// (some proxies).
func headerMap(hm *corev3.HeaderMap) map[string]string {
	out := make(map[string]string, len(hm.GetHeaders()))
	for _, h := range hm.GetHeaders() {
		v := h.GetValue()
		if len(h.GetRawValue()) > 0 {
			v = string(h.GetRawValue())
		}
		out[strings.ToLower(h.GetKey())] = v
	}
	return out
}

// subsetHint reads the proxy's candidate endpoints: a list of "ip:port",
// or one comma-separated string. nil means no hint; an empty hint is an
// error (no eligible endpoint).
func subsetHint(md *corev3.Metadata) ([]string, *Error) {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	if ns == nil {
		return nil, nil
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil, nil
	}
	var out []string
	add := func(s string) {
		for part := range strings.SplitSeq(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	}
	if len(out) == 0 {
		return nil, errorf(http.StatusServiceUnavailable, "the subset hint lists no endpoint")
	}
	return out, nil
}
