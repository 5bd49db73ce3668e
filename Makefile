# Baton: `make demo` shows it working, `make test` runs every test.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps build release demo test lint unit cluster-test bench clean

deps:
	@./scripts/install-deps.sh

build: deps
	$(CARGO) build --bins
	$(CARGO) build -p baton-server --features fault-injection --bin batond-faulty

release: deps
	$(CARGO) build --release --bins

# Starts a local 3-member cluster, shows the main job, stops everything.
demo: release
	./scripts/demo.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy -p baton-server --all-targets --features fault-injection -- -D warnings

# The whole suite: lint, unit and golden tests, then real 3-member clusters.
test: lint build
	$(CARGO) test --workspace -- --test-threads=2

# Throughput and latency on a fresh local cluster (release build).
bench: release
	./scripts/bench.sh

clean:
	$(CARGO) clean
