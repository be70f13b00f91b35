// Package envoytest is an Envoy stand-in for tests: it drives an ext_proc
// server over a real gRPC stream the way Envoy's ext_proc filter does
// (phase order, protocol configuration on the first message, chunked
// bodies in FULL_DUPLEX_STREAMED or BUFFERED mode, subset hints in the
// metadata context) and applies the picker's answer. It is for tests only;
// non-test code must not import it.
package envoytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// Mode is the body processing mode of both directions.
type Mode int

// The modes a picker must support.
const (
	FullDuplex Mode = iota // FULL_DUPLEX_STREAMED, Envoy's recommended mode for pickers
	Buffered               // BUFFERED
)

func (m Mode) String() string {
	if m == Buffered {
		return "buffered"
	}
	return "full-duplex"
}

func (m Mode) proto() filterv3.ProcessingMode_BodySendMode {
	if m == Buffered {
		return filterv3.ProcessingMode_BUFFERED
	}
	return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// Client is a connection to an ext_proc server.
type Client struct {
	conn *grpc.ClientConn
	api  extprocv3.ExternalProcessorClient
}

// Dial connects to addr (host:port); without options, without TLS.
func Dial(addr string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, api: extprocv3.NewExternalProcessorClient(conn)}, nil
}

// Conn returns the gRPC connection (for health checks).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Request is one HTTP request as Envoy hands it to the filter.
type Request struct {
	Method, Path string
	Headers      map[string]string
	Body         []byte // nil: a request without body
	Chunk        int    // body chunk size (default 16 KiB)
	Mode         Mode
	// Subset is the subset hint: nil, a []string list or a string.
	Subset any
	// ValueHeaders sends header values in "value" instead of "raw_value".
	ValueHeaders bool
}

// Exchange is one request's stream, after the picker answered.
type Exchange struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	mode   Mode
	// Immediate is the picker's ImmediateResponse, if it refused.
	Immediate *extprocv3.ImmediateResponse
	// Headers are the request headers after the picker's mutation.
	Headers map[string]string
	// Metadata is the envoy.lb destination from the dynamic metadata.
	Metadata        string
	ClearRouteCache bool
	// Body is the request body as it continues upstream.
	Body []byte
	// ResponseHeaders are the response headers as the client receives
	// them, after the picker's response headers mutation (set by
	// Respond).
	ResponseHeaders map[string]string
	// Decision is the time from sending the request's last phase (the
	// last body chunk, or the headers of a bodyless request) to receiving
	// the picker's answer: its decision latency as Envoy sees it.
	Decision time.Duration
}

// Route sends req's request phases and returns the picker's answer. The
// exchange must end with Respond or Cancel.
func (c *Client) Route(ctx context.Context, req Request) (*Exchange, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := c.api.Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	x := &Exchange{stream: st, cancel: cancel, mode: req.Mode, Headers: map[string]string{}}
	fail := func(err error) (*Exchange, error) { cancel(); return nil, err }
	h := map[string]string{":method": req.Method, ":path": req.Path, ":authority": "gateway", ":scheme": "http"}
	if req.Method == "" {
		h[":method"] = "POST"
	}
	for k, v := range req.Headers {
		h[strings.ToLower(k)] = v
	}
	if req.Body != nil {
		h["content-type"] = "application/json"
		h["content-length"] = strconv.Itoa(len(req.Body))
	}
	for k, v := range h {
		x.Headers[k] = v
	}
	first := &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: req.Mode.proto(), ResponseBodyMode: req.Mode.proto(),
			SendBodyWithoutWaitingForHeaderResponse: req.Mode == FullDuplex},
		MetadataContext: subsetMetadata(req.Subset),
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(h, req.ValueHeaders), EndOfStream: req.Body == nil}},
	}
	if err := st.Send(first); err != nil {
		return fail(err)
	}
	if req.Body == nil {
		return x.finishRoute(nil, time.Now())
	}
	chunk := req.Chunk
	if chunk <= 0 {
		chunk = 16 << 10
	}
	if req.Mode == Buffered {
		// Envoy waits for the headers answer, then sends the whole body.
		resp, err := st.Recv()
		if err != nil {
			return fail(err)
		}
		if x.immediate(resp) {
			return x, nil
		}
		if resp.GetRequestHeaders() == nil {
			return fail(fmt.Errorf("buffered mode: want a request headers response first, got %T", resp.GetResponse()))
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: req.Body, EndOfStream: true}}}); err != nil {
			return fail(err)
		}
		return x.finishRoute(req.Body, time.Now())
	}
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(req.Body))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: req.Body[off:end], EndOfStream: end == len(req.Body)}}}); err != nil {
			return fail(err)
		}
		if end == len(req.Body) {
			break
		}
	}
	return x.finishRoute(req.Body, time.Now())
}

// finishRoute reads the picker's answer: the headers (or, buffered, body)
// response with the mutation, then in full-duplex mode the body chunks.
func (x *Exchange) finishRoute(body []byte, sent time.Time) (*Exchange, error) {
	resp, err := x.stream.Recv()
	if err != nil {
		x.cancel()
		return nil, err
	}
	x.Decision = time.Since(sent)
	if x.immediate(resp) {
		return x, nil
	}
	var common *extprocv3.CommonResponse
	switch {
	case resp.GetRequestHeaders() != nil && (body == nil || x.mode == FullDuplex):
		common = resp.GetRequestHeaders().GetResponse()
	case resp.GetRequestBody() != nil && x.mode == Buffered:
		common = resp.GetRequestBody().GetResponse()
		x.Body = body
	default:
		x.cancel()
		return nil, fmt.Errorf("%s mode: unexpected answer %T", x.mode, resp.GetResponse())
	}
	x.apply(common)
	x.Metadata = resp.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
	if body == nil || x.mode == Buffered {
		return x, nil
	}
	for {
		r, err := x.stream.Recv()
		if err != nil {
			x.cancel()
			return nil, err
		}
		sb := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil {
			x.cancel()
			return nil, fmt.Errorf("full-duplex mode: want streamed request body chunks, got %T", r.GetResponse())
		}
		x.Body = append(x.Body, sb.GetBody()...)
		if sb.GetEndOfStream() {
			return x, nil
		}
	}
}

