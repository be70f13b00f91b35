package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvgate/kvgate/indexer"
)

// This file handles a listener's batches: gap and restart detection,
// replay over DEALER, decoding and conversion into the index's events.

// consume receives and applies live batches until the connection fails or
// ctx ends.
func (l *listener) consume(ctx context.Context, sub zmq4.Socket) error {
	fresh := true // the first batch of a connection
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if ctx.Err() != nil {
			// Stopping: leave the batch to the replay after a restart.
			return ctx.Err()
		}
		m := l.g.m
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			m.batchesReceived.Inc()
			m.decodeErrors.Inc()
			m.batchesDropped.WithLabelValues(dropMalformed).Inc()
			l.warn("frames", "kv event message is not [topic, seq(8 bytes), payload]", "frames", len(msg.Frames))
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if fresh {
			l.mark.armed = true
		}
		l.handle(ctx, msg.Frames[0], seq, msg.Frames[2], fresh)
		fresh = false
	}
}

// sglEpoch is the marker SGLang appends to the topic to name its
// publisher's lifetime.
var sglEpoch = []byte("\x00sgl-kv-epoch=")

// handle applies one live batch after the gap and restart rules of the
// spec: a restarted engine's blocks are cleared first; a gap is replayed;
// a batch already applied (through replay) is skipped.
func (l *listener) handle(ctx context.Context, topic []byte, seq uint64, payload []byte, fresh bool) {
	m, mk := l.g.m, l.mark
	m.batchesReceived.Inc()
	epoch := ""
	if i := bytes.Index(topic, sglEpoch); i >= 0 {
		e := topic[i+len(sglEpoch):]
		if j := bytes.IndexByte(e, 0); j >= 0 {
			e = e[:j]
		}
		epoch = string(e)
	}
	last, has := mk.last()
	restarted := epoch != "" && mk.epoch != "" && epoch != mk.epoch
	if has && !restarted {
		// A publisher never resends a batch on a new connection, and counts
		// from 0 when it starts: either below the watermark means a restart.
		restarted = seq == 0 || (fresh && seq <= last)
	}
	if epoch != "" {
		mk.epoch = epoch
	}
	if restarted {
		m.restarts.Inc()
		l.g.log.Warn("kv event publisher restarted; clearing its blocks", "worker", l.reg.Worker, "rank", l.reg.Rank,
			"endpoint", l.reg.Endpoint, "seq", seq, "last_seq", last)
		if !l.clearRanks(ctx) {
			return // stopping; the next listener detects the restart again
		}
		mk.next.Store(0)
		mk.unknown.Store(0)
		mk.armed = true
		last, has = 0, false
	}
	if has && seq <= last {
		m.batchesDuplicate.Inc()
		return
	}
	want := uint64(0)
	if has {
		want = last + 1
	}
	lost := lostGap
	if !has {
		lost = lostBeforeJoin
	}
	if u := mk.unknown.Load(); u > 0 && u-1 <= last && mk.armed && l.reg.ReplayEndpoint != "" && has {
		// An event's parent was unknown: events were missed before the
		// cursor. Replay the engine's whole buffer, once until re-armed.
		m.resyncs.Inc()
		mk.armed = false
		l.replay(ctx, 0, true, lost)
		last, has = mk.last()
		want = last + 1
	}
	if seq > want {
		m.gaps.Inc()
		mk.armed = true
		if l.reg.ReplayEndpoint != "" {
			l.replay(ctx, want, false, lost)
			if last, has = mk.last(); has {
				want = last + 1
			}
		}
		if seq > want {
			m.batchesLost.WithLabelValues(lost).Add(float64(seq - want))
			l.warn("gap", "kv event batches missed", "from_seq", want, "to_seq", seq-1, "replay", l.reg.ReplayEndpoint != "")
		}
	}
	if last, has = mk.last(); has && seq <= last {
		m.batchesDuplicate.Inc() // the replay already delivered it
		return
	}
	l.apply(ctx, seq, payload)
}

