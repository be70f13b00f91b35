package httpapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/scheduler/replica"
)

// This file serves replica sync's peer routes (Dynamo's selection service,
// docs/http-api.md), on or off.

// ReplicaRoutes returns the replica sync routes of r: register_peer,
// deregister_peer and peers.
func ReplicaRoutes(r *replica.Replica) []admin.Route {
	h := replicaAPI{r}
	return []admin.Route{
		{Pattern: "POST /replica_sync/register_peer", Handler: h.handleRegisterPeer, Mutates: true},
		{Pattern: "POST /replica_sync/deregister_peer", Handler: h.handleDeregisterPeer, Mutates: true},
		{Pattern: "GET /replica_sync/peers", Handler: h.handlePeers},
	}
}

// ReplicaSyncOffRoutes are the replica sync routes of a process without
// replica sync: the peer list is empty and changing it is a conflict.
func ReplicaSyncOffRoutes() []admin.Route {
	off := func(w http.ResponseWriter, _ *http.Request) {
		admin.WriteError(w, admin.Errorf(http.StatusConflict, "replica sync is off; start kvgate with --replica-sync-port"))
	}
	return []admin.Route{
		{Pattern: "POST /replica_sync/register_peer", Handler: off, Mutates: true},
		{Pattern: "POST /replica_sync/deregister_peer", Handler: off, Mutates: true},
		{Pattern: "GET /replica_sync/peers", Handler: func(w http.ResponseWriter, _ *http.Request) {
			admin.WriteJSON(w, http.StatusOK, []string{})
		}},
	}
}

// replicaAPI serves the replica sync routes.
type replicaAPI struct{ r *replica.Replica }

type replicaPeerRequest struct {
	Endpoint *string `json:"endpoint"`
}

func decodeReplicaPeer(r *http.Request) (string, error) {
	var req replicaPeerRequest
	if err := admin.Decode(r, &req); err != nil {
		return "", err
	}
	if req.Endpoint == nil {
		return "", admin.Errorf(http.StatusBadRequest, "endpoint is required")
	}
	return *req.Endpoint, nil
}

func (h replicaAPI) handleRegisterPeer(w http.ResponseWriter, req *http.Request) {
	ep, err := decodeReplicaPeer(req)
	var added bool
	if err == nil {
		added, err = h.r.AddPeer(ep)
	}
	switch {
	case err != nil:
		admin.WriteError(w, replicaHTTPError(err))
	case added:
		admin.OK(w, http.StatusCreated)
	default: // registered already, as Dynamo answers
		admin.OK(w, http.StatusOK)
	}
}

func (h replicaAPI) handleDeregisterPeer(w http.ResponseWriter, req *http.Request) {
	ep, err := decodeReplicaPeer(req)
	var found bool
	if err == nil {
		found, err = h.r.RemovePeer(ep)
	}
	switch {
	case err != nil:
		admin.WriteError(w, replicaHTTPError(err))
	case !found:
		admin.WriteError(w, admin.Errorf(http.StatusNotFound, "replica sync peer %s is not registered", strings.TrimSpace(ep)))
	default:
		admin.OK(w, http.StatusOK)
	}
}

func (h replicaAPI) handlePeers(w http.ResponseWriter, _ *http.Request) {
	admin.WriteJSON(w, http.StatusOK, h.r.Peers())
}

// replicaHTTPError passes API errors through and maps the scheduler's.
func replicaHTTPError(err error) error {
	var e *admin.Error
	if errors.As(err, &e) {
		return e
	}
	return httpError(err)
}
