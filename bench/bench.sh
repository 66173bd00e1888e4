#!/usr/bin/env bash
# `make bench` / `make bench-quick`: installs what the benchmark needs beyond
# `make deps` (pgbouncer, python3), builds Sluice in release mode and runs the
# driver, bench/run.py, which does everything else. Arguments go to run.py
# (--quick, --rounds N, --seconds N, --only KEYS, --idle N, --scale-idle N, --keep).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bench/install-deps.sh
"${CARGO:-cargo}" build --release
exec python3 bench/run.py "$@"
