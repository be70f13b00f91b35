package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/internal/httpapi"
	"github.com/kvgate/kvgate/internal/stacktest"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
)

// testVersion is stamped into the binary built by TestMain.
const testVersion = "v0.0.0-e2e"

// kvgateBin is the kvgate binary built once by TestMain for end-to-end tests.
var kvgateBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kvgate-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	kvgateBin = filepath.Join(dir, "kvgate")
	build := exec.Command("go", "build", "-ldflags", "-X main.version="+testVersion, "-o", kvgateBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building kvgate: %v\n", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		// The engine publisher's PUB writer goroutine never ends (zmq4 v0.17.0).
		if err := goleak.Find(goleak.IgnoreAnyFunction(engine.LeakedGoroutine)); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			return 1
		}
	}
	return code
}

// unsetKvgateEnv removes every KVGATE_* variable for the duration of the test.
func unsetKvgateEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) || k == dynMinWorkersEnv {
			t.Setenv(k, "") // restores the original value after the test
			os.Unsetenv(k)
		}
	}
}

func TestLoadServeConfig(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full := file("full.yaml", "admin-addr: \":9000\"\nevent-threads: 8\nlog-level: debug\nlog-format: json\nshutdown-timeout: 3s\n")
	partial := file("partial.yaml", "admin-addr: \":9000\"\nevent-threads: 8\n")
	typo := file("typo.yaml", "admin-addr: \":9000\"\nevent-thread: 8\n")
	nested := file("nested.yaml", "admin:\n  addr: \":9000\"\n")
	badLevel := file("bad-level.yaml", "log-level: verbose\n")
	noUnit := file("no-unit.yaml", "shutdown-timeout: 10\n")
	intAddr := file("int-addr.yaml", "admin-addr: 9000\n")
	malformed := file("malformed.yaml", "admin-addr: [\n")
	empty := file("empty.yaml", "")
	reuseFile := file("reuse.yaml", "reuse-weight: 32\n")
	testRoutesFile := file("test-routes.yaml", "enable-test-routes: true\n")
	servicesFile := file("services.yaml", "indexer-addr: \":8090\"\nslot-tracker-addr: \"127.0.0.1:8091\"\n")

	def := serveConfig{AdminAddr: ":8090", EventThreads: 4, IndexShards: 1, LogLevel: "info", LogFormat: "text", ShutdownTimeout: 10 * time.Second,
		ModelName: "default", TenantID: "default", BlockSize: 16, MaxBody: 8 << 20, PeerTimeout: 10 * time.Second,
		ExtProcAddr: ":9002", WorkerEndpoints: map[uint64]string{}, RoutingPolicy: "kv",
		Discovery: "static", PoolAPIVersion: "auto", KVEventsTemplate: "tcp://{podIP}:{5557+rank}", OverlapWeight: 1,
		ReuseWeight: scheduler.DefaultReuseWeight}
	workersFile := file("workers.yaml", "workers: \"7=tcp://e:1\"\nmodel-name: llama\nblock-size: 32\n")
	syncFile := file("sync.yaml", "replica-sync-port: 9092\nreplica-sync-peers: \"tcp://b:9092\"\n")
	with := func(f func(*serveConfig)) serveConfig {
		c := def
		f(&c)
		return c
	}

	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    serveConfig
		wantErr string // substring of the error; "" means no error
	}{
		{name: "defaults", want: def},
		{name: "empty env is ignored", env: map[string]string{"KVGATE_ADMIN_ADDR": ""}, want: def},
		{name: "empty file", args: []string{"--config", empty}, want: with(func(c *serveConfig) { c.ConfigFile = empty })},
		{
			name: "file only",
			args: []string{"--config", full},
			want: with(func(c *serveConfig) {
				*c = serveConfig{ConfigFile: full, AdminAddr: ":9000", EventThreads: 8, IndexShards: 1, LogLevel: "debug", LogFormat: "json", ShutdownTimeout: 3 * time.Second,
					ModelName: c.ModelName, TenantID: c.TenantID, BlockSize: c.BlockSize, MaxBody: c.MaxBody, PeerTimeout: c.PeerTimeout,
					ExtProcAddr: c.ExtProcAddr, WorkerEndpoints: c.WorkerEndpoints, RoutingPolicy: c.RoutingPolicy,
					Discovery: c.Discovery, PoolAPIVersion: c.PoolAPIVersion, KVEventsTemplate: c.KVEventsTemplate, OverlapWeight: c.OverlapWeight,
					ReuseWeight: c.ReuseWeight}
			}),
		},
		{
			name: "file from KVGATE_CONFIG",
			env:  map[string]string{"KVGATE_CONFIG": partial},
			want: with(func(c *serveConfig) { c.ConfigFile, c.AdminAddr, c.EventThreads = partial, ":9000", 8 }),
		},
		{
			name: "env only",
			env:  map[string]string{"KVGATE_LOG_FORMAT": "JSON", "KVGATE_SHUTDOWN_TIMEOUT": "1m30s", "KVGATE_EVENT_THREADS": " 2 "},
			want: with(func(c *serveConfig) { c.LogFormat, c.ShutdownTimeout, c.EventThreads = "json", 90*time.Second, 2 }),
		},
		{
			name: "index shards",
			args: []string{"--index-shards", "3"},
			want: with(func(c *serveConfig) { c.IndexShards = 3 }),
		},
		{
			name: "env overrides file",
			args: []string{"--config", partial},
			env:  map[string]string{"KVGATE_EVENT_THREADS": "16"},
			want: with(func(c *serveConfig) { c.ConfigFile, c.AdminAddr, c.EventThreads = partial, ":9000", 16 }),
		},
		{
			name: "flag overrides env",
			args: []string{"--config", partial, "--event-threads", "2", "--log-level", "warn"},
			env:  map[string]string{"KVGATE_EVENT_THREADS": "16", "KVGATE_LOG_LEVEL": "error"},
			want: with(func(c *serveConfig) {
				c.ConfigFile, c.AdminAddr, c.EventThreads, c.LogLevel = partial, ":9000", 2, "warn"
			}),
		},
		{
			name: "flag config overrides KVGATE_CONFIG",
			args: []string{"--config", full},
			env:  map[string]string{"KVGATE_CONFIG": typo},
			want: with(func(c *serveConfig) {
				*c = serveConfig{ConfigFile: full, AdminAddr: ":9000", EventThreads: 8, IndexShards: 1, LogLevel: "debug", LogFormat: "json", ShutdownTimeout: 3 * time.Second,
					ModelName: c.ModelName, TenantID: c.TenantID, BlockSize: c.BlockSize, MaxBody: c.MaxBody, PeerTimeout: c.PeerTimeout,
					ExtProcAddr: c.ExtProcAddr, WorkerEndpoints: c.WorkerEndpoints, RoutingPolicy: c.RoutingPolicy,
					Discovery: c.Discovery, PoolAPIVersion: c.PoolAPIVersion, KVEventsTemplate: c.KVEventsTemplate, OverlapWeight: c.OverlapWeight,
					ReuseWeight: c.ReuseWeight}
			}),
		},
		{name: "unknown key in file", args: []string{"--config", typo}, wantErr: `typo.yaml: unknown key "event-thread"`},
		{name: "nested unknown key in file", args: []string{"--config", nested}, wantErr: `unknown key "admin.addr"`},
		{name: "missing file", args: []string{"--config", filepath.Join(dir, "nope.yaml")}, wantErr: "nope.yaml: not found"},
		{name: "missing file from env", env: map[string]string{"KVGATE_CONFIG": filepath.Join(dir, "nope.yaml")}, wantErr: "nope.yaml: not found"},
		{name: "malformed file", args: []string{"--config", malformed}, wantErr: "malformed.yaml"},
		{name: "event-threads 0", args: []string{"--event-threads", "0"}, wantErr: "invalid event-threads 0 (from flag --event-threads): must be >= 1"},
		{name: "index-shards 0", args: []string{"--index-shards", "0"}, wantErr: "invalid index-shards 0 (from flag --index-shards): must be >= 1"},
		{name: "index-shards not a number", env: map[string]string{"KVGATE_INDEX_SHARDS": "two"}, wantErr: `invalid index-shards "two" (from env KVGATE_INDEX_SHARDS): want an integer`},
		{name: "event-threads not a number", env: map[string]string{"KVGATE_EVENT_THREADS": "four"}, wantErr: `invalid event-threads "four" (from env KVGATE_EVENT_THREADS): want an integer`},
		{name: "log level in file", args: []string{"--config", badLevel}, wantErr: `invalid log-level "verbose" (from config file ` + badLevel},
		{name: "log format", args: []string{"--log-format", "xml"}, wantErr: `invalid log-format "xml"`},
		{name: "duration without unit", args: []string{"--config", noUnit}, wantErr: "invalid shutdown-timeout 10 (from config file"},
		{name: "duration zero", env: map[string]string{"KVGATE_SHUTDOWN_TIMEOUT": "0s"}, wantErr: "invalid shutdown-timeout \"0s\" (from env KVGATE_SHUTDOWN_TIMEOUT): must be > 0"},
		{name: "admin-addr without port", args: []string{"--admin-addr", "localhost"}, wantErr: `invalid admin-addr "localhost"`},
		{name: "admin-addr not a string", args: []string{"--config", intAddr}, wantErr: "invalid admin-addr 9000 (from config file"},
		{name: "empty --config", args: []string{"--config", ""}, wantErr: "--config: empty path"},
		{
			name: "service listeners from flag, env and file",
			args: []string{"--config", servicesFile, "--selection-addr", ":8092"},
			env:  map[string]string{"KVGATE_SLOT_TRACKER_ADDR": ":9091"},
			want: with(func(c *serveConfig) {
				c.ConfigFile, c.IndexerAddr, c.SlotTrackerAddr, c.SelectionAddr = servicesFile, ":8090", ":9091", ":8092"
			}),
		},
		{name: "indexer-addr without port", args: []string{"--indexer-addr", "localhost"}, wantErr: `invalid indexer-addr "localhost" (from flag --indexer-addr): want host:port, e.g. :8090`},
		{name: "slot-tracker-addr without port", env: map[string]string{"KVGATE_SLOT_TRACKER_ADDR": "x"}, wantErr: `invalid slot-tracker-addr "x" (from env KVGATE_SLOT_TRACKER_ADDR)`},
		{name: "selection-addr not a string", args: []string{"--config", file("sel.yaml", "selection-addr: 8092\n")}, wantErr: "invalid selection-addr 8092 (from config file"},
		{
			name: "workers flag",
			args: []string{"--workers", "1=tcp://h:5557, 2:1=tcp://h:5558|tcp://h:5559,", "--model-name", "m:v1", "--tenant-id", "t", "--block-size", "64", "--kv-topic", "kv"},
			want: with(func(c *serveConfig) {
				c.Workers = []workerSpec{{ID: 1, Endpoint: "tcp://h:5557"}, {ID: 2, Rank: 1, Endpoint: "tcp://h:5558", ReplayEndpoint: "tcp://h:5559"}}
				c.ModelName, c.TenantID, c.BlockSize, c.KVTopic = "m:v1", "t", 64, "kv"
			}),
		},
		{
			name: "workers from file",
			args: []string{"--config", workersFile},
			want: with(func(c *serveConfig) {
				c.ConfigFile, c.Workers, c.ModelName, c.BlockSize = workersFile, []workerSpec{{ID: 7, Endpoint: "tcp://e:1"}}, "llama", 32
			}),
		},
		{name: "worker without endpoint", args: []string{"--workers", "1"}, wantErr: `invalid workers "1" (from flag --workers): worker "1": want id[:dp_rank]=endpoint`},
		{name: "worker bad id", args: []string{"--workers", "x=tcp://h:1"}, wantErr: `id "x" is not an unsigned integer`},
		{name: "worker bad rank", args: []string{"--workers", "1:-1=tcp://h:1"}, wantErr: `dp_rank "-1"`},
		{name: "worker bind endpoint", args: []string{"--workers", "1=tcp://*:5557"}, wantErr: "bind address"},
		{name: "worker bad transport", args: []string{"--workers", "1=udp://h:1"}, wantErr: `transport "udp" not supported`},
		{name: "worker bad replay", args: []string{"--workers", "1=tcp://h:1|h:2"}, wantErr: "replay endpoint"},
		{name: "worker twice", args: []string{"--workers", "1=tcp://h:1,1:0=tcp://h:2"}, wantErr: "worker 1 rank 0 listed twice"},
		{name: "block size 0", env: map[string]string{"KVGATE_BLOCK_SIZE": "0"}, wantErr: "invalid block-size 0 (from env KVGATE_BLOCK_SIZE)"},
		{name: "block size over the bound", args: []string{"--block-size", "65537"}, wantErr: "invalid block-size 65537 (from flag --block-size): must be between 1 and 65536"},
		{name: "block size 2^63-1", args: []string{"--block-size", "9223372036854775807"}, wantErr: "must be between 1 and 65536"},
		{name: "empty model", args: []string{"--model-name", " "}, wantErr: "invalid model-name"},
		{
			name: "admin api settings",
			args: []string{"--admin-token", " tok ", "--max-body", "512KiB", "--peers", "http://a:8090/, https://b", "--peer-timeout", "2s", "--min-initial-workers", "3"},
			want: with(func(c *serveConfig) {
				c.AdminToken, c.MaxBody, c.Peers, c.PeerTimeout, c.MinInitialWorkers = "tok", 512<<10, []string{"http://a:8090", "https://b"}, 2*time.Second, 3
			}),
		},
		{name: "max-body in bytes", env: map[string]string{"KVGATE_MAX_BODY": "1000"}, want: with(func(c *serveConfig) { c.MaxBody = 1000 })},
		{name: "max-body 1MB", args: []string{"--max-body", "1MB"}, want: with(func(c *serveConfig) { c.MaxBody = 1e6 })},
		{name: "max-body zero", args: []string{"--max-body", "0"}, wantErr: `invalid max-body "0" (from flag --max-body): want a positive size`},
		{name: "max-body junk", args: []string{"--max-body", "8 furlongs"}, wantErr: `invalid max-body "8 furlongs"`},
		{name: "test routes off by default", want: with(func(c *serveConfig) { c.EnableTestRoutes = false })},
		{name: "test routes flag", args: []string{"--enable-test-routes"}, want: with(func(c *serveConfig) { c.EnableTestRoutes = true })},
		{name: "test routes env", env: map[string]string{"KVGATE_ENABLE_TEST_ROUTES": "true"}, want: with(func(c *serveConfig) { c.EnableTestRoutes = true })},
		{name: "test routes YAML", args: []string{"--config", testRoutesFile}, want: with(func(c *serveConfig) { c.ConfigFile, c.EnableTestRoutes = testRoutesFile, true })},
		{name: "test routes flag beats env", args: []string{"--enable-test-routes=false"}, env: map[string]string{"KVGATE_ENABLE_TEST_ROUTES": "1"}, want: def},
		{name: "test routes not a bool", env: map[string]string{"KVGATE_ENABLE_TEST_ROUTES": "maybe"}, wantErr: `invalid enable-test-routes "maybe" (from env KVGATE_ENABLE_TEST_ROUTES): want true or false`},
		{name: "peer not a URL", args: []string{"--peers", "host:8090"}, wantErr: `invalid peers "host:8090" (from flag --peers): peer url "host:8090" is not an http(s)://host:port base URL`},
		{name: "peer-timeout zero", args: []string{"--peer-timeout", "0s"}, wantErr: "invalid peer-timeout"},
		{name: "min workers from Dynamo env", env: map[string]string{dynMinWorkersEnv: "2"}, want: with(func(c *serveConfig) { c.MinInitialWorkers = 2 })},
		{name: "min workers flag beats Dynamo env", args: []string{"--min-initial-workers", "1"}, env: map[string]string{dynMinWorkersEnv: "2"}, want: with(func(c *serveConfig) { c.MinInitialWorkers = 1 })},
		{name: "min workers KVGATE env beats Dynamo env", env: map[string]string{dynMinWorkersEnv: "2", "KVGATE_MIN_INITIAL_WORKERS": "5"}, want: with(func(c *serveConfig) { c.MinInitialWorkers = 5 })},
		{name: "Dynamo env invalid", env: map[string]string{dynMinWorkersEnv: "many"}, wantErr: `invalid DYN_ROUTER_MIN_INITIAL_WORKERS "many": want a non-negative integer`},
		{name: "min workers negative", args: []string{"--min-initial-workers", "-1"}, wantErr: "invalid min-initial-workers -1 (from flag --min-initial-workers): must be >= 0"},
		{
			name: "replica sync",
			args: []string{"--replica-sync-port", "9092", "--replica-sync-peers", " tcp://Kvgate-B:9092, tcp://10.0.0.3:9092,,tcp://kvgate-b:9092"},
			want: with(func(c *serveConfig) {
				c.ReplicaSyncPort, c.ReplicaSyncPeers = 9092, []string{"tcp://kvgate-b:9092", "tcp://10.0.0.3:9092"}
			}),
		},
		{
			name: "replica sync from env",
			env:  map[string]string{"KVGATE_REPLICA_SYNC_PORT": "9092", "KVGATE_REPLICA_SYNC_PEERS": "tcp://[::1]:9093"},
			want: with(func(c *serveConfig) { c.ReplicaSyncPort, c.ReplicaSyncPeers = 9092, []string{"tcp://[::1]:9093"} }),
		},
		{
			name: "replica sync from file",
			args: []string{"--config", syncFile},
			want: with(func(c *serveConfig) {
				c.ConfigFile, c.ReplicaSyncPort, c.ReplicaSyncPeers = syncFile, 9092, []string{"tcp://b:9092"}
			}),
		},
		{name: "replica sync port only", args: []string{"--replica-sync-port", "9092"}, want: with(func(c *serveConfig) { c.ReplicaSyncPort = 9092 })},
		{name: "replica sync port too big", args: []string{"--replica-sync-port", "70000"}, wantErr: "invalid replica-sync-port 70000 (from flag --replica-sync-port): must be between 1 and 65535, or 0 for off"},
		{name: "replica sync port negative", env: map[string]string{"KVGATE_REPLICA_SYNC_PORT": "-1"}, wantErr: `invalid replica-sync-port -1 (from env KVGATE_REPLICA_SYNC_PORT)`},
		{name: "replica sync port not a number", env: map[string]string{"KVGATE_REPLICA_SYNC_PORT": "ninety"}, wantErr: `invalid replica-sync-port "ninety" (from env KVGATE_REPLICA_SYNC_PORT): want an integer`},
		{name: "replica sync peers without port", args: []string{"--replica-sync-peers", "tcp://b:9092"}, wantErr: `invalid replica-sync-peers "tcp://b:9092" (from flag --replica-sync-peers): requires --replica-sync-port`},
		{name: "replica sync peer without scheme", args: []string{"--replica-sync-port", "1", "--replica-sync-peers", "b:9092"}, wantErr: `invalid replica-sync-peers "b:9092" (from flag --replica-sync-peers): replica sync endpoint "b:9092" is not tcp://host:port: want the tcp:// scheme`},
		{name: "replica sync peer bind address", args: []string{"--replica-sync-port", "1", "--replica-sync-peers", "tcp://*:9092"}, wantErr: "is not a host name or address"},
		{name: "replica sync peer without port", args: []string{"--replica-sync-port", "1", "--replica-sync-peers", "tcp://b"}, wantErr: "no host:port"},
		{name: "gateway flags", args: []string{"--ext-proc-addr", "", "--proxy-addr", "127.0.0.1:8080", "--models", "m.yaml",
			"--worker-endpoints", "1=10.0.0.1:8000, 2=http://10.0.0.2:8000", "--fallbacks", "2", "--max-requests-per-rank", "8", "--routing-policy", "prefix-hash"},
			want: with(func(c *serveConfig) {
				c.ExtProcAddr, c.ProxyAddr, c.ModelsFile, c.Fallbacks, c.MaxRequestsPerRank = "", "127.0.0.1:8080", "m.yaml", 2, 8
				c.RoutingPolicy = "prefix-hash"
				c.WorkerEndpoints = map[uint64]string{1: "10.0.0.1:8000", 2: "10.0.0.2:8000"}
			})},
		{name: "gateway TLS", env: map[string]string{"KVGATE_TLS_CERT": "c.pem", "KVGATE_TLS_KEY": "k.pem"},
			want: with(func(c *serveConfig) { c.TLSCert, c.TLSKey = "c.pem", "k.pem" })},
		{name: "TLS cert without key", args: []string{"--tls-cert", "c.pem"}, wantErr: "--tls-cert and --tls-key go together"},
		{name: "kubernetes discovery", args: []string{"--discovery", "kubernetes", "--pool-name", "llama", "--pod-model-label", "kvgate.io/model",
			"--kv-replay-template", "tcp://{podIP}:{5657+rank}", "--kubeconfig", "/k.yaml", "--pool-api-version", "v1"},
			env: map[string]string{"KVGATE_POOL_NAMESPACE": "inference"},
			want: with(func(c *serveConfig) {
				c.Discovery, c.PoolName, c.PoolNamespace, c.PodModelLabel = "kubernetes", "llama", "inference", "kvgate.io/model"
				c.KVReplayTemplate, c.Kubeconfig, c.PoolAPIVersion = "tcp://{podIP}:{5657+rank}", "/k.yaml", "v1"
			})},
		{name: "kubernetes discovery without pool", args: []string{"--discovery", "kubernetes", "--pool-name", "p"}, wantErr: "needs --pool-name and --pool-namespace"},
		{name: "pool without discovery", args: []string{"--pool-name", "p"}, wantErr: "needs --discovery kubernetes"},
		{name: "unknown discovery", args: []string{"--discovery", "consul"}, wantErr: "want static or kubernetes"},
		{name: "engine metrics", args: []string{"--metrics-scrape-interval", "2s"}, env: map[string]string{"KVGATE_METRICS_LOAD_WEIGHT": "0.5"},
			want: with(func(c *serveConfig) { c.MetricsScrapeInterval, c.MetricsLoadWeight = 2*time.Second, 0.5 })},
		{name: "metrics weight without scrapes", args: []string{"--metrics-load-weight", "1"}, wantErr: "needs --metrics-scrape-interval > 0"},
		{name: "negative metrics weight", args: []string{"--metrics-scrape-interval", "1s", "--metrics-load-weight", "-1"}, wantErr: "want a finite number >= 0"},
		{name: "metrics weight not a number", args: []string{"--metrics-scrape-interval", "1s"}, env: map[string]string{"KVGATE_METRICS_LOAD_WEIGHT": "NaN"}, wantErr: "want a finite number >= 0"},
		{name: "cost defaults", args: []string{"--overlap-weight", "0", "--router-temperature", "0.5"},
			want: with(func(c *serveConfig) { c.OverlapWeight, c.RouterTemperature = 0, 0.5 })},
		{name: "reuse weight from flag", args: []string{"--reuse-weight", "4"}, want: with(func(c *serveConfig) { c.ReuseWeight = 4 })},
		{name: "reuse weight 0 from env: the spec's cost", env: map[string]string{"KVGATE_REUSE_WEIGHT": "0"}, want: with(func(c *serveConfig) { c.ReuseWeight = 0 })},
		{name: "reuse weight from file", args: []string{"--config", reuseFile}, want: with(func(c *serveConfig) { c.ConfigFile, c.ReuseWeight = reuseFile, 32 })},
		{name: "negative reuse weight", args: []string{"--reuse-weight", "-1"}, wantErr: `invalid reuse-weight "-1" (from flag --reuse-weight): want a finite number >= 0`},
		{name: "infinite reuse weight", env: map[string]string{"KVGATE_REUSE_WEIGHT": "+Inf"}, wantErr: `invalid reuse-weight "+Inf" (from env KVGATE_REUSE_WEIGHT): want a finite number >= 0`},
		{name: "NaN overlap weight", env: map[string]string{"KVGATE_OVERLAP_WEIGHT": "NaN"}, wantErr: `invalid overlap-weight "NaN" (from env KVGATE_OVERLAP_WEIGHT): want a finite number >= 0`},
		{name: "negative overlap weight", env: map[string]string{"KVGATE_OVERLAP_WEIGHT": "-2"}, wantErr: `invalid overlap-weight "-2" (from env KVGATE_OVERLAP_WEIGHT): want a finite number >= 0`},
		{name: "negative scrape interval", args: []string{"--metrics-scrape-interval", "-1s"}, wantErr: "want a duration >= 0"},
		{name: "bad routing policy", args: []string{"--routing-policy", "fastest"}, wantErr: `invalid routing-policy "fastest" (from flag --routing-policy): want kv, round-robin`},
		{name: "bad ext-proc addr", args: []string{"--ext-proc-addr", "9002"}, wantErr: `invalid ext-proc-addr "9002" (from flag --ext-proc-addr): want host:port`},
		{name: "bad worker endpoint", args: []string{"--worker-endpoints", "1=nohost"}, wantErr: `invalid worker-endpoints "1=nohost" (from flag --worker-endpoints): entry "1=nohost": want id=host:port`},
		{name: "duplicate worker endpoint", args: []string{"--worker-endpoints", "1=a:1,1=b:2"}, wantErr: "worker 1 listed twice"},
		{name: "negative fallbacks", args: []string{"--fallbacks", "-1"}, wantErr: "invalid fallbacks"},
		{name: "Dynamo env does not skip later checks", args: []string{"--replica-sync-peers", "tcp://b:1"}, env: map[string]string{dynMinWorkersEnv: "2"}, wantErr: "requires --replica-sync-port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			unsetKvgateEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cmd := newServeCmd()
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := loadServeConfig(cmd)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("config = %+v\nwant     %+v", got, tc.want)
			}
		})
	}
}

