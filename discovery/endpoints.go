package discovery

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/indexer/kvevents"
)

// This file turns a pod and one of its ranks into endpoints: the worker
// id, the KV event and replay endpoints, from the pod's annotations or the
// configured templates.

// Annotations a pod may carry to override the configured templates. Each
// holds either one template, expanded for every rank, or a comma list with
// one template (or literal endpoint) per target port, rank i taking entry
// i. An annotation that is present but empty means "none" for that pod (no
// KV events, or no replay). A malformed annotation makes the pod's workers
// unregistrable: the pod is skipped, logged and counted.
const (
	AnnotationEvents = "kvgate.io/kv-events-endpoints"
	AnnotationReplay = "kvgate.io/kv-replay-endpoints"
)

// Template defaults and special values.
const (
	// DefaultEventsTemplate is vLLM's default KV event publisher, offset by
	// the data-parallel rank as vLLM does.
	DefaultEventsTemplate = "tcp://{podIP}:{5557+rank}"
	// NoEvents as Config.EventsTemplate registers workers without KV event
	// publishers (load-only routing).
	NoEvents = "none"
)

// WorkerID returns the catalog id of rank of pod in namespace: the xxh3
// hash of "<namespace>/<pod>-rank-<rank>", kept below 2^63 so that it
// survives JSON readers that use signed or floating-point integers.
func WorkerID(namespace, pod string, rank int) uint64 {
	return xxh3.HashString(namespace+"/"+workerName(pod, rank)) & (1<<63 - 1)
}

// workerName is how logs name the worker of rank of pod.
func workerName(pod string, rank int) string { return pod + "-rank-" + strconv.Itoa(rank) }

type pieceKind uint8

const (
	literal pieceKind = iota
	podIP             // {podIP}
	rankNum           // {rank}
	portNum           // {port}
	offset            // {N+rank}
)

type piece struct {
	kind pieceKind
	lit  string // literal text
	base int    // N of {N+rank}
}

// template is a parsed endpoint template.
type template struct {
	raw    string
	pieces []piece
}

// vars are the values a template expands with.
type vars struct {
	podIP string // bracketed when IPv6, so that "{podIP}:port" is host:port
	rank  int
	port  int32 // the rank's target port
}

// hostVars returns the vars of rank of a pod at ip with target port port.
func hostVars(ip string, rank int, port int32) vars {
	if strings.Contains(ip, ":") {
		ip = "[" + ip + "]"
	}
	return vars{podIP: ip, rank: rank, port: port}
}

// parseTemplate parses s: literal text with the placeholders {podIP},
// {rank}, {port} and {N+rank} (N a decimal number up to 65535).
func parseTemplate(s string) (template, error) {
	t := template{raw: s}
	if strings.TrimSpace(s) == "" {
		return t, fmt.Errorf("template is empty")
	}
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.pieces = append(t.pieces, piece{kind: literal, lit: rest})
			break
		}
		if i > 0 {
			t.pieces = append(t.pieces, piece{kind: literal, lit: rest[:i]})
		}
		if rest[i] == '}' {
			return t, fmt.Errorf("template %q: '}' without '{'", s)
		}
		j := strings.IndexAny(rest[i+1:], "{}")
		if j < 0 || rest[i+1+j] != '}' {
			return t, fmt.Errorf("template %q: unclosed '{'", s)
		}
		p, err := parsePlaceholder(rest[i+1 : i+1+j])
		if err != nil {
			return t, fmt.Errorf("template %q: %w", s, err)
		}
		t.pieces = append(t.pieces, p)
		rest = rest[i+2+j:]
	}
	return t, nil
}

func parsePlaceholder(name string) (piece, error) {
	switch name {
	case "podIP":
		return piece{kind: podIP}, nil
	case "rank":
		return piece{kind: rankNum}, nil
	case "port":
		return piece{kind: portNum}, nil
	}
	if base, ok := strings.CutSuffix(name, "+rank"); ok && base != "" && strings.Trim(base, "0123456789") == "" {
		if n, err := strconv.Atoi(base); err == nil && n <= 65535 {
			return piece{kind: offset, base: n}, nil
		}
	}
	return piece{}, fmt.Errorf("unknown placeholder {%s} (want {podIP}, {rank}, {port} or {N+rank})", name)
}

// expand returns t with its placeholders replaced by v's values.
func (t template) expand(v vars) string {
	var b strings.Builder
	for _, p := range t.pieces {
		switch p.kind {
		case literal:
			b.WriteString(p.lit)
		case podIP:
			b.WriteString(v.podIP)
		case rankNum:
			b.WriteString(strconv.Itoa(v.rank))
		case portNum:
			b.WriteString(strconv.Itoa(int(v.port)))
		case offset:
			b.WriteString(strconv.Itoa(p.base + v.rank))
		}
	}
	return b.String()
}

// expandEndpoint expands t and checks that the result is a ZMQ endpoint
// kvgate can connect to.
func (t template) expandEndpoint(v vars) (string, error) {
	ep := t.expand(v)
	if err := checkEndpoint(ep); err != nil {
		return "", fmt.Errorf("template %q: %w", t.raw, err)
	}
	return ep, nil
}

// checkEndpoint is kvevents.ValidateEndpoint plus a check of a tcp
// endpoint's port number.
func checkEndpoint(ep string) error {
	if err := kvevents.ValidateEndpoint(ep); err != nil {
		return err
	}
	if addr, ok := strings.CutPrefix(ep, "tcp://"); ok {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("endpoint %q: %w", ep, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("endpoint %q: port %q is not between 1 and 65535", ep, port)
		}
	}
	return nil
}

// sampleVars returns the values New checks configured templates with.
func sampleVars() vars { return vars{podIP: "10.0.0.1", rank: 0, port: 8000} }

// parseConfigTemplate parses a configured template and checks that it
// expands to a valid endpoint.
func parseConfigTemplate(s string) (template, error) {
	t, err := parseTemplate(s)
	if err != nil {
		return t, err
	}
	if _, err := t.expandEndpoint(sampleVars()); err != nil {
		return t, err
	}
	return t, nil
}

// rankTemplates are the templates of a pod's ranks: one for all (len 1),
// one per rank, or none (nil).
type rankTemplates []template

// parseAnnotation parses an endpoints annotation for a pod with n ranks.
func parseAnnotation(value string, n int) (rankTemplates, error) {
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	parts := strings.Split(value, ",")
	if len(parts) != 1 && len(parts) != n {
		return nil, fmt.Errorf("%d entries for %d target ports (give one template for all ranks or one entry per rank)", len(parts), n)
	}
	ts := make(rankTemplates, len(parts))
	for i, part := range parts {
		t, err := parseTemplate(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
		ts[i] = t
	}
	return ts, nil
}

// forRank returns the endpoint of rank ("" when ts is empty).
func (ts rankTemplates) forRank(v vars) (string, error) {
	switch len(ts) {
	case 0:
		return "", nil
	case 1:
		return ts[0].expandEndpoint(v)
	default:
		return ts[v.rank].expandEndpoint(v)
	}
}

// endpointSource picks a pod's templates for one kind of endpoint: the
// annotation when the pod has it, else the configured default (nil: none).
func endpointSource(annotations map[string]string, key string, def *template, n int) (rankTemplates, error) {
	if value, ok := annotations[key]; ok {
		ts, err := parseAnnotation(value, n)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: %w", key, err)
		}
		return ts, nil
	}
	if def == nil {
		return nil, nil
	}
	return rankTemplates{*def}, nil
}
