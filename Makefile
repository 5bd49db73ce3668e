# Baton: `make demo` shows it working, `make test` runs every test.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps peer-deps zk-clients-deps build release demo test lint advisories fuzz-smoke sim jepsen-faults-long jepsen-smoke compare-smoke compare scale-smoke scale bench clean

deps:
	@./scripts/install-deps.sh

# etcd 3.4 and ZooKeeper 3.8 from Debian, for the side-by-side (no-ops
# when installed).
peer-deps:
	@./jepsen/peers/etcd.sh install
	@./jepsen/peers/zookeeper.sh install

# Curator 5 (Debian) with javac, and kazoo (PyPI, in a virtualenv under
# /var/cache) for tests/tests/zookeeper_clients.rs (no-ops when present).
zk-clients-deps:
	@./scripts/zk-clients-deps.sh

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

# The whole suite: lint, the advisory check, unit and golden tests, real
# 3-member clusters, the harness's fault-catching tests, the peers' adapters
# and etcd's lock safety test, Curator's and kazoo's recipes on the
# ZooKeeper port, the simulator, 20 s of each fuzz target, a
# short Jepsen run of every workload, a short compare and a short scale.
test: lint advisories build check-docs check-readme peer-deps zk-clients-deps
	$(CARGO) test --workspace -- --test-threads=2
	$(MAKE) sim
	$(MAKE) fuzz-smoke FUZZ_SECS=20
	$(MAKE) jepsen-smoke
	$(MAKE) compare-smoke
	$(MAKE) scale-smoke

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

# Every compare workload for a few seconds on every target (Baton, etcd,
# ZooKeeper, and Baton through its ZooKeeper port), to keep the adapters
# working (debug build: the figures mean nothing). A failed run fails it.
compare-smoke: build peer-deps
	@set -o pipefail; out=$$(mktemp -d /tmp/baton-compare-smoke.XXXXXX); \
	$(CARGO) run -q -p baton-jepsen -- compare --targets baton,etcd,zookeeper,baton-zk \
	  --duration 2 --warmup 0 --run-warmup 1 --runs 1 --out $$out 2>&1 | grep -v WARN | tail -n 40 \
	  || { echo "compare smoke failed; see $$out"; exit 1; }; \
	rows=$$(grep -c '"workload"' $$out/compare.json); \
	[ "$$rows" -eq 24 ] || { echo "compare smoke: $$rows rows in compare.json, expected 24"; exit 1; }; \
	! grep -q '"failed"' $$out/compare.json || { echo "compare smoke: a run failed; see $$out/compare.md"; exit 1; }; \
	test -s $$out/compare.png && test -s $$out/compare.md; rm -rf $$out

# The full side-by-side (release build, ~20 min): docs/comparison.md has
# the last results.
compare: release peer-deps
	$(CARGO) run --release -q -p baton-jepsen -- compare --out jepsen/store/compare-$$(date +%s)

# Every scale dimension at small sizes on Baton and ZooKeeper, and etcd's
# (nodes, sessions, locks, clients; ~40 s), one cluster each (debug build,
# ~3 min): fails if the command fails (a herd in a lock queue fails it) or
# scale.json lacks a dimension's rows.
scale-smoke: build peer-deps
	@set -o pipefail; out=$$(mktemp -d /tmp/baton-scale-smoke.XXXXXX); \
	timeout 420 $(CARGO) run -q -p baton-jepsen -- scale --targets baton,zookeeper,etcd --shared-cluster \
	  --nodes 1000,3000 --sessions 50 --watches 500 --watchers 50 --waiters 1,5,20 --clients 1,8 \
	  --session-timeout 4000 --interval 1 --expiry-sample 5 --lock-window 2 --duration 1 --runs 1 \
	  --out $$out 2>&1 | grep -v WARN | tail -n 60 \
	  || { echo "scale smoke failed; see $$out"; exit 1; }; \
	for d in nodes sessions watches fanout locks clients; do \
	  rows=$$(grep -c "\"dim\": \"$$d\"" $$out/scale.json); \
	  [ "$$rows" -ge 2 ] || { echo "scale smoke: $$rows $$d rows in scale.json, expected 2 or more"; exit 1; }; \
	  test -s $$out/scale-$$d.png || { echo "scale smoke: no scale-$$d.png"; exit 1; }; \
	done; \
	grep -q '"wakeups_per_release"' $$out/scale.json && test -s $$out/scale.md; rm -rf $$out

# The full scale run (release build, ~15 min; docs/scaling.md has the last
# results): 10k-1M nodes, 1k-25k sessions, 10k-100k watches, 1k-10k
# watchers, 1-1000 lock waiters, 1-512 clients, Baton and ZooKeeper.
scale: release peer-deps
	$(CARGO) run --release -q -p baton-jepsen -- scale --runs 2 --duration 3 --lock-window 3 --interval 5 \
	  --out jepsen/store/scale-$$(date +%s)

# Each workload ~30 s under a random mix of every nemesis, the lock workload
# once more with TLS on both ports, and every workload at once through the
# ZooKeeper door (a ZooKeeper client on the ZooKeeper port); any invalid
# result fails the build.
JEPSEN_SECS ?= 30
jepsen-smoke: build
	@set -o pipefail; out=$$(mktemp -d /tmp/baton-jepsen-smoke.XXXXXX); \
	for w in register lock election session lock+tls all+zk; do \
	  args="--workload $${w%+*}"; [ "$$w" = lock+tls ] && args="$$args --tls"; \
	  [ "$$w" = all+zk ] && args="$$args --door zookeeper"; \
	  for try in 1 2; do \
	    $(CARGO) run -q -p baton-jepsen -- test $$args --nemesis all \
	      --time-limit $(JEPSEN_SECS) --out $$out/$$w-$$try | tail -n 12; rc=$$?; \
	    [ $$rc -eq 2 ] && [ $$try -eq 1 ] && { echo "harness error or unknown; retrying $$w once"; continue; }; \
	    break; \
	  done; \
	  [ $$rc -eq 0 ] || { echo "jepsen smoke: $$w failed (exit $$rc); results in $$out/$$w-$$try"; exit 1; }; \
	done; rm -rf $$out

# Each fuzz target (fuzz/README.md) for FUZZ_SECS seconds with nightly and
# cargo-fuzz (installed if missing); a crash fails and leaves its input in
# fuzz/artifacts/. `make test` runs it with FUZZ_SECS=20.
FUZZ_SECS ?= 30
fuzz-smoke:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@for t in client_frame peer_frame apply zk_frame; do \
	  mkdir -p fuzz/corpus/$$t fuzz/seeds/$$t; \
	  echo "fuzz-smoke: $$t ($(FUZZ_SECS) s)"; \
	  $(CARGO) +nightly fuzz run -a $$t fuzz/corpus/$$t fuzz/seeds/$$t -- \
	    -max_total_time=$(FUZZ_SECS) -print_final_stats=1 2>&1 \
	    | grep -E '^(Done|stat::average_exec_per_sec)|panicked|ERROR|SUMMARY|Test unit written' ; \
	  [ $${PIPESTATUS[0]} -eq 0 ] || { echo "fuzz-smoke: $$t failed (input in fuzz/artifacts/$$t)"; exit 1; }; \
	done

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

# Throughput and latency on a fresh local cluster (release build).
bench: release
	./scripts/bench.sh

clean:
	$(CARGO) clean
