# Sluice — build, test, lint, demo.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps build test lint demo clean bench bench-quick

all: build

deps:
	@scripts/install-deps.sh

build:
	$(CARGO) build --release

test: deps
	$(CARGO) build --all-targets
	$(CARGO) test

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

demo: deps
	$(CARGO) build --release
	scripts/demo.sh

# Sluice vs PgBouncer vs PostgreSQL; see bench/README.md. BENCH_ARGS are
# passed to bench/run.py (e.g. BENCH_ARGS="--rounds 5 --seconds 10").
bench: deps
	bench/bench.sh $(BENCH_ARGS)

bench-quick: deps
	bench/bench.sh --quick $(BENCH_ARGS)

clean:
	$(CARGO) clean
