package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/httpapi"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/replica"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// envPrefix is the prefix of the environment variables that configure kvgate:
// flag --admin-addr <-> KVGATE_ADMIN_ADDR.
const envPrefix = "KVGATE_"

// configFlag names the flag (and KVGATE_CONFIG) that points at a YAML file.
// It is not itself a configuration key.
const configFlag = "config"

// serveConfig is the effective configuration of `kvgate serve`, after merging
// flags, KVGATE_* environment variables, the YAML file and defaults.
type serveConfig struct {
	ConfigFile string // path of the YAML file that was read, "" if none
	AdminAddr  string
	// Listeners of one service each ("": off): Dynamo's standalone
	// indexer (with Mooncake's conductor routes), slot tracker and
	// selection service.
	IndexerAddr     string
	SlotTrackerAddr string
	SelectionAddr   string
	EventThreads    int
	IndexShards     int    // shards of each index, >= 1
	LogLevel        string // debug | info | warn | error
	LogFormat       string // text | json
	ShutdownTimeout time.Duration

	// Workers registered at start (--workers), for ModelName / TenantID
	// with BlockSize tokens per block.
	Workers   []workerSpec
	ModelName string
	TenantID  string
	BlockSize int
	KVTopic   string

	AdminToken        string   // bearer token required on mutating admin routes; "" for none
	EnableTestRoutes  bool     // mount Dynamo's /test/ routes (pause and resume listeners)
	MaxBody           int64    // admin request body limit, bytes
	Peers             []string // indexers to recover the index from at start
	PeerTimeout       time.Duration
	MinInitialWorkers int

	// Replica sync: the port of this replica's ZMQ PUB socket (0: off)
	// and the PUB endpoints of the other replicas.
	ReplicaSyncPort  int
	ReplicaSyncPeers []string

	// The gateway: the ext_proc server's address (TLS with both files),
	// the embedded proxy's ("" for off), the models configuration file,
	// where the --workers' requests go, fallbacks and the load limit.
	ExtProcAddr        string
	TLSCert, TLSKey    string
	ProxyAddr          string
	ModelsFile         string
	WorkerEndpoints    map[uint64]string
	Fallbacks          int
	MaxRequestsPerRank int
	// RoutingPolicy is kvgate's KV-aware routing or a baseline to compare
	// it with.
	RoutingPolicy extproc.Policy

	// Engine metrics: how often workers' /metrics are scraped (0: never)
	// and the weight of their load in the cost (0: not used).
	MetricsScrapeInterval time.Duration
	MetricsLoadWeight     float64

	// OverlapWeight and RouterTemperature are the cost function's defaults
	// (docs/scheduling.md); requests to /select may override them.
	OverlapWeight     float64
	RouterTemperature float64
	// ReuseWeight charges the gateway's KV-aware decisions for the cached
	// prefix they give up (scheduler.CostOptions.ReuseWeight); 0: the
	// spec's cost. /select never uses it.
	ReuseWeight float64

	// Discovery is "static" (flags and HTTP registration only) or
	// "kubernetes" (the workers of an InferencePool, with the Pool* and
	// template settings).
	Discovery        string
	PoolName         string
	PoolNamespace    string
	PoolAPIVersion   string
	PodModelLabel    string
	KVEventsTemplate string
	KVReplayTemplate string
	Kubeconfig       string
}

// dynMinWorkersEnv is Dynamo's variable for the startup gate; kvgate honours
// it when --min-initial-workers is not set any other way.
const dynMinWorkersEnv = "DYN_ROUTER_MIN_INITIAL_WORKERS"

// workerSpec is one entry of --workers: id[:dp_rank]=endpoint[|replay_endpoint].
type workerSpec struct {
	ID             uint64
	Rank           uint32
	Endpoint       string
	ReplayEndpoint string
}

