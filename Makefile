# onebitd — make help lists the targets.
GO      ?= go
BIN     := bin
CMDS    := onebitd onebit-decoder-sim onebit-provider-sim onebit-prefill
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help build test test-short bench run lint fuzz clean soak

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build every binary into bin/
	@mkdir -p $(BIN)
	@for c in $(CMDS); do if [ -d cmd/$$c ]; then $(GO) build -o $(BIN)/$$c ./cmd/$$c || exit 1; fi; done

test: ## run every test with the race detector
	$(GO) test -race -count=1 -timeout 30m -parallel 4 ./...

test-short: ## quick tests (no long end-to-end prompts)
	$(GO) test -short -count=1 ./...

bench: build ## Go benchmarks of the hot paths + the side-by-side harness (docs/BENCHMARKS.md); BENCH_BASE=old.out compares before → after; LLAMA_SERVER=… MODEL=… adds a real llama-server, plain vs file route
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./fdpass ./event ./eventlog ./bus ./handoff ./handlers ./decoder ./internal/decodersim 2>&1 | tee bench.out
	$(GO) test -run '^$$' -bench HandoffBreakEven -benchtime 1x -count 3 ./daemon 2>&1 | tee -a bench.out
	$(GO) run ./cmd/onebit-bench -out docs/BENCHMARKS.md -gobench bench.out $(if $(BENCH_BASE),-gobench-base $(BENCH_BASE)) -llama-server "$(LLAMA_SERVER)" -model "$(MODEL)"$(if $(LLAMA_CTX), -llama-ctx $(LLAMA_CTX))$(if $(LLAMA_ARGS), -llama-args "$(LLAMA_ARGS)")

run: build ## run onebitd (embedded NATS; the decoder simulator when LLAMA_SERVER is unset)
	./scripts/run.sh

lint: ## go vet + staticcheck
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

fuzz: ## run each fuzz target for 20s
	@for t in $$(grep -rl '^func Fuzz' --include='*_test.go' . | xargs -n1 dirname | sort -u); do \
	  for f in $$(grep -h '^func Fuzz' $$t/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 20s $$t || exit 1; done; done

SOAK_DURATION ?= 10m
soak: build ## soak test: a fault per request against onebitd stacks, then the leak and audit checks (SOAK_DURATION=2m for CI; docs/RELIABILITY.md)
	$(GO) build -o $(BIN)/onebit-soak ./cmd/onebit-soak
	./$(BIN)/onebit-soak --bin-dir $(BIN) --duration $(SOAK_DURATION)

clean: ## remove build output and the default state dir
	rm -rf $(BIN) onebitd-state bench.out