// TestServeFlagLowerBounds checks that help, README and validation agree
// on each bounded integer flag: the help and the README's row state the
// least value, which loads, and one less fails with an error naming it.
func TestServeFlagLowerBounds(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	addServeFlags(fs)
	for _, tc := range []struct {
		flag string
		min  int
	}{
		{"event-threads", 1},
		{"index-shards", 1},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			bound := fmt.Sprintf(">= %d", tc.min)
			if help := fs.Lookup(tc.flag).Usage; !strings.Contains(help, bound) {
				t.Errorf("--%s help does not state %q: %q", tc.flag, bound, help)
			}
			row := regexp.MustCompile("(?m)^\\| `--" + regexp.QuoteMeta(tc.flag) + "` .*$").Find(readme)
			if !bytes.Contains(row, []byte(bound)) {
				t.Errorf("README's row of --%s does not state %q: %q", tc.flag, bound, row)
			}
			unsetKvgateEnv(t)
			for v, wantErr := range map[int]string{
				tc.min:     "",
				tc.min - 1: fmt.Sprintf("invalid %s %d (from flag --%s): must be %s", tc.flag, tc.min-1, tc.flag, bound),
			} {
				cmd := newServeCmd()
				if err := cmd.ParseFlags([]string{"--" + tc.flag, strconv.Itoa(v)}); err != nil {
					t.Fatal(err)
				}
				_, err := loadServeConfig(cmd)
				if wantErr == "" && err != nil {
					t.Errorf("--%s %d: %v", tc.flag, v, err)
				}
				if wantErr != "" && (err == nil || err.Error() != wantErr) {
					t.Errorf("--%s %d: error %v, want %q", tc.flag, v, err, wantErr)
				}
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	if got := envName("admin-addr"); got != "KVGATE_ADMIN_ADDR" {
		t.Errorf("envName(admin-addr) = %q", got)
	}
}

func TestRunInProcess(t *testing.T) {
	unsetKvgateEnv(t)
	tests := []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string // exact
	}{
		{args: []string{"version"}, wantStdout: fmt.Sprintf("kvgate %s (%s)\n", versionString(), runtime.Version())},
		{args: []string{"serve", "--event-threads", "0"}, wantCode: 1,
			wantStderr: "kvgate: invalid event-threads 0 (from flag --event-threads): must be >= 1\n"},
		{args: []string{"serve", "--no-such-flag"}, wantCode: 1, wantStderr: "kvgate: unknown flag: --no-such-flag\n"},
		{args: []string{"serve", "extra"}, wantCode: 1, wantStderr: "kvgate: unknown command \"extra\" for \"kvgate serve\"\n"},
		{args: []string{"serv"}, wantCode: 1, wantStderr: "kvgate: unknown command \"serv\" for \"kvgate\" Did you mean this? serve\n"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tc.args, strings.NewReader(""), &stdout, &stderr)
			if code != tc.wantCode || stdout.String() != tc.wantStdout || stderr.String() != tc.wantStderr {
				t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d, %q, %q",
					tc.args, code, stdout.String(), stderr.String(), tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
		})
	}
}