// parseWorkers parses --workers: comma-separated
// id[:dp_rank]=endpoint[|replay_endpoint] entries, e.g.
// "1=tcp://h:5557,2:1=tcp://h:5558|tcp://h:5559".
func parseWorkers(s string) ([]workerSpec, error) {
	var out []workerSpec
	seen := map[[2]uint64]bool{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, ep, ok := strings.Cut(entry, "=")
		if !ok || ep == "" {
			return nil, fmt.Errorf("worker %q: want id[:dp_rank]=endpoint", entry)
		}
		var w workerSpec
		idStr, rankStr, hasRank := strings.Cut(id, ":")
		var err error
		if w.ID, err = strconv.ParseUint(strings.TrimSpace(idStr), 10, 64); err != nil {
			return nil, fmt.Errorf("worker %q: id %q is not an unsigned integer", entry, idStr)
		}
		if hasRank {
			r, err := strconv.ParseUint(strings.TrimSpace(rankStr), 10, 31)
			if err != nil {
				return nil, fmt.Errorf("worker %q: dp_rank %q is not a small unsigned integer", entry, rankStr)
			}
			w.Rank = uint32(r)
		}
		w.Endpoint, w.ReplayEndpoint, _ = strings.Cut(strings.TrimSpace(ep), "|")
		if err := kvevents.ValidateEndpoint(w.Endpoint); err != nil {
			return nil, fmt.Errorf("worker %q: %w", entry, err)
		}
		if w.ReplayEndpoint != "" {
			if err := kvevents.ValidateEndpoint(w.ReplayEndpoint); err != nil {
				return nil, fmt.Errorf("worker %q: replay %w", entry, err)
			}
		}
		k := [2]uint64{w.ID, uint64(w.Rank)}
		if seen[k] {
			return nil, fmt.Errorf("worker %d rank %d listed twice", w.ID, w.Rank)
		}
		seen[k] = true
		out = append(out, w)
	}
	return out, nil
}

