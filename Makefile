# Baton: `make demo` shows it working, `make test` runs every test.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps build release demo test lint jepsen-smoke bench clean

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

# The whole suite: lint, unit and golden tests, real 3-member clusters, the
# harness's fault-catching tests, and a short Jepsen run of every workload.
test: lint build
	$(CARGO) test --workspace -- --test-threads=2
	$(MAKE) jepsen-smoke

# Each workload ~30 s under a random mix of faults (kill, pause, partition,
# leader-targeted); any invalid result fails the build.
JEPSEN_SECS ?= 30
jepsen-smoke: build
	@set -o pipefail; out=$$(mktemp -d /tmp/baton-jepsen-smoke.XXXXXX); \
	for w in register lock election session; do \
	  for try in 1 2; do \
	    $(CARGO) run -q -p baton-jepsen -- test --workload $$w --nemesis all \
	      --time-limit $(JEPSEN_SECS) --out $$out/$$w-$$try | tail -n 12; rc=$$?; \
	    [ $$rc -eq 2 ] && [ $$try -eq 1 ] && { echo "harness error or unknown; retrying $$w once"; continue; }; \
	    break; \
	  done; \
	  [ $$rc -eq 0 ] || { echo "jepsen smoke: $$w failed (exit $$rc); results in $$out/$$w-$$try"; exit 1; }; \
	done; rm -rf $$out

# Throughput and latency on a fresh local cluster (release build).
bench: release
	./scripts/bench.sh

clean:
	$(CARGO) clean
