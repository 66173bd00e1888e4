#!/usr/bin/env bash
# Installs what the build, tests and demo need, if missing: a Rust toolchain
# (not installed automatically: prints how), a C linker, PostgreSQL server
# binaries (initdb/pg_ctl/postgres), psql and pgbench, PAM's modules, slapd. Idempotent and quiet
# when everything is present. Uses sudo only when not root.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
if [ -d "${HOME:-/root}/.cargo/bin" ]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
else
    SUDO=(sudo)
fi

# The PostgreSQL binary dir with server binaries, or nothing.
pg_server_bindir() {
    local dir
    if dir="$(pg_config --bindir 2>/dev/null)" && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
        echo "$dir"
        return 0
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

have_client() { # name
    local dir
    command -v "$1" >/dev/null 2>&1 && return 0
    dir="$(pg_server_bindir)" && [ -x "$dir/$1" ]
}

missing=()
if ! command -v cc >/dev/null 2>&1; then
    missing+=(gcc libc6-dev)
fi
if ! pg_server_bindir >/dev/null || ! have_client psql || ! have_client pgbench; then
    missing+=(postgresql postgresql-contrib postgresql-client)
fi
if ! command -v make >/dev/null 2>&1; then
    missing+=(make)
fi
# libpam and its standard modules (pam_exec), for the auth_type = pam tests; part
# of every Debian install, but a trimmed image may lack them.
if ! compgen -G '/usr/lib/*/security/pam_exec.so' >/dev/null && ! compgen -G '/lib/*/security/pam_exec.so' >/dev/null; then
    missing+=(libpam0g libpam-modules)
fi

# slapd (and the libldap it brings), for the LDAP login tests, which start their own.
if [ ! -x /usr/sbin/slapd ]; then
    missing+=(slapd)
fi

if [ "${#missing[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-deps: missing ${missing[*]} and apt-get is not available; install them by hand" >&2
        exit 1
    fi
    echo "install-deps: installing ${missing[*]}" >&2
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # Debian's slapd package starts a system slapd; the tests need none, so a
    # policy-rc.d refuses service starts for the length of the install.
    policy_added=0
    if [[ " ${missing[*]} " == *" slapd "* ]] && [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
        "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
        policy_added=1
    fi
    rc=0
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
    if [ "$policy_added" = 1 ]; then
        "${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
    fi
    if [ "$rc" -ne 0 ]; then
        exit "$rc"
    fi
    if ! pg_server_bindir >/dev/null || ! have_client psql || ! have_client pgbench; then
        echo "install-deps: PostgreSQL binaries still not found after installing" >&2
        exit 1
    fi
fi

# Optional: Debian's pgbouncer exporter, which an admin-console test points at Sluice
# (skipped when absent). Its own service stays disabled; the test starts it itself.
if [ ! -x /usr/bin/prometheus-pgbouncer-exporter ] && command -v apt-get >/dev/null 2>&1; then
    exporter=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-pgbouncer-exporter)
    if "${SUDO[@]}" "${exporter[@]}" >/dev/null 2>&1 \
        || { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 \
            && "${SUDO[@]}" "${exporter[@]}" >/dev/null 2>&1; }; then
        if command -v systemctl >/dev/null 2>&1; then
            "${SUDO[@]}" systemctl disable --now prometheus-pgbouncer-exporter >/dev/null 2>&1 || true
        fi
    else
        echo "install-deps: prometheus-pgbouncer-exporter not installed (optional; its test is skipped)" >&2
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    cat >&2 <<'MSG'
install-deps: `cargo` not found. Install a Rust toolchain (>= 1.80) with rustup:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy
    . "$HOME/.cargo/env"
MSG
    exit 1
fi

# Client drivers of the driver matrix (tests/it/drivers.rs); silent when present.
"$(dirname "${BASH_SOURCE[0]}")/../tests/drivers/install.sh"