// addServeFlags defines the flags of `kvgate serve`. Every flag except
// --config is also a YAML key and a KVGATE_* environment variable.
func addServeFlags(fs *pflag.FlagSet) {
	fs.String(configFlag, "", "YAML configuration file (keys are the flag names); env KVGATE_CONFIG")
	fs.String("admin-addr", ":8090", "listen address of the admin HTTP server (every admin API, /metrics and /health); the default listens on all interfaces")
	fs.String("indexer-addr", "", "listen address of a listener serving only Dynamo's standalone indexer routes (with Mooncake's /conductor/ routes), /health, /ready and /metrics; empty: off (Dynamo's default port: 8090)")
	fs.String("slot-tracker-addr", "", "listen address of a listener serving only Dynamo's slot tracker routes, /health, /ready and /metrics; empty: off (Dynamo's default port: 8091)")
	fs.String("selection-addr", "", "listen address of a listener serving only Dynamo's selection service routes, /health, /ready and /metrics; empty: off (Dynamo's default port: 8092)")
	fs.Int("event-threads", 4, "goroutines applying KV events, sharded by worker (>= 1)")
	fs.Int("index-shards", 1, "shards of each KV index (>= 1), split by worker id, each a whole tree with writers of its own: events of workers in different shards apply in parallel (use a divisor of --event-threads, at most the cores); every match walks all shards, and never waits for writers")
	fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.String("log-format", "text", "log format: text or json")
	fs.Duration("shutdown-timeout", 10*time.Second, "how long to wait for in-flight requests on shutdown")
	fs.String("workers", "", `KV event publishers to register at start: comma-separated id[:dp_rank]=endpoint[|replay_endpoint], e.g. "1=tcp://h:5557,2:1=tcp://h:5558|tcp://h:5559"`)
	fs.String("model-name", "default", "model name of the workers given with --workers and --worker-endpoints, and of discovered pods (unless --pod-model-label); requests without a body are routed among its workers")
	fs.String("tenant-id", indexer.DefaultTenant, "tenant of the workers given with --workers or discovered, and of every request the gateway (ext_proc, proxy) routes")
	fs.Int("block-size", 16, "tokens per KV block of the workers given with --workers or discovered, and of --model-name when --models does not list it")
	fs.String("kv-topic", "", "ZMQ topic prefix to subscribe to on the KV event publishers of --workers and of discovered pods; empty: every topic")
	fs.String("admin-token", "", "bearer token (Authorization: Bearer <token>) required on every admin route that changes state: "+
		"workers (POST /register, /unregister, /workers; PATCH and DELETE /workers/{id}), "+
		"bookings (POST /add, /prefill_complete, /free, /select_and_reserve, /reservations and /reservations/{id}/...; DELETE /reservations/{id}), "+
		"peer lists (POST /register_peer, /deregister_peer, /replica_sync/register_peer, /replica_sync/deregister_peer) "+
		"and listeners (POST /test/pause_listener, /test/resume_listener, with --enable-test-routes); routes that only read stay open; empty: no token, every route open")
	fs.Bool("enable-test-routes", false, "mount Dynamo's test routes POST /test/pause_listener and /test/resume_listener, which stop and restart a worker's KV event listeners; off: they are 404")
	fs.String("max-body", "8MiB", "largest admin request body, in bytes or with a unit (KiB, MiB, GiB)")
	fs.String("peers", "", "comma-separated base URLs of indexers (kvgate or Dynamo) to recover the index from at start, first reachable wins")
	fs.Duration("peer-timeout", 10*time.Second, "how long to wait for one peer's /dump during recovery")
	fs.Int("min-initial-workers", 0, "active workers needed before /ready first answers 200 (and the ext_proc readiness turns SERVING); env "+dynMinWorkersEnv+" is honoured too")
	fs.Int("replica-sync-port", 0, "port of the ZMQ PUB socket (bound on tcp://*:<port>) sharing active-load events with other kvgate replicas; 0: replica sync off")
	fs.String("ext-proc-addr", ":9002", "listen address of the Envoy ext_proc (endpoint picker) gRPC server, plaintext unless --tls-cert; the default listens on all interfaces; empty: off")
	fs.String("tls-cert", "", "TLS certificate file for the ext_proc server (with --tls-key)")
	fs.String("tls-key", "", "TLS private key file for the ext_proc server (with --tls-cert)")
	fs.String("proxy-addr", "", "listen address of the embedded OpenAI-compatible proxy; empty: off")
	fs.String("models", "", "YAML file mapping served model names to tokenizers and block sizes (see README); --model-name is added when not listed, tokenized by its workers (else approximately)")
	fs.String("worker-endpoints", "", `where the requests of the --workers go: comma-separated id=host:port, e.g. "1=10.0.0.5:8000,2=10.0.0.6:8000"`)
	fs.Int("fallbacks", 0, "next-best endpoints listed after the chosen one (kv routing only), tried in order when a worker cannot be reached: by the embedded proxy, and by Envoy only with a load balancer that reads the list (keep 0 with envoy/envoy.yaml)")
	fs.Int("max-requests-per-rank", 0, "refuse requests with 429 when every candidate rank has this many active requests; 0: no limit")
	fs.Float64("overlap-weight", 1, "weight of prefill against decode load in the routing cost (Dynamo's overlap_score_weight): higher favours cached prefixes over balance")
	fs.Float64("reuse-weight", scheduler.DefaultReuseWeight, "kv routing (ext_proc, proxy) also charges a rank weight x overlap-weight x (its new prefill - the least any candidate needs)/block size: a prompt leaves the rank holding its longest cached prefix only when that rank's extra load outweighs (1 + weight) times the prefix; 0: the spec's (Dynamo's) cost, which /select always uses")
	fs.Float64("router-temperature", 0, "0 picks the cheapest rank; T > 0 samples ranks with p ∝ exp(-normalized cost / T)")
	fs.Duration("metrics-scrape-interval", 0, "how often to scrape every worker's /metrics (vLLM's num_requests_waiting, kv_cache_usage_perc), shown in /workers; 0: never")
	fs.Float64("metrics-load-weight", 0, "weight of the scraped engine load in the routing cost, as a correction to the load kvgate tracks (see README); 0: not used")
	fs.String("discovery", "static", "where workers come from besides flags and HTTP registration: static (nowhere else) or kubernetes (the Ready pods of an InferencePool)")
	fs.String("pool-name", "", "InferencePool to follow with --discovery kubernetes")
	fs.String("pool-namespace", "", "namespace of the InferencePool (and its pods) with --discovery kubernetes")
	fs.String("pool-api-version", "auto", "InferencePool API: auto (inference.networking.k8s.io/v1, else v1alpha2), v1 or v1alpha2")
	fs.String("pod-model-label", "", "pod label holding the served model name (overrides --model-name for that pod) with --discovery kubernetes")
	fs.String("kv-events-template", "tcp://{podIP}:{5557+rank}", "KV event endpoint of a discovered pod's DP rank ({podIP}, {rank}, {port}, {N+rank}); none: no events; the pod annotation kvgate.io/kv-events-endpoints overrides it")
	fs.String("kv-replay-template", "", "KV event replay endpoint of a discovered pod's DP rank, same placeholders; empty: none")
	fs.String("kubeconfig", "", "kubeconfig file for --discovery kubernetes; empty: the in-cluster configuration")
	fs.String("routing-policy", string(extproc.PolicyKV), "how requests are routed: kv (KV-cache-aware), or a baseline to compare with: round-robin, random, least-loaded, prefix-hash (approximate prefix routing on prompt bytes)")
	fs.String("replica-sync-peers", "", `comma-separated replica sync PUB endpoints of the other replicas, e.g. "tcp://kvgate-b:9092"; requires --replica-sync-port`)
}

