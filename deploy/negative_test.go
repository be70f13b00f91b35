package deploy

// Each check must be able to fail: mutate a copy of a real build in memory
// and make sure the mistake is reported (and was not reported before).

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// doc is one build output document as generic YAML.
type doc = map[string]any

// at walks a path of map keys (string) and list indexes (int).
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: %T is not a map", path, v)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at %v: no index %d", path, k)
			}
			v = l[k]
		}
	}
	return v
}

// set sets the last key of path in the map the rest of path leads to.
func set(t *testing.T, v any, val any, path ...any) {
	t.Helper()
	m, ok := at(t, v, path[:len(path)-1]...).(map[string]any)
	if !ok {
		t.Fatalf("set %v: parent is not a map", path)
	}
	m[path[len(path)-1].(string)] = val
}

func find(t *testing.T, docs []doc, kind, name string) doc {
	t.Helper()
	for _, d := range docs {
		if d["kind"] == kind && at(t, d, "metadata", "name") == name {
			return d
		}
	}
	t.Fatalf("no %s %s in the build", kind, name)
	return nil
}

// podContainer returns a container of a Deployment's or StatefulSet's pod.
func podContainer(t *testing.T, docs []doc, workload, name string) map[string]any {
	t.Helper()
	for _, d := range docs {
		if (d["kind"] == "Deployment" || d["kind"] == "StatefulSet") && at(t, d, "metadata", "name") == workload {
			for _, c := range at(t, d, "spec", "template", "spec", "containers").([]any) {
				if c.(map[string]any)["name"] == name {
					return c.(map[string]any)
				}
			}
		}
	}
	t.Fatalf("no container %s in %s", name, workload)
	return nil
}

// setArg replaces the "--flag=..." argument of a container.
func setArg(t *testing.T, c map[string]any, flag, val string) {
	t.Helper()
	args := c["args"].([]any)
	for i, a := range args {
		if strings.HasPrefix(a.(string), "--"+flag+"=") {
			args[i] = "--" + flag + "=" + val
			return
		}
	}
	t.Fatalf("no --%s= argument", flag)
}

// setEnv replaces the value of an environment variable of a container.
func setEnv(t *testing.T, c map[string]any, name, val string) {
	t.Helper()
	for _, e := range c["env"].([]any) {
		if e.(map[string]any)["name"] == name {
			e.(map[string]any)["value"] = val
			return
		}
	}
	t.Fatalf("no env %s", name)
}

