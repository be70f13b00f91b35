package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/sim"
)

// TestE2ESim runs `kvgate sim` (2 workers x 2 DP ranks) and `kvgate serve`
// subscribed to it with the command line the simulator prints (its
// listeners on free ports of the same interface): a completion served by
// worker 2's rank 1 shows up, through real KV events, in kvgate's /query
// for that worker and rank only, and the command's proxy, on the loopback
// interface, serves completions.
func TestE2ESim(t *testing.T) {
	ctx := e2eContext(t)
	dir := t.TempDir()
	epFile := filepath.Join(dir, "endpoints.json")
	simProc := startKvgate(t, ctx, "sim", "--workers", "2", "--dp-size", "2", "--base-port", "0",
		"--event-base-port", "0", "--replay-base-port", "0", "--speedup", "1000", "--endpoints-file", epFile)
	if _, err := simProc.waitLine(ctx, func(l string) bool { return strings.Contains(l, `msg="sim fleet ready"`) }); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(epFile)
	if err != nil {
		t.Fatal(err)
	}
	var eps sim.Endpoints
	if err := json.Unmarshal(data, &eps); err != nil {
		t.Fatal(err)
	}
	if len(eps.Workers) != 2 || len(eps.Workers[1].Ranks) != 2 || eps.Model != "sim-model" || eps.BlockSize != 16 {
		t.Fatalf("endpoints: %s", data)
	}
	if want := []string{"--proxy-addr", "127.0.0.1:8080", "--admin-addr", "127.0.0.1:8090", "--ext-proc-addr", "127.0.0.1:9002"}; !slices.Equal(eps.ListenArgs, want) {
		t.Errorf("listen_args %q, want %q", eps.ListenArgs, want)
	}
	// The printed command, on free ports: tests run several kvgate
	// processes at once.
	args := []string{"serve"}
	for _, a := range eps.ListenArgs {
		if host, _, err := net.SplitHostPort(a); err == nil {
			a = net.JoinHostPort(host, "0")
		}
		args = append(args, a)
	}
	kv := startKvgate(t, ctx, append(args, eps.ServeArgs...)...)
	api := apiClient{t: t, ctx: ctx, c: testClient(t), base: "http://" + kv.adminAddr(t, ctx)}
	api.eventually(func() string {
		body := api.must(http.StatusOK, "GET", "/workers", nil)
		if n := strings.Count(body, `"active"`); n < 4 {
			return "listeners not all active: " + body
		}
		return ""
	})

	prompt := make([]uint32, 200)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 1})
	req, err := http.NewRequestWithContext(ctx, "POST", eps.Workers[1].URL+"/v1/completions", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-data-parallel-rank", "1")
	resp, err := testClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: status %d", resp.StatusCode)
	}

	// 200 prompt tokens: 12 full blocks of 16 = 192 tokens on worker 2 rank 1.
	want := fmt.Sprintf(`{"%d":{"1":192}}`, eps.Workers[1].ID)
	api.eventually(func() string {
		got := api.must(http.StatusOK, "POST", "/query", map[string]any{"model_name": "sim-model", "token_ids": prompt})
		var q struct {
			Scores json.RawMessage `json:"scores"`
		}
		if err := json.Unmarshal([]byte(got), &q); err != nil || !sameJSON(string(q.Scores), want) {
			return fmt.Sprintf("scores in %s, want %s", got, want)
		}
		return ""
	})

	// The proxy is on, on the loopback interface, and routes.
	line, err := kv.waitLine(ctx, func(l string) bool { return strings.Contains(l, `msg="proxy listening"`) })
	if err != nil {
		t.Fatal(err)
	}
	m := listenRE.FindStringSubmatch(line)
	if m == nil || !strings.HasPrefix(m[2], "127.0.0.1:") {
		t.Fatalf("proxy: %q, want an address on 127.0.0.1", line)
	}
	body, _ = json.Marshal(map[string]any{"model": "sim-model", "prompt": prompt[:40], "max_tokens": 2})
	req, err = http.NewRequestWithContext(ctx, "POST", "http://"+m[2]+"/v1/completions", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err = testClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"completion_tokens":2`) {
		t.Errorf("completion through the proxy: status %d, %s", resp.StatusCode, data)
	}
	for _, l := range kv.stderrLines() {
		if m := listenRE.FindStringSubmatch(l); m != nil && !strings.HasPrefix(m[2], "127.0.0.1:") {
			t.Errorf("%s listens on %s, not on the loopback interface", m[1], m[2])
		}
	}

	stop(t, kv)
	stop(t, simProc)
	// What it printed (read once it exited): the same command, quoted for
	// a shell, with the listeners on the loopback interface.
	want = "route with: kvgate serve --proxy-addr 127.0.0.1:8080 --admin-addr 127.0.0.1:8090 --ext-proc-addr 127.0.0.1:9002 " + shellJoin(eps.ServeArgs) + "\n"
	if !strings.Contains(simProc.stdout.String(), want) {
		t.Errorf("output %q lacks %q", simProc.stdout.String(), want)
	}
}

func TestShellJoin(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{"--workers", "1:0=tcp://127.0.0.1:5557|tcp://127.0.0.1:6557"}, "--workers '1:0=tcp://127.0.0.1:5557|tcp://127.0.0.1:6557'"},
		{[]string{"--model-name", "meta-llama/Llama-3.1-8B"}, "--model-name meta-llama/Llama-3.1-8B"},
		{[]string{"it's", ""}, `'it'\''s' ''`},
	} {
		if got := shellJoin(tc.in); got != tc.want {
			t.Errorf("shellJoin(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestE2ESimBadFlags(t *testing.T) {
	ctx := e2eContext(t)
	for _, args := range [][]string{
		{"sim", "--encoding", "xml"},
		{"sim", "--workers", "0", "--base-port", "0"},
		{"sim", "--block-size", "0", "--base-port", "0"},
		{"sim", "--block-size", "65537", "--base-port", "0"},
		{"sim", "--fail-rate", "2", "--base-port", "0"},
		{"sim", "--mean-output-tokens", "-1", "--base-port", "0"},
		{"sim", "--tokenizer", "/nonexistent", "--base-port", "0"},
	} {
		p := startKvgate(t, ctx, args...)
		if code := p.wait(); code != 1 {
			t.Errorf("%v: exit code %d, want 1", args, code)
		}
		lines := p.stderrLines()
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "kvgate: ") {
			t.Errorf("%v: stderr %q, want one kvgate: line", args, lines)
		}
	}
}