// envName maps a flag name to its environment variable.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
}

// lookupEnv treats an empty variable as unset, as viper does.
func lookupEnv(name string) (string, bool) {
	v, ok := os.LookupEnv(name)
	return v, ok && v != ""
}

// loadServeConfig computes the effective configuration of cmd, whose flags
// must have been defined by addServeFlags and parsed. Precedence:
// flag > KVGATE_* environment > config file > default.
func loadServeConfig(cmd *cobra.Command) (serveConfig, error) {
	flags := cmd.Flags()
	v := viper.New()

	var keys []string
	flags.VisitAll(func(f *pflag.Flag) {
		if f.Name != configFlag && f.Name != "help" {
			keys = append(keys, f.Name)
		}
	})

	var cfg serveConfig
	if f := flags.Lookup(configFlag); f != nil && f.Changed {
		cfg.ConfigFile = f.Value.String()
		if cfg.ConfigFile == "" {
			return cfg, errors.New("--config: empty path")
		}
	} else if p, ok := lookupEnv(envName(configFlag)); ok {
		cfg.ConfigFile = p
	}

	fileKeys := map[string]bool{}
	if cfg.ConfigFile != "" {
		v.SetConfigFile(cfg.ConfigFile)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return cfg, fmt.Errorf("config file %s: not found", cfg.ConfigFile)
			}
			return cfg, fmt.Errorf("config file %s: %w", cfg.ConfigFile, err)
		}
		// Only the file has been loaded so far, so AllKeys is the file's keys.
		names := v.AllKeys()
		slices.Sort(names)
		for _, k := range names {
			if !slices.Contains(keys, k) {
				return cfg, fmt.Errorf("config file %s: unknown key %q (known keys: %s)",
					cfg.ConfigFile, k, strings.Join(keys, ", "))
			}
			fileKeys[k] = true
		}
	}

	for _, k := range keys {
		if err := v.BindPFlag(k, flags.Lookup(k)); err != nil {
			return cfg, err
		}
		if err := v.BindEnv(k, envName(k)); err != nil {
			return cfg, err
		}
	}

	// source describes where the value of key came from, for error messages.
	source := func(key string) string {
		if f := flags.Lookup(key); f != nil && f.Changed {
			return "flag --" + key
		}
		if _, ok := lookupEnv(envName(key)); ok {
			return "env " + envName(key)
		}
		if fileKeys[key] {
			return "config file " + cfg.ConfigFile
		}
		return "default"
	}
	// bad reports an invalid value, naming where it came from.
	bad := func(key string, val any, why string) error {
		if s, ok := val.(string); ok {
			val = strconv.Quote(s)
		}
		return fmt.Errorf("invalid %s %v (from %s): %s", key, val, source(key), why)
	}

	var err error
	if cfg.AdminAddr, err = getString(v, "admin-addr"); err != nil {
		return cfg, bad("admin-addr", v.Get("admin-addr"), err.Error())
	}
	if _, _, err := net.SplitHostPort(cfg.AdminAddr); err != nil {
		return cfg, bad("admin-addr", cfg.AdminAddr, "want host:port, e.g. :8090 or 127.0.0.1:8090")
	}
	for _, l := range []struct {
		key  string
		addr *string
		eg   string
	}{{"indexer-addr", &cfg.IndexerAddr, "8090"}, {"slot-tracker-addr", &cfg.SlotTrackerAddr, "8091"}, {"selection-addr", &cfg.SelectionAddr, "8092"}} {
		if *l.addr, err = getString(v, l.key); err != nil {
			return cfg, bad(l.key, v.Get(l.key), err.Error())
		}
		if *l.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(*l.addr); err != nil {
			return cfg, bad(l.key, *l.addr, fmt.Sprintf("want host:port, e.g. :%s or 127.0.0.1:%s (empty: off)", l.eg, l.eg))
		}
	}

	if cfg.EventThreads, err = getInt(v, "event-threads"); err != nil {
		return cfg, bad("event-threads", v.Get("event-threads"), err.Error())
	}
	if cfg.EventThreads < 1 {
		return cfg, bad("event-threads", cfg.EventThreads, "must be >= 1")
	}
	if cfg.IndexShards, err = getInt(v, "index-shards"); err != nil {
		return cfg, bad("index-shards", v.Get("index-shards"), err.Error())
	}
	if cfg.IndexShards < 1 {
		return cfg, bad("index-shards", cfg.IndexShards, "must be >= 1")
	}

	if cfg.LogLevel, err = getString(v, "log-level"); err != nil {
		return cfg, bad("log-level", v.Get("log-level"), err.Error())
	}
	cfg.LogLevel = strings.ToLower(strings.TrimSpace(cfg.LogLevel))
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, cfg.LogLevel) {
		return cfg, bad("log-level", cfg.LogLevel, "want debug, info, warn or error")
	}

	if cfg.LogFormat, err = getString(v, "log-format"); err != nil {
		return cfg, bad("log-format", v.Get("log-format"), err.Error())
	}
	cfg.LogFormat = strings.ToLower(strings.TrimSpace(cfg.LogFormat))
	if cfg.LogFormat != "text" && cfg.LogFormat != "json" {
		return cfg, bad("log-format", cfg.LogFormat, "want text or json")
	}

	if cfg.ShutdownTimeout, err = getDuration(v, "shutdown-timeout"); err != nil {
		return cfg, bad("shutdown-timeout", v.Get("shutdown-timeout"), err.Error())
	}
	if cfg.ShutdownTimeout <= 0 {
		return cfg, bad("shutdown-timeout", cfg.ShutdownTimeout.String(), "must be > 0")
	}

	workers, err := getString(v, "workers")
	if err != nil {
		return cfg, bad("workers", v.Get("workers"), err.Error())
	}
	if cfg.Workers, err = parseWorkers(workers); err != nil {
		return cfg, bad("workers", workers, err.Error())
	}
	if cfg.ModelName, err = getString(v, "model-name"); err != nil || strings.TrimSpace(cfg.ModelName) == "" {
		return cfg, bad("model-name", v.Get("model-name"), "want a non-empty string")
	}
	if cfg.TenantID, err = getString(v, "tenant-id"); err != nil || strings.TrimSpace(cfg.TenantID) == "" {
		return cfg, bad("tenant-id", v.Get("tenant-id"), "want a non-empty string")
	}
	if cfg.BlockSize, err = getInt(v, "block-size"); err != nil {
		return cfg, bad("block-size", v.Get("block-size"), err.Error())
	}
	if cfg.BlockSize < 1 || cfg.BlockSize > indexer.MaxBlockSize {
		return cfg, bad("block-size", cfg.BlockSize, fmt.Sprintf("must be between 1 and %d", indexer.MaxBlockSize))
	}
	if cfg.KVTopic, err = getString(v, "kv-topic"); err != nil {
		return cfg, bad("kv-topic", v.Get("kv-topic"), err.Error())
	}

	if cfg.AdminToken, err = getString(v, "admin-token"); err != nil {
		return cfg, bad("admin-token", "(hidden)", err.Error())
	}
	cfg.AdminToken = strings.TrimSpace(cfg.AdminToken)
	if cfg.EnableTestRoutes, err = getBool(v, "enable-test-routes"); err != nil {
		return cfg, bad("enable-test-routes", v.Get("enable-test-routes"), err.Error())
	}
	maxBody, err := getString(v, "max-body")
	if err != nil {
		return cfg, bad("max-body", v.Get("max-body"), err.Error())
	}
	if cfg.MaxBody, err = parseSize(maxBody); err != nil {
		return cfg, bad("max-body", maxBody, err.Error())
	}
	peers, err := getString(v, "peers")
	if err != nil {
		return cfg, bad("peers", v.Get("peers"), err.Error())
	}
	for p := range strings.SplitSeq(peers, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		u, err := httpapi.NormalizePeerURL(p)
		if err != nil {
			return cfg, bad("peers", peers, err.Error())
		}
		cfg.Peers = append(cfg.Peers, u)
	}
	if cfg.PeerTimeout, err = getDuration(v, "peer-timeout"); err != nil {
		return cfg, bad("peer-timeout", v.Get("peer-timeout"), err.Error())
	}
	if cfg.PeerTimeout <= 0 {
		return cfg, bad("peer-timeout", cfg.PeerTimeout.String(), "must be > 0")
	}
	if s, ok := lookupEnv(dynMinWorkersEnv); ok && source("min-initial-workers") == "default" {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("invalid %s %q: want a non-negative integer", dynMinWorkersEnv, s)
		}
		cfg.MinInitialWorkers = n
	} else {
		if cfg.MinInitialWorkers, err = getInt(v, "min-initial-workers"); err != nil {
			return cfg, bad("min-initial-workers", v.Get("min-initial-workers"), err.Error())
		}
		if cfg.MinInitialWorkers < 0 {
			return cfg, bad("min-initial-workers", cfg.MinInitialWorkers, "must be >= 0")
		}
	}

	if cfg.ReplicaSyncPort, err = getInt(v, "replica-sync-port"); err != nil {
		return cfg, bad("replica-sync-port", v.Get("replica-sync-port"), err.Error())
	}
	if cfg.ReplicaSyncPort < 0 || cfg.ReplicaSyncPort > 65535 {
		return cfg, bad("replica-sync-port", cfg.ReplicaSyncPort, "must be between 1 and 65535, or 0 for off")
	}
	syncPeers, err := getString(v, "replica-sync-peers")
	if err != nil {
		return cfg, bad("replica-sync-peers", v.Get("replica-sync-peers"), err.Error())
	}
	for p := range strings.SplitSeq(syncPeers, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		ep, err := replica.NormalizeEndpoint(p)
		if err != nil {
			return cfg, bad("replica-sync-peers", syncPeers, err.Error())
		}
		if !slices.Contains(cfg.ReplicaSyncPeers, ep) {
			cfg.ReplicaSyncPeers = append(cfg.ReplicaSyncPeers, ep)
		}
	}
	if len(cfg.ReplicaSyncPeers) > 0 && cfg.ReplicaSyncPort == 0 {
		return cfg, bad("replica-sync-peers", syncPeers, "requires --replica-sync-port (this replica's own PUB port)")
	}

	for _, a := range []struct {
		key string
		dst *string
	}{{"ext-proc-addr", &cfg.ExtProcAddr}, {"proxy-addr", &cfg.ProxyAddr}} {
		if *a.dst, err = getString(v, a.key); err != nil {
			return cfg, bad(a.key, v.Get(a.key), err.Error())
		}
		if *a.dst != "" {
			if _, _, err := net.SplitHostPort(*a.dst); err != nil {
				return cfg, bad(a.key, *a.dst, "want host:port, e.g. :9002, or empty for off")
			}
		}
	}
	if cfg.TLSCert, err = getString(v, "tls-cert"); err != nil {
		return cfg, bad("tls-cert", v.Get("tls-cert"), err.Error())
	}
	if cfg.TLSKey, err = getString(v, "tls-key"); err != nil {
		return cfg, bad("tls-key", v.Get("tls-key"), err.Error())
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return cfg, bad("tls-cert", cfg.TLSCert, "--tls-cert and --tls-key go together")
	}
	if cfg.ModelsFile, err = getString(v, "models"); err != nil {
		return cfg, bad("models", v.Get("models"), err.Error())
	}
	eps, err := getString(v, "worker-endpoints")
	if err != nil {
		return cfg, bad("worker-endpoints", v.Get("worker-endpoints"), err.Error())
	}
	if cfg.WorkerEndpoints, err = parseWorkerEndpoints(eps); err != nil {
		return cfg, bad("worker-endpoints", eps, err.Error())
	}
	if cfg.Fallbacks, err = getInt(v, "fallbacks"); err != nil || cfg.Fallbacks < 0 {
		return cfg, bad("fallbacks", v.Get("fallbacks"), "want an integer >= 0")
	}
	if cfg.MaxRequestsPerRank, err = getInt(v, "max-requests-per-rank"); err != nil || cfg.MaxRequestsPerRank < 0 {
		return cfg, bad("max-requests-per-rank", v.Get("max-requests-per-rank"), "want an integer >= 0")
	}
	policy, err := getString(v, "routing-policy")
	if err != nil {
		return cfg, bad("routing-policy", v.Get("routing-policy"), err.Error())
	}
	if cfg.RoutingPolicy, err = extproc.ParsePolicy(policy); err != nil {
		return cfg, bad("routing-policy", policy, "want kv, round-robin, random, least-loaded or prefix-hash")
	}
	for _, k := range []struct {
		key string
		dst *float64
	}{{"overlap-weight", &cfg.OverlapWeight}, {"router-temperature", &cfg.RouterTemperature}, {"reuse-weight", &cfg.ReuseWeight}} {
		if *k.dst, err = getFloat(v, k.key); err != nil || !(*k.dst >= 0) || math.IsInf(*k.dst, 0) {
			return cfg, bad(k.key, v.Get(k.key), "want a finite number >= 0")
		}
	}
	if cfg.MetricsScrapeInterval, err = getDuration(v, "metrics-scrape-interval"); err != nil || cfg.MetricsScrapeInterval < 0 {
		return cfg, bad("metrics-scrape-interval", v.Get("metrics-scrape-interval"), "want a duration >= 0 with a unit, e.g. 2s")
	}
	if cfg.MetricsLoadWeight, err = getFloat(v, "metrics-load-weight"); err != nil || cfg.MetricsLoadWeight < 0 || math.IsInf(cfg.MetricsLoadWeight, 0) {
		return cfg, bad("metrics-load-weight", v.Get("metrics-load-weight"), "want a finite number >= 0")
	}
	if cfg.MetricsLoadWeight > 0 && cfg.MetricsScrapeInterval == 0 {
		return cfg, bad("metrics-load-weight", cfg.MetricsLoadWeight, "needs --metrics-scrape-interval > 0: without scrapes there is no engine load to weigh")
	}
	for _, k := range []struct {
		key string
		dst *string
	}{{"discovery", &cfg.Discovery}, {"pool-name", &cfg.PoolName}, {"pool-namespace", &cfg.PoolNamespace}, {"pool-api-version", &cfg.PoolAPIVersion},
		{"pod-model-label", &cfg.PodModelLabel}, {"kv-events-template", &cfg.KVEventsTemplate}, {"kv-replay-template", &cfg.KVReplayTemplate}, {"kubeconfig", &cfg.Kubeconfig}} {
		if *k.dst, err = getString(v, k.key); err != nil {
			return cfg, bad(k.key, v.Get(k.key), err.Error())
		}
		*k.dst = strings.TrimSpace(*k.dst)
	}
	switch cfg.Discovery {
	case "static":
		if cfg.PoolName != "" {
			return cfg, bad("pool-name", cfg.PoolName, "needs --discovery kubernetes")
		}
	case "kubernetes":
		if cfg.PoolName == "" || cfg.PoolNamespace == "" {
			return cfg, bad("discovery", cfg.Discovery, "needs --pool-name and --pool-namespace")
		}
	default:
		return cfg, bad("discovery", cfg.Discovery, "want static or kubernetes")
	}
	return cfg, nil
}

