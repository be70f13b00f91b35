package httpapi

// This file serves the dump and the peer list, and recovers the index at
// startup from the first peer whose dump loads (docs/http-api.md).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
)

func (a *indexAPI) dump(w http.ResponseWriter, _ *http.Request) {
	b, err := indexer.MarshalDump(a.set.Dump())
	if err != nil {
		admin.WriteError(w, fmt.Errorf("dump: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

type peerRequest struct {
	URL *string `json:"url"`
}

func decodePeer(r *http.Request) (string, error) {
	var req peerRequest
	if err := admin.Decode(r, &req); err != nil {
		return "", err
	}
	if req.URL == nil {
		return "", admin.Errorf(http.StatusBadRequest, "url is required")
	}
	u, err := NormalizePeerURL(*req.URL)
	if err != nil {
		return "", admin.Errorf(http.StatusBadRequest, "%v", err)
	}
	return u, nil
}

func (a *indexAPI) registerPeer(w http.ResponseWriter, r *http.Request) {
	u, err := decodePeer(r)
	if err != nil {
		admin.WriteError(w, err)
		return
	}
	a.peers.Add(u)
	admin.OK(w, http.StatusCreated)
}

func (a *indexAPI) deregisterPeer(w http.ResponseWriter, r *http.Request) {
	u, err := decodePeer(r)
	if err != nil {
		admin.WriteError(w, err)
		return
	}
	if !a.peers.Remove(u) {
		admin.WriteError(w, admin.Errorf(http.StatusNotFound, "peer %s is not registered", u))
		return
	}
	admin.OK(w, http.StatusOK)
}

func (a *indexAPI) listPeers(w http.ResponseWriter, _ *http.Request) {
	admin.WriteJSON(w, http.StatusOK, a.peers.List())
}

// Peers is the list of peer indexers (kvgate or Dynamo) to recover the
// index from at startup. Peers do not synchronize state after that.
type Peers struct {
	mu   sync.Mutex
	urls []string // sorted, unique
}

// NewPeers returns a peer list holding urls, each normalized with
// NormalizePeerURL.
func NewPeers(urls []string) (*Peers, error) {
	p := &Peers{}
	for _, s := range urls {
		u, err := NormalizePeerURL(s)
		if err != nil {
			return nil, err
		}
		p.Add(u)
	}
	return p, nil
}

// NormalizePeerURL checks that s is an http(s) base URL with a host name
// and no query, fragment or user info, and returns it with the scheme and
// host in lower case and without a trailing slash.
func NormalizePeerURL(s string) (string, error) {
	s = strings.TrimSpace(s)
	u, err := url.Parse(s)
	if err != nil || u.Hostname() == "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil || u.Opaque != "" {
		return "", fmt.Errorf("peer url %q is not an http(s)://host:port base URL", truncate(s, 100))
	}
	u.Scheme, u.Host = strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("peer url %q is not an http(s)://host:port base URL", truncate(s, 100))
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Add adds a normalized URL; adding one already present does nothing.
func (p *Peers) Add(u string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i, found := slices.BinarySearch(p.urls, u); !found {
		p.urls = slices.Insert(p.urls, i, u)
	}
}

// Remove removes a normalized URL and reports whether it was present.
func (p *Peers) Remove(u string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, found := slices.BinarySearch(p.urls, u)
	if found {
		p.urls = slices.Delete(p.urls, i, i+1)
	}
	return found
}

// List returns the peers, sorted.
func (p *Peers) List() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string{}, p.urls...)
}

// Recovery is the outcome of Recover.
type Recovery struct {
	Peer    string // the peer whose dump was loaded; "" if none answered
	Indexes int    // indexes in the dump
	Events  int    // events loaded
	Skipped int    // events that could not be placed
	// Conflicts names indexes left out because this process already has
	// them with another block size.
	Conflicts []string
	// Unloadable names indexes left out because the dump's entry for them
	// is invalid (key, block size or an event) or the set refused them.
	Unloadable []string
}

// Reasons an index of a peer's dump is left out, the label values of
// kvgate_peer_recovery_skipped_indexes_total.
const (
	skipInvalid  = "invalid"  // the dump's entry does not decode or validate
	skipConflict = "conflict" // this process has the index with another block size
	skipRefused  = "refused"  // the set would not create the index
)

// skippedIndexes returns the counter of indexes left out of a recovery,
// registered with reg (nil: none), or the one already there.
func skippedIndexes(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_peer_recovery_skipped_indexes_total",
		Help: "Indexes of a peer's dump left out of startup recovery, by reason: invalid (the dump's entry), conflict (another block size here), refused (the index could not be created).",
	}, []string{"reason"})
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			if prev, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return prev
			}
		}
	}
	return c
}

