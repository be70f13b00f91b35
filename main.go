// Command kvgate is a KV-cache-aware router for LLM inference: an Envoy
// ext_proc endpoint picker that sends each request to the worker holding the
// longest cached prefix of its prompt, balanced against load.
//
// main.go is the thin shell: the command tree, logging, the admin HTTP server
// and graceful shutdown. Configuration loading lives in config.go.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/discovery"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/internal/httpapi"
	"github.com/kvgate/kvgate/internal/listeners"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/scheduler/replica"
	"github.com/kvgate/kvgate/scheduler/scrape"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version string

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes the command line args and returns the process exit code.
// Errors are printed as a single line "kvgate: <error>" on stderr.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(stdin, stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "kvgate: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		return 1
	}
	return 0
}

// newRootCmd builds a fresh command tree; it holds no global state.
func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:               "kvgate",
		Short:             "KV-cache-aware router for LLM inference (Envoy ext_proc endpoint picker)",
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newServeCmd(), newVersionCmd(), newTokenizeCmd(), newSimCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the kvgate version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "kvgate %s (%s)\n", versionString(), runtime.Version())
			return err
		},
	}
}

// versionString returns the -ldflags version, else the VCS revision recorded
// by the Go toolchain, else the module version, else "dev".
func versionString() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	var rev string
	var modified bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified {
			rev += "-dirty"
		}
		return rev
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return "dev"
}

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the router and its admin HTTP server",
		Long: "Run the router and its admin HTTP server.\n\n" +
			"Every flag can also be set with a KVGATE_* environment variable (--admin-addr -> KVGATE_ADMIN_ADDR)\n" +
			"or a key of the YAML file given with --config (admin-addr: \":9000\").\n" +
			"Precedence: flag > environment > config file > default.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadServeConfig(cmd)
			if err != nil {
				return err
			}
			logger := newLogger(cmd.ErrOrStderr(), cfg)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// After the first signal, restore default handling so that a
			// second one terminates a shutdown that hangs.
			context.AfterFunc(ctx, stop)
			if err := runServe(ctx, cfg, logger); err != nil {
				return err
			}
			logger.Info("shutdown complete")
			return nil
		},
	}
	addServeFlags(cmd.Flags())
	return cmd
}

