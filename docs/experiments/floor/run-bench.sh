#!/bin/bash
# Builds floor and runs the project's bench with it in Sluice's place:
#   docs/experiments/floor/run-bench.sh [bench/run.py options, e.g. --only select1_tcp]
# The report goes to bench/results/floor/ (its "Sluice" columns are floor's). No
# scale test: floor is one process and does not share its port.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
export CARGO_TARGET_DIR="$root/target/floor"
(cd "$here" && cargo build --release --quiet)
SLUICE_BUILD="floor (docs/experiments/floor), in Sluice's place" \
    python3 "$root/bench/run.py" --sluice "$CARGO_TARGET_DIR/release/floor" \
    --scale-idle 0 --out "$root/bench/results/floor" "$@"
