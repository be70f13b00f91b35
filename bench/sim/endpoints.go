package sim

// Endpoints is the document `kvgate sim --endpoints-file` writes: where
// each simulated worker listens. Its readers (the end-to-end tests,
// bench/routing) decode it with the same types.
type Endpoints struct {
	Model     string           `json:"model"`
	BlockSize int              `json:"block_size"`
	Workers   []EndpointWorker `json:"workers"`
	// ServeArgs are the arguments of `kvgate serve` that describe the
	// fleet: model, block size, every rank's events and every worker's
	// HTTP endpoint. They name no listener, so callers add their own.
	ServeArgs []string `json:"serve_args"`
	// ListenArgs are the listener flags of the command `kvgate sim`
	// prints (proxy on 127.0.0.1:8080, admin on 127.0.0.1:8090, ext_proc
	// on 127.0.0.1:9002): `kvgate serve` with ListenArgs, then ServeArgs,
	// is that command.
	ListenArgs []string `json:"listen_args,omitempty"`
}

// EndpointWorker is one worker of Endpoints: its HTTP API and its ranks'
// event sockets.
type EndpointWorker struct {
	ID    uint64         `json:"id"`
	URL   string         `json:"url"`
	Ranks []EndpointRank `json:"ranks"`
}

// EndpointRank is one data-parallel rank's live event and replay sockets.
type EndpointRank struct {
	Rank   int    `json:"dp_rank"`
	Events string `json:"events"`
	Replay string `json:"replay,omitempty"`
}
