#!/usr/bin/env bash
# Profile-guided build of Sluice (`make pgo`, and what `make bench` measures):
#   1. an instrumented release build (-Cprofile-generate) in target/pgo-gen;
#   2. `bench/run.py --train`: a throwaway PostgreSQL, every bench scenario once
#      through the instrumented Sluice, as the bench meets it (the TLS scenario
#      through one offering TLS, the others through one answering libpq's
#      SSLRequest with N), each writing its profile at exit;
#   3. llvm-profdata merges them; 4. the release build with -Cprofile-use, in
#      target/pgo/release/sluice.
# The optimiser then lays out the hot path (the relay, the pool, the runtime's
# poll loop) together and inlines by measured use: about a fifth fewer
# instructions and half the instruction-cache misses per transaction
# (docs/performance.md, tenth round). llvm-profdata comes with rustup's
# llvm-tools component, added here if missing. Exit 2 when no llvm-profdata can
# be had (the caller may fall back to the plain build); anything else failing
# is an error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CARGO="${CARGO:-cargo}"
export PATH="$HOME/.cargo/bin:$PATH"

profdata() {
    local bin
    bin="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
    if [ ! -x "$bin" ] && command -v rustup >/dev/null 2>&1; then
        echo "pgo: adding rustup's llvm-tools component (for llvm-profdata)" >&2
        rustup component add llvm-tools >&2 || true
    fi
    [ -x "$bin" ] && echo "$bin"
}

PROFDATA="$(profdata)" || {
    echo "pgo: llvm-profdata not found (rustup component llvm-tools); no profile-guided build" >&2
    exit 2
}

# Under /tmp so that the instrumented Sluice, run as nobody when we are root,
# can write there; no "sluice" in the name (see run.py on pkill).
RAW="$(mktemp -d /tmp/pooler-pgo.XXXXXX)"
trap 'rm -rf "$RAW"' EXIT
chmod 755 "$RAW"

echo "pgo: instrumented build (target/pgo-gen)"
# Build scripts are instrumented too and write profiles as the build runs
# them: into a dir of their own, left out of the merge (a fixed path, so that
# the flags, and so this build, stay the same from one run to the next).
mkdir "$RAW/train"
RUSTFLAGS="-Cprofile-generate=$ROOT/target/pgo-gen/build-profiles" "$CARGO" build --release --target-dir target/pgo-gen
echo "pgo: training run"
python3 bench/run.py --train "$RAW/train" --sluice "$ROOT/target/pgo-gen/release/sluice" \
    --seconds "${PGO_SECONDS:-2}" --idle 0 --scale-idle 0
mkdir -p target/pgo
"$PROFDATA" merge -o target/pgo/sluice.profdata "$RAW"/train/*.profraw
echo "pgo: optimised build (target/pgo/release/sluice)"
RUSTFLAGS="-Cprofile-use=$ROOT/target/pgo/sluice.profdata" \
    "$CARGO" build --release --target-dir target/pgo
