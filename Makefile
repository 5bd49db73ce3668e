# Baton: `make demo` shows it working, `make test` runs every test.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps rival-deps zk-clients-deps store-deps locks-smoke locks build release demo test check lint advisories fuzz-smoke sim jepsen-faults-long jepsen-smoke compare-smoke compare scale-smoke scale bench fsync-probe clean

deps:
	@./scripts/install-deps.sh

# Baton's rivals, etcd 3.4 and ZooKeeper 3.8, from Debian, for the
# benchmark (bench/) and the ZooKeeper CLI tests (no-ops when installed).
rival-deps:
	@./bench/rivals/etcd.sh install
	@./bench/rivals/zookeeper.sh install

# Curator 5 (Debian) with javac, and kazoo (PyPI, in a virtualenv under
# /var/cache) for tests/tests/zookeeper_clients.rs (no-ops when present).
zk-clients-deps:
	@./scripts/zk-clients-deps.sh

# PostgreSQL and Redis (Debian), the stores a lock protects, for the
# fence tests (fence/tests/, tests/tests/fence.rs); no-ops when installed.
store-deps:
	@./scripts/store-deps.sh

build: deps
	$(CARGO) build --workspace --bins
	$(CARGO) build -p baton-server --features fault-injection --bin batond-faulty

release: deps
	$(CARGO) build --release --bins

# Starts a local 3-member cluster, shows the main job, stops everything.
demo: release
	./scripts/demo.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p baton-server --all-targets --features fault-injection -- -D warnings

# Every crate in Cargo.lock against the pinned RustSec advisory database,
# offline (installs cargo-deny if missing). Exceptions and their reasons are
# in deny.toml; docs/advisories.md tells how to refresh the database.
advisories:
	./scripts/advisories.sh

# The whole suite, stage by stage (scripts/test-all.sh): lint, the advisory
# check, the build, the docs, the rivals (etcd, ZooKeeper) and ZooKeeper
# clients, the stores a lock protects (PostgreSQL, Redis), the workspace's tests (unit, golden, real 3-member clusters,
# the harness's fault-catching tests, the rivals' lock safety test, Curator's and kazoo's
# recipes), the simulator, 20 s of each fuzz target, a short Jepsen run of
# every workload, a short compare, a short run of every lock kind and a
# short scale. Ends with the time each
# stage took and the slowest test binaries. What CI runs.
test:
	@MAKE="$(MAKE)" CARGO="$(CARGO)" ./scripts/test-all.sh

# The fast tier for the edit loop (a few minutes warm): fmt, clippy, every
# crate's unit tests, the golden scripts, the failure table's simulator
# scripts, the wire captures, and the
# simulator's session scripts with BATON_SIM_SEEDS (default 300) random
# fault schedules. No clusters, no rivals, no smokes: `make test` has them.
CHECK_SIM_SEEDS ?= 300
check: lint
	$(CARGO) test --workspace --lib --bins -- --test-threads=2
	$(CARGO) test -p baton-server --test golden --test failures --test member --test admin
	$(CARGO) test -p baton-proto --tests
	BATON_SIM_SEEDS=$(CHECK_SIM_SEEDS) $(MAKE) --no-print-directory sim

# The deterministic simulator: the session scripts (findings S1-S7, L1, each
# with a planted-bug twin) and BATON_SIM_SEEDS random fault schedules
# (default 2,000, ~1.5 min). The twins need the deliberate bugs compiled in.
# Replay a failing seed: BATON_SIM_SEED=<n> make sim
sim:
	$(CARGO) test -p baton-server --features fault-injection --test sessions -- --test-threads=2 --nocapture \
	  2>&1 | grep -E '^test |seeds|caught|panicked|failed|VIOLATION|test result' ; exit $${PIPESTATUS[0]}

# The harness's fault tests whose catch depends on timing inside a member
# (keepalive-without-quorum, expire-from-stale-role: up to 6 seeds each,
# ~10 min); the simulator proves both deterministically in `make test`.
jepsen-faults-long: build
	$(CARGO) test -p baton-jepsen --test faults -- --ignored --test-threads=1 --nocapture

# fdatasync latency of 300 B records on this machine's disk, by how the
# file was made (a growing file, an overwritten preallocated one, a
# fallocated one), 1 and 3 writers, 100 s per row (~10 min; figures in
# docs/perf/fsync.md). FSYNC_DIR: a folder on the disk to test.
FSYNC_DIR ?= /var/tmp/baton-fsync-probe
FSYNC_SECS ?= 100
fsync-probe: build
	$(CARGO) run -q -p baton-server --bin fsync-probe -- --dir $(FSYNC_DIR) --secs $(FSYNC_SECS)