// testClient does not keep connections alive, so no goroutines outlive a test.
func testClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// do sends a request and returns the status, headers and body.
func do(t *testing.T, c *http.Client, method, url string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

func discardLogger() *slog.Logger { return newLogger(io.Discard, serveConfig{LogLevel: "error"}) }

// testAdmin returns an admin server with the process routes and extra.
func testAdmin(extra ...admin.Route) *admin.Server {
	srv := admin.New(admin.Options{})
	srv.Handle(processRoutes(prometheus.NewRegistry(), discardLogger())...)
	srv.Handle(extra...)
	return srv
}

func TestServeAdminGracefulShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- serveAdmin(ctx, []servedListener{{name: "admin", ln: ln, h: testAdmin()}}, 5*time.Second, discardLogger())
	}()

	status, _, body := do(t, testClient(t), "GET", "http://"+ln.Addr().String()+"/health")
	if status != 200 || strings.TrimSpace(body) != `{"status":"ok"}` {
		t.Fatalf("GET /health = %d %s", status, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serveAdmin = %v, want nil after clean shutdown", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("listener still accepting after shutdown")
	}
}

func TestServeAdminShutdownTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	srv := testAdmin(admin.Route{Pattern: "GET /slow", Handler: func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
	}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- serveAdmin(ctx, []servedListener{{name: "admin", ln: ln, h: srv}}, 50*time.Millisecond, discardLogger())
	}()

	c := testClient(t)
	reqDone := make(chan struct{})
	go func() {
		defer close(reqDone)
		if resp, err := c.Get("http://" + ln.Addr().String() + "/slow"); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	cancel()
	err = <-done
	close(release)
	<-reqDone
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("serveAdmin = %v, want a shutdown deadline error", err)
	}
}

