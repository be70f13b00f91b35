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
}

// maxDumpBytes bounds a peer's dump.
const maxDumpBytes = 4 << 30

// Recover fetches GET /dump from the first of peers that answers with a
// valid dump, trying them in order with timeout each, and loads it into
// set. No peer answering is not an error: the index then starts empty.
// Call it before releasing a held Set, so that live events queued meanwhile
// apply on top of the dump.
func Recover(ctx context.Context, set *indexer.Set, peers []string, client *http.Client, timeout time.Duration, log *slog.Logger) Recovery {
	if client == nil {
		client = http.DefaultClient
	}
	if log == nil {
		log = slog.Default()
	}
	for _, peer := range peers {
		dumps, err := fetchDump(ctx, client, peer, timeout)
		if err != nil {
			log.Warn("peer recovery: peer unusable", "peer", peer, "err", err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		rec := Recovery{Peer: peer, Indexes: len(dumps)}
		for _, d := range dumps {
			if ix := set.Lookup(d.Key); ix != nil && ix.BlockSize() != d.BlockSize {
				log.Warn("peer recovery: index skipped, block size differs", "peer", peer, "index", d.Key.String(),
					"peer_block_size", d.BlockSize, "block_size", ix.BlockSize())
				rec.Conflicts = append(rec.Conflicts, d.Key.String())
				continue
			}
			n, err := set.Load([]indexer.IndexDump{d})
			rec.Skipped += n
			rec.Events += len(d.Events) - n
			if err != nil {
				log.Warn("peer recovery: index partly loaded", "peer", peer, "index", d.Key.String(), "err", err)
			}
		}
		log.Info("peer recovery: loaded dump", "peer", peer, "indexes", rec.Indexes, "events", rec.Events, "skipped", rec.Skipped)
		return rec
	}
	if len(peers) > 0 {
		log.Warn("peer recovery: no peer answered; starting with an empty index", "peers", len(peers))
	}
	return Recovery{}
}

func fetchDump(ctx context.Context, client *http.Client, peer string, timeout time.Duration) ([]indexer.IndexDump, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer+"/dump", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /dump: status %s", resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxDumpBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET /dump: %w", err)
	}
	if len(data) > maxDumpBytes {
		return nil, errors.New("GET /dump: dump larger than 4 GiB")
	}
	return indexer.UnmarshalDump(data)
}
