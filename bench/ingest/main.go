// Command ingest measures kvgate's end-to-end KV event ingestion over
// loopback ZMQ: engine publishers (package bench/engine, speaking vLLM's
// protocol) stream pre-encoded event batches to an kvevents.Ingester, which
// decodes, hashes and applies them to the index. The clock runs from the
// first batch sent until every batch of every publisher has been applied.
//
// It reports batches, events and blocks per second. Publishers run in the
// same process and share the CPUs with the router; their payloads are
// encoded before the clock starts, so their cost is the sending alone.
//
//	go run ./bench/ingest -publishers 4 -batches 20000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
)

type config struct {
	publishers   int
	batches      int // per publisher
	events       int // Stored events per batch (each followed later by its Removed)
	blocks       int // blocks per Stored event
	blockSize    int
	eventThreads int
	encoding     string
}

func main() {
	var cfg config
	flag.IntVar(&cfg.publishers, "publishers", 4, "engine publishers (one worker each)")
	flag.IntVar(&cfg.batches, "batches", 20000, "batches per publisher")
	flag.IntVar(&cfg.events, "events", 2, "Stored events per batch")
	flag.IntVar(&cfg.blocks, "blocks", 4, "blocks per Stored event")
	flag.IntVar(&cfg.blockSize, "block-size", 16, "tokens per block")
	flag.IntVar(&cfg.eventThreads, "event-threads", 4, "indexer apply goroutines")
	flag.StringVar(&cfg.encoding, "encoding", "map", "event encoding: map (vLLM >= mid-2026) or array")
	flag.Parse()
	if err := run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ingest:", err)
		os.Exit(1)
	}
}

// result is what one run measured.
type result struct {
	elapsed                 time.Duration
	batches, events, blocks int
}

func run(cfg config, out io.Writer) error {
	if cfg.publishers < 1 || cfg.batches < 1 || cfg.events < 1 || cfg.blocks < 1 || cfg.blockSize < 1 || cfg.eventThreads < 1 {
		return errors.New("publishers, batches, events, blocks, block-size and event-threads must be >= 1")
	}
	var enc engine.Encoding
	switch cfg.encoding {
	case "map":
		enc = engine.MapEncoding
	case "array":
		enc = engine.ArrayEncoding
	default:
		return fmt.Errorf("encoding %q: want map or array", cfg.encoding)
	}
	res, err := measure(cfg, enc)
	if err != nil {
		return err
	}
	s := res.elapsed.Seconds()
	_, err = fmt.Fprintf(out, "publishers=%d batches=%d events=%d block_ops=%d block_size=%d encoding=%s elapsed=%s\n"+
		"batches/s=%.0f events/s=%.0f block_ops/s=%.0f (stored + removed)\n",
		cfg.publishers, res.batches, res.events, res.blocks, cfg.blockSize, cfg.encoding, res.elapsed.Round(time.Millisecond),
		float64(res.batches)/s, float64(res.events)/s, float64(res.blocks)/s)
	return err
}

func measure(cfg config, enc engine.Encoding) (result, error) {
	set := indexer.NewSet(indexer.Options{EventThreads: cfg.eventThreads})
	defer set.Close()
	g := kvevents.NewIngester(set, kvevents.IngestOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer g.Close()
	key := indexer.Key{Model: "bench", Tenant: indexer.DefaultTenant}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pubs := make([]*engine.Publisher, cfg.publishers)
	payloads := make([][][]byte, cfg.publishers)
	var res result
	for i := range pubs {
		p, err := engine.NewPublisher(ctx, engine.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Encoding: enc})
		if err != nil {
			return res, err
		}
		defer p.Close()
		pubs[i] = p
		if err := g.Register(kvevents.Registration{Key: key, BlockSize: cfg.blockSize, Worker: uint64(i + 1),
			Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}); err != nil {
			return res, err
		}
		var n int
		payloads[i], n, err = workload(cfg, uint64(i+1), enc)
		if err != nil {
			return res, err
		}
		res.batches += cfg.batches
		res.events += n
		res.blocks += 2 * cfg.batches * cfg.events * cfg.blocks // every stored block is removed again
	}
	for _, p := range pubs {
		if err := p.WaitSubscribed(ctx); err != nil {
			return res, err
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(pubs))
	for i, p := range pubs {
		wg.Go(func() {
			for _, payload := range payloads[i] {
				if _, err := p.PublishRaw(payload); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	last := uint64(cfg.batches - 1)
	for !caughtUp(g, last) {
		if ctx.Err() != nil {
			return res, fmt.Errorf("listeners did not catch up: %w", ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
	for i := range pubs {
		if err := set.Do(ctx, uint64(i+1), func() {}); err != nil {
			return res, err
		}
	}
	res.elapsed = time.Since(start)
	if n := set.Lookup(key).Stats(); n.Nodes != 0 {
		return res, fmt.Errorf("index holds %d blocks after every block was removed: events were lost", n.Nodes)
	}
	return res, nil
}

func caughtUp(g *kvevents.Ingester, last uint64) bool {
	for _, l := range g.Listeners() {
		if !l.HasSeq || l.Seq < last {
			return false
		}
	}
	return true
}

// workload encodes one worker's batches: each stores events chains of
// blocks and removes the chains the previous batch stored, so the index
// stays small and every event does real work. It returns the payloads and
// the number of events.
func workload(cfg config, worker uint64, enc engine.Encoding) ([][]byte, int, error) {
	out := make([][]byte, cfg.batches)
	events := 0
	var prev []uint64
	next := worker << 40
	for b := range out {
		var evs []engine.Event
		if len(prev) > 0 {
			evs = append(evs, engine.BlockRemoved{BlockHashes: prev})
		}
		prev = prev[:0:0]
		for range cfg.events {
			ids := make([]uint64, cfg.blocks)
			toks := make([]uint32, cfg.blocks*cfg.blockSize)
			for i := range ids {
				ids[i] = next
				next++
			}
			for i := range toks {
				toks[i] = uint32(next)*7 + uint32(i)
			}
			prev = append(prev, ids...)
			evs = append(evs, engine.BlockStored{BlockHashes: ids, TokenIDs: toks, BlockSize: cfg.blockSize})
		}
		if b == len(out)-1 {
			evs = append(evs, engine.BlockRemoved{BlockHashes: prev})
		}
		events += len(evs)
		p, err := engine.EncodeBatch(float64(b), evs, engine.Config{Encoding: enc})
		if err != nil {
			return nil, 0, err
		}
		out[b] = p
	}
	return out, events, nil
}