// kvgateProc is a kvgate child process whose stderr is collected line by line.
type kvgateProc struct {
	cmd     *exec.Cmd
	stdout  bytes.Buffer
	changed chan struct{} // signalled (capacity 1) when a line is added
	eof     chan struct{} // closed when stderr is drained

	mu    sync.Mutex
	lines []string

	waitOnce sync.Once
	code     int
}

func startKvgate(t *testing.T, ctx context.Context, args ...string) *kvgateProc {
	t.Helper()
	return startKvgateEnv(t, ctx, nil, args...)
}

// startKvgateEnv starts kvgate with args and, on top of the test's
// environment without its KVGATE_* and DYN_* variables, env ("K=V").
func startKvgateEnv(t *testing.T, ctx context.Context, env []string, args ...string) *kvgateProc {
	t.Helper()
	p := &kvgateProc{changed: make(chan struct{}, 1), eof: make(chan struct{})}
	if len(args) > 0 && args[0] == "serve" && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--ext-proc-addr") }) {
		// Not the default :9002: tests run several kvgate processes at once.
		args = append(slices.Clone(args), "--ext-proc-addr", "127.0.0.1:0")
	}
	p.cmd = exec.CommandContext(ctx, kvgateBin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) && !strings.HasPrefix(kv, "DYN_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout = &p.stdout
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.eof)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.changed <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill() // no-op error if it already exited
		p.wait()
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *kvgateProc) wait() int {
	p.waitOnce.Do(func() {
		<-p.eof // all reads from the pipe must finish before Wait
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
	})
	return p.code
}