// genericDocs returns fresh generic copies of a build's documents.
func genericDocs(t *testing.T, raw [][]byte) []doc {
	t.Helper()
	docs := make([]doc, len(raw))
	for i, r := range raw {
		if err := yaml.Unmarshal(r, &docs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return docs
}

func problemsOfGeneric(t *testing.T, tg target, docs []doc, flags map[string]bool) []string {
	t.Helper()
	raw := make([][]byte, len(docs))
	for i, d := range docs {
		var err error
		if raw[i], err = yaml.Marshal(d); err != nil {
			t.Fatal(err)
		}
	}
	var out []string
	for _, e := range problems(tg, raw, flags) {
		out = append(out, e.Error())
	}
	return out
}

func TestChecksCatchMistakes(t *testing.T) {
	flags := serveFlags(t)
	kvgate := func(t *testing.T, docs []doc) map[string]any { return podContainer(t, docs, "kvgate", "kvgate") }
	vllm := func(t *testing.T, docs []doc) map[string]any { return podContainer(t, docs, "vllm-llama3-8b", "vllm") }
	kvEvents := func(events, replay, topic string) string {
		return fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%s","replay_endpoint":"tcp://*:%s","topic":"%s"}`,
			events, replay, topic)
	}
	// Each target is built and checked once; every case mutates its own
	// copy.
	built := map[string][][]byte{}
	before := map[string][]string{}
	for _, tg := range targets() {
		raw, err := buildDocs(tg.Dir)
		if err != nil {
			t.Fatal(err)
		}
		built[tg.Dir] = raw
		before[tg.Dir] = problemsOfGeneric(t, tg, genericDocs(t, raw), flags)
	}
	for _, tc := range []struct {
		name   string
		dir    string
		mutate func(t *testing.T, docs []doc)
		want   string
	}{
		{"unknown field in the kvgate Deployment", "base", func(t *testing.T, docs []doc) {
			kvgate(t, docs)["imagePullPolicyy"] = "Always"
		}, `unknown field "spec.template.spec.containers[0].imagePullPolicyy"`},
		{"unknown field in the InferencePool", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "InferencePool", "vllm-llama3-8b"), "x", "spec", "extensionRef")
		}, `unknown field "spec.extensionRef"`},
		{"bad failureMode", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "InferencePool", "vllm-llama3-8b"), "FailSafe", "spec", "endpointPickerRef", "failureMode")
		}, `failureMode "FailSafe"`},
		{"pool without targetPorts", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "InferencePool", "vllm-llama3-8b"), []any{}, "spec", "targetPorts")
		}, "spec.targetPorts has 0 entries"},
		{"pool selector matches no vLLM pod", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "InferencePool", "vllm-llama3-8b"), map[string]any{"app": "vllm-llama3-70b"}, "spec", "selector", "matchLabels")
		}, "matches no pod template"},
		{"vLLM pod labels changed", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "Deployment", "vllm-llama3-8b"), "vllm", "spec", "template", "metadata", "labels", "app")
			set(t, find(t, docs, "Deployment", "vllm-llama3-8b"), map[string]any{"app": "vllm"}, "spec", "selector", "matchLabels")
		}, "matches no pod template"},
		{"picker port not on the Service", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "InferencePool", "vllm-llama3-8b"), int64(9003), "spec", "endpointPickerRef", "port", "number")
		}, "endpointPickerRef port 9003"},
		{"picker Service missing", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "InferencePool", "vllm-llama3-8b"), "epp", "spec", "endpointPickerRef", "name")
		}, "names Service epp, which is not in the build"},
		{"Service targetPort not a container port", "base", func(t *testing.T, docs []doc) {
			set(t, at(t, find(t, docs, "Service", "kvgate"), "spec", "ports", 0), "grpc", "targetPort")
		}, "targetPort grpc is not a port"},
		{"Service without h2c", "base", func(t *testing.T, docs []doc) {
			set(t, at(t, find(t, docs, "Service", "kvgate"), "spec", "ports", 0), "http", "appProtocol")
		}, "appProtocol should be kubernetes.io/h2c"},
		{"gRPC probe on a wrong port", "base", func(t *testing.T, docs []doc) {
			set(t, kvgate(t, docs), int64(9003), "livenessProbe", "grpc", "port")
		}, "livenessProbe: gRPC port 9003"},
		{"liveness waits for workers", "base", func(t *testing.T, docs []doc) {
			set(t, kvgate(t, docs), "readiness", "livenessProbe", "grpc", "service")
		}, "livenessProbe waits for vLLM workers"},
		{"startup probe on /ready", "base", func(t *testing.T, docs []doc) {
			set(t, kvgate(t, docs), "/ready", "startupProbe", "httpGet", "path")
		}, "startupProbe waits for vLLM workers"},
		{"RBAC without watch on pods", "base", func(t *testing.T, docs []doc) {
			set(t, at(t, find(t, docs, "Role", "kvgate"), "rules", 0), []any{"get", "list"}, "verbs")
		}, `cannot watch pods in API group ""`},
		{"RBAC without the x-k8s.io group", "base", func(t *testing.T, docs []doc) {
			set(t, at(t, find(t, docs, "Role", "kvgate"), "rules", 1), []any{"inference.networking.k8s.io"}, "apiGroups")
		}, `in API group "inference.networking.x-k8s.io"`},
		{"RBAC grants writes", "base", func(t *testing.T, docs []doc) {
			set(t, at(t, find(t, docs, "Role", "kvgate"), "rules", 0), []any{"get", "list", "watch", "delete"}, "verbs")
		}, "may delete"},
		{"unknown kvgate flag", "base", func(t *testing.T, docs []doc) {
			c := kvgate(t, docs)
			c["args"] = append(c["args"].([]any), "--pool-nmae=x")
		}, "--pool-nmae is not a `kvgate serve` flag"},
		{"unknown KVGATE_ env", "base", func(t *testing.T, docs []doc) {
			c := kvgate(t, docs)
			c["env"] = append(c["env"].([]any), map[string]any{"name": "KVGATE_LOGLEVEL", "value": "debug"})
		}, "--loglevel is not a `kvgate serve` flag"},
		{"flag and env both set", "base", func(t *testing.T, docs []doc) {
			c := kvgate(t, docs)
			c["args"] = append(c["args"].([]any), "--log-level=warn")
		}, "which wins"},
		{"pool name not defined", "base", func(t *testing.T, docs []doc) {
			setArg(t, kvgate(t, docs), "pool-name", "llama")
		}, "no InferencePool llama"},
		{"KV events port differs from the template", "base", func(t *testing.T, docs []doc) {
			setArg(t, vllm(t, docs), "kv-events-config", kvEvents("5559", "5558", "kv-events"))
		}, "KV events on port 5559"},
		{"KV replay port differs from the template", "base", func(t *testing.T, docs []doc) {
			setArg(t, kvgate(t, docs), "kv-replay-template", "tcp://{podIP}:{6558+rank}")
		}, "kvgate --kv-replay-template uses port 6558"},
		{"KV events template without the pod address", "base", func(t *testing.T, docs []doc) {
			setArg(t, kvgate(t, docs), "kv-events-template", "tcp://vllm:{5557+rank}")
		}, "has no {podIP}"},
		{"KV events template with an unknown placeholder", "base", func(t *testing.T, docs []doc) {
			setArg(t, kvgate(t, docs), "kv-events-template", "tcp://{ip}:5557")
		}, "unknown placeholder {ip}"},
		{"kvgate block size differs", "base", func(t *testing.T, docs []doc) {
			setArg(t, kvgate(t, docs), "block-size", "32")
		}, "but kvgate --block-size=32"},
		{"kvgate default model not in models.yaml", "base", func(t *testing.T, docs []doc) {
			setArg(t, kvgate(t, docs), "model-name", "llama")
		}, "kvgate --model-name=llama is not in models.yaml"},
		{"pod model label differs from the served name", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "Deployment", "vllm-llama3-8b"), "llama3", "spec", "template", "metadata", "labels", "kvgate.io/model")
		}, `pod label kvgate.io/model="llama3"`},
		{"KV events topic differs", "base", func(t *testing.T, docs []doc) {
			setArg(t, kvgate(t, docs), "kv-topic", "kv-cache")
		}, "does not start with kvgate's --kv-topic"},
		{"unknown field in --kv-events-config", "base", func(t *testing.T, docs []doc) {
			setArg(t, vllm(t, docs), "kv-events-config", `{"enable_kv_cache_events":true,"endpoints":"tcp://*:5557"}`)
		}, `unknown field "endpoints"`},
		{"block size differs", "base", func(t *testing.T, docs []doc) {
			setArg(t, vllm(t, docs), "block-size", "32")
		}, "--block-size=32 but models.yaml says block_size 16"},
		{"served model not in models.yaml", "base", func(t *testing.T, docs []doc) {
			setArg(t, vllm(t, docs), "served-model-name", "llama3")
		}, `served model "llama3" is not in kvgate's models.yaml`},
		{"unknown key in models.yaml", "base", func(t *testing.T, docs []doc) {
			for _, d := range docs {
				if d["kind"] == "ConfigMap" {
					data := d["data"].(map[string]any)
					data["models.yaml"] = strings.Replace(data["models.yaml"].(string), "block_size:", "blocksize:", 1)
				}
			}
		}, "blocksize"},
		{"grace period shorter than the drain", "base", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "Deployment", "kvgate"), int64(60), "spec", "template", "spec", "terminationGracePeriodSeconds")
		}, "terminationGracePeriodSeconds"},
		{"writable root filesystem", "base", func(t *testing.T, docs []doc) {
			set(t, kvgate(t, docs), false, "securityContext", "readOnlyRootFilesystem")
		}, "readOnlyRootFilesystem is not true"},
		{"GOMEMLIMIT above the limit", "base", func(t *testing.T, docs []doc) {
			setEnv(t, kvgate(t, docs), "GOMEMLIMIT", "3GiB")
		}, "GOMEMLIMIT=3GiB is not below"},
		{"route to a missing pool", "base", func(t *testing.T, docs []doc) {
			set(t, at(t, find(t, docs, "HTTPRoute", "llm"), "spec", "rules", 0, "backendRefs", 0), "other", "name")
		}, "backendRef InferencePool inference/other is not in the build"},
		{"route to a missing Gateway", "overlays/envoy-gateway", func(t *testing.T, docs []doc) {
			set(t, at(t, find(t, docs, "HTTPRoute", "llm"), "spec", "parentRefs", 0), "gw", "name")
		}, "parentRef Gateway inference/gw is not in the build"},
		{"tokenizer emptyDir never filled", "overlays/envoy-gateway", func(t *testing.T, docs []doc) {
			delete(at(t, find(t, docs, "Deployment", "kvgate"), "spec", "template", "spec").(map[string]any), "initContainers")
		}, "which no init container fills"},
		{"more replicas than replica sync peers", "overlays/ha", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "StatefulSet", "kvgate"), int64(3), "spec", "replicas")
		}, "lists 2 peers for 3 replicas"},
		{"replicas without replica sync", "overlays/ha", func(t *testing.T, docs []doc) {
			c := kvgate(t, docs)
			c["env"] = slices.DeleteFunc(c["env"].([]any), func(e any) bool {
				return strings.HasPrefix(e.(map[string]any)["name"].(string), "KVGATE_REPLICA_SYNC")
			})
		}, "2 replicas without --replica-sync-port"},
		{"PDB that blocks drains", "overlays/ha", func(t *testing.T, docs []doc) {
			set(t, find(t, docs, "PodDisruptionBudget", "kvgate"), int64(2), "spec", "minAvailable")
		}, "blocks every voluntary eviction"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := targetByDir(t, tc.dir)
			hit := func(ps []string) bool {
				return slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) })
			}
			if hit(before[tc.dir]) {
				t.Fatalf("the unchanged build already reports %q: %q", tc.want, before[tc.dir])
			}
			docs := genericDocs(t, built[tc.dir])
			tc.mutate(t, docs)
			if after := problemsOfGeneric(t, tg, docs, flags); !hit(after) {
				t.Errorf("the mistake was not caught: want a problem containing %q, got %q", tc.want, after)
			}
		})
	}
}
