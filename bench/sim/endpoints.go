package sim

// Endpoints is the document `kvgate sim --endpoints-file` writes: where
// each simulated worker listens. Its readers (the end-to-end tests,
// bench/routing) decode it with the same types.
type Endpoints struct {
	Model     string           `json:"model"`
	BlockSize int              `json:"block_size"`
	Workers   []EndpointWorker `json:"workers"`
	// ServeArgs are the arguments of `kvgate serve` that subscribe to
	// every rank's events.
	ServeArgs []string `json:"serve_args"`
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