func (p *kvgateProc) stderrLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// waitLine waits until a stderr line satisfies match and returns it.
func (p *kvgateProc) waitLine(ctx context.Context, match func(string) bool) (string, error) {
	for i := 0; ; {
		lines := p.stderrLines()
		for ; i < len(lines); i++ {
			if match(lines[i]) {
				return lines[i], nil
			}
		}
		select {
		case <-p.changed:
		case <-p.eof:
			if len(p.stderrLines()) == i {
				return "", fmt.Errorf("stderr closed; lines:\n%s", strings.Join(lines, "\n"))
			}
		case <-ctx.Done():
			return "", fmt.Errorf("%w; lines so far:\n%s", ctx.Err(), strings.Join(lines, "\n"))
		}
	}
}

var textAddrRE = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)

// adminAddr waits for the "admin listening" log line and returns its address.
func (p *kvgateProc) adminAddr(t *testing.T, ctx context.Context) string {
	t.Helper()
	var addr string
	_, err := p.waitLine(ctx, func(line string) bool {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "admin listening" {
			addr = rec.Addr
			return true
		}
		if m := textAddrRE.FindStringSubmatch(line); m != nil {
			addr = m[1]
			return true
		}
		return false
	})
	if err != nil {
		t.Fatalf("waiting for admin listening: %v", err)
	}
	return addr
}

