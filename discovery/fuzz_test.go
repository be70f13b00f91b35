package discovery

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// FuzzAnnotation feeds pod annotation values (outside input) to the
// endpoint template parser and expands what it accepts: no panic, and every
// endpoint produced is a valid one.
func FuzzAnnotation(f *testing.F) {
	for _, s := range []string{"tcp://{podIP}:{5557+rank}", "tcp://{podIP}:5000, tcp://127.0.0.9:{port}", "ipc:///run/kv-{rank}",
		"", " , ", "tcp://{podIP}:{99999+rank}", "tcp://{nope}:1", "{", "}", "tcp://[{podIP}]:{port}"} {
		f.Add(s, uint8(2))
	}
	f.Fuzz(func(t *testing.T, value string, ports uint8) {
		n := int(ports%8) + 1
		ts, err := parseAnnotation(value, n)
		if err != nil {
			return
		}
		for rank := range n {
			ep, err := ts.forRank(hostVars("10.1.2.3", rank, int32(8000+rank)))
			if err != nil || ep == "" {
				continue
			}
			if err := checkEndpoint(ep); err != nil {
				t.Fatalf("annotation %q rank %d expanded to an invalid endpoint %q: %v", value, rank, ep, err)
			}
		}
	})
}

// FuzzParsePool feeds InferencePool objects (outside input, as JSON) to the
// pool parser of both API versions: an error or a pool, never a panic, and
// an accepted pool has a selector and valid, distinct ports.
func FuzzParsePool(f *testing.F) {
	for _, s := range []string{
		`{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000},{"number":8001}]}}`,
		`{"spec":{"selector":{"app":"vllm"},"targetPortNumber":8000}}`,
		`{"spec":{"selector":{"matchLabels":{}},"targetPorts":[{"number":0}]}}`,
		`{"spec":{"targetPorts":[{"number":"8000"},{"number":8000}]}}`, `{"spec":null}`, `{}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		var obj map[string]any
		if json.Unmarshal([]byte(doc), &obj) != nil || obj == nil {
			return
		}
		for _, v := range []string{APIVersionV1, APIVersionV1Alpha2} {
			p, err := parsePool(v, &unstructured.Unstructured{Object: obj})
			if err != nil {
				continue
			}
			if len(p.selector) == 0 || len(p.ports) == 0 {
				t.Fatalf("%s %s: accepted a pool without selector or ports: %+v", v, doc, p)
			}
			seen := map[int32]bool{}
			for _, port := range p.ports {
				if port < 1 || port > 65535 || seen[port] {
					t.Fatalf("%s %s: accepted port %d (%v)", v, doc, port, p.ports)
				}
				seen[port] = true
			}
		}
	})
}
