#!/usr/bin/env bash
# `make bench` / `make bench-quick`: installs what the benchmark needs beyond
# `make deps` (pgbouncer, python3), builds Sluice and runs the driver,
# bench/run.py, which does everything else. Arguments go to run.py
# (--quick, --rounds N, --seconds N, --only KEYS, --idle N, --scale-idle N, --keep).
#
# Sluice is measured as shipped by `make pgo`: a profile-guided release build
# (bench/pgo.sh). BENCH_PGO=0 measures the plain `cargo build --release`
# instead, as does a machine without llvm-profdata.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bench/install-deps.sh
if [ -n "${SLUICE_BIN:-}" ]; then
    export SLUICE_BUILD="${SLUICE_BUILD:-given (SLUICE_BIN)}"
elif [ "${BENCH_PGO:-1}" != 0 ]; then
    rc=0
    bench/pgo.sh || rc=$?
    if [ "$rc" = 0 ]; then
        export SLUICE_BIN="$ROOT/target/pgo/release/sluice" SLUICE_BUILD="profile-guided (make pgo)"
    elif [ "$rc" = 2 ]; then
        echo "bench: measuring the plain release build instead" >&2
    else
        exit "$rc"
    fi
fi
if [ -z "${SLUICE_BIN:-}" ]; then
    "${CARGO:-cargo}" build --release
    export SLUICE_BUILD="plain (cargo build --release)"
fi
exec python3 bench/run.py "$@"