func e2eContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestE2EServe(t *testing.T) {
	tests := []struct {
		format string
		sig    syscall.Signal
	}{
		{"json", syscall.SIGTERM},
		{"text", syscall.SIGINT},
	}
	for _, tc := range tests {
		t.Run(tc.format+"/"+tc.sig.String(), func(t *testing.T) {
			ctx := e2eContext(t)
			p := startKvgate(t, ctx, "serve", "--admin-addr", "127.0.0.1:0", "--log-format", tc.format)
			base := "http://" + p.adminAddr(t, ctx)
			c := testClient(t)

			status, hdr, body := do(t, c, "GET", base+"/health")
			if status != 200 || hdr.Get("Content-Type") != "application/json" {
				t.Errorf("GET /health = %d (Content-Type %q)", status, hdr.Get("Content-Type"))
			}
			var health map[string]string
			if err := json.Unmarshal([]byte(body), &health); err != nil || health["status"] != "ok" {
				t.Errorf("GET /health body = %q (%v)", body, err)
			}

			status, _, body = do(t, c, "GET", base+"/no/such/route")
			var notFound map[string]string
			if err := json.Unmarshal([]byte(body), &notFound); status != 404 || err != nil || notFound["error"] == "" {
				t.Errorf("GET /no/such/route = %d %q, want 404 with a JSON error", status, body)
			}

			if err := p.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(); code != 0 {
				t.Errorf("exit code = %d, want 0; stderr:\n%s", code, strings.Join(p.stderrLines(), "\n"))
			}
			if _, err := p.waitLine(ctx, func(l string) bool { return strings.Contains(l, "shutdown complete") }); err != nil {
				t.Errorf("no \"shutdown complete\" log line: %v", err)
			}
		})
	}
}