func newLogger(w io.Writer, cfg serveConfig) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated by loadServeConfig
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// runServe runs kvgate until ctx is cancelled, then shuts down gracefully.
// It returns nil after a clean shutdown; deferred component cleanup runs after
// the admin server has stopped.
func runServe(ctx context.Context, cfg serveConfig, logger *slog.Logger) error {
	logger.Info("starting kvgate", "version", versionString(), "config_file", cfg.ConfigFile,
		"admin_addr", cfg.AdminAddr, "event_threads", cfg.EventThreads, "index_shards", cfg.IndexShards, "peers", len(cfg.Peers),
		"min_initial_workers", cfg.MinInitialWorkers, "admin_token", cfg.AdminToken != "",
		"test_routes", cfg.EnableTestRoutes,
		"replica_sync_port", cfg.ReplicaSyncPort, "replica_sync_peers", len(cfg.ReplicaSyncPeers))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := admin.New(admin.Options{Token: cfg.AdminToken, MaxBody: cfg.MaxBody, Registerer: reg})

	// Components live for the whole run; deferred Close calls run after the
	// admin server has shut down, in reverse order. With peers, the index
	// holds live events until the peer's dump is loaded.
	peers, err := httpapi.NewPeers(cfg.Peers)
	if err != nil {
		return fmt.Errorf("--peers: %w", err)
	}
	indexes := indexer.NewSet(indexer.Options{EventThreads: cfg.EventThreads, IndexShards: cfg.IndexShards, Hold: len(cfg.Peers) > 0})
	defer indexes.Close()
	ingest := kvevents.NewIngester(indexes, kvevents.IngestOptions{Logger: logger, Metrics: kvevents.NewMetrics(reg)})
	defer ingest.Close() // before indexes.Close: listeners stop submitting first
	cat := catalog.New(indexes, listeners.New(ingest), reg, catalog.Options{Logger: logger, MinInitialWorkers: cfg.MinInitialWorkers})

	// Scheduling: the loads, following the catalog's workers, the
	// scheduler over them and the index, the slot tracker and selection
	// service routes, the periodic expiry of requests never freed, and
	// replica sync of the loads.
	loads := scheduler.NewLoads(scheduler.LoadOptions{})
	cat.Watch(loads.Follow)
	// The reuse charge applies to the gateway's decisions only: the
	// Dynamo-compatible routes answer with the spec's cost. The engines'
	// reports, when scraped, may correct it.
	cost := scheduler.CostOptions{
		OverlapWeight: zeroAs(cfg.OverlapWeight, scheduler.NoOverlapWeight), Temperature: cfg.RouterTemperature, MetricsWeight: cfg.MetricsLoadWeight,
		ReuseWeight: zeroAs(cfg.ReuseWeight, scheduler.NoReuseWeight)}
	var scraper *scrape.Scraper
	if cfg.MetricsScrapeInterval > 0 {
		scraper = scrape.New(cat, scrape.Options{Interval: cfg.MetricsScrapeInterval, Logger: logger}, reg)
		cost.Engines = scraper
	}
	sched := scheduler.NewScheduler(cat, indexes, loads, cost, randomSeed(), reg)
	bgCtx, stopBg := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopBg()
	bg.Go(func() { expireLoads(bgCtx, loads, loadExpiryInterval, logger) })
	if scraper != nil {
		bg.Go(func() {
			if err := scraper.Run(bgCtx); err != nil {
				logger.Error("engine metrics scraping stopped", "err", err)
			}
		})
	}
	replicaRoutes := httpapi.ReplicaSyncOffRoutes()
	if cfg.ReplicaSyncPort != 0 {
		rsync, err := replica.New(loads, reg, replica.Options{
			Port: cfg.ReplicaSyncPort, Peers: cfg.ReplicaSyncPeers, Logger: logger})
		if err != nil {
			return fmt.Errorf("--replica-sync-port: %w", err)
		}
		defer func() {
			if err := rsync.Close(); err != nil {
				logger.Warn("replica sync close", "err", err)
			}
		}()
		replicaRoutes = httpapi.ReplicaRoutes(rsync)
	}
	routes := adminRoutes(reg, logger, httpapi.IndexRoutes(indexes, peers, reg), workerRoutes(cat, scraper, cfg.EnableTestRoutes), httpapi.ServiceRoutes(cat, sched, indexes), replicaRoutes)
	srv.Handle(routes...)

	for _, w := range cfg.Workers {
		err := cat.RegisterRank(catalog.RankRegistration{
			WorkerKey: catalog.WorkerKey{Key: indexer.Key{Model: cfg.ModelName, Tenant: cfg.TenantID}, ID: w.ID},
			BlockSize: cfg.BlockSize,
			Rank:      w.Rank,
			Publisher: catalog.Publisher{Endpoint: w.Endpoint, Replay: w.ReplayEndpoint, Topic: cfg.KVTopic},
			Source:    catalog.SourceConfig,
		})
		if err != nil {
			return fmt.Errorf("--workers: %w", err)
		}
	}

	for id, ep := range cfg.WorkerEndpoints {
		err := cat.PatchWorker(catalog.WorkerPatch{
			WorkerKey: catalog.WorkerKey{Key: indexer.Key{Model: cfg.ModelName, Tenant: cfg.TenantID}, ID: id}, Endpoint: &ep})
		if err != nil {
			return fmt.Errorf("--worker-endpoints: worker %d: %w (list it in --workers too)", id, err)
		}
	}

	if cfg.Discovery == "kubernetes" {
		d, err := newDiscovery(cfg, cat, reg, logger)
		if err != nil {
			return err
		}
		bg.Go(func() {
			if err := d.Run(bgCtx); err != nil {
				logger.Error("kubernetes discovery stopped", "err", err)
			}
		})
	}

	gw, err := newGateway(cfg, cat, sched, reg, logger)
	if err != nil {
		return err
	}
	stopFronts, err := startFronts(cfg, gw, cat, logger)
	if err != nil {
		return err
	}
	// The fronts drain as soon as shutdown starts, alongside the admin
	// server (their health turns NOT_SERVING at once), not after it.
	var frontsWG sync.WaitGroup
	defer frontsWG.Wait()
	frontsCtx, endFronts := context.WithCancel(ctx)
	defer endFronts()
	frontsWG.Go(func() {
		<-frontsCtx.Done()
		stopFronts()
	})

	ln, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	logger.Info("admin listening", "addr", ln.Addr().String())
	if a, ok := ln.Addr().(*net.TCPAddr); ok && cfg.AdminToken == "" && !a.IP.IsLoopback() {
		// The default (:8090, no token): kept for existing deployments,
		// but said out loud.
		logger.Warn("the admin API accepts changes from anyone who can reach it: set --admin-token, or bind --admin-addr to 127.0.0.1",
			"addr", ln.Addr().String(), "open_changes", "workers (register, endpoints, removal), bookings, peer lists")
	}

	served := []servedListener{{name: "admin", ln: ln, h: srv}}
	defer func() {
		for _, l := range served {
			_ = l.ln.Close() // the ones never served; closing twice is harmless
		}
	}()
	for _, sl := range []struct {
		service httpapi.Service
		addr    string
		own     []admin.Route // the service's versions of routes it shares with another
	}{
		{httpapi.IndexerService, cfg.IndexerAddr, nil},
		{httpapi.SlotTrackerService, cfg.SlotTrackerAddr, httpapi.SlotTrackerRoutes(cat, sched, indexes)},
		{httpapi.SelectionService, cfg.SelectionAddr, httpapi.SelectionServiceRoutes(cat, sched, indexes)},
	} {
		if sl.addr == "" {
			continue
		}
		sln, err := net.Listen("tcp", sl.addr)
		if err != nil {
			return fmt.Errorf("%s listener: %w", sl.service, err)
		}
		s := srv.Sibling()
		s.Handle(sl.service.Routes(append(sl.own, routes...))...)
		served = append(served, servedListener{name: string(sl.service), ln: sln, h: s})
		logger.Info(string(sl.service)+" listening", "addr", sln.Addr().String())
		if a, ok := sln.Addr().(*net.TCPAddr); ok && cfg.AdminToken == "" && !a.IP.IsLoopback() {
			logger.Warn("the "+string(sl.service)+" listener accepts changes from anyone who can reach it: set --admin-token, or bind it to 127.0.0.1",
				"addr", sln.Addr().String())
		}
	}

	if len(cfg.Peers) > 0 {
		// Listeners are already subscribed and their events queue on the
		// held index; load a peer's dump, then let them apply.
		cat.HoldReady("recovering the index from peers")
		var wg sync.WaitGroup
		defer wg.Wait() // runs before ingest.Close and indexes.Close
		wg.Go(func() {
			httpapi.Recover(ctx, indexes, cfg.Peers, &http.Client{}, cfg.PeerTimeout, logger, reg)
			indexes.Release()
			cat.HoldReady("")
		})
	}
	return serveAdmin(ctx, served, cfg.ShutdownTimeout, logger)
}

