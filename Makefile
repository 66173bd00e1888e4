# Sluice — build, test, lint, demo.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps build test lint demo clean

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

clean:
	$(CARGO) clean