func TestE2EVersion(t *testing.T) {
	p := startKvgate(t, e2eContext(t), "version")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit code = %d; stderr: %q", code, p.stderrLines())
	}
	want := fmt.Sprintf("kvgate %s (%s)\n", testVersion, runtime.Version())
	if got := p.stdout.String(); got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
}

func TestE2EInvalidConfig(t *testing.T) {
	p := startKvgate(t, e2eContext(t), "serve", "--event-threads", "0")
	if code := p.wait(); code != 1 {
		t.Errorf("exit code = %d, want 1", code)
	}
	lines := p.stderrLines()
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "kvgate: ") || !strings.Contains(lines[0], "event-threads") {
		t.Errorf("stderr = %q, want one line \"kvgate: ...event-threads...\"", lines)
	}
}

func TestE2EPortInUse(t *testing.T) {
	ctx := e2eContext(t)
	first := startKvgate(t, ctx, "serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json")
	addr := first.adminAddr(t, ctx)

	second := startKvgate(t, ctx, "serve", "--admin-addr", addr)
	if code := second.wait(); code == 0 {
		t.Errorf("second kvgate on %s exited 0, want non-zero", addr)
	}
	var errLines []string
	for _, l := range second.stderrLines() {
		if strings.HasPrefix(l, "kvgate: ") {
			errLines = append(errLines, l)
		}
	}
	if len(errLines) != 1 || !strings.Contains(errLines[0], addr) {
		t.Errorf("stderr error lines = %q, want one \"kvgate: ...\" line naming %s", errLines, addr)
	}

	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := first.wait(); code != 0 {
		t.Errorf("first kvgate exit code = %d, want 0", code)
	}
}