// parseWorkerEndpoints parses --worker-endpoints: comma-separated
// id=host:port (or id=http://host:port).
func parseWorkerEndpoints(s string) (map[uint64]string, error) {
	out := map[uint64]string{}
	for entry := range strings.SplitSeq(s, ",") {
		if entry = strings.TrimSpace(entry); entry == "" {
			continue
		}
		idStr, ep, ok := strings.Cut(entry, "=")
		id, err := strconv.ParseUint(strings.TrimSpace(idStr), 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("entry %q: want id=host:port", entry)
		}
		hp := strings.TrimPrefix(strings.TrimSpace(ep), "http://")
		if _, _, err := net.SplitHostPort(hp); err != nil {
			return nil, fmt.Errorf("entry %q: want id=host:port", entry)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("worker %d listed twice", id)
		}
		out[id] = hp
	}
	return out, nil
}

// parseSize parses a byte count: "1048576", "512KiB", "8MiB", "1GiB" (also
// KB, MB, GB as powers of 1000). It must be positive.
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, errors.New("want a positive size in bytes, e.g. 8388608 or 8MiB")
	}
	return n * mult, nil
}

// The getters below are strict: viper's GetInt/GetDuration silently turn
// "abc" into 0, which would hide typos. Their errors say what was wanted.