// clearRanks queues the removal of every block of the ranks this publisher
// reported.
func (l *listener) clearRanks(ctx context.Context) bool {
	l.mark.addRank(l.reg.Rank)
	for _, r := range l.mark.rankList() {
		ev := indexer.Event{Kind: indexer.Cleared, Worker: indexer.WorkerRank{Worker: l.reg.Worker, Rank: r}, Tier: indexer.AllTiers}
		if !l.submit(ctx, ev, 0) {
			return false
		}
	}
	clear(l.objects)
	return true
}

// replay asks the publisher's replay socket for every buffered batch from
// seq from and applies those after the cursor (all of them when resync is
// set), until the end marker, an error or the timeout. Batches the buffer
// no longer holds are counted lost, for reason lost.
func (l *listener) replay(ctx context.Context, from uint64, resync bool, lost string) {
	m := l.g.m
	rctx, cancel := context.WithTimeout(ctx, l.g.opts.ReplayTimeout)
	defer cancel()
	hs := &handshake{timeout: l.g.opts.DialTimeout}
	dealer := zmq4.NewDealer(context.WithValue(rctx, handshakeKey{}, hs), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(l.g.opts.DialTimeout))
	defer closeSocket(dealer)
	fail := func(err error) {
		m.replayFailures.Inc()
		l.warn("replay", "kv event replay failed", "replay_endpoint", l.reg.ReplayEndpoint, "from_seq", from, "err", err)
	}
	if err := dialBounded(dealer, hs, l.reg.ReplayEndpoint); err != nil {
		fail(err)
		return
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		fail(err)
		return
	}
	// A resync re-applies batches at or below the cursor: it is applied
	// only once the end marker came, so that a partial one never brings
	// back blocks whose removal it did not get to.
	type held struct {
		seq     uint64
		payload []byte
	}
	var resyncs []held
	for {
		msg, err := dealer.Recv()
		if err != nil {
			fail(err)
			return
		}
		if ctx.Err() != nil {
			return // stopping
		}
		seq, payload, end, ok := parseReply(msg.Frames)
		if !ok {
			m.decodeErrors.Inc()
			m.batchesDropped.WithLabelValues(dropMalformed).Inc()
			l.warn("frames", "malformed replay reply", "frames", len(msg.Frames))
			continue
		}
		if end {
			for _, h := range resyncs {
				m.batchesReplayed.Inc()
				if !l.apply(ctx, h.seq, h.payload) {
					return
				}
			}
			return
		}
		if seq < from {
			continue
		}
		if resync {
			resyncs = append(resyncs, held{seq, payload}) // zmq4 frames are not reused
			continue
		}
		last, has := l.mark.last()
		if has && seq <= last && !resync {
			continue
		}
		if next := max(from, last+1); !resync && seq > next {
			m.batchesLost.WithLabelValues(lost).Add(float64(seq - next))
			l.warn("gap", "kv event batches no longer in the replay buffer", "from_seq", next, "to_seq", seq-1)
		}
		m.batchesReplayed.Inc()
		if !l.apply(ctx, seq, payload) {
			return
		}
	}
}

// parseReply reads one replay reply: ["", topic, seq8, payload] (vLLM >=
// 0.26) or ["", seq8, payload] (older vLLM, SGLang), with or without the
// leading delimiter. An empty payload or an all-0xFF sequence ends the
// replay.
func parseReply(frames [][]byte) (seq uint64, payload []byte, end, ok bool) {
	if len(frames) > 0 && len(frames[0]) == 0 && len(frames) >= 3 {
		frames = frames[1:]
	}
	switch len(frames) {
	case 2: // seq8, payload
	case 3: // topic, seq8, payload
		frames = frames[1:]
	default:
		return 0, nil, false, false
	}
	if len(frames[0]) != 8 {
		return 0, nil, false, false
	}
	seq = binary.BigEndian.Uint64(frames[0])
	if seq == ^uint64(0) || len(frames[1]) == 0 {
		return seq, nil, true, true
	}
	return seq, frames[1], false, true
}

