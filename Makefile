# Sluice — build, test, lint, demo.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps build pgo test lint demo clean bench bench-quick bench-scale fuzz

all: build

deps:
	@scripts/install-deps.sh

build:
	$(CARGO) build --release

# The profile-guided release build, trained on the bench's scenarios against a
# throwaway PostgreSQL: target/pgo/release/sluice (bench/pgo.sh).
pgo: deps
	bench/install-deps.sh
	bench/pgo.sh

test: deps
	$(CARGO) build --all-targets
	$(CARGO) test
	@# Again on the multi-threaded runtime, Sluice's default on machines of more than
	@# 2 cores (this pass is what runs there; the driver matrix is covered once).
	SLUICE_WORKERS=2 $(CARGO) test --test it -- --skip drivers::

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps

demo: deps
	$(CARGO) build --release
	scripts/demo.sh

# Sluice vs PgBouncer vs PostgreSQL; see bench/README.md. BENCH_ARGS are
# passed to bench/run.py (e.g. BENCH_ARGS="--rounds 5 --seconds 10").
# `make bench` measures the profile-guided build (BENCH_PGO=0: the plain one);
# the quick run, the plain one (BENCH_PGO=1: the profile-guided one), since
# the training and second build would take longer than the run itself.
bench: deps
	bench/bench.sh $(BENCH_ARGS)

bench-quick: deps
	BENCH_PGO="$${BENCH_PGO:-0}" bench/bench.sh --quick $(BENCH_ARGS)

# How the poolers scale with cores, for machines with more than 2 (bench/scale.py;
# SCALE_ARGS e.g. "--workers 1,4,16 --sluice-procs 4 --pgbouncer-procs 1,4").
bench-scale: deps
	bench/install-deps.sh
	$(CARGO) build --release
	python3 bench/scale.py $(SCALE_ARGS)

# Coverage-guided fuzzing (fuzz/README.md): every target for FUZZ_SECONDS (60) each,
# or those in FUZZ_TARGETS. Not part of `make test`: it needs a nightly toolchain.
fuzz:
	fuzz/run.sh

clean:
	$(CARGO) clean