func getString(v *viper.Viper, key string) (string, error) {
	if x, ok := v.Get(key).(string); ok {
		return x, nil
	}
	return "", errors.New("want a string")
}

func getBool(v *viper.Viper, key string) (bool, error) {
	switch x := v.Get(key).(type) {
	case bool:
		return x, nil
	case string:
		if b, err := strconv.ParseBool(strings.TrimSpace(x)); err == nil {
			return b, nil
		}
	}
	return false, errors.New("want true or false")
}

func getInt(v *viper.Viper, key string) (int, error) {
	switch x := v.Get(key).(type) {
	case int:
		return x, nil
	case string:
		if n, err := strconv.Atoi(strings.TrimSpace(x)); err == nil {
			return n, nil
		}
	}
	return 0, errors.New("want an integer")
}

func getFloat(v *viper.Viper, key string) (float64, error) {
	switch x := v.Get(key).(type) {
	case float64:
		if !math.IsNaN(x) {
			return x, nil
		}
	case int:
		return float64(x), nil
	case string:
		if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil && !math.IsNaN(f) {
			return f, nil
		}
	}
	return 0, errors.New("want a number")
}

func getDuration(v *viper.Viper, key string) (time.Duration, error) {
	switch x := v.Get(key).(type) {
	case time.Duration:
		return x, nil
	case string:
		if d, err := time.ParseDuration(strings.TrimSpace(x)); err == nil {
			return d, nil
		}
	}
	return 0, errors.New("want a duration with a unit, e.g. 500ms or 10s")
}
