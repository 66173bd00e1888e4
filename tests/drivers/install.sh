#!/usr/bin/env bash
# Installs the client drivers of the driver matrix (tests/it/drivers.rs), each
# pinned, from its package registry, into the build tree (never into the source
# tree):
#   target/driver-venv          psycopg 3 + asyncpg (PyPI, tests/drivers/python/requirements.txt)
#   Go module cache + target/drivers/pgx-driver   pgx v5 (Go module proxy, tests/drivers/go/go.sum)
#   target/drivers/node         node-postgres (npm, tests/drivers/node/package-lock.json)
#   target/drivers/java         pgjdbc (Maven Central, tests/drivers/java/pom.xml)
# Idempotent and silent when everything is in place (a stamp per driver records
# what it was installed from). A missing toolchain (python3 venv, go, node/npm,
# JDK/maven) is installed with apt-get when CI=true, and reported otherwise (the
# matching tests then skip locally and fail in CI). With CI=true any failure is
# fatal; otherwise it is a warning, so that `make test` still runs the rest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRIVERS="$ROOT/tests/drivers"
OUT="$ROOT/target/drivers"
VENV="$ROOT/target/driver-venv"
CI_MODE=false
if [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
    CI_MODE=true
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo); fi

mkdir -p "$OUT"
LOG="$OUT/install.log"

# One installer at a time (parallel `make test` runs share target/).
exec 9>"$OUT/.install.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
: >"$LOG"

failed=()
say() { echo "install-drivers: $*" >&2; }
fail() { # what
    failed+=("$1")
    say "FAILED: $1 (log: $LOG)"
    tail -n 20 "$LOG" >&2 || true
}
run() { "$@" >>"$LOG" 2>&1; }
hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

apt_updated=false
apt_install() { # packages...
    if [ "$CI_MODE" != true ] || ! command -v apt-get >/dev/null 2>&1; then
        return 1
    fi
    say "installing $* (apt)"
    if [ "$apt_updated" = false ]; then
        run "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
        apt_updated=true
    fi
    run "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}
need() { # command apt-packages...
    local cmd="$1"
    shift
    command -v "$cmd" >/dev/null 2>&1 && return 0
    apt_install "$@" && command -v "$cmd" >/dev/null 2>&1 && return 0
    say "$cmd not found: skipping its drivers (CI=true installs it with apt-get)"
    return 1
}

python_drivers() {
    need python3 python3 python3-venv || return 0
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        apt_install python3-venv || { say "python3 has no venv/ensurepip: skipping psycopg/asyncpg"; return 0; }
    fi
    local req="$DRIVERS/python/requirements.txt" want
    want="$(hash_of "$req")-$(python3 -c 'import sys; print(sys.version.split()[0])')"
    stamp_ok "$VENV/.sluice-stamp" "$want" && return 0
    say "installing psycopg + asyncpg into target/driver-venv (PyPI)"
    rm -rf "$VENV"
    run python3 -m venv "$VENV" &&
        run "$VENV/bin/pip" install -q --disable-pip-version-check --no-input -r "$req" &&
        echo "$want" >"$VENV/.sluice-stamp" || fail "python drivers"
}

go_driver() {
    need go golang-go || return 0
    local want
    want="$(hash_of "$DRIVERS/go/go.mod" "$DRIVERS/go/go.sum" "$DRIVERS/go/main.go")-$(go env GOVERSION)"
    stamp_ok "$OUT/pgx.stamp" "$want" && return 0
    say "installing pgx v5 (Go module proxy) and building target/drivers/pgx-driver"
    (cd "$DRIVERS/go" && run go mod download && run go build -o "$OUT/pgx-driver" .) &&
        echo "$want" >"$OUT/pgx.stamp" || fail "pgx"
}

node_driver() {
    need node nodejs || return 0
    need npm npm || return 0
    local want
    want="$(hash_of "$DRIVERS/node/package.json" "$DRIVERS/node/package-lock.json")-$(node --version)"
    stamp_ok "$OUT/node.stamp" "$want" && return 0
    say "installing node-postgres into target/drivers/node (npm)"
    mkdir -p "$OUT/node"
    cp "$DRIVERS/node/package.json" "$DRIVERS/node/package-lock.json" "$OUT/node/"
    (cd "$OUT/node" && run npm ci --no-audit --no-fund --loglevel=error) &&
        echo "$want" >"$OUT/node.stamp" || fail "node-postgres"
}

java_driver() {
    need javac default-jdk-headless || return 0
    need mvn maven || return 0
    local want
    want="$(hash_of "$DRIVERS/java/pom.xml")"
    stamp_ok "$OUT/java.stamp" "$want" && ls "$OUT"/java/lib/postgresql-*.jar >/dev/null 2>&1 && return 0
    say "installing pgjdbc into target/drivers/java (Maven Central)"
    run mvn -q -B -Dstyle.color=never -f "$DRIVERS/java/pom.xml" compile &&
        echo "$want" >"$OUT/java.stamp" || fail "pgjdbc"
}

python_drivers
go_driver
node_driver
java_driver

if [ "${#failed[@]}" -gt 0 ]; then
    if [ "$CI_MODE" = true ]; then
        say "could not install: ${failed[*]}"
        exit 1
    fi
    say "could not install: ${failed[*]}; their tests will skip (run tests/drivers/install.sh again)"
fi
exit 0
