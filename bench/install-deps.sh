#!/usr/bin/env bash
# Installs what `make bench` needs on top of `make deps` (PostgreSQL, pgbench,
# a Rust toolchain): Debian's `pgbouncer` package, to measure against,
# python3 for the driver, and openssl for the TLS scenario's certificate. Idempotent and quiet when everything is present;
# uses sudo only when not root.
#
# The pgbouncer package enables a systemd service listening on port 6432. The
# bench never uses that port, but a service we caused to start is stopped and
# disabled again so that installing the benchmark leaves no daemon behind. A
# pgbouncer that was already installed is left exactly as it was.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
else
    SUDO=(sudo)
fi

have_pgbouncer() {
    command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]
}

missing=()
have_pgbouncer || missing+=(pgbouncer)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# The TLS scenario's key and certificate.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ "${#missing[@]}" -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "bench/install-deps: missing ${missing[*]} and apt-get is not available; install them by hand" >&2
    exit 1
fi
echo "bench/install-deps: installing ${missing[*]}" >&2
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

case " ${missing[*]} " in
*" pgbouncer "*)
    # Only where systemd actually runs (not in most containers, where the
    # package's start is refused by policy-rc.d anyway).
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        "${SUDO[@]}" systemctl disable --now pgbouncer.service >/dev/null 2>&1 || true
    fi
    ;;
esac

have_pgbouncer || { echo "bench/install-deps: pgbouncer still not found after installing" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "bench/install-deps: python3 still not found" >&2; exit 1; }