func (x *Exchange) immediate(r *extprocv3.ProcessingResponse) bool {
	if im := r.GetImmediateResponse(); im != nil {
		x.Immediate = im
		x.cancel()
		return true
	}
	return false
}

func (x *Exchange) apply(c *extprocv3.CommonResponse) {
	x.ClearRouteCache = c.GetClearRouteCache()
	x.Headers = mutate(x.Headers, c.GetHeaderMutation())
}

// mutate applies m to h (in place) and returns h.
func mutate(h map[string]string, m *extprocv3.HeaderMutation) map[string]string {
	for _, o := range m.GetSetHeaders() {
		v := o.GetHeader().GetValue()
		if raw := o.GetHeader().GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		h[strings.ToLower(o.GetHeader().GetKey())] = v
	}
	for _, k := range m.GetRemoveHeaders() {
		delete(h, strings.ToLower(k))
	}
	return h
}

// Response is the upstream response Envoy passes through the filter.
type Response struct {
	Status  int
	Headers map[string]string
	// Body yields the body in the chunks the upstream delivered.
	Body io.Reader
	// Chunk is the read size (default 4 KiB).
	Chunk int
	// Trailers ends the stream with response trailers instead of
	// end_of_stream on the last body chunk.
	Trailers bool
	// Served, when set, is reported with the response headers as the
	// endpoint that served the request, in the metadata context
	// (envoy.lb/x-gateway-destination-endpoint-served), as a proxy that
	// implements it does.
	Served string
}

// Respond passes resp through the stream as Envoy does and returns the
// body as the client receives it; the stream is then closed.
func (x *Exchange) Respond(resp Response) ([]byte, error) {
	defer x.cancel()
	h := map[string]string{":status": strconv.Itoa(resp.Status)}
	for k, v := range resp.Headers {
		h[strings.ToLower(k)] = v
	}
	var md *corev3.Metadata
	if resp.Served != "" {
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.lb": {Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-served": structpb.NewStringValue(resp.Served)}},
		}}
	}
	if err := x.stream.Send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(h, false)}}}); err != nil {
		return nil, err
	}
	r, err := x.stream.Recv()
	if err != nil || r.GetResponseHeaders() == nil {
		return nil, fmt.Errorf("response headers: %v %v", r.GetResponse(), err)
	}
	x.ResponseHeaders = mutate(h, r.GetResponseHeaders().GetResponse().GetHeaderMutation())
	chunk := resp.Chunk
	if chunk <= 0 {
		chunk = 4 << 10
	}
	var chunks [][]byte
	if x.mode == Buffered {
		all, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		chunks = [][]byte{all}
	}
	var out []byte
	send := func(b []byte, end bool) error {
		if err := x.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: end}}}); err != nil {
			return err
		}
		r, err := x.stream.Recv()
		if err != nil {
			return err
		}
		if x.mode == FullDuplex {
			sb := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sb == nil {
				return fmt.Errorf("full-duplex mode: want the response body streamed back, got %v", r.GetResponse())
			}
			out = append(out, sb.GetBody()...)
		} else {
			if r.GetResponseBody() == nil {
				return fmt.Errorf("buffered mode: want a body response, got %T", r.GetResponse())
			}
			out = append(out, b...)
		}
		return nil
	}
	if x.mode == Buffered {
		if err := send(chunks[0], !resp.Trailers); err != nil {
			return nil, err
		}
	} else {
		buf := make([]byte, chunk)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if err := send(append([]byte(nil), buf[:n]...), false); err != nil {
					return nil, err
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, err
			}
		}
		if !resp.Trailers {
			if err := send(nil, true); err != nil {
				return nil, err
			}
		}
	}
	if resp.Trailers {
		if err := x.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{}}}); err != nil {
			return nil, err
		}
		if r, err := x.stream.Recv(); err != nil || r.GetResponseTrailers() == nil {
			return nil, fmt.Errorf("response trailers: %v %v", r.GetResponse(), err)
		}
	}
	_ = x.stream.CloseSend()
	return out, nil
}

// Cancel ends the stream abruptly, as when the client goes away.
func (x *Exchange) Cancel() { x.cancel() }

func headerMap(h map[string]string, inValue bool) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for k, v := range h {
		hv := &corev3.HeaderValue{Key: k, RawValue: []byte(v)}
		if inValue {
			hv = &corev3.HeaderValue{Key: k, Value: v}
		}
		m.Headers = append(m.Headers, hv)
	}
	return m
}

func subsetMetadata(subset any) *corev3.Metadata {
	var v *structpb.Value
	switch s := subset.(type) {
	case nil:
		return nil
	case string:
		v = structpb.NewStringValue(s)
	case []string:
		vals := make([]*structpb.Value, len(s))
		for i, e := range s {
			vals[i] = structpb.NewStringValue(e)
		}
		v = structpb.NewListValue(&structpb.ListValue{Values: vals})
	default:
		panic(fmt.Sprintf("envoytest: subset hint of type %T", subset))
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		"envoy.lb.subset_hint": {Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-subset": v}},
	}}
}
