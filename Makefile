# kvgate — build, test and check targets. Run `make help` for a list.

GO       ?= go
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
FUZZTIME ?= 10s

.DEFAULT_GOAL := build
.PHONY: build install demo test test-deps bench bench-routing fuzz lint clean help

build: ## Build bin/kvgate, version stamped from git describe (or "dev")
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kvgate .

install: ## Install kvgate into $(go env GOPATH)/bin (or GOBIN), version stamped as for build
	$(GO) install -ldflags '$(LDFLAGS)' .

demo: build ## Replay a window of the Mooncake conversation trace through kvgate in front of a simulated fleet, once per routing policy; results in demo-out/
	$(GO) run ./bench/routing -kvgate bin/kvgate -out demo-out

# Tests that need a tokenizer that is absent (see KVGATE_TOKENIZERS in
# CONTRIBUTING.md) skip and append a line to $KVGATE_SKIP_LOG
# (internal/fixture); the last line sums them up, pass or fail.
test: test-deps ## Run all tests with the race detector (installs the interop test's Debian packages if missing); the last line lists the tokenizer fixture skips
	@skips=$$(mktemp) || exit; trap 'rm -f "$$skips"' EXIT; export KVGATE_SKIP_LOG="$$skips"; \
	run() { echo "$$*"; "$$@"; }; \
	run env KVGATE_INTEROP=1 $(GO) test -race -count=1 ./...; \
	status=$$?; \
	tests() { if [ "$$1" = 1 ]; then echo "1 test"; else echo "$$1 tests"; fi; }; \
	list() { sort -u | paste -sd, - | sed 's/,/, /g'; }; \
	if [ -s "$$skips" ]; then \
		summary="$$(tests $$(grep -c '^skip' "$$skips")) skipped"; \
		part=$$(grep -c '^part' "$$skips"); \
		[ "$$part" = 0 ] || summary="$$summary, $$(tests $$part) run in part"; \
		echo "fixture skips: $$summary, missing $$(cut -f2 "$$skips" | tr , '\n' | list) in $$(cut -f3 "$$skips" | list) (set KVGATE_TOKENIZERS)"; \
	else echo "fixture skips: none"; fi; \
	exit $$status

# The libzmq interop test runs a publisher on Debian's python3 with
# python3-zmq and python3-msgpack (what vLLM and SGLang use).
test-deps:
	@if ! /usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null; then \
		echo "installing python3-zmq python3-msgpack for the libzmq interop test"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q python3 python3-zmq python3-msgpack; \
	fi

bench: ## Go benchmarks, then the index, ingestion, gateway and tokenizer benchmarks (BENCHMARKS.md), on the shipped data
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./bench/indexload
	$(GO) run ./bench/indexload -index-shards 2
	$(GO) run ./bench/indexload -split 1 -capacity 512
	$(GO) run ./bench/ingest -publishers 4 -batches 20000
	$(GO) run ./bench/ingest -publishers 64 -batches 2000 -encoding array
	$(GO) run ./bench/gateway -duration 30s -sweep 200,400,800,1200 -sweep-duration 10s
	$(GO) run ./bench/tokenize

bench-routing: build ## Routing quality at larger scale: load sweeps on the conversation and synthetic traces; results in bench-out/
	$(GO) run ./bench/routing -kvgate bin/kvgate -out bench-out/conversation -window 15m -compression 15,20,25,30
	$(GO) run ./bench/routing -kvgate bin/kvgate -out bench-out/synthetic -trace data/mooncake-traces/synthetic_trace.jsonl.gz -window 0 -compression 12,18,24
	$(GO) run ./bench/routing -kvgate bin/kvgate -out bench-out/dp -window 15m -dp-size 2 -speedup 2.5 -compression 25

fuzz: ## Run every fuzz target for FUZZTIME each (default 10s)
	GO='$(GO)' FUZZTIME='$(FUZZTIME)' .ci/fuzz

lint: ## Fail on unformatted files; go vet
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

clean: ## Remove build output
	rm -rf bin demo-out bench-out

help: ## List targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'