// TestE2EWorkersFlag runs the binary with --workers pointing at an engine
// publisher and follows the events into /metrics.
func TestE2EWorkersFlag(t *testing.T) {
	ctx := e2eContext(t)
	pub, err := engine.NewPublisher(ctx, engine.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	p := startKvgate(t, ctx, "serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json",
		"--workers", fmt.Sprintf("7:1=%s|%s", pub.Endpoint(), pub.ReplayEndpoint()), "--model-name", "llama", "--block-size", "4")
	base := "http://" + p.adminAddr(t, ctx)
	if _, err := p.waitLine(ctx, func(l string) bool { return strings.Contains(l, "kv event listener connected") }); err != nil {
		t.Fatal(err)
	}
	if err := pub.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	// The first batch is dropped from the live stream: replay delivers it.
	for i := range 3 {
		ev := engine.BlockStored{BlockHashes: []uint64{uint64(i)}, TokenIDs: []uint32{1, 2, 3, uint32(i)}, BlockSize: 4}
		if i == 0 {
			if _, err := pub.Publish(); err != nil { // an empty batch 0, never sent
				t.Fatal(err)
			}
			continue
		}
		if _, err := pub.Publish(ev); err != nil {
			t.Fatal(err)
		}
	}
	c := testClient(t)
	want := `kvgate_kv_event_events_applied_total{kind="stored"} 2`
	for {
		status, _, body := do(t, c, "GET", base+"/metrics")
		if status != 200 {
			t.Fatalf("GET /metrics = %d", status)
		}
		if strings.Contains(body, want) && strings.Contains(body, `kvgate_kv_event_listeners{status="active"} 1`) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("metrics never showed %q:\n%s", want, body)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d; stderr:\n%s", code, strings.Join(p.stderrLines(), "\n"))
	}
}

func TestE2EWorkersFlagInvalid(t *testing.T) {
	ctx := e2eContext(t)
	p := startKvgate(t, ctx, "serve", "--admin-addr", "127.0.0.1:0", "--workers", "1=tcp://*:5557")
	if code := p.wait(); code == 0 {
		t.Fatal("kvgate accepted a bind address as a worker endpoint")
	}
	lines := p.stderrLines()
	if len(lines) != 1 || !strings.Contains(lines[0], "bind address") {
		t.Errorf("want one line naming the problem, got:\n%s", strings.Join(lines, "\n"))
	}
}

func FuzzParseWorkers(f *testing.F) {
	for _, s := range []string{"1=tcp://h:5557", "1=tcp://h:5557,2:1=tcp://h:5558|tcp://h:5559", "x", "1:=", ",,", "1=ipc:///tmp/kv"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ws, err := parseWorkers(s)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		seen := map[[2]uint64]bool{}
		for _, w := range ws {
			if kvevents.ValidateEndpoint(w.Endpoint) != nil || (w.ReplayEndpoint != "" && kvevents.ValidateEndpoint(w.ReplayEndpoint) != nil) {
				t.Fatalf("accepted invalid endpoint in %+v", w)
			}
			k := [2]uint64{w.ID, uint64(w.Rank)}
			if seen[k] {
				t.Fatalf("duplicate %v accepted", k)
			}
			seen[k] = true
		}
	})
}

// adminRouteTable returns the admin listener's route table as runServe
// builds it with --enable-test-routes (replica sync off: its routes have
// the same patterns on).
func adminRouteTable(t *testing.T) []admin.Route {
	t.Helper()
	logger := discardLogger()
	st := stacktest.New(t, stacktest.Options{})
	set, cat := st.Set, st.Catalog
	loads := scheduler.NewLoads(scheduler.LoadOptions{})
	cat.Watch(loads.Follow)
	sched := scheduler.NewScheduler(cat, set, loads, scheduler.CostOptions{}, 1, nil)
	peers, err := httpapi.NewPeers(nil)
	if err != nil {
		t.Fatal(err)
	}
	return adminRoutes(prometheus.NewRegistry(), logger, httpapi.IndexRoutes(set, peers, nil),
		workerRoutes(cat, nil, true), httpapi.ServiceRoutes(cat, sched, set), httpapi.ReplicaSyncOffRoutes())
}

// TestTestRoutesNeedTheFlag checks that Dynamo's /test/ routes are in the
// admin route table only with --enable-test-routes.
func TestTestRoutesNeedTheFlag(t *testing.T) {
	cat := stacktest.New(t, stacktest.Options{}).Catalog
	for _, on := range []bool{false, true} {
		var got []string
		for _, rt := range workerRoutes(cat, nil, on) {
			if strings.Contains(rt.Pattern, " /test/") {
				got = append(got, rt.Pattern)
			}
		}
		if want := map[bool]int{false: 0, true: 2}[on]; len(got) != want {
			t.Errorf("test routes on %v: %v, want %d routes", on, got, want)
		}
	}
}

// routeFamily is a route path up to its first wildcard: "/workers/{id}"
// and "/reservations/{id}/free" are "/workers" and "/reservations".
func routeFamily(path string) string {
	path, _, _ = strings.Cut(path, "/{")
	return path
}

var helpPathRE = regexp.MustCompile(`/[a-z_]+(/[a-z_]+)*`)

// TestAdminTokenHelp checks --admin-token's help against the route table:
// it names the family of every route the token guards, with its method,
// and no path the token does not guard.
func TestAdminTokenHelp(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	addServeFlags(fs)
	help := fs.Lookup("admin-token").Usage
	mentioned := map[string]bool{}
	for _, p := range helpPathRE.FindAllString(help, -1) {
		mentioned[p] = true
	}
	guarded := map[string]bool{}
	for _, rt := range adminRouteTable(t) {
		if !rt.Mutates {
			continue
		}
		method, path, _ := strings.Cut(rt.Pattern, " ")
		fam := routeFamily(path)
		guarded[fam] = true
		if !mentioned[fam] || !strings.Contains(help, method+" ") {
			t.Errorf("--admin-token guards %s, but its help names no %s %s: %q", rt.Pattern, method, fam, help)
		}
	}
	if len(guarded) < 10 {
		t.Fatalf("only %d guarded route families in the table: %v", len(guarded), guarded)
	}
	for p := range mentioned {
		if !guarded[p] {
			t.Errorf("--admin-token's help names %s, which the token does not guard", p)
		}
	}
}

// TestBinaryLinksNoTesting checks that the kvgate binary does not link
// package testing (test helpers of the packages it uses belong in packages
// only tests import, such as bench/engine/enginetest).
func TestBinaryLinksNoTesting(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps .: %v", err)
	}
	for dep := range strings.Lines(string(out)) {
		if strings.TrimSpace(dep) == "testing" {
			t.Fatal("the kvgate binary links package testing; find the importer with: go list -f '{{.ImportPath}}: {{.Imports}}' -deps . | grep -w testing")
		}
	}
}
