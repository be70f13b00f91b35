package extproc

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The response headers that tell a client which worker served its request.
// Both fronts set them, whatever the routing policy: the embedded proxy on
// the response it relays, the ext_proc server in the response headers
// phase (Envoy's processing_mode must send response headers, as
// envoy/envoy.yaml does). They carry the worker's id and rank only, never
// its address: the endpoint (x-gateway-destination-endpoint) and the
// fallbacks stay between kvgate, the proxy and the workers. A worker's own
// headers of these names never reach the client.
const (
	// WorkerIDHeader is the decimal id of the worker that served the
	// request: the id it was registered with (--workers,
	// /register's instance_id, /workers, or the one discovery gave it).
	WorkerIDHeader = "x-kvgate-worker-id"
	// DPRankHeader is the data-parallel rank kvgate chose on that worker,
	// in decimal. It is always set, also on a worker with a single rank
	// (usually "0"), whereas the worker is told its rank
	// (x-data-parallel-rank) only when it has several.
	DPRankHeader = "x-kvgate-dp-rank"
	// ServedKey is the envoy.lb metadata key in which a proxy reports the
	// endpoint that finally served a request (the endpoint-picker
	// protocol). Without it, the response is the chosen endpoint's.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// pick is a worker rank a routed request may be sent to: the chosen one,
// or a fallback.
type pick struct {
	endpoint string // host:port
	worker   uint64
	rank     uint32
	setRank  bool // the worker has several ranks: tell it which
}

// picks returns the chosen worker rank, then the fallbacks in order.
func (r *Route) picks() []pick {
	return append([]pick{{endpoint: r.Endpoint, worker: r.Worker, rank: r.Rank, setRank: r.SetRank}}, r.fallbackPicks...)
}

// servedBy returns the pick whose endpoint is ep ("" means the chosen
// one); false when ep is none of the route's.
func (r *Route) servedBy(ep string) (pick, bool) {
	ps := r.picks()
	if ep = strings.TrimSpace(ep); ep == "" {
		return ps[0], true
	}
	ep = HostPort(ep)
	for _, p := range ps {
		if p.endpoint == ep {
			return p, true
		}
	}
	return pick{}, false
}

// servedHeaders returns the response headers naming p, as name-value
// pairs.
func (p pick) servedHeaders() [2][2]string {
	return [2][2]string{
		{WorkerIDHeader, strconv.FormatUint(p.worker, 10)},
		{DPRankHeader, strconv.FormatUint(uint64(p.rank), 10)},
	}
}

// servedEndpoint reads the endpoint a proxy reports in
// envoy.lb/x-gateway-destination-endpoint-served: a string, the first of a
// comma-separated list, or the first of a list; "" when absent.
func servedEndpoint(md *corev3.Metadata) string {
	v, ok := md.GetFilterMetadata()[LBNamespace].GetFields()[ServedKey]
	if !ok {
		return ""
	}
	s := v.GetStringValue()
	if l := v.GetListValue(); l != nil && len(l.GetValues()) > 0 {
		s = l.GetValues()[0].GetStringValue()
	}
	s, _, _ = strings.Cut(s, ",")
	return strings.TrimSpace(s)
}

// servedMutation is the response headers mutation of an ext_proc stream:
// the worker that served the request (the chosen one unless the proxy
// reports another of the route's endpoints), or, when kvgate cannot tell,
// the removal of those headers, so that no upstream can set them.
func servedMutation(r *Route, md *corev3.Metadata) *extprocv3.HeaderMutation {
	if r != nil {
		if p, ok := r.servedBy(servedEndpoint(md)); ok {
			m := &extprocv3.HeaderMutation{}
			for _, h := range p.servedHeaders() {
				m.SetHeaders = append(m.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h[0], RawValue: []byte(h[1])},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
			}
			return m
		}
	}
	return &extprocv3.HeaderMutation{RemoveHeaders: []string{WorkerIDHeader, DPRankHeader}}
}
