package scheduler

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/indexer"
)

// ingestListeners is the catalog's Listeners over an *indexer.Ingester, as
// internal/listeners adapts it for main (which this package's tests cannot
// import).
type ingestListeners struct{ g *indexer.Ingester }

func (a ingestListeners) CheckEndpoint(endpoint string) error {
	return indexer.ValidateEndpoint(endpoint)
}

func (a ingestListeners) Listen(l Listener) error {
	err := a.g.Register(indexer.Registration{
		Key: l.Key, BlockSize: l.BlockSize, Worker: l.ID, Rank: l.Rank,
		Endpoint: l.Endpoint, ReplayEndpoint: l.Replay, Topic: l.Topic,
	})
	if errors.Is(err, indexer.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

func (a ingestListeners) Stop(ctx context.Context, wk WorkerKey, rank *uint32) error {
	_, err := a.g.Unregister(ctx, wk.Key, wk.ID, rank)
	return err
}

func (a ingestListeners) Pause(wk WorkerKey, rank *uint32) int { return a.g.Pause(wk.Key, wk.ID, rank) }
func (a ingestListeners) Resume(wk WorkerKey, rank *uint32) int {
	return a.g.Resume(wk.Key, wk.ID, rank)
}
func (a ingestListeners) Generation() uint64 { return a.g.Generation() }

func (a ingestListeners) States() []ListenerState {
	var out []ListenerState
	for _, l := range a.g.Listeners() {
		out = append(out, ListenerState{
			Listener: Listener{WorkerKey: WorkerKey{Key: l.Key, ID: l.Worker}, Rank: l.Rank, BlockSize: l.BlockSize,
				Publisher: Publisher{Endpoint: l.Endpoint, Replay: l.ReplayEndpoint, Topic: l.Topic}},
			Status: Status(l.Status), LastError: l.LastError, Seq: l.Seq, HasSeq: l.HasSeq,
		})
	}
	return out
}