// apply decodes a batch, hashes its events and queues them, then advances
// the cursor to seq. A batch that does not decode is counted and skipped.
// It reports false, leaving the cursor, when the listener is stopping and
// not every event could be queued: the batch is replayed when it resumes.
func (l *listener) apply(ctx context.Context, seq uint64, payload []byte) bool {
	m, mk := l.g.m, l.mark
	advance := func() bool {
		if seq+1 > mk.next.Load() {
			mk.next.Store(seq + 1)
		}
		return true
	}
	b, err := l.dec.Decode(payload)
	if err != nil {
		m.decodeErrors.Inc()
		m.batchesDropped.WithLabelValues(dropMalformed).Inc()
		l.warn("decode", "malformed kv event batch", "seq", seq, "err", err)
		return advance()
	}
	rank := l.reg.Rank
	if b.HasRank {
		rank = b.Rank
	}
	mk.addRank(rank)
	wr := indexer.WorkerRank{Worker: l.reg.Worker, Rank: rank}
	for i := range b.Events {
		we := &b.Events[i]
		m.eventsReceived.WithLabelValues(we.Kind.String()).Inc()
		if we.Skip != "" {
			m.eventsIgnored.WithLabelValues(we.Skip).Inc()
			continue
		}
		for _, ev := range l.convert(wr, we) {
			if !l.submit(ctx, ev, seq) {
				return false
			}
		}
	}
	return advance()
}

// submit queues ev; seq is its batch, for unknown-parent tracking. It
// reports false when ctx ended first (the event is counted dropped).
func (l *listener) submit(ctx context.Context, ev indexer.Event, seq uint64) bool {
	m, mk := l.g.m, l.mark
	kind := ev.Kind.String()
	err := l.g.set.Submit(ctx, l.ix, ev, func(res indexer.ApplyResult, err error) {
		m.blocksStored.Add(float64(res.Stored))
		m.blocksRemoved.Add(float64(res.Removed))
		m.blocksUnknown.Add(float64(res.Unknown))
		switch {
		case err == nil:
			m.eventsApplied.WithLabelValues(kind).Inc()
		case errors.Is(err, indexer.ErrUnknownParent):
			m.eventsDropped.WithLabelValues(dropUnknownParent).Inc()
			for {
				old := mk.unknown.Load()
				if old >= seq+1 || mk.unknown.CompareAndSwap(old, seq+1) {
					break
				}
			}
		case errors.Is(err, indexer.ErrRemoved):
			m.eventsDropped.WithLabelValues(dropIndexRemoved).Inc()
		default:
			m.eventsDropped.WithLabelValues(dropInvalid).Inc()
		}
	})
	if err != nil {
		m.eventsDropped.WithLabelValues(dropShutdown).Inc()
		return false
	}
	return true
}