// newDiscovery follows the InferencePool named by the configuration.
func newDiscovery(cfg serveConfig, cat *catalog.Catalog, reg prometheus.Registerer, logger *slog.Logger) (*discovery.Discovery, error) {
	klog.SetSlogLogger(logger.With("component", "client-go")) // client-go logs through klog, a process-wide logger
	kube, dyn, err := discovery.Clients(cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--discovery kubernetes: %w", err)
	}
	d, err := discovery.New(kube, dyn, cat, discovery.Config{
		PoolName: cfg.PoolName, PoolNamespace: cfg.PoolNamespace, APIVersion: cfg.PoolAPIVersion,
		Model: cfg.ModelName, ModelLabel: cfg.PodModelLabel, Tenant: cfg.TenantID, BlockSize: cfg.BlockSize,
		EventsTemplate: cfg.KVEventsTemplate, ReplayTemplate: cfg.KVReplayTemplate, Topic: cfg.KVTopic, Logger: logger,
	}, reg)
	if err != nil {
		return nil, fmt.Errorf("--discovery kubernetes: %w", err)
	}
	return d, nil
}

// loadExpiryInterval is how often requests older than the TTL are freed.
const loadExpiryInterval = 10 * time.Second

// expireLoads frees, every interval until ctx ends, the requests that
// outlived the TTL (a lost free must not hold load forever).
func expireLoads(ctx context.Context, loads *scheduler.Loads, interval time.Duration, logger *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := loads.Expire(); n > 0 {
				logger.Info("expired active requests never freed", "requests", n, "ttl", scheduler.DefaultRequestTTL.String())
			}
		}
	}
}

