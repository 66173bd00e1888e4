#!/usr/bin/env bash
# `make demo`: the connect-per-transaction experiment. Starts a throwaway
# PostgreSQL and a Sluice in front of it, runs
#     pgbench -n -C -c 8 -j 2 -T $DEMO_SECONDS -f select.sql   (SELECT 1;)
# first directly against PostgreSQL, then through Sluice, and prints both tps
# figures and their ratio. Everything it starts is stopped on exit.
#
# Env: DEMO_SECONDS (default 10), DEMO_CLIENTS (8), DEMO_JOBS (2),
#      SLUICE_BIN (default target/release/sluice).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO_SECONDS="${DEMO_SECONDS:-10}"
DEMO_CLIENTS="${DEMO_CLIENTS:-8}"
DEMO_JOBS="${DEMO_JOBS:-2}"
SLUICE_BIN="${SLUICE_BIN:-$ROOT/target/release/sluice}"

# Keep the ambient libpq environment (PGHOST, PGPASSWORD, ...) out of it.
while read -r var; do
    unset "$var"
done < <(compgen -e | grep '^PG' || true)
export LC_ALL=C

log() { printf 'demo: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ -x "$SLUICE_BIN" ] || die "$SLUICE_BIN not found; run 'cargo build --release' (or 'make demo')"

# --- PostgreSQL binaries -----------------------------------------------------
PGBIN=""
if dir="$(pg_config --bindir 2>/dev/null)" && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
    PGBIN="$dir"
else
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            PGBIN="$dir"
            break
        fi
    done
fi
[ -n "$PGBIN" ] || die "PostgreSQL server binaries not found; run 'make deps'"
PGBENCH="$PGBIN/pgbench"
[ -x "$PGBENCH" ] || PGBENCH="$(command -v pgbench)" || die "pgbench not found; run 'make deps'"

# --- run the server as nobody when root ---------------------------------------
if [ "$(id -u)" -eq 0 ]; then
    TMPBASE=/tmp
    if command -v runuser >/dev/null 2>&1; then
        as_pg() { runuser -u nobody -- "$@"; }
    else
        as_pg() { setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$@"; }
    fi
else
    TMPBASE="${TMPDIR:-/tmp}"
    as_pg() { "$@"; }
fi

WORK="$(mktemp -d "$TMPBASE/sluice-demo.XXXXXX")"
SLUICE_PID=""
PG_STARTED=""

cleanup() {
    local rc=$?
    set +e
    if [ -n "$SLUICE_PID" ]; then
        kill "$SLUICE_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$SLUICE_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$SLUICE_PID" 2>/dev/null
        wait "$SLUICE_PID" 2>/dev/null
    fi
    if [ -n "$PG_STARTED" ]; then
        (cd "$WORK" && as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -m immediate -w stop >/dev/null 2>&1)
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$(id -u)" -eq 0 ]; then
    chown nobody "$WORK"
fi
cd "$WORK"
mkdir -p "$WORK/sock"
chmod 755 "$WORK/sock"
[ "$(id -u)" -ne 0 ] || chown nobody "$WORK/sock"

# A TCP port on 127.0.0.1 with nothing listening on it, below the kernel's ephemeral
# range when there is room: a port that a live client connection uses as its local
# end cannot be listened on, and pgbench -C leaves thousands of those.
free_port() {
    local p low base=20000 span=40000
    low="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true)"
    if [ -n "$low" ] && [ "$low" -gt 12000 ]; then
        base=10000
        span=$((low - 10000))
    fi
    for _ in $(seq 100); do
        p=$((base + RANDOM % span))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# Waits until something accepts on 127.0.0.1:$1, while pid $2 is alive.
wait_port() {
    for _ in $(seq 100); do
        kill -0 "$2" 2>/dev/null || return 1
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# --- PostgreSQL ---------------------------------------------------------------
log "starting PostgreSQL ($PGBIN) in $WORK"
as_pg "$PGBIN/initdb" -D "$WORK/data" -A trust -U postgres --no-sync -E UTF8 --locale=C \
    >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
cat >>"$WORK/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK/sock'
max_connections = 200
fsync = off
synchronous_commit = off
shared_buffers = 32MB
CONF
PGPORT=""
for attempt in 1 2 3; do
    port="$(free_port)" || die "no free port"
    if as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/postgres.log" -w -t 60 \
        -o "-p $port" start >/dev/null 2>&1; then
        PGPORT="$port"
        PG_STARTED=1
        break
    fi
    log "PostgreSQL failed to start on port $port (attempt $attempt)"
done
if [ -z "$PGPORT" ]; then
    tail -n 30 "$WORK/postgres.log" >&2 || true
    die "could not start PostgreSQL"
fi

printf 'SELECT 1;\n' >"$WORK/select.sql"

# pgbench against 127.0.0.1:$1; prints the tps figure.
bench() {
    local port="$1" name="$2" out="$WORK/pgbench-$2.txt"
    log "pgbench -n -C -c $DEMO_CLIENTS -j $DEMO_JOBS -T $DEMO_SECONDS -f select.sql ($name)"
    if ! "$PGBENCH" -n -C -c "$DEMO_CLIENTS" -j "$DEMO_JOBS" -T "$DEMO_SECONDS" \
        -f "$WORK/select.sql" -h 127.0.0.1 -p "$port" -U postgres postgres >"$out" 2>&1; then
        cat "$out" >&2
        return 1
    fi
    local tps
    tps="$(awk '/^tps = / { print $3; exit }' "$out")"
    [ -n "$tps" ] || { cat "$out" >&2; return 1; }
    echo "$tps"
}

DIRECT_TPS="$(bench "$PGPORT" direct)" || die "pgbench against PostgreSQL failed"
log "direct: $DIRECT_TPS tps"

# --- Sluice -------------------------------------------------------------------
printf '"postgres" ""\n' >"$WORK/userlist.txt"
SLUICE_PID=""
for attempt in 1 2 3; do
    SPORT="$(free_port)" || die "no free port"
    cat >"$WORK/sluice.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$PGPORT dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $SPORT
unix_socket_dir = $WORK
auth_type = trust
auth_file = $WORK/userlist.txt
logfile = $WORK/sluice.log
admin_users = postgres
pool_mode = session
default_pool_size = 20
INI
    log "starting $SLUICE_BIN on 127.0.0.1:$SPORT"
    "$SLUICE_BIN" "$WORK/sluice.ini" >"$WORK/sluice.out" 2>&1 &
    SLUICE_PID=$!
    if wait_port "$SPORT" "$SLUICE_PID"; then
        break
    fi
    tail -n 30 "$WORK/sluice.out" "$WORK/sluice.log" >&2 2>/dev/null || true
    kill "$SLUICE_PID" 2>/dev/null || true
    wait "$SLUICE_PID" 2>/dev/null || true
    SLUICE_PID=""
    log "Sluice did not start listening on 127.0.0.1:$SPORT (attempt $attempt)"
done
[ -n "$SLUICE_PID" ] || die "could not start Sluice"

if ! SLUICE_TPS="$(bench "$SPORT" sluice)"; then
    tail -n 30 "$WORK/sluice.log" >&2 2>/dev/null || true
    die "pgbench through Sluice failed"
fi
log "sluice: $SLUICE_TPS tps"

RATIO="$(awk -v s="$SLUICE_TPS" -v d="$DIRECT_TPS" 'BEGIN { if (d > 0) printf "%.2f", s / d; else print "n/a" }')"
echo
echo "connect-per-transaction: pgbench -n -C -c $DEMO_CLIENTS -j $DEMO_JOBS -T $DEMO_SECONDS, SELECT 1"
printf '%-24s %12s\n' "target" "tps"
printf '%-24s %12s\n' "------------------------" "------------"
printf '%-24s %12.1f\n' "PostgreSQL (direct)" "$DIRECT_TPS"
printf '%-24s %12.1f\n' "Sluice (session pool)" "$SLUICE_TPS"
printf '%-24s %11sx\n' "ratio Sluice/direct" "$RATIO"
