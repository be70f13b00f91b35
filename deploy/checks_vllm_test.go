package deploy

// Cross-object checks of the vLLM fleet a pool selects: its flags and KV
// event endpoints against kvgate's models and templates.

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/tokenize"
	corev1 "k8s.io/api/core/v1"
)

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