// convert turns a decoded event into index events: blocks hashed with the
// index's block size, Mooncake objects resolved.
func (l *listener) convert(wr indexer.WorkerRank, we *wireEvent) []indexer.Event {
	m := l.g.m
	switch we.Kind {
	case wireCleared:
		if we.Tier&indexer.TierDevice == 0 {
			clear(l.objects)
		}
		return []indexer.Event{{Kind: indexer.Cleared, Worker: wr, Tier: we.Tier}}
	case wireRemoved:
		hashes := slices.Clone(we.IDs)
		if len(hashes) == 0 && we.HasObject {
			if o, ok := l.objects[we.Object]; ok {
				hashes = append(hashes, o.block.ID)
				delete(l.objects, we.Object)
			}
		}
		if len(hashes) == 0 {
			m.eventsDropped.WithLabelValues(dropEmpty).Inc()
			return nil
		}
		return []indexer.Event{{Kind: indexer.Removed, Worker: wr, Tier: we.Tier, IDs: hashes}}
	case wireMoved:
		return l.move(wr, we)
	}
	// Stored.
	if len(we.IDs) == 0 {
		m.eventsDropped.WithLabelValues(dropEmpty).Inc()
		return nil
	}
	if len(we.Tokens) == 0 {
		// Ids only (Mooncake's store publisher): a tier for known blocks.
		return []indexer.Event{{Kind: indexer.Stored, Worker: wr, Tier: we.Tier, IDs: slices.Clone(we.IDs), ByID: true}}
	}
	bs := l.ix.BlockSize()
	if we.BlockSize != 0 && we.BlockSize != bs {
		m.eventsDropped.WithLabelValues(dropBlockSize).Inc()
		m.blocksDropped.WithLabelValues(dropBlockSize).Add(float64(len(we.IDs)))
		l.warn("block_size", "kv event block size differs from the registered one", "event_block_size", we.BlockSize, "block_size", bs)
		return nil
	}
	n := min(len(we.IDs), len(we.Tokens)/bs)
	if n < len(we.IDs) {
		m.blocksDropped.WithLabelValues(dropPartialBlock).Add(float64(len(we.IDs) - n))
	}
	if n == 0 {
		m.eventsDropped.WithLabelValues(dropPartialBlock).Inc()
		return nil
	}
	seed := indexer.LoRASeed(we.LoRA)
	blocks := make([]indexer.Block, n)
	for i := range blocks {
		var extra []uint64
		if i < len(we.Extra) {
			extra = we.Extra[i]
		}
		blocks[i] = indexer.Block{ID: we.IDs[i], Local: indexer.LocalHash(we.Tokens[i*bs:(i+1)*bs], seed, extra)}
	}
	if we.HasObject && n == 1 {
		if l.objects == nil {
			l.objects = make(map[uint64]object)
		}
		l.objects[we.Object] = object{block: blocks[0], parent: we.Parent, hasParent: we.HasParent, tiers: we.Tier}
	}
	return []indexer.Event{{Kind: indexer.Stored, Worker: wr, Tier: we.Tier, Parent: we.Parent, HasParent: we.HasParent, Blocks: blocks}}
}

// move applies a Mooncake BlockUpdateEvent: the object now occupies
// exactly the tiers of its replicas.
func (l *listener) move(wr indexer.WorkerRank, we *wireEvent) []indexer.Event {
	o, ok := l.objects[we.Object]
	if !ok {
		l.g.m.eventsDropped.WithLabelValues(dropUnknownObject).Inc()
		return nil
	}
	var evs []indexer.Event
	for _, t := range []indexer.Tier{indexer.TierHost, indexer.TierDisk} {
		switch {
		case o.tiers&t != 0 && we.Tier&t == 0:
			evs = append(evs, indexer.Event{Kind: indexer.Removed, Worker: wr, Tier: t, IDs: []uint64{o.block.ID}})
		case o.tiers&t == 0 && we.Tier&t != 0:
			evs = append(evs, indexer.Event{Kind: indexer.Stored, Worker: wr, Tier: t, Parent: o.parent, HasParent: o.hasParent, Blocks: []indexer.Block{o.block}})
		}
	}
	if we.Tier&(indexer.TierHost|indexer.TierDisk) == 0 {
		delete(l.objects, we.Object)
	} else {
		o.tiers = we.Tier & (indexer.TierHost | indexer.TierDisk)
		l.objects[we.Object] = o
	}
	return evs
}

// warn logs at most once per LogEvery per kind, with the count of lines
// suppressed since the last one.
func (l *listener) warn(kind, msg string, args ...any) {
	ok, suppressed := l.limiter.allow(kind, l.g.opts.LogEvery)
	if !ok {
		return
	}
	args = append(args, "worker", l.reg.Worker, "rank", l.reg.Rank, "endpoint", l.reg.Endpoint)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	l.g.log.Warn(msg, args...)
}

// logLimiter allows one log line per kind per interval.
type logLimiter struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

func (r *logLimiter) allow(kind string, every time.Duration) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.last == nil {
		r.last, r.suppressed = make(map[string]time.Time), make(map[string]int)
	}
	if t, ok := r.last[kind]; ok && now.Sub(t) < every {
		r.suppressed[kind]++
		return false, 0
	}
	n := r.suppressed[kind]
	r.last[kind], r.suppressed[kind] = now, 0
	return true, n
}