// maxDumpBytes bounds a peer's dump.
const maxDumpBytes = 4 << 30

// Recover fetches GET /dump from the first of peers that answers with a
// valid dump, trying them in order with timeout each, and loads it into
// set. No peer answering is not an error: the index then starts empty.
// An index of the dump that is invalid, or cannot be loaded, is left out
// (a dump with no valid index counts as no answer) with a warning and counted in kvgate_peer_recovery_skipped_indexes_total
// (registered with reg, nil: none); the others are loaded.
// Call it before releasing a held Set, so that live events queued meanwhile
// apply on top of the dump.
func Recover(ctx context.Context, set *indexer.Set, peers []string, client *http.Client, timeout time.Duration, log *slog.Logger, reg prometheus.Registerer) Recovery {
	skipped := skippedIndexes(reg)
	for _, r := range []string{skipInvalid, skipConflict, skipRefused} {
		skipped.WithLabelValues(r) // the series exist from the start, at 0
	}
	if client == nil {
		client = http.DefaultClient
	}
	if log == nil {
		log = slog.Default()
	}
	for _, peer := range peers {
		dumps, bad, err := fetchDump(ctx, client, peer, timeout)
		if err != nil {
			log.Warn("peer recovery: peer unusable", "peer", peer, "err", err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		rec := Recovery{Peer: peer, Indexes: len(dumps) + len(bad)}
		for _, e := range bad {
			log.Warn("peer recovery: index skipped, invalid in the dump", "peer", peer, "index", e.Index, "err", e.Err)
			rec.Unloadable = append(rec.Unloadable, e.Index)
			skipped.WithLabelValues(skipInvalid).Inc()
		}
		for _, d := range dumps {
			if ix := set.Lookup(d.Key); ix != nil && ix.BlockSize() != d.BlockSize {
				log.Warn("peer recovery: index skipped, block size differs", "peer", peer, "index", d.Key.String(),
					"peer_block_size", d.BlockSize, "block_size", ix.BlockSize())
				rec.Conflicts = append(rec.Conflicts, d.Key.String())
				skipped.WithLabelValues(skipConflict).Inc()
				continue
			}
			if _, err := set.Index(d.Key, d.BlockSize); err != nil {
				log.Warn("peer recovery: index skipped, cannot create it", "peer", peer, "index", d.Key.String(), "err", err)
				rec.Unloadable = append(rec.Unloadable, d.Key.String())
				skipped.WithLabelValues(skipRefused).Inc()
				continue
			}
			n, err := set.Load([]indexer.IndexDump{d})
			rec.Skipped += n
			rec.Events += len(d.Events) - n
			if err != nil {
				log.Warn("peer recovery: index partly loaded", "peer", peer, "index", d.Key.String(), "err", err)
			}
		}
		slices.Sort(rec.Unloadable)
		log.Info("peer recovery: loaded dump", "peer", peer, "indexes", rec.Indexes, "events", rec.Events, "skipped", rec.Skipped,
			"indexes_left_out", len(rec.Conflicts)+len(rec.Unloadable))
		return rec
	}
	if len(peers) > 0 {
		log.Warn("peer recovery: no peer answered; starting with an empty index", "peers", len(peers))
	}
	return Recovery{}
}

// fetchDump fetches and decodes peer's dump: its valid indexes, and the
// invalid ones left out. err is a dump that could not be had at all, or
// whose indexes are all invalid.
func fetchDump(ctx context.Context, client *http.Client, peer string, timeout time.Duration) (dumps []indexer.IndexDump, bad []*indexer.DumpError, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer+"/dump", nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET /dump: status %s", resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxDumpBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("GET /dump: %w", err)
	}
	if len(data) > maxDumpBytes {
		return nil, nil, errors.New("GET /dump: dump larger than 4 GiB")
	}
	dumps, err = indexer.UnmarshalDump(data)
	if err == nil {
		return dumps, nil, nil
	}
	// An invalid index is left out; anything else, or no valid index at
	// all, spoils the whole dump (the next peer may have a better one).
	if len(dumps) == 0 {
		return nil, nil, err
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for _, e := range errs {
		de, ok := errors.AsType[*indexer.DumpError](e)
		if !ok {
			return nil, nil, err
		}
		bad = append(bad, de)
	}
	return dumps, bad, nil
}
