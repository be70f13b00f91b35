package discovery

import (
	"strings"
	"testing"
)

func TestTemplates(t *testing.T) {
	v4 := hostVars("10.1.2.3", 2, 8001)
	v6 := hostVars("fd00::7", 1, 9000)
	tests := []struct {
		name, template string
		v              vars
		want           string // expansion
		parseErr       string // non-empty: parseTemplate fails with this
		endpointErr    string // non-empty: expandEndpoint fails with this
	}{
		{name: "default", template: DefaultEventsTemplate, v: v4, want: "tcp://10.1.2.3:5559"},
		{name: "rank 0", template: DefaultEventsTemplate, v: hostVars("10.1.2.3", 0, 8000), want: "tcp://10.1.2.3:5557"},
		{name: "ipv6 bracketed", template: DefaultEventsTemplate, v: v6, want: "tcp://[fd00::7]:5558"},
		{name: "port and rank", template: "ipc:///run/{podIP}/{port}/r{rank}", v: v4, want: "ipc:///run/10.1.2.3/8001/r2"},
		{name: "port", template: "tcp://{podIP}:{port}", v: v4, want: "tcp://10.1.2.3:8001"},
		{name: "port path", template: "tcp://{podIP}:{port}/x", v: v4, want: "tcp://10.1.2.3:8001/x", endpointErr: "between 1 and 65535"},
		{name: "literal", template: "tcp://engine.local:6000", v: v4, want: "tcp://engine.local:6000"},
		{name: "ipc", template: "ipc:///run/vllm/kv-{rank}.sock", v: v4, want: "ipc:///run/vllm/kv-2.sock"},
		{name: "zero base", template: "tcp://{podIP}:{0+rank}", v: v4, want: "tcp://10.1.2.3:2", endpointErr: ""},
		{name: "leading zeros", template: "tcp://{podIP}:{05557+rank}", v: v4, want: "tcp://10.1.2.3:5559"},
		{name: "empty", template: "", parseErr: "empty"},
		{name: "blank", template: "  ", parseErr: "empty"},
		{name: "unknown placeholder", template: "tcp://{host}:5557", parseErr: "unknown placeholder {host}"},
		{name: "case matters", template: "tcp://{podip}:5557", parseErr: "unknown placeholder {podip}"},
		{name: "unclosed", template: "tcp://{podIP:5557", parseErr: "unclosed"},
		{name: "nested", template: "tcp://{{podIP}}:5557", parseErr: "unclosed"},
		{name: "stray close", template: "tcp://podIP}:5557", parseErr: "without"},
		{name: "empty placeholder", template: "tcp://{}:5557", parseErr: "unknown placeholder {}"},
		{name: "negative base", template: "tcp://{podIP}:{-1+rank}", parseErr: "unknown placeholder"},
		{name: "signed base", template: "tcp://{podIP}:{+5+rank}", parseErr: "unknown placeholder"},
		{name: "base too big", template: "tcp://{podIP}:{65536+rank}", parseErr: "unknown placeholder"},
		{name: "no base", template: "tcp://{podIP}:{+rank}", parseErr: "unknown placeholder"},
		{name: "rank minus", template: "tcp://{podIP}:{5557-rank}", parseErr: "unknown placeholder"},
		{name: "no transport", template: "{podIP}:5557", v: v4, want: "10.1.2.3:5557", endpointErr: "transport://address"},
		{name: "bad transport", template: "udp://{podIP}:5557", v: v4, want: "udp://10.1.2.3:5557", endpointErr: "not supported"},
		{name: "no port", template: "tcp://{podIP}", v: v4, want: "tcp://10.1.2.3", endpointErr: "host:port"},
		{name: "port overflow", template: "tcp://{podIP}:{65535+rank}", v: v4, want: "tcp://10.1.2.3:65537", endpointErr: "between 1 and 65535"},
		{name: "bind address", template: "tcp://*:5557", v: v4, want: "tcp://*:5557", endpointErr: "bind address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tpl, err := parseTemplate(tc.template)
			if tc.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.parseErr) {
					t.Fatalf("parseTemplate(%q) error = %v, want one containing %q", tc.template, err, tc.parseErr)
				}
				if _, err := parseConfigTemplate(tc.template); err == nil {
					t.Fatalf("parseConfigTemplate(%q) accepted a template parseTemplate rejects", tc.template)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseTemplate(%q): %v", tc.template, err)
			}
			if got := tpl.expand(tc.v); got != tc.want {
				t.Errorf("expand = %q, want %q", got, tc.want)
			}
			ep, err := tpl.expandEndpoint(tc.v)
			switch {
			case tc.endpointErr == "" && err != nil:
				t.Errorf("expandEndpoint: %v", err)
			case tc.endpointErr == "" && ep != tc.want:
				t.Errorf("expandEndpoint = %q, want %q", ep, tc.want)
			case tc.endpointErr != "" && (err == nil || !strings.Contains(err.Error(), tc.endpointErr)):
				t.Errorf("expandEndpoint error = %v, want one containing %q", err, tc.endpointErr)
			}
		})
	}
}

func TestParseAnnotation(t *testing.T) {
	tests := []struct {
		name, value string
		ranks       int
		want        []string // endpoint per rank; nil: none
		err         string
	}{
		{name: "empty means none", value: "", ranks: 2, want: nil},
		{name: "blank means none", value: " ", ranks: 2, want: nil},
		{name: "one template for all", value: "tcp://{podIP}:{7000+rank}", ranks: 3,
			want: []string{"tcp://10.0.0.9:7000", "tcp://10.0.0.9:7001", "tcp://10.0.0.9:7002"}},
		{name: "one literal for the only rank", value: "tcp://10.9.9.9:5000", ranks: 1, want: []string{"tcp://10.9.9.9:5000"}},
		{name: "per rank", value: "tcp://a:1, tcp://{podIP}:{port}", ranks: 2,
			want: []string{"tcp://a:1", "tcp://10.0.0.9:8001"}},
		{name: "too few", value: "tcp://a:1,tcp://a:2", ranks: 3, err: "2 entries for 3 target ports"},
		{name: "too many", value: "tcp://a:1,tcp://a:2", ranks: 1, err: "2 entries for 1 target ports"},
		{name: "empty entry", value: "tcp://a:1,", ranks: 2, err: "entry 1: template is empty"},
		{name: "bad placeholder", value: "tcp://{pod}:1", ranks: 1, err: "entry 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts, err := parseAnnotation(tc.value, tc.ranks)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for rank := range tc.ranks {
				ep, err := ts.forRank(hostVars("10.0.0.9", rank, int32(8000+rank)))
				if err != nil {
					t.Fatalf("rank %d: %v", rank, err)
				}
				if ep != "" {
					got = append(got, ep)
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("endpoints = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWorkerID(t *testing.T) {
	seen := make(map[uint64]string)
	for _, ns := range []string{"a", "b"} {
		for _, pod := range []string{"vllm-0", "vllm-1", "vllm-0-rank-1"} {
			for rank := range 3 {
				id := WorkerID(ns, pod, rank)
				what := ns + "/" + workerName(pod, rank)
				if id >= 1<<63 {
					t.Errorf("%s: id %d does not fit in int64", what, id)
				}
				if id != WorkerID(ns, pod, rank) {
					t.Errorf("%s: id is not stable", what)
				}
				if other, dup := seen[id]; dup {
					t.Errorf("%s and %s share id %d", what, other, id)
				}
				seen[id] = what
			}
		}
	}
}
