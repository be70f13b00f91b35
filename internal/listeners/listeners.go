// Package listeners adapts the indexer's KV event listeners (an
// *kvevents.Ingester) to the worker catalog's Listeners interface: the one
// place where the two meet. main wires it; tests and benchmarks that build
// a catalog with real listeners use it too.
//
// It translates types and errors, nothing more: it must not add behaviour
// of its own to either side.
package listeners

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// Ingester is the catalog's view of an *kvevents.Ingester.
type Ingester struct{ g *kvevents.Ingester }

// New returns g as the catalog's Listeners.
func New(g *kvevents.Ingester) Ingester { return Ingester{g} }

var _ catalog.Listeners = Ingester{}

// CheckEndpoint is kvevents.ValidateEndpoint.
func (a Ingester) CheckEndpoint(endpoint string) error { return kvevents.ValidateEndpoint(endpoint) }

// Listen registers l with the ingester; a closed one is unavailable.
func (a Ingester) Listen(l catalog.Listener) error {
	err := a.g.Register(kvevents.Registration{
		Key: l.Key, BlockSize: l.BlockSize, Worker: l.ID, Rank: l.Rank,
		Endpoint: l.Endpoint, ReplayEndpoint: l.Replay, Topic: l.Topic,
	})
	if errors.Is(err, indexer.ErrClosed) {
		return fmt.Errorf("%w: %w", catalog.ErrUnavailable, err)
	}
	return err
}

// Stop unregisters the listeners of wk (one rank when rank is not nil).
func (a Ingester) Stop(ctx context.Context, wk catalog.WorkerKey, rank *uint32) error {
	_, err := a.g.Unregister(ctx, wk.Key, wk.ID, rank)
	return err
}

// Pause pauses the listeners of wk (one rank when rank is not nil).
func (a Ingester) Pause(wk catalog.WorkerKey, rank *uint32) int {
	return a.g.Pause(wk.Key, wk.ID, rank)
}

// Resume resumes the listeners of wk (one rank when rank is not nil).
func (a Ingester) Resume(wk catalog.WorkerKey, rank *uint32) int {
	return a.g.Resume(wk.Key, wk.ID, rank)
}

// Generation is the ingester's.
func (a Ingester) Generation() uint64 { return a.g.Generation() }

// States returns the ingester's listeners.
func (a Ingester) States() []catalog.ListenerState {
	ls := a.g.Listeners()
	out := make([]catalog.ListenerState, len(ls))
	for i, l := range ls {
		out[i] = catalog.ListenerState{
			Listener: catalog.Listener{
				WorkerKey: catalog.WorkerKey{Key: l.Key, ID: l.Worker}, Rank: l.Rank, BlockSize: l.BlockSize,
				Publisher: catalog.Publisher{Endpoint: l.Endpoint, Replay: l.ReplayEndpoint, Topic: l.Topic},
			},
			Status: catalog.Status(l.Status), LastError: l.LastError, Seq: l.Seq, HasSeq: l.HasSeq,
		}
	}
	return out
}
