package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/tokenize"
)

// remoteTokenizeTimeout bounds one tokenization on a worker (the remote
// path): a slow worker must not hold routing for long.
const remoteTokenizeTimeout = 5 * time.Second

// newGateway builds the routing decision: the models (--models, plus
// --model-name tokenized remotely when not listed), the tokenizers loaded
// once, and the gateway over the scheduler.
func newGateway(cfg serveConfig, cat *catalog.Catalog, sched *scheduler.Scheduler, reg prometheus.Registerer, logger *slog.Logger) (*extproc.Gateway, error) {
	var models tokenize.Config
	if cfg.ModelsFile != "" {
		var err error
		if models, err = tokenize.LoadConfig(cfg.ModelsFile); err != nil {
			return nil, fmt.Errorf("--models: %w", err)
		}
	}
	if !slices.ContainsFunc(models.Models, func(m tokenize.ModelConfig) bool { return m.Name == cfg.ModelName }) {
		models.Models = append(models.Models, tokenize.ModelConfig{Name: cfg.ModelName, BlockSize: cfg.BlockSize})
	}
	var registry *tokenize.Registry
	remote := &tokenize.HTTPRemote{
		Client: &http.Client{Timeout: remoteTokenizeTimeout},
		Endpoints: func(model string) []string {
			if info, err := registry.Lookup(model); err == nil {
				model = info.Model // an adapter's requests go to its base model's workers
			}
			var out []string
			for _, t := range cat.Targets(indexer.Key{Model: model, Tenant: cfg.TenantID}) {
				if t.Endpoint != "" {
					out = append(out, "http://"+extproc.HostPort(t.Endpoint))
				}
			}
			return out
		},
	}
	registry, err := tokenize.NewRegistry(models, tokenize.RegistryOptions{Remote: remote, Logger: logger, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("--models: %w", err)
	}
	return extproc.New(registry, cat, sched, extproc.Options{
		Tenant: cfg.TenantID, Fallbacks: cfg.Fallbacks, MaxRequestsPerRank: cfg.MaxRequestsPerRank,
		DefaultModel: cfg.ModelName, Policy: cfg.RoutingPolicy, Seed: randomSeed(), Logger: logger, Registerer: reg,
	}), nil
}

// startFronts starts the ext_proc server and the embedded proxy (each
// when its address is set) and returns the function that drains them,
// each within the shutdown timeout.
func startFronts(cfg serveConfig, gw *extproc.Gateway, cat *catalog.Catalog, logger *slog.Logger) (stop func(), err error) {
	var wg sync.WaitGroup
	var stops []func(context.Context)
	stopAll := func() {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		for _, s := range slices.Backward(stops) {
			s(ctx)
		}
		wg.Wait()
	}
	if cfg.ExtProcAddr != "" {
		srv, err := extproc.NewServer(gw, extproc.ServerOptions{
			TLSCert: cfg.TLSCert, TLSKey: cfg.TLSKey, Logger: logger,
			Ready: func() bool { return cat.Ready().Ready },
		})
		if err != nil {
			return nil, fmt.Errorf("--ext-proc-addr: %w", err)
		}
		ln, err := net.Listen("tcp", cfg.ExtProcAddr)
		if err != nil {
			return nil, fmt.Errorf("ext_proc listener: %w", err)
		}
		logger.Info("ext_proc listening", "addr", ln.Addr().String(), "tls", cfg.TLSCert != "")
		wg.Go(func() {
			if err := srv.Serve(ln); err != nil {
				logger.Error("ext_proc server stopped", "err", err)
			}
		})
		stops = append(stops, srv.Shutdown)
	}
	if cfg.ProxyAddr != "" {
		ln, err := net.Listen("tcp", cfg.ProxyAddr)
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("proxy listener: %w", err)
		}
		hs := &http.Server{Handler: extproc.NewProxy(gw, extproc.ProxyOptions{Logger: logger}), ReadHeaderTimeout: 10 * time.Second}
		logger.Info("proxy listening", "addr", ln.Addr().String())
		wg.Go(func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("proxy stopped", "err", err)
			}
		})
		stops = append(stops, func(ctx context.Context) {
			if err := hs.Shutdown(ctx); err != nil {
				_ = hs.Close() // streams still running at the deadline are cut; their bookings are freed
			}
		})
	}
	return stopAll, nil
}