# Every compare workload for a few seconds on every target (Baton, etcd,
# ZooKeeper, and Baton through its ZooKeeper port), to keep the adapters
# working (debug build: the figures mean nothing). A failed run fails it.
compare-smoke: build rival-deps
	@CARGO="$(CARGO)" ./scripts/compare-smoke.sh

# The full comparison with the rivals (baton-bench; release build, 5
# interleaved runs of each workload on each target, ~30 min):
# docs/comparison.md has the last results.
compare: release rival-deps
	$(CARGO) run --release -q -p baton-bench -- compare --out bench/store/compare-$$(date +%s)

# Every lock kind of the seeds' comparison for 3 s, without a fault, with
# paused holders, with the lock service's primary killed and with a holder's
# links to it cut (debug build, ~5 min): fails unless the run is valid and
# its report complete.
locks-smoke: build store-deps rival-deps
	@CARGO="$(CARGO)" ./scripts/locks-smoke.sh

# The seeds' comparison (release build; 12 lock kinds x 16 and 64 workers x
# no fault, paused holders, a killed lock service and a cut link, 20 s
# each, ~32 min):
# docs/locks-compared.md has the last results.
locks: release store-deps rival-deps
	$(CARGO) run --release -q -p baton-bench -- locks --workers 16,64 --faults none,pause,kill,cut --time-limit 20 \
	  --out bench/store/locks-$$(date +%s)

# Every scale dimension at small sizes on Baton and ZooKeeper, and etcd's
# (nodes, sessions, locks, clients; ~40 s), one cluster each (debug build,
# ~3 min): fails if the command fails (a herd in a lock queue fails it) or
# scale.json lacks a dimension's rows.
scale-smoke: build rival-deps
	@CARGO="$(CARGO)" ./scripts/scale-smoke.sh

# The full scale run (release build, ~20 min; docs/scaling.md has the last
# results): 10k-1M nodes, 1k-25k sessions, 10k-100k watches, 1k-10k
# watchers, 1-1000 lock waiters, 1-512 clients, on Baton, etcd (nodes,
# sessions, locks and clients: it has no one-shot watches) and ZooKeeper.
scale: release rival-deps
	$(CARGO) run --release -q -p baton-bench -- scale --targets baton,etcd,zookeeper --rivals-may-fail \
	  --runs 2 --duration 3 --lock-window 3 --interval 5 \
	  --out bench/store/scale-$$(date +%s)

# Each workload ~30 s under a random mix of every nemesis, the lock
# workload once more with TLS on both ports, every workload at once through
# the ZooKeeper door (a ZooKeeper client on the ZooKeeper port), and the
# lock, election, rwlock and semaphore workloads through the CLI door (`baton lock`,
# `baton elect`, with `kill-client` in the mix); any invalid result fails
# the build.
JEPSEN_SECS ?= 30
jepsen-smoke: build
	@CARGO="$(CARGO)" JEPSEN_SECS=$(JEPSEN_SECS) ./scripts/jepsen-smoke.sh

# Each fuzz target (fuzz/README.md) for FUZZ_SECS seconds with nightly and
# cargo-fuzz (installed if missing); a crash fails and leaves its input in
# fuzz/artifacts/. `make test` runs it with FUZZ_SECS=20.
FUZZ_SECS ?= 30
fuzz-smoke:
	@CARGO="$(CARGO)" FUZZ_SECS=$(FUZZ_SECS) ./scripts/fuzz-smoke.sh

# Every `baton`, `batond` and `make` command in README.md and docs/*.md
# names a subcommand and flags the binaries have (their --help) or a
# target of this Makefile, and README's Rust example is the doctest of
# client/src/lib.rs (a few seconds).
.PHONY: check-docs check-readme
check-docs: build
	./scripts/check-docs.sh

# README's shell examples, run against a fresh local 3-member cluster
# (bounded: 30 s to start it, 120 s for the examples; stopped either way).
check-readme: build
	./scripts/check-docs.sh --run-readme

# Throughput and latency on a fresh local cluster (baton-bench bench,
# release build).
bench: release
	./scripts/bench.sh

clean:
	$(CARGO) clean