// zeroAs returns v, or marker when v is 0 (for options whose zero value
// means "the default").
func zeroAs(v, marker float64) float64 {
	if v == 0 {
		return marker
	}
	return v
}

// randomSeed seeds the scheduler's tie-breaks and sampling, and the
// baseline routing policies' random choices.
func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go >= 1.24)
	return binary.LittleEndian.Uint64(b[:])
}

// servedListener is one admin HTTP listener: the combined admin port or
// one service's own.
type servedListener struct {
	name string
	ln   net.Listener
	h    http.Handler
}

// serveAdmin serves each listener until ctx is cancelled or one of them
// fails, then shuts them all down together, waiting up to
// shutdownTimeout for in-flight requests.
func serveAdmin(ctx context.Context, ls []servedListener, shutdownTimeout time.Duration, logger *slog.Logger) error {
	type served struct {
		name string
		srv  *http.Server
		errc chan error
	}
	all := make([]served, len(ls))
	failed := make(chan struct{}, len(ls))
	for i, l := range ls {
		all[i] = served{name: l.name, errc: make(chan error, 1), srv: &http.Server{
			Handler:           l.h,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}}
		go func() {
			err := all[i].srv.Serve(l.ln)
			all[i].errc <- err
			failed <- struct{}{}
		}()
	}

	var errs []error
	select {
	case <-failed:
		// One stopped on its own (Serve returns only with an error); the
		// others shut down below.
		for _, s := range all {
			select {
			case err := <-s.errc:
				errs = append(errs, fmt.Errorf("%s server: %w", s.name, err))
				s.errc <- nil // read again below
			default:
			}
		}
	case <-ctx.Done():
		logger.Info("shutting down", "reason", context.Cause(ctx).Error(), "timeout", shutdownTimeout.String())
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	shut := make([]error, len(all))
	for i, s := range all {
		wg.Go(func() {
			if err := s.srv.Shutdown(sctx); err != nil {
				_ = s.srv.Close()
				shut[i] = fmt.Errorf("%s server shutdown: %w (timeout %s)", s.name, err, shutdownTimeout)
			}
			if err := <-s.errc; err != nil && !errors.Is(err, http.ErrServerClosed) && shut[i] == nil {
				shut[i] = fmt.Errorf("%s server: %w", s.name, err)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return errors.Join(shut...)
}

// adminRoutes is the admin listener's route table: the process's own
// routes, then each API's in order (the index's, the catalog's, the slot
// tracker and selection service's, replica sync's, on or off). The
// routes marked Mutates are the ones --admin-token guards.
func adminRoutes(reg *prometheus.Registry, logger *slog.Logger, apis ...[]admin.Route) []admin.Route {
	routes := processRoutes(reg, logger)
	for _, rs := range apis {
		routes = append(routes, rs...)
	}
	return routes
}

// workerRoutes are the worker catalog's routes, with Dynamo's test routes
// when testRoutes (--enable-test-routes).
func workerRoutes(cat *catalog.Catalog, scraper *scrape.Scraper, testRoutes bool) []admin.Route {
	routes := httpapi.WorkerRoutes(cat, scraper)
	if testRoutes {
		routes = append(routes, httpapi.ListenerTestRoutes(cat)...)
	}
	return routes
}

// processRoutes are the routes of the process itself: liveness (always
// 200) and the Prometheus metrics of reg.
func processRoutes(reg *prometheus.Registry, logger *slog.Logger) []admin.Route {
	return []admin.Route{
		{Pattern: "GET /health", Handler: func(w http.ResponseWriter, _ *http.Request) {
			admin.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}},
		{Pattern: "GET /metrics", Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}).ServeHTTP},
	}
}
