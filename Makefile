# kvgate — build, test and check targets. Run `make help` for a list.

GO       ?= go
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
FUZZTIME ?= 10s

.DEFAULT_GOAL := build
.PHONY: build test bench fuzz lint clean help

build: ## Build bin/kvgate, version stamped from git describe (or "dev")
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kvgate .

test: ## Run all tests with the race detector
	$(GO) test -race -count=1 ./...

bench: ## Run Go benchmarks, then the index load benchmark on the Mooncake conversation trace
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./bench/indexload -trace ../shared/data/mooncake-traces/conversation_trace.jsonl
	$(GO) run ./bench/indexload -trace ../shared/data/mooncake-traces/conversation_trace.jsonl -split 1 -capacity 512

fuzz: ## Run every fuzz target for FUZZTIME each (default 10s)
	GO='$(GO)' FUZZTIME='$(FUZZTIME)' .ci/fuzz

lint: ## Fail on unformatted files; go vet
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

clean: ## Remove build output
	rm -rf bin

help: ## List targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-6s %s\n", $$1, $$2}'
