#!/usr/bin/env bash
# Runs the fuzz targets, each for FUZZ_SECONDS (default 60), from its seeds and the
# corpus of earlier runs: `make fuzz`, or `make fuzz FUZZ_TARGETS="relay_steps"`.
# Installs what cargo fuzz needs (a nightly toolchain, cargo-fuzz) when missing.
# Stops at the first target that finds a crash; its input is under artifacts/.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-$(ls fuzz_targets | sed 's/\.rs$//')}

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "== installing the nightly toolchain (cargo fuzz needs it)"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

for t in $targets; do
    [ -f "fuzz_targets/$t.rs" ] || { echo "no fuzz target $t (see fuzz_targets/)" >&2; exit 2; }
    echo "== $t, ${seconds} s"
    mkdir -p "corpus/$t" "artifacts/$t"
    before=$(ls "artifacts/$t" | wc -l)
    # -timeout: a run that takes 5 s is a hang (the relay must always stop).
    cargo +nightly fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -timeout=5 -print_final_stats=1 2>&1 |
        grep -E '^(Done|==|SUMMARY|stat::number_of_executed_units)|panicked|artifact' || true
    if [ "$(ls "artifacts/$t" | wc -l)" -gt "$before" ]; then
        echo "$t found a failing input: artifacts/$t/ (replay: cargo +nightly fuzz run $t <file>)" >&2
        exit 1
    fi
done
