package kvevents

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons an event, batch or block is dropped, as metric labels.
const (
	dropMalformed     = "malformed"      // the message or payload does not decode
	dropUnknownParent = "unknown_parent" // a Stored event's parent is not held by the worker rank
	dropInvalid       = "invalid"        // the index rejected the event (bad tier or kind)
	dropShutdown      = "shutdown"       // the listener stopped before the event was queued
	dropIndexRemoved  = "index_removed"  // the index was removed (its last worker left) before the event applied
	dropEmpty         = "empty"          // an event without blocks
	dropBlockSize     = "block_size"     // the event's block size differs from the index's
	dropPartialBlock  = "partial_block"  // blocks without a full block of tokens
	dropUnknownObject = "unknown_object" // a Mooncake update of an object never stored
)

// Reasons batches are lost (never received, not recoverable).
const (
	lostGap        = "gap"         // a gap in the sequence that replay did not fill
	lostBeforeJoin = "before_join" // published before the listener first connected
)

// Metrics are the event path's Prometheus metrics (kvgate_kv_event_*).
type Metrics struct {
	batchesReceived  prometheus.Counter
	batchesReplayed  prometheus.Counter
	batchesDuplicate prometheus.Counter
	batchesDropped   *prometheus.CounterVec
	batchesLost      *prometheus.CounterVec
	decodeErrors     prometheus.Counter
	eventsReceived   *prometheus.CounterVec
	eventsApplied    *prometheus.CounterVec
	eventsIgnored    *prometheus.CounterVec
	eventsDropped    *prometheus.CounterVec
	blocksStored     prometheus.Counter
	blocksRemoved    prometheus.Counter
	blocksUnknown    prometheus.Counter
	blocksDropped    *prometheus.CounterVec
	gaps             prometheus.Counter
	replayFailures   prometheus.Counter
	resyncs          prometheus.Counter
	restarts         prometheus.Counter
	reconnects       prometheus.Counter
	transitions      *prometheus.CounterVec

	statuses atomic.Pointer[func() map[ListenerStatus]int]
}

// NewMetrics creates the metrics and registers them with reg, if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_kv_event_" + name, Help: help})
	}
	vec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_kv_event_" + name, Help: help}, []string{label})
	}
	m := &Metrics{
		batchesReceived:  counter("batches_received_total", "Live event batches received."),
		batchesReplayed:  counter("batches_replayed_total", "Event batches applied from a replay."),
		batchesDuplicate: counter("batches_duplicate_total", "Live batches skipped because a replay already applied them."),
		batchesDropped:   vec("batches_dropped_total", "Event batches received but not applied, by reason.", "reason"),
		batchesLost:      vec("batches_lost_total", "Event batches missed in sequence gaps and not recovered, by reason.", "reason"),
		decodeErrors:     counter("decode_errors_total", "Messages or payloads that failed to decode."),
		eventsReceived:   vec("events_received_total", "Events decoded, by kind.", "kind"),
		eventsApplied:    vec("events_applied_total", "Events applied to the index, by kind.", "kind"),
		eventsIgnored:    vec("events_ignored_total", "Events deliberately not indexed (hybrid-attention groups, remote blocks), by reason.", "reason"),
		eventsDropped:    vec("events_dropped_total", "Events that could not be applied, by reason.", "reason"),
		blocksStored:     counter("blocks_stored_total", "(block, tier) entries added to the index."),
		blocksRemoved:    counter("blocks_removed_total", "(block, tier) entries removed from the index."),
		blocksUnknown:    counter("blocks_unknown_total", "Removals or tier updates of blocks the worker rank did not hold."),
		blocksDropped:    vec("blocks_dropped_total", "Blocks of stored events not indexed, by reason.", "reason"),
		gaps:             counter("gaps_total", "Sequence gaps detected."),
		replayFailures:   counter("replay_failures_total", "Replay requests that failed or timed out."),
		resyncs:          counter("resyncs_total", "Full-buffer replays after an event with an unknown parent."),
		restarts:         counter("publisher_restarts_total", "Publisher restarts detected (sequence back to 0 or a new epoch)."),
		reconnects:       counter("listener_disconnects_total", "Listener connections lost."),
		transitions:      vec("listener_transitions_total", "Listener state changes, by new state.", "status"),
	}
	if reg == nil {
		return m
	}
	for _, c := range []prometheus.Collector{m.batchesReceived, m.batchesReplayed, m.batchesDuplicate, m.batchesDropped,
		m.batchesLost, m.decodeErrors, m.eventsReceived, m.eventsApplied, m.eventsIgnored, m.eventsDropped,
		m.blocksStored, m.blocksRemoved, m.blocksUnknown, m.blocksDropped, m.gaps, m.replayFailures, m.resyncs,
		m.restarts, m.reconnects, m.transitions} {
		reg.MustRegister(c)
	}
	for _, s := range []ListenerStatus{StatusPending, StatusActive, StatusFailed, StatusPaused} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "kvgate_kv_event_listeners",
			Help:        "KV event listeners, by state.",
			ConstLabels: prometheus.Labels{"status": string(s)},
		}, func() float64 {
			if f := m.statuses.Load(); f != nil {
				return float64((*f)()[s])
			}
			return 0
		}))
	}
	return m
}

// bindListeners sets the source of the listener state gauges.
func (m *Metrics) bindListeners(f func() map[ListenerStatus]int) { m.statuses.Store(&f) }
